"""`precision`: the Keras dtype policy a run trains with, and what `precision=auto` picks.

`auto` is `mixed_bfloat16` where every device that trains computes bfloat16 natively, and
`float32` elsewhere: on GPUs, compute capability 8.0 or above (Ampere and later); without a
GPU, a CPU with bfloat16 instructions (`avx512_bf16` or `amx_bf16` among its flags in
/proc/cpuinfo: AMD Zen 4, Intel Cooper Lake and Sapphire Rapids onwards). Elsewhere oneDNN
emulates bfloat16 and a run is slower than in float32 (docs/BENCHMARKS.md), so `auto` keeps
float32. A run resolves `auto` once, as it starts; its run directory records the policy it
chose (the config a rerun is compared with, and results.json's `precision`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, read_write

log = logging.getLogger("distlab")

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


def auto_policy() -> tuple[str, str]:
    """(the policy `precision=auto` picks on this machine, why)."""
    gpus = gpu_capabilities()
    if gpus:
        if all(c is not None and tuple(c) >= BF16_GPU_CAPABILITY for c in gpus):
            return "mixed_bfloat16", "its GPUs compute bfloat16 natively"
        return "float32", "not every GPU computes bfloat16 natively (compute capability < 8.0)"
    if native := sorted(NATIVE_BF16_CPU_FLAGS & cpu_flags()):
        return "mixed_bfloat16", f"the CPU computes bfloat16 natively ({', '.join(native)})"
    return "float32", "the CPU has no bfloat16 instructions (avx512_bf16, amx_bf16)"


def resolve(cfg: DictConfig) -> str:
    """Set `cfg.precision` to the policy it stands for (`auto`: this machine's, logged once)
    and return it; any other value is returned as it is."""
    if cfg.precision != "auto":
        return cfg.precision
    policy, why = auto_policy()
    log.info("precision=auto: %s (%s)", policy, why)
    with read_write(cfg):
        cfg.precision = policy
    return policy
