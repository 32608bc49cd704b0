"""`precision`: the Keras dtype policy a run trains with, and what `precision=auto` picks.

`auto` is `mixed_bfloat16` where every device the run trains on computes bfloat16 natively,
and `float32` elsewhere: GPUs of compute capability 8.0 or above (Ampere and later); a CPU
with bfloat16 instructions (`avx512_bf16` or `amx_bf16` among its flags in /proc/cpuinfo:
AMD Zen 4, Intel Cooper Lake and Sapphire Rapids onwards). The devices are the strategy's:
`default` and `one_device` train on one (the first GPU, `strategy.device`'s, or the CPU),
the others on every GPU of the machine, or on its CPU without GPUs. Each process (each
worker of a cluster) decides for its own machine. On a CPU without those instructions
oneDNN emulates bfloat16, slower than float32, so `auto` keeps float32. A run resolves
`auto` once, as it starts; its run directory records the policy it chose (the config a
rerun is compared with, and results.json's `precision`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, read_write

NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
BF16_GPU_CAPABILITY = (8, 0)
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> set[str]:
    """The host CPU's feature flags (Linux' /proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags")
            for flag in line.partition(":")[2].split()}


def gpu_capabilities() -> list[tuple[int, int] | None]:
    """The compute capability of each GPU TensorFlow sees (None where it does not say)."""
    import tensorflow as tf

    return [tf.config.experimental.get_device_details(gpu).get("compute_capability")
            for gpu in tf.config.list_physical_devices("GPU")]


def auto_policy(strategy: DictConfig) -> tuple[str, str]:
    """(the policy `precision=auto` picks for a run of `strategy` (its config) on this
    machine, why)."""
    from distlab.components import strategies  # (TensorFlow: only for precision=auto)

    gpus = strategies.trained_gpus(strategy, gpu_capabilities())
    if gpus:
        if all(c is not None and tuple(c) >= BF16_GPU_CAPABILITY for c in gpus):
            return "mixed_bfloat16", "the GPUs it trains on compute bfloat16 natively"
        return "float32", ("a GPU it trains on does not compute bfloat16 natively (compute "
                           "capability < 8.0)")
    if native := sorted(NATIVE_BF16_CPU_FLAGS & cpu_flags()):
        return "mixed_bfloat16", f"the CPU computes bfloat16 natively ({', '.join(native)})"
    return "float32", "the CPU has no bfloat16 instructions (avx512_bf16, amx_bf16)"


def resolve(cfg: DictConfig) -> str | None:
    """Set `cfg.precision` to the policy `auto` stands for on this machine, for its strategy;
    return the line to log about that choice (None: the precision was not auto)."""
    if cfg.precision != "auto":
        return None
    policy, why = auto_policy(cfg.strategy)
    with read_write(cfg):
        cfg.precision = policy
    return f"precision=auto: {policy} ({why})"
