"""`precision=auto`: mixed_bfloat16 where every training device computes bfloat16 natively,
float32 elsewhere; chosen once as a run starts, recorded, and held to by reruns."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import ROOT, compose_once, fast_overrides, refusal_in_process
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
    chosen, why = precision.auto_policy(OmegaConf.create({"name": "mirrored"}))
    assert chosen == policy, why
    assert why and "\n" not in why


@pytest.mark.parametrize("strategy, policy", [
    ({"name": "mirrored"}, "float32"),                       # every GPU: one is a Turing
    ({"name": "multi_worker_mirrored"}, "float32"),
    ({"name": "default"}, "float32"),                        # the first GPU: the Turing
    ({"name": "one_device", "device": None}, "float32"),
    ({"name": "one_device", "device": "/gpu:1"}, "mixed_bfloat16"),  # the Ampere
    ({"name": "one_device", "device": "GPU:1"}, "mixed_bfloat16"),
    ({"name": "one_device", "device": "/cpu:0"}, "float32"),  # the CPU, without bf16 here
    ({"name": "one_device", "device": "/gpu:7"}, "float32"),  # no such GPU: the CPU's rule
])
def test_auto_looks_at_the_devices_the_strategy_trains_on(monkeypatch, strategy, policy):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f"})
    monkeypatch.setattr(precision, "gpu_capabilities", lambda: [(7, 5), (8, 6)])
    chosen, why = precision.auto_policy(OmegaConf.create(strategy))
    assert chosen == policy, (strategy, why)
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    assert precision.auto_policy(OmegaConf.create(
        {"name": "one_device", "device": "/cpu:0"}))[0] == "mixed_bfloat16"


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
    monkeypatch.setattr(precision, "auto_policy", lambda strategy: ("mixed_bfloat16", "a test"))
    cfg = compose_once(["precision=auto"])
    OmegaConf.set_readonly(cfg, True)  # as a caller may hand it over
    assert precision.resolve(cfg) == "precision=auto: mixed_bfloat16 (a test)"
    assert cfg.precision == "mixed_bfloat16"
    for explicit in ("float32", "mixed_float16", "mixed_bfloat16"):
        cfg = compose_once([f"precision={explicit}"])
        assert precision.resolve(cfg) is None and cfg.precision == explicit


def test_a_run_started_where_auto_chose_float32_is_refused_where_it_chooses_bfloat16(
        monkeypatch, caplog, tiny_data_dir, tmp_path):
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

    monkeypatch.setattr(precision, "auto_policy", lambda strategy: ("float32", "a test"))
    run_dir = RunDir(tmp_path / "run")
    run_dir.record_start(resolved())
    run_dir.checkpoints.mkdir(parents=True)
    (run_dir.checkpoints / "ckpt-1.index").write_bytes(b"")
    assert rerun_refusal(run_dir, resolved()) is None  # the same machine: it resumes
    monkeypatch.setattr(precision, "auto_policy", lambda strategy: ("mixed_bfloat16", "a test"))
    with caplog.at_level(logging.INFO, logger="distlab"):
        error = refusal_in_process(run_dir.path, *line)
    assert "precision ('float32' -> 'mixed_bfloat16')" in error, error
    assert "precision=auto chose mixed_bfloat16 here" in error, error
    # nothing logged (Hydra's handler would put it in the refused run's run.log)
    assert not [r for r in caplog.records if "precision=auto" in r.getMessage()]


@pytest.mark.slow
def test_an_auto_run_trains_as_the_policy_it_chose(run_inprocess, tiny_data_dir, tmp_path):
    """On this machine, `precision=auto` trains exactly as the policy it picked, named in
    results.json, in the config the run directory keeps and in run.log (distlab.train)."""
    import distlab
    from distlab.records.run_dir import RunDir

    chosen, _ = precision.auto_policy(compose_once(["precision=auto"]).strategy)
    line = ["trainer.epochs=1", "trainer.steps_per_epoch=3", "deterministic=true"]
    results = distlab.train([*fast_overrides(tiny_data_dir), *line, "precision=auto"],
                            output_dir=tmp_path / "auto", config_path=ROOT / "conf")
    assert results.exit_code == 0, results.error
    auto = json.loads((tmp_path / "auto" / "results.json").read_text())
    explicit = run_inprocess(*line, f"precision={chosen}", out=tmp_path / "explicit")
    assert auto["precision"] == explicit["precision"] == chosen
    assert f"precision: {chosen}" in RunDir(tmp_path / "auto").started_config_yaml.read_text()
    assert f"precision=auto: {chosen} (" in (tmp_path / "auto" / "run.log").read_text()
    for key in ("test_loss", "test_accuracy"):
        assert auto[key] == explicit[key], key
    rows = {}
    for name in ("auto", "explicit"):
        header, first = (tmp_path / name / "history.csv").read_text().splitlines()[:2]
        rows[name] = {k: v for k, v in zip(header.split(","), first.split(","), strict=True)
                      if k in ("loss", "accuracy", "learning_rate")}
    assert rows["auto"] == rows["explicit"] and len(rows["auto"]) == 3, rows
