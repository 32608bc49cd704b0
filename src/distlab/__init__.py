"""distlab: config-driven tf.distribute experiments.

`run(cfg)` (distlab.job) is what `run.py` and the `distlab` command call; `register` adds
your own component to a group's registry; a dataset builder returns `DataSplits`.
Importing this package does not import TensorFlow, so `--cfg job` and config checks stay
fast.
"""

from distlab.errors import DistlabError
from distlab.job import run
from distlab.registry import register
from distlab.splits import DataSplits

__all__ = ["run", "register", "DataSplits", "DistlabError"]
