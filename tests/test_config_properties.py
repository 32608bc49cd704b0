"""Properties of the whole configuration space, over configurations Hypothesis draws from the
schema and conf/ (tests/config_strategies.py), not only the ones the other tests list:

- any command line composes and passes every check before training, or is refused in one
  line with exit status 2 before distlab's TensorFlow side is imported (no traceback);
- a valid configuration trains to `status: completed` on tiny data, every results.json
  field of its documented type (distlab.records.fields);
- a run stopped mid-epoch and rerun equals the uninterrupted run;
- the figures do not depend on the replica count (1, 2 or 3 logical CPUs).

The examples are the same on every run (conftest's `ci` Hypothesis profile); an example that
once failed is kept below as an `@example`. HYPOTHESIS_PROFILE=explore draws new ones.
"""

from __future__ import annotations

import csv
import json
import signal
import tempfile
from pathlib import Path

import config_strategies as cs
import pytest
from conftest import compose, runner_refused
from hypothesis import assume, event, example, given, settings
from hypothesis import strategies as st

import distlab
from distlab.records import fields


def examples(share: float) -> int:
    """A share of the profile's examples (ci: 30; explore: 300)."""
    return max(1, round(settings.default.max_examples * share))


class _ChecksPassed(Exception):
    """Raised where a job takes its run directory: every check before training passed."""


def checks_before_training(line: list[str], out: Path) -> str | None:
    """Compose `line` as the command does and run the job's checks in this process, up to
    where it would take the run directory and start TensorFlow's side: None when they all
    pass, else the one-line refusal (`composing: ` first if Hydra refused it; asserting
    exit status 2, no traceback, and that distlab.training.runner was not imported first)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from distlab.config.checks import composition_problem
    from distlab.records.run_dir import RunDir

    try:
        cfg = compose(line)
    except (HydraException, OmegaConfBaseException) as e:
        error = composition_problem(e)
        assert error and "\n" not in error and "Traceback" not in error, (line, error)
        return f"composing: {error}"

    def taken(self) -> None:
        raise _ChecksPassed

    with runner_refused() as guard, pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunDir, "mark_holder", taken)
        results = distlab.run(cfg, output_dir=out)
    assert not guard.asked, f"{line}: distlab.training.runner imported before the checks ended"
    if results.error == "_ChecksPassed: ":  # (the job reports what it caught as a failure)
        return None
    assert results.exit_code == 2, (line, results.exit_code, results.error)
    assert results.error and "\n" not in results.error, (line, results.error)
    assert "Traceback" not in results.error, (line, results.error)
    return results.error


# ------------------------------------------------------------------------ fast: no training
@settings(max_examples=examples(0.5))
@given(line=cs.overrides() | cs.overrides(users=True))
# found by this property: a list where a user dataset's split name goes crashed the rule
# (AttributeError: a traceback, exit 1) instead of refusing the value
@example(line=["dataset=diabetes", "dataset.validation=[1]", "hydra.searchpath="
               f"[file://{cs.ROOT / 'examples/tabular_project/conf'}]"])
def test_a_drawn_command_line_passes_the_checks_or_is_refused_in_one_line(line):
    with tempfile.TemporaryDirectory() as out:
        refused = checks_before_training(line, Path(out))
    event("passed the checks" if refused is None else "refused while composing"
          if refused.startswith("composing: ") else "refused by the checks")


@settings(max_examples=examples(0.25))
@given(line=cs.overrides(valid=True))
def test_drawn_valid_values_pass_the_checks_or_are_refused_in_one_line(line):
    """The same with values each key's own rule accepts (so the checks that relate keys, and
    not only the per-key rules, are what refuses)."""
    with tempfile.TemporaryDirectory() as out:
        refused = checks_before_training(line, Path(out))
    event("passed the checks" if refused is None else "refused while composing"
          if refused.startswith("composing: ") else "refused by the checks")


def test_every_seed_takes_its_whole_documented_range():
    """Each key whose rule is a seed's ([0, 2**32), drawn above over that range) accepts its
    last value and refuses the next (found by the properties: dataset.validation_seed's rule
    said [0, 2**32) but the int32 limit of other keys refused it from 2**31)."""
    from distlab.config import validate
    from distlab.errors import ConfigError

    seeds = [leaf.key for leaf in cs.leaves(cs.Config) + list(cs.group_leaves("dataset", "mnist"))
             if cs._whole_range(leaf.rule)]
    assert {"seed", "dataset.validation_seed"} <= set(seeds)
    for key in seeds:
        validate(compose([f"{key}={2**32 - 1}"]))
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate(compose([f"{key}={2**32}"]))


# ------------------------------------------------------------------ slow: tiny training runs
def harness(data_dir: Path, epochs: int = 1, steps: int = 3) -> list[str]:
    """What every drawn run is given: the tiny data, a few steps, no progress bar, no
    export unless drawn (a later override wins)."""
    return [f"dataset.data_dir={data_dir}", f"trainer.epochs={epochs}",
            f"trainer.steps_per_epoch={steps}", "loop.verbose=0", "trainer.export=false"]


def train(line: list[str], out: Path) -> tuple[int, str | None, dict]:
    """(exit status, error, results.json) of the job `line` run in this process."""
    results = distlab.run(compose(line), output_dir=out)
    record = out / "results.json"
    return results.exit_code, results.error, (json.loads(record.read_text())
                                              if record.exists() else {})


def _valid(line: list[str]) -> None:
    with tempfile.TemporaryDirectory() as out:
        assume(checks_before_training(line, Path(out)) is None)


@pytest.mark.slow
@settings(max_examples=examples(0.1))
@given(line=cs.runs())
# found by this property: under a mixed precision a model with nested dict inputs was rebuilt
# on its flattened inputs (the float32 output cast), so no step could feed it (exit 1)
@example(line=["loop=custom", "model=mlp", "task=classification", "precision=mixed_float16",
               "seed=0", "imports=[user_inputs]", "dataset.name=nested_floats",
               "dataset.preprocess.rescale=null", "model.name=flat_net",
               "strategy.cpu_devices=1"])
def test_a_drawn_valid_configuration_trains_to_completed_with_fields_of_their_types(
        line, tiny_data_dir):
    line = harness(tiny_data_dir) + line
    _valid(line)
    with tempfile.TemporaryDirectory() as out:
        status, error, record = train(line, Path(out))
    assert status == 0 and record["status"] == "completed", (line, error)
    for key, value in record.items():
        field = fields.field_of(key)
        assert field is not None, (line, key)
        assert fields.fits(field, value), (line, key, value, field.type)
    assert set(fields.COMPLETED) <= set(record), (line, set(fields.COMPLETED) - set(record))


# the figures a run's history.csv and results.json hold (not its times or throughput)
def _figures(run_dir: Path) -> tuple[list[dict], dict]:
    with open(run_dir / "history.csv", newline="") as f:
        rows = [{k: v for k, v in row.items() if k not in ("seconds", "examples_per_sec")}
                for row in csv.DictReader(f)]
    record = json.loads((run_dir / "results.json").read_text())
    kept = {k: v for k, v in record.items()
            if k.startswith(("val_", "test_", "best_test_")) or k in (
                "epochs_completed", "best_value", "best_epoch", "epochs_to_target",
                "stopped_early", "objective_value", "num_validation", "steps_per_epoch")}
    return rows, kept


def _close(a, b, tolerance: float) -> bool:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return a == b or abs(a - b) <= tolerance * max(1.0, abs(b))


def _same_figures(a: Path, b: Path, tolerance: float, what: str) -> None:
    (rows_a, record_a), (rows_b, record_b) = _figures(a), _figures(b)
    assert [r["epoch"] for r in rows_a] == [r["epoch"] for r in rows_b], what
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        for key in row_b:
            assert _close(row_a[key], row_b[key], tolerance), (what, key, row_a, row_b)
    assert record_a.keys() == record_b.keys(), what
    for key in record_b:
        assert _close(record_a[key], record_b[key], tolerance), (what, key, record_a[key],
                                                                 record_b[key])


def _stop_after(mp: pytest.MonkeyPatch, epoch: int, step: int) -> None:
    """As a SIGTERM would: ask for a stop at the first step end from step `step` of epoch
    `epoch` (0-based) on (a block of several steps ends past it)."""
    from distlab.training.controller import Controller

    original = Controller.step_end

    def step_end(self, e, steps_done, loss):
        if e == epoch and steps_done >= step and self.stop.signum is None:
            self.stop.signum = signal.SIGTERM
        original(self, e, steps_done, loss)

    mp.setattr(Controller, "step_end", step_end)


# keys a resumed run must repeat to equal the uninterrupted one, or that only cost time here
RESUMED = frozenset({"deterministic", "trainer.export"})


@pytest.mark.slow
@settings(max_examples=examples(0.07))
@given(line=cs.runs(fixed=RESUMED), stop=st.integers(1, 3))
def test_a_run_stopped_mid_epoch_then_rerun_equals_the_uninterrupted_one(line, stop,
                                                                         tiny_data_dir):
    line = [*harness(tiny_data_dir, epochs=1, steps=4), "deterministic=true", *line]
    _valid(line)
    with tempfile.TemporaryDirectory() as out:
        out = Path(out)
        status, error, _ = train(line, out / "whole")
        assert status == 0, (line, error)
        with pytest.MonkeyPatch.context() as mp:
            _stop_after(mp, epoch=0, step=stop)
            status, error, stopped = train(line, out / "resumed")
        assume(status != 0)  # (trained to its end before the stop: an early stop, say)
        assert status == 128 + signal.SIGTERM and stopped["status"] == "interrupted", (
            line, error)
        status, error, _ = train(line, out / "resumed")
        assert status == 0, (line, error)
        _same_figures(out / "resumed", out / "whole", 1e-6, "resumed")


# the figures of these depend on the replica count by design: batch normalization over each
# replica's rows (resnet's sync_batch_norm aside), dropout drawn per replica, reduced
# precision's rounding; a per-replica batch is what varies here; XLA runs on one CPU only
PER_REPLICA = frozenset({"model.batch_norm", "model.dropout", "precision",
                         "dataset.batch_size_per_replica", "loop.jit_compile",
                         "deterministic", "trainer.export"})
REPLICA_GROUPS = {"strategy": ("mirrored", "auto"),
                  "model": tuple(o for o in cs.group_options()["model"]
                                 if o not in ("resnet", "keras_applications"))}


@pytest.mark.slow
@settings(max_examples=examples(0.04))
@given(line=cs.runs(fixed=PER_REPLICA, groups=REPLICA_GROUPS),
       global_batch=st.sampled_from([6, 12, 24]))
def test_the_figures_do_not_depend_on_the_replica_count(line, global_batch, tiny_data_dir):
    line = [*harness(tiny_data_dir, epochs=1, steps=3), "deterministic=true",
            *(o for o in line if "cpu_devices" not in o)]
    _valid([*line, f"dataset.batch_size_per_replica={global_batch}"])
    with tempfile.TemporaryDirectory() as out:
        out = Path(out)
        for replicas in (1, 2, 3):
            status, error, record = train(
                [*line, f"strategy.cpu_devices={replicas}",
                 f"dataset.batch_size_per_replica={global_batch // replicas}"],
                out / str(replicas))
            assert status == 0 and record["num_replicas"] == replicas, (line, error)
        for replicas in (2, 3):
            _same_figures(out / str(replicas), out / "1", 1e-5, f"{replicas} replicas")
