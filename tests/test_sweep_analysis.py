"""What a sweep's summary concludes: repeats (jobs that differ only in seed) grouped with
their mean, standard deviation, 95% confidence interval and n, ranked on the validation
objective; the best configuration; only what differs between jobs; an Optuna search's
parameter importances and history. Synthetic results: nothing trains."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from test_sweep import _fake_job

from distlab.reporting.repeats import group_repeats, interval, rank, t_quantile
from distlab.reporting.summary import SweepSummary
from distlab.reporting.table import repeats_markdown

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_t_quantile_matches_the_tables():
    # two-sided 95%: the textbook table, then the large-dof values
    known = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 9: 2.262, 10: 2.228, 29: 2.045,
             30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980, 100000: 1.960}
    for dof, value in known.items():
        assert t_quantile(dof) == pytest.approx(value, abs=6e-4), dof
    try:
        from scipy import stats
    except ImportError:
        return
    for dof in range(1, 301):
        assert t_quantile(dof) == pytest.approx(stats.t.ppf(0.975, dof), abs=1e-4), dof
    with pytest.raises(ValueError):
        t_quantile(0)


def test_interval_is_students_t_over_the_finite_values():
    stat = interval([1, 2, 3, 4, 5, float("nan"), None])
    assert (stat.mean, stat.n) == (3.0, 5)
    assert stat.std == pytest.approx(math.sqrt(2.5))
    half = 2.7764 * math.sqrt(2.5) / math.sqrt(5)
    assert (stat.low, stat.high) == pytest.approx((3 - half, 3 + half), abs=1e-4)
    assert stat.half_width == pytest.approx(half, abs=1e-4)
    one = interval([0.5])
    assert (one.mean, one.n, one.std, one.low, one.high) == (0.5, 1, None, None, None)
    assert interval([None, float("inf")]) is None


def test_group_repeats_groups_by_every_override_but_seed():
    rows = [{"overrides": ["optimizer.learning_rate=1e-3", f"seed={s}"], "status": "completed",
             "val_accuracy": 0.8 + s / 100} for s in range(3)]
    rows += [{"overrides": "optimizer.learning_rate=3e-3 seed=0", "val_accuracy": 0.9},
             {"overrides": "optimizer.learning_rate=3e-3 seed=1", "val_accuracy": 0.7},
             {"overrides": "optimizer.learning_rate=3e-3 seed=2", "status": "failed",
              "val_accuracy": 0.0}]
    groups = group_repeats(rows, ["val_accuracy", "test_accuracy"])
    assert [g.config for g in groups] == [{"optimizer.learning_rate": "1e-3"},
                                          {"optimizer.learning_rate": "3e-3"}]
    assert [g.seeds for g in groups] == [["0", "1", "2"], ["0", "1", "2"]]
    assert [g.n for g in groups] == [3, 2]  # the failed repeat has no figures
    assert groups[0].stats["val_accuracy"].mean == pytest.approx(0.81)
    assert groups[1].stats["val_accuracy"].mean == pytest.approx(0.8)
    assert "test_accuracy" not in groups[0].stats
    assert [g.label() for g in rank(groups, "val_accuracy", maximize=True)] == [
        "optimizer.learning_rate=1e-3", "optimizer.learning_rate=3e-3"]
    assert [g.label() for g in rank(groups, "val_accuracy", maximize=False)] == [
        "optimizer.learning_rate=3e-3", "optimizer.learning_rate=1e-3"]
    # `seed=0,0,1`: seed 0 ran twice, the same experiment: counted once, not as a third draw
    rows = [{"overrides": f"seed={s}", "val_accuracy": v} for s, v in ((0, 0.8), (0, 0.8),
                                                                        (1, 0.9))]
    [group] = group_repeats(rows, ["val_accuracy"])
    assert (group.seeds, group.n, group.stats["val_accuracy"].n) == (["0", "0", "1"], 2, 2)
    assert group.stats["val_accuracy"].mean == pytest.approx(0.85)
    lines = repeats_markdown([group], ["seed"], "val_accuracy", ["val_accuracy"])
    assert "| 1 | (no other override) | 2 | 0 0 1 |" in "\n".join(lines)
    assert "A seed listed twice ran twice in its configuration: it counts once" in lines[-1]


def test_repeats_are_ranked_on_the_validation_mean_with_intervals(tmp_path):
    """lr=1e-3 has the better validation mean, lr=3e-3 the better test mean (and the single
    best job): the summary chooses 1e-3, on validation, by its mean over three seeds."""
    val = {"1e-3": [0.80, 0.82, 0.84], "3e-3": [0.90, 0.70, 0.71]}
    test = {"1e-3": [0.70, 0.71, 0.72], "3e-3": [0.90, 0.90, 0.90]}
    num = 0
    for lr in ("1e-3", "3e-3"):
        for seed in range(3):
            # the search.* keys distlab's Optuna sweeper sets on each trial are no setting
            _fake_job(tmp_path, num, [f"seed={seed}", f"optimizer.learning_rate={lr}",
                                      "loop=custom", f"search.trial={num}",
                                      f"search.storage={tmp_path}/optuna.journal"],
                      {"status": "completed", "objective": "val_accuracy",
                       "objective_direction": "maximize", "val_accuracy": val[lr][seed],
                       "val_loss": 1 - val[lr][seed], "test_accuracy": test[lr][seed],
                       "test_loss": 0.3, "batch_size_per_replica": 64, "num_replicas": 1,
                       "train_examples_per_sec": 1000.0 + 10 * seed, "wall_time_s": 5.0})
            num += 1
    SweepSummary(tensorboard=False).summarise(tmp_path)

    groups = _csv(tmp_path / "summary_groups.csv")
    assert [(g["rank"], g["configuration"], g["n"], g["seeds"]) for g in groups] == [
        ("1", "optimizer.learning_rate=1e-3", "3", "0 1 2"),
        ("2", "optimizer.learning_rate=3e-3", "3", "0 1 2")]
    best = groups[0]
    half = 4.3027 * 0.02 / math.sqrt(3)  # t(2) x std / sqrt(n)
    assert float(best["val_accuracy_mean"]) == pytest.approx(0.82)
    assert float(best["val_accuracy_std"]) == pytest.approx(0.02)
    assert (float(best["val_accuracy_ci_low"]), float(best["val_accuracy_ci_high"])) == (
        pytest.approx((0.82 - half, 0.82 + half), abs=1e-4))
    assert float(groups[1]["test_accuracy_mean"]) == pytest.approx(0.9)
    assert float(best["train_examples_per_sec_mean"]) == pytest.approx(1010.0)
    assert "optimizer.learning_rate" in best and "seed" not in best
    assert "search" not in (tmp_path / "summary.md").read_text()

    md = (tmp_path / "summary.md").read_text()
    assert ("Best configuration (chosen on the mean `val_accuracy` over its seeds, "
            "maximized): `optimizer.learning_rate=1e-3` (val_accuracy 0.82 ± 0.02 "
            f"[{0.82 - half:.4g}, {0.82 + half:.4g}], n=3).") in md, md
    assert "## Repeats" in md and "## Jobs" in md
    assert "| 1 | optimizer.learning_rate=1e-3 | 3 | 0 1 2 | 0.82 ± 0.02 [" in md, md
    # only what differs: the settings every job shares are said once, not a column each
    assert "Same in every job: batch/replica 64, replicas 1." in md, md
    assert "batch/replica |" not in md and "`loop=custom`" in md
    assert (tmp_path / "summary.png").read_bytes()[:8] == PNG_MAGIC


def test_a_sweep_without_repeats_has_no_groups(tmp_path):
    for num, lr in enumerate(("1e-3", "3e-3")):
        _fake_job(tmp_path, num, ["seed=0", f"optimizer.learning_rate={lr}"],
                  {"status": "completed", "val_accuracy": 0.5 + num / 10,
                   "batch_size_per_replica": 32 * (num + 1)})
    SweepSummary(plot=False, tensorboard=False).summarise(tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "summary_groups.csv").exists() and "## Repeats" not in md
    assert ("Best configuration (chosen on `val_accuracy`, maximized): "
            "`optimizer.learning_rate=3e-3` (job 1: val_accuracy 0.6).") in md, md
    assert "| batch/replica |" in md  # it differs between the jobs


def test_a_pruned_job_is_listed_but_neither_ranked_nor_a_failure(tmp_path):
    _fake_job(tmp_path, 0, ["optimizer.learning_rate=1e-3"],
              {"status": "completed", "val_accuracy": 0.5})
    _fake_job(tmp_path, 1, ["optimizer.learning_rate=3e-3"],
              {"status": "pruned", "val_accuracy": 0.9, "epochs_completed": 1})
    _fake_job(tmp_path, 2, ["optimizer.learning_rate=1e-2"],
              {"status": "failed", "error": "non-finite loss"})
    failed = SweepSummary(plot=False, tensorboard=False).summarise(tmp_path)
    assert [j.num for j in failed] == [2]
    md = (tmp_path / "summary.md").read_text()
    assert "3 jobs: 1 completed, 1 failed, 1 pruned." in md, md
    assert "`optimizer.learning_rate=1e-3` (job 0: val_accuracy 0.5)" in md, md
    assert "| 1 | optimizer.learning_rate=3e-3 | pruned |" in md, md


def _optuna_at_least_3_6():
    optuna = pytest.importorskip("optuna")
    from distlab.reporting.search import MIN_OPTUNA, _version

    if _version(optuna.__version__) < MIN_OPTUNA:
        pytest.skip(f"optuna {optuna.__version__} has no PED-ANOVA importance")
    return optuna


def _storage(optuna, path: Path):
    if path.suffix == ".db":
        return f"sqlite:///{path}"
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))


def test_an_optuna_search_gets_its_importances_and_history(tmp_path):
    """A study kept in the sweep dir (its journal file): the learning rate decides the
    value, the batch size does not; the importances say so (table, csv, plot), the history
    is drawn, and matplotlib's style is left as it was (Optuna's plots set ggplot)."""
    optuna = _optuna_at_least_3_6()
    import matplotlib

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="distlab", direction="maximize",
                                storage=_storage(optuna, tmp_path / "optuna.journal"),
                                sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial):
        lr = trial.suggest_float("optimizer.learning_rate", 1e-4, 1e-2, log=True)
        trial.suggest_categorical("dataset.batch_size_per_replica", [32, 64, 128])
        if trial.number == 3:
            raise ValueError("a failed trial")
        return 1 - (math.log10(lr) + 3) ** 2

    study.optimize(objective, n_trials=24, catch=(ValueError,))
    other = optuna.create_study(study_name="other", storage=study._storage)  # not analysed
    other.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    for num in range(2):
        _fake_job(tmp_path, num, [f"optimizer.learning_rate={num + 1}e-3"],
                  {"status": "completed", "val_accuracy": 0.5 + num / 10})
    style = dict(matplotlib.rcParams)

    SweepSummary(tensorboard=False).summarise(tmp_path, study_name="distlab")

    assert dict(matplotlib.rcParams) == style
    rows = _csv(tmp_path / "optuna_importance.csv")
    assert [r["parameter"] for r in rows] == ["optimizer.learning_rate",
                                              "dataset.batch_size_per_replica"]
    assert float(rows[0]["importance"]) > 0.5
    for name in ("optuna_importance.png", "optuna_history.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC, name
    md = (tmp_path / "summary.md").read_text()
    assert "## Search (Optuna study `distlab`)" in md and "24 trials: " in md, md
    assert "23 complete" in md and "1 fail" in md, md
    assert f"Best trial: #{study.best_trial.number}, value {study.best_value:.4g}" in md
    assert f"| optimizer.learning_rate | {float(rows[0]['importance']):.3f} |" in md, md
    assert md.index("## Search") < md.index("## Jobs")


@pytest.mark.slow  # trains nothing, but Optuna's SQLite schema takes seconds to create
def test_the_study_loads_from_an_sqlite_file_too(tmp_path):
    optuna = _optuna_at_least_3_6()
    from distlab.reporting.search import load_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="distlab",
                                storage=_storage(optuna, tmp_path / "optuna.db"))
    study.optimize(lambda t: t.suggest_float("x", 0, 2), n_trials=1)
    loaded, why = load_study(tmp_path)
    assert (loaded.study_name, len(loaded.trials), why) == ("distlab", 1, "")


def test_a_search_analysis_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, caplog):
    """No study file: no analysis and nothing said. A study file with an Optuna too old for
    it: one line, and the rest of the summary as usual."""
    import logging

    from distlab.reporting import search

    _fake_job(tmp_path, 0, ["optimizer.learning_rate=1e-3"],
              {"status": "completed", "val_accuracy": 0.5})
    _fake_job(tmp_path, 1, ["optimizer.learning_rate=3e-3"],
              {"status": "completed", "val_accuracy": 0.6})
    with caplog.at_level(logging.INFO):
        SweepSummary(plot=False, tensorboard=False).summarise(tmp_path)
    assert "search analysis" not in caplog.text and "optuna" not in caplog.text
    (tmp_path / "optuna.journal").write_text("")
    optuna = pytest.importorskip("optuna")
    monkeypatch.setattr(optuna, "__version__", "2.10.1")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        SweepSummary(plot=False, tensorboard=False).summarise(tmp_path)
    lines = [r.getMessage() for r in caplog.records if "optuna" in r.getMessage()]
    assert lines == ["sweep summary: optuna 2.10.1 is too old for the search analysis "
                     "(needs 3.6 or newer)"], lines
    assert "## Search" not in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / search.IMPORTANCE_CSV).exists()


def test_a_summary_claims_no_objective_no_job_reported_nor_a_setting_a_failed_job_lacks(
        tmp_path):
    """Jobs that all failed before their results name no objective: the summary says so
    (it named `val_accuracy (maximized)` before). A setting is "same in every job" only
    when every job reported it: a failed job's global batch is not known."""
    for num in range(2):
        _fake_job(tmp_path / "all_failed", num, [f"seed={num}"],
                  {"status": "failed", "error": "refused", "batch_size_per_replica": 64})
    SweepSummary(plot=False).summarise(tmp_path / "all_failed")
    md = (tmp_path / "all_failed" / "summary.md").read_text()
    assert "Objective: none, no job got as far as reporting its objective." in md, md
    assert "maximized" not in md and "Same in every job: batch/replica 64." in md, md
    assert {(row["objective"], row["status"]) for row in _csv(
        tmp_path / "all_failed" / "summary.csv")} == {("", "failed")}

    done = {"status": "completed", "objective": "val_loss", "val_loss": 0.5,
            "batch_size_per_replica": 64, "global_batch_size": 128}
    _fake_job(tmp_path / "one_failed", 0, ["seed=0"], done)
    _fake_job(tmp_path / "one_failed", 1, ["seed=1"],
              {"status": "failed", "error": "refused", "batch_size_per_replica": 64})
    SweepSummary(plot=False).summarise(tmp_path / "one_failed")
    md = (tmp_path / "one_failed" / "summary.md").read_text()
    assert "Objective: `val_loss` (minimized)" in md, md
    assert "Same in every job: batch/replica 64." in md and "| global batch |" in md, md


def test_a_study_without_a_completed_trial_gets_no_plots_and_no_optuna_warning(tmp_path,
                                                                               caplog):
    """A search stopped in its first trial: Optuna warned "There are no complete trials"
    among distlab's lines, and drew an empty history."""
    import logging

    import optuna

    from distlab.reporting.search import analyse

    study = optuna.create_study(study_name="distlab")
    study.ask()  # running, stopped
    with caplog.at_level(logging.WARNING):
        out = analyse(study, tmp_path)
    assert out.written == [] and not list(tmp_path.iterdir())
    assert "no complete trials" not in caplog.text.lower()
    assert "1 trials: 1 running." in out.lines
