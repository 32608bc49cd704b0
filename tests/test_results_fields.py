"""results.json's fields are defined once (distlab.launch.results.FIELDS): the README's table,
the config's objectives, the sweep summary's columns and the evaluation's `trained` all come
from, or are checked against, that list (no training)."""

from __future__ import annotations

import re

from conftest import ROOT

from distlab.launch import results
from distlab.reporting import summary


def _readme_table() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### results.json fields", 1)[1].split("\n\n", 3)[2]
    return dict(re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, flags=re.M))


def test_the_readme_documents_every_field_and_no_other():
    table = _readme_table()
    assert list(table) == [f.name for f in results.FIELDS]
    for field in results.FIELDS:
        assert table[field.name].strip() == results.WRITTEN_BY[field.when], field.name


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
