"""distlab: config-driven tf.distribute experiments.

`run(cfg)` (distlab.job) is what `run.py` calls. Importing this package does not import
TensorFlow, so `python run.py --cfg job` and config validation stay fast.
"""

from distlab.errors import DistlabError
from distlab.job import run

__all__ = ["run", "DistlabError"]
