"""distlab: config-driven tf.distribute experiments.

`train(overrides)` composes the config as the `distlab` command does and runs one job in
this process; `run(cfg, output_dir)` runs an already composed config (what each Hydra job
calls). Both return a `Results` and never exit. `register` adds your own component to a
group's registry; a dataset builder returns `DataSplits`. Importing this package does not
import TensorFlow, so `--cfg job` and config checks stay fast.
"""

from distlab.errors import DistlabError
from distlab.job import Results, run, train
from distlab.registry import register
from distlab.splits import DataSplits

__all__ = ["train", "run", "Results", "register", "DataSplits", "DistlabError"]
