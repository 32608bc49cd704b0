"""results.json's fields are defined once (distlab.records.FIELDS), each with its type and the
way it ranks: the config's objectives, the sweep summary's columns, what real runs write and
every ranking come from, or are checked against, that list. The documentation's table is
generated from it (tests/test_docs_site.py checks the page)."""

from __future__ import annotations

import pytest
from test_training_options import reached_at_epoch_1

from distlab.records import fields, ranking, results
from distlab.reporting import summary


def test_objectives_and_summary_columns_are_fields():
    from distlab.config import schema

    assert schema.OBJECTIVES is fields.OBJECTIVES
    assert {"val_loss", "wall_time_s", "time_to_target_s"} <= set(fields.OBJECTIVES)
    assert not any(o.startswith("test_") for o in fields.OBJECTIVES)  # test only reports
    own = {"job", "overrides", "scaling_efficiency"}  # the summary's own columns
    for column in (*summary.LEADING, *summary.TRAILING):
        assert column in own or fields.is_field(column), column
    assert not fields.is_field("accuracy") and fields.is_field("test_top5_accuracy")
    assert fields.field_of("best_test_loss").name == "best_test_<figure>"


def test_every_field_declares_a_type_and_every_objective_a_direction():
    for field in fields.FIELDS:
        kinds = {k.strip() for k in field.type.split("|")}
        assert kinds and kinds <= {"str", "int", "float", "bool", "object", "null"}, field
        assert field.direction in ("max", "min", "metric", "best", None), field
        if field.objective:
            assert field.direction is not None, field.name


def test_the_throughput_spread_ranks_down_though_its_name_says_throughput():
    # the old rule guessed from the name (not a time, not a loss: up) and maximised it
    assert ranking.maximizes("train_examples_per_sec") is True
    assert ranking.maximizes("train_examples_per_sec_std") is False
    assert ranking.maximizes("train_examples_per_sec_per_replica") is True


def test_one_rule_ranks_fields_and_figures():
    regression = {"mae": False, "rmse": False}
    assert ranking.maximizes("val_mae", regression) is False
    assert ranking.maximizes("val_mae") is False  # distlab's own metric, known without a task
    assert ranking.maximizes("val_my_score", {"my_score": False}) is False
    assert ranking.maximizes("val_my_score") is True  # a metric not known: higher is better
    assert ranking.maximizes("val_log_loss") is False  # ... unless its name says loss
    assert ranking.maximizes("best_test_loss") is ranking.maximizes("loss") is False
    assert ranking.maximizes("best_value", regression, best=False) is False
    assert ranking.maximizes("best_value") is True  # no metric followed
    assert ranking.maximizes("wall_time_s") is ranking.maximizes("epochs_to_target") is False
    assert ranking.metric_direction("val_rmse", "auto", regression) == "min"
    assert ranking.metric_direction("val_rmse", "max", regression) == "max"
    with pytest.raises(ValueError, match="num_replicas does not rank"):
        ranking.maximizes("num_replicas")


def test_results_json_is_assembled_from_the_field_list():
    assembled = results.assemble({"wall_time_s": 1.0, "val_accuracy": 0.5, "status": "completed",
                                  "objective": "val_accuracy", "val_loss": 0.1,
                                  "objective_direction": "maximize"})
    assert list(assembled) == ["status", "objective", "objective_direction", "objective_value",
                               "val_loss", "val_accuracy", "wall_time_s"]
    assert assembled["objective_value"] == 0.5
    with pytest.raises(ValueError, match="no field .throughput."):
        results.assemble({"status": "completed", "throughput": 3.0})


@pytest.mark.parametrize("option, written", [
    ("mirrored", "MirroredStrategy"), ("default", "DefaultStrategy"),
    ("multi_worker_mirrored", "MultiWorkerMirroredStrategy"),
    ("auto", None), ("my_strategy", None)])  # a class decided by the devices, or a user's
def test_a_failed_run_names_its_strategy_as_a_completed_one_does(option, written):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"strategy": {"name": option}, "loop": {"name": "custom"}})
    failed = results.failed_results(cfg, "refused", started=0.0)
    assert (failed["status"], failed["strategy"], failed["loop"]) == ("failed", written, "custom")


@pytest.mark.slow  # trains 3 steps, then evaluates the checkpoint
def test_a_real_run_and_its_evaluation_write_only_fields_of_their_declared_types(
        run_inprocess, run_once, tmp_path):
    """Every key a training run (with a target, a best checkpoint tested, early stop) and its
    evaluation write is a field of FIELDS, its value of the field's type; every completed
    field is there; the evaluation's `trained` holds exactly the fields marked trained."""
    # test_training_options' run that stops at its target at epoch 1 (3 steps, an MLP)
    trained, trained_dir = reached_at_epoch_1(run_once, "keras_fit")
    evaluated = run_inprocess("mode=evaluate", f"ckpt_path={trained_dir}", "strategy=default",
                              "model=mlp", "model.hidden_units=[32]", out=tmp_path / "eval")
    for record in (trained, evaluated):
        for key, value in record.items():
            field = fields.field_of(key)
            assert field is not None, key
            assert fields.fits(field, value), (key, value, field.type)
    assert set(fields.COMPLETED) <= set(trained)
    assert {"target", "epochs_to_target", "best_value", "best_test_loss"} <= set(trained)
    assert list(evaluated["trained"]) == list(fields.TRAINED)
    assert trained["objective_direction"] == "maximize"  # val_accuracy
