"""`precision=auto`: mixed_bfloat16 where every training device computes bfloat16 natively,
float32 elsewhere; chosen once as a run starts, recorded, and held to by reruns."""

from __future__ import annotations

import pytest
from conftest import compose_once, fast_overrides, refusal_in_process
from omegaconf import OmegaConf

from distlab.components import precision


@pytest.mark.parametrize("flags, gpus, policy", [
    ({"avx512f", "avx512_bf16"}, [], "mixed_bfloat16"),       # AMD Zen 4, Cooper Lake
    ({"avx512f", "amx_bf16", "amx_tile"}, [], "mixed_bfloat16"),  # Sapphire Rapids
    ({"avx512f", "avx512bw"}, [], "float32"),                 # bf16 only emulated: slower
    (set(), [], "float32"),                                   # flags unreadable (not Linux)
    ({"avx512_bf16"}, [(8, 0), (9, 0)], "mixed_bfloat16"),    # Ampere, Hopper
    ({"avx512_bf16"}, [(8, 6), (7, 5)], "float32"),           # one Turing GPU among them
    (set(), [None], "float32"),                               # a GPU that gives no capability
])
def test_auto_picks_bfloat16_only_where_every_training_device_computes_it(
        monkeypatch, flags, gpus, policy):
    monkeypatch.setattr(precision, "cpu_flags", lambda: set(flags))
    monkeypatch.setattr(precision, "gpu_capabilities", lambda: list(gpus))
    chosen, why = precision.auto_policy()
    assert chosen == policy, why
    assert why and "\n" not in why


def test_the_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n"
                       "bogomips\t: 4800\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx512f "
                       "avx512_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)
    assert precision.cpu_flags() == {"fpu", "sse2", "avx512f", "avx512_bf16"}
    monkeypatch.setattr(precision, "CPUINFO", tmp_path / "absent")
    assert precision.cpu_flags() == set()


def test_resolve_sets_the_config_s_policy_and_leaves_explicit_ones(monkeypatch):
    monkeypatch.setattr(precision, "auto_policy", lambda: ("mixed_bfloat16", "a test"))
    cfg = compose_once(["precision=auto"])
    OmegaConf.set_readonly(cfg, True)  # as a caller may hand it over
    assert precision.resolve(cfg) == "mixed_bfloat16" == cfg.precision
    for explicit in ("float32", "mixed_float16", "mixed_bfloat16"):
        cfg = compose_once([f"precision={explicit}"])
        assert precision.resolve(cfg) == explicit == cfg.precision


def test_a_run_started_where_auto_chose_float32_is_refused_where_it_chooses_bfloat16(
        monkeypatch, tiny_data_dir, tmp_path):
    """The run directory keeps the policy auto chose; a rerun on a machine where auto picks
    another is refused in one line naming precision (before TensorFlow's side is imported),
    and a rerun where it picks the same one is not."""
    from distlab.launch.rerun import rerun_refusal
    from distlab.records.run_dir import RunDir

    line = [*fast_overrides(tiny_data_dir), "precision=auto"]

    def resolved() -> dict:
        cfg = compose_once(line)
        precision.resolve(cfg)
        return OmegaConf.to_container(cfg, resolve=True)

    monkeypatch.setattr(precision, "auto_policy", lambda: ("float32", "a test"))
    run_dir = RunDir(tmp_path / "run")
    run_dir.record_start(resolved())
    run_dir.checkpoints.mkdir(parents=True)
    (run_dir.checkpoints / "ckpt-1.index").write_bytes(b"")
    assert rerun_refusal(run_dir, resolved()) is None  # the same machine: it resumes
    monkeypatch.setattr(precision, "auto_policy", lambda: ("mixed_bfloat16", "a test"))
    error = refusal_in_process(run_dir.path, *line)
    assert "precision ('float32' -> 'mixed_bfloat16')" in error, error


@pytest.mark.slow
def test_an_auto_run_trains_as_the_policy_it_chose(run_inprocess, tmp_path):
    """On this machine, `precision=auto` trains exactly as the policy it picked, named in
    results.json and in the config the run directory keeps."""
    from distlab.records.run_dir import RunDir

    chosen, _ = precision.auto_policy()
    line = ["trainer.epochs=1", "trainer.steps_per_epoch=3", "deterministic=true"]
    auto = run_inprocess(*line, "precision=auto", out=tmp_path / "auto")
    explicit = run_inprocess(*line, f"precision={chosen}", out=tmp_path / "explicit")
    assert auto["precision"] == explicit["precision"] == chosen
    assert f"precision: {chosen}" in RunDir(tmp_path / "auto").started_config_yaml.read_text()
    for key in ("test_loss", "test_accuracy"):
        assert auto[key] == explicit[key], key
    rows = {}
    for name in ("auto", "explicit"):
        header, first = (tmp_path / name / "history.csv").read_text().splitlines()[:2]
        rows[name] = {k: v for k, v in zip(header.split(","), first.split(","), strict=True)
                      if k in ("loss", "accuracy", "learning_rate")}
    assert rows["auto"] == rows["explicit"] and len(rows["auto"]) == 3, rows
