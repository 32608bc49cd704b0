"""`distlab verify`: each planted fault is caught by the check that should catch it (and the
other checks the test runs hold), verify passes on the tiny MNIST data for the default loop,
and the command's table, verify.json and exit status. In-process (`distlab.verify`), each
test running only the checks its fault needs, on the tiny data."""

from __future__ import annotations

import json
import re
import signal

import pytest

import distlab

USER = ("imports=[verify_faults]", "dataset.preprocess.rescale=null", "model=mlp",
        "model.hidden_units=[16]", "dataset.validation=null")


@pytest.fixture
def verify(tiny_data_dir, tmp_path):
    """verify(*overrides, checks=[...]) -> Report, on the tiny data, into tmp_path."""
    counter = iter(range(100))

    def _verify(*overrides: str, checks: list[str]):
        return distlab.verify([f"dataset.data_dir={tiny_data_dir}", *overrides,
                               f"verify.checks=[{','.join(checks)}]", "verify.steps=2",
                               f"verify.dir={tmp_path / f'verify{next(counter)}'}"])

    return _verify


def statuses(report) -> dict[str, str]:
    assert report.error is None, report.error
    return {row.check: row.status for row in report.rows}


# ---- the data check (no training: the fast tier)
def test_a_test_split_that_overlaps_train_fails_the_data_check(verify):
    report = verify(*USER, "dataset.name=overlapping", checks=["data"])
    assert statuses(report) == {"data": "failed"}
    row = report["data"]
    assert "12 of the 64 rows of the test split are also rows of the train split" in row.differs
    assert row.cause.startswith("dataset.name='overlapping' gives some rows to two splits")
    assert row.figures["test_rows_in_train"] == 12
    assert report.exit_code == 1


def test_a_nan_feature_fails_the_data_check(verify):
    report = verify(*USER, "dataset.name=nan_feature", checks=["data"])
    assert statuses(report) == {"data": "failed"}
    row = report["data"]
    assert "test split has NaN or Inf in input 'inputs' in 1 of 64 rows" in row.differs, row
    assert "NaN" in row.cause


def test_clean_rows_pass_the_data_check_and_verify_json_says_so(verify):
    report = verify(*USER, "dataset.name=clean_rows", checks=["data"])
    assert statuses(report) == {"data": "passed"} and report.exit_code == 0
    written = json.loads(report.json_path.read_text())
    assert written["ok"] is True and [r["check"] for r in written["rows"]] == ["data"]
    assert "256 train / 64 test rows" in report.table()


def test_the_command_prints_a_row_per_check_and_its_status_says_whether_all_hold(
        tiny_data_dir, tmp_path, monkeypatch, capsys):
    """`distlab verify ARGS` (through the `distlab` command's entry point): the table, then
    exit 1 on a failed row, 0 when every row holds, 2 for a flag it does not take."""
    from conftest import ROOT

    from distlab import cli

    def command(*args: str) -> int:
        monkeypatch.setattr("sys.argv", ["distlab", "verify", f"dataset.data_dir={tiny_data_dir}",
                                         *USER, "verify.checks=[data]", *args])
        with pytest.raises(SystemExit) as ended:
            cli.main(config_path=str(ROOT / "conf"))
        return ended.value.code

    assert command("dataset.name=overlapping", f"verify.dir={tmp_path / 'a'}") == 1
    out = capsys.readouterr().out
    assert re.search(r"\ndata +failed ", out), out
    assert "differs: 12 of the 64 rows of the test split" in out
    assert "1 check(s) failed" in out
    written = list((tmp_path / "a").glob("*/verify.json"))  # a fresh folder of verify.dir
    assert len(written) == 1 and f"details: {written[0]}" in out, out
    assert "this takes a minute or two" in out
    assert command("dataset.name=clean_rows", f"verify.dir={tmp_path / 'b'}") == 0
    assert "every check holds" in capsys.readouterr().out
    assert command("--cfg", "job") == 2
    assert capsys.readouterr().err.startswith("error: distlab verify does not take --cfg")
    assert command("dataset.name=clean_rows", "model=nope") == 2  # refused: one line, no
    refused = capsys.readouterr()  # promise of a minute or two
    assert refused.out == "" and refused.err.count("\n") == 1, refused


def test_a_bad_verify_setting_is_one_line():
    report = distlab.verify(["verify.checks=[data,speed]"])
    assert report.exit_code == 2 and report.rows == []
    assert report.error == ("verify.checks=['data', 'speed']: speed is not a check; the checks: "
                            "data, determinism, replicas, loops, resume, export, workers")
    assert "\n" not in report.error


def test_a_dataset_that_cannot_be_found_is_one_line_not_a_failed_row_per_check(tmp_path):
    for overrides, says in ((["dataset.name=no_such_ds"], "dataset.name='no_such_ds' is not"),
                            ([f"dataset.data_dir={tmp_path / 'nope'}"], "is not a directory")):
        report = distlab.verify(overrides)
        assert report.exit_code == 2 and report.rows == [] and report.json_path is None
        assert says in report.error and "\n" not in report.error, report.error


def test_a_config_dir_that_is_no_directory_is_one_line(tmp_path, capsys, monkeypatch):
    """As run.py's and distlab.train's: never the default configs verified instead."""
    from distlab import cli

    missing = tmp_path / "nope"
    report = distlab.verify(["verify.checks=[data]"], config_dir=missing)
    assert report.exit_code == 2 and report.rows == [] and report.json_path is None
    assert report.error.startswith(f"config_dir {missing}: no directory {missing} (check the "
                                   "path)") and "\n" not in report.error
    monkeypatch.setattr(cli.sys, "argv", ["distlab", "verify", "--config-dir", str(missing),
                                          "verify.checks=[data]"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"error: --config-dir {missing}: no directory {missing} "
                                       "(check the path); configs shipped in an installed "
                                       "package (a distlab.configs entry point) need none\n")


# ---- checks that train (a few steps each)
@pytest.mark.slow
def test_a_builder_that_shuffles_with_an_unseeded_generator_fails_determinism(verify):
    report = verify(*USER, "dataset.name=unseeded_shuffle", checks=["data", "determinism"])
    assert statuses(report) == {"data": "passed", "determinism": "failed"}
    row = report["determinism"]
    assert row.differs.startswith("per-step losses differ (step 1: loss")
    assert ("dataset.name='unseeded_shuffle') gives the same rows in another order each time "
            "it is called: a shuffle or sample with an unseeded generator") in row.cause


@pytest.mark.slow
def test_a_metric_whose_state_is_a_mean_fails_the_replicas_check(verify):
    report = verify(*USER, "dataset.name=clean_rows", "task.name=mean_state",
                    checks=["replicas"])
    assert statuses(report) == {"replicas": "failed"}
    row = report["replicas"]
    assert ("the initial model's test mean_state_accuracy on 64 test rows is 0.359375 on 1 "
            "replica and 0.71875 on 2") in row.differs
    assert "test loss" not in row.differs  # the loss, a sum, agrees
    assert row.cause.startswith("task metric 'mean_state_accuracy' (MeanStateAccuracy): its "
                                "state is not a sum over rows")


@pytest.mark.slow
def test_a_user_loop_without_model_losses_under_l2_is_a_loops_warning(verify):
    report = verify(*USER, "imports=[verify_faults,user_loops]", "dataset.name=clean_rows",
                    "model.l2=0.01", "loop=custom", "loop.name=own_loss",
                    checks=["loops"])
    assert statuses(report) == {"loops": "warning"}
    assert report.exit_code == 0  # a user's loop may differ on purpose
    row = report["loops"]
    assert "the loss leaves out model.losses (2 regularisation term(s))" in row.differs, row
    assert row.summary.startswith("loop=own_loss against loop=custom")


@pytest.mark.slow
def test_an_export_that_forgets_preprocessing_fails_the_export_check(verify, monkeypatch):
    from distlab.training import export

    def forgetful(exp):  # the model fed raw inputs: no dataset.preprocess
        return lambda inputs: exp.model(export.tf.cast(inputs, "float32"), training=False)

    monkeypatch.setattr(export, "serving_function", forgetful)
    report = verify("model=mlp", "model.hidden_units=[16]", "dataset.validation=null",
                    checks=["export"])
    assert statuses(report) == {"export": "failed"}
    row = report["export"]
    assert row.differs.startswith("predictions differ by up to")
    assert row.cause.startswith("the export leaves out the inference-time preprocessing")


@pytest.mark.slow
def test_verify_passes_on_tiny_mnist_for_the_default_loop(verify, caplog):
    report = verify(checks=["data", "determinism", "replicas", "loops", "resume", "export"])
    # the resume row's own SIGTERM is expected: its job's error line is not shown
    assert not [r for r in caplog.records if "stopped by signal" in r.getMessage()]
    assert statuses(report) == dict.fromkeys(
        ["data", "determinism", "replicas", "loops", "resume", "export"], "passed"), \
        report.table()
    assert report.exit_code == 0
    assert report["resume"].figures["stopped"].startswith(
        f"stopped by signal {int(signal.SIGTERM)} at epoch 1, step 1")


@pytest.mark.slow
def test_the_resume_check_signals_after_the_block_that_holds_its_step(verify):
    """loop=custom_fast's blocks of 50 steps are longer than verify's epochs (experiment=
    mnist_fast failed here: the hook runs after each block, never after the step itself):
    the check shortens them, so that its cut is still mid-epoch."""
    report = verify("model=mlp", "model.hidden_units=[16]", "loop=custom_fast",
                    checks=["resume"])
    assert statuses(report) == {"resume": "passed"}, report.table()
    assert "blocks of" in report["resume"].summary  # shortened, so that the cut is mid-epoch
    assert report["resume"].figures["stopped"].startswith(
        f"stopped by signal {int(signal.SIGTERM)} at epoch 1, step 1"), report["resume"].figures


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_local_workers_train_as_one_process_with_two_replicas(verify):
    """The workers row: 2 worker processes (each killed after WORKER_TIMEOUT) against 1
    process with 2 replicas, on the tiny MNIST data."""
    report = verify("model=mlp", "model.hidden_units=[16]", checks=["workers"])
    assert statuses(report) == {"workers": "passed"}, report.table()
    assert report.exit_code == 0
    chief = report.scratch_dir / "workers" / "W0"
    assert json.loads((chief / "results.json").read_text())["num_replicas"] == 2


@pytest.mark.slow
def test_the_command_runs_the_replicas_row_in_a_process_of_its_own(tiny_data_dir, tmp_path):
    """The replicas row as the command runs it: in a process whose TensorFlow has not started
    (the test session's has 3 CPU devices already, which hid a probe's strategy.cpu_devices=1
    splitting the host into 1 device before the runtime started)."""
    from conftest import run_cli

    out = run_cli("verify", f"dataset.data_dir={tiny_data_dir}", "model=mlp",
                  "model.hidden_units=[16]", "verify.checks=[replicas]", "verify.steps=2",
                  f"verify.dir={tmp_path}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"\nreplicas +passed ", out.stdout), out.stdout


# ---- settings refused in one line, fresh scratch directories, what verify.json holds
@pytest.mark.parametrize("setting, says", [
    ("verify.checks=[]", "verify.checks=[] names no check: give one or more of data, "),
    ("verify.dir=", "verify.dir is empty: give the directory"),
])
def test_an_empty_verify_setting_is_one_line(setting, says):
    report = distlab.verify([setting])
    assert report.exit_code == 2 and report.error.startswith(says), report.error
    assert "\n" not in report.error and report.json_path is None


def test_a_verify_dir_that_cannot_be_a_directory_is_refused_in_one_line(
        tiny_data_dir, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for where, says in ((a_file, "is a file, not a directory"),
                        (a_file / "below", "cannot create a directory there"),
                        ("/proc/nope", "cannot create a directory there"),
                        # its runs failed on it, blamed on the experiment
                        (tmp_path / "v[2]", "has '[' in its path, which TensorFlow reads")):
        report = distlab.verify([f"dataset.data_dir={tiny_data_dir}", *USER,
                                 "dataset.name=clean_rows", "verify.checks=[data]",
                                 f"verify.dir='{where}'"])
        assert report.exit_code == 2, report.error
        assert report.error.startswith(f"verify.dir={where}: {says}"), report.error
        assert "\n" not in report.error and report.json_path is None


def test_each_verify_writes_a_fresh_folder_of_verify_dir(tiny_data_dir, tmp_path):
    """Rerun with the same verify.dir: its runs and verify.json in a new folder, so nothing
    of the first is reused."""
    args = [f"dataset.data_dir={tiny_data_dir}", *USER, "dataset.name=clean_rows",
            "verify.checks=[data]", f"verify.dir={tmp_path}"]
    first, second = distlab.verify(args), distlab.verify(args)
    assert first.ok and second.ok, (first.error, second.error)
    assert first.scratch_dir != second.scratch_dir
    assert {first.scratch_dir.parent, second.scratch_dir.parent} == {tmp_path}
    assert first.json_path.exists() and second.json_path.exists()


def test_brief_runs_log_to_no_tracker_whatever_the_user_s_logger(tiny_data_dir, tmp_path):
    """logger=mlflow (and its settings) among the overrides: the run verified has it, the
    brief runs do not (nothing goes into the user's tracking store)."""
    from distlab.verification.options import Options
    from distlab.verification.session import Session

    session = Session([f"dataset.data_dir={tiny_data_dir}", "model=mlp", "logger=mlflow",
                       "logger.experiment_name=mine"], Options(), tmp_path)
    assert session.run_config.logger.name == "mlflow"
    assert session.brief_config().logger.name == "tensorboard"


def test_verify_json_is_strict_json_when_a_loss_is_not_finite(tmp_path):
    from distlab.verification.report import FAILED, Report, Row

    row = Row("determinism", FAILED, "x", figures={"losses": [1.0, float("nan")],
                                                   "diff": float("inf")})
    path = Report([row], tmp_path).write()
    written = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c))
    assert written["rows"][0]["figures"] == {"losses": [1.0, None], "diff": None}


@pytest.mark.slow
def test_a_diverging_run_fails_as_diverged_not_as_nondeterministic(verify):
    report = verify("model=mlp", "model.hidden_units=[16]", "dataset.validation=null",
                    "optimizer=sgd", "optimizer.learning_rate=1e30", checks=["determinism"])
    row = report["determinism"]
    assert row.status == "failed" and "the loss is not finite (step" in row.differs, row
    assert "the run diverged" in row.differs and "diverges" in row.cause
    json.loads(report.json_path.read_text(), parse_constant=lambda c: pytest.fail(c))


def test_ctrl_c_stops_the_command_with_one_line_and_no_verdict(
        tiny_data_dir, tmp_path, monkeypatch, capsys):
    """SIGINT while a check runs: exit 130, one line, no verify.json (nothing trains: the
    check is replaced by one that sends the signal)."""
    import os

    from conftest import ROOT

    from distlab import cli, verification

    def interrupted(session):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("SIGINT not raised")

    monkeypatch.setattr(verification, "_checks", lambda: {"data": interrupted})
    monkeypatch.setattr("sys.argv", ["distlab", "verify", f"dataset.data_dir={tiny_data_dir}",
                                     *USER, "dataset.name=clean_rows", "verify.checks=[data]",
                                     f"verify.dir={tmp_path}"])
    with pytest.raises(SystemExit) as ended:
        cli.main(config_path=str(ROOT / "conf"))
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("verify interrupted: no verdict, no verify.json"), err
    assert err.count("\n") == 1 and not list(tmp_path.rglob("verify.json"))


def test_a_job_stopped_by_sigint_stops_verify():
    """The resume row's jobs hear Ctrl-C first (they stop at a checkpoint, exit 130): verify
    stops too instead of reading it as a failed row."""
    from types import SimpleNamespace

    from distlab.verification.resume import interruptible

    with pytest.raises(KeyboardInterrupt):
        interruptible(SimpleNamespace(exit_code=128 + int(signal.SIGINT)))
    stopped = SimpleNamespace(exit_code=128 + int(signal.SIGTERM))
    assert interruptible(stopped) is stopped
