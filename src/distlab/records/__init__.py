"""The records layer, the bottom of the package: what a run records and how its figures rank.

`fields`: `FIELDS`, the one list of results.json's fields, each with its name, type, ranking
direction and meaning (the documented module: the README's and the documentation site's
results.json tables come from it); `ranking`: the one rule saying which way a figure or a
field ranks, used by the monitors, callbacks, runner, sweep summary and sweepers;
`metrics`: distlab's own tasks' metrics and their directions, known without TensorFlow;
`results`: results.json assembled from `FIELDS` (no writer invents a key) and the objective
a sweeper gets; `run_dir`: the run directory's layout and files. It imports nothing of
distlab but `distlab.errors`, and no TensorFlow.
"""

from distlab.records.fields import FIELDS, Field

__all__ = ["FIELDS", "Field"]
