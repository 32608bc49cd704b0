"""results.json's fields are defined once (distlab.launch.results.FIELDS): the config's
objectives, the sweep summary's columns and the evaluation's `trained` all come from, or are
checked against, that list (no training). The documentation's table is generated from it
(tests/test_docs_site.py checks the page)."""

from __future__ import annotations

from distlab.launch import results
from distlab.reporting import summary


def test_objectives_trained_and_summary_columns_are_fields():
    from distlab.config import schema

    assert schema.OBJECTIVES is results.OBJECTIVES
    assert {"val_loss", "wall_time_s", "time_to_target_s"} <= set(results.OBJECTIVES)
    assert not any(o.startswith("test_") for o in results.OBJECTIVES)  # test only reports
    assert all(results.is_field(name) for name in results.TRAINED)
    own = {"job", "overrides", "scaling_efficiency"}  # the summary's own columns
    for column in (*summary.LEADING, *summary.TRAILING):
        assert column in own or results.is_field(column), column
    assert not results.is_field("accuracy") and results.is_field("test_top5_accuracy")
