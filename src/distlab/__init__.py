"""distlab: config-driven tf.distribute experiments.

`train(overrides)` composes the config as the `distlab` command does and runs one job in
this process; `run(cfg, output_dir)` runs an already composed config (what each Hydra job
calls). Both return a `Results` and never exit. `verify(overrides)` checks that run's
invariants on a brief version of it and returns a `Report` (`distlab verify` on the command
line). `register` adds your own component to a
group's registry; a dataset builder returns `DataSplits`, a task builder a `Task` of
`Metric`s, a loop is a `Loop` subclass, and a dataset schema subclasses `DatasetConfig`;
`keras_inputs(input_spec)` gives a model builder the `keras.Input`s of structured inputs.
Importing this package does not import TensorFlow (`Task`, `Metric` and `Loop` import it
when first named), so `--cfg job` and config checks stay fast.

The public API is `__all__` here and, in documented modules, `distlab.config.DatasetConfig`,
`distlab.errors` (`DistlabError`, `ConfigError`), `distlab.tracking.Tracker` and
`distlab.training.loops.Loop`; paths that moved stay importable for a minor version as
aliases that warn (`distlab.deprecated`).

The package's layers, bottom up; a module imports from its own layer and those below only,
and no module imports itself back through others (the layout test checks both, on every
import statement, those inside functions too):

1. `records` (results.json's fields, how figures rank, the run directory, file locks), `errors`,
   `deprecated`
2. `registry`, `config`
3. `distribute`, `tracking`, `keras_patches`, `search` (a search's Optuna study, as the
   sweeper and each job see it)
4. `data`, `components`, `plugins`
5. `training`
6. `launch`, `reporting`, `verification`
7. `cli`, `__main__`, this module and its aliases (`tasks`, `loops`), and the Hydra plug-ins
   (`hydra_plugins`)
"""

from importlib import import_module
from typing import Any

from distlab.config import DatasetConfig
from distlab.data.splits import DataSplits
from distlab.deprecated import MOVED
from distlab.errors import DistlabError
from distlab.launch.api import train
from distlab.launch.job import Results, run
from distlab.registry import register
from distlab.verification import Report, verify

__version__ = "0.2.0"

_LAZY = {"Task": "distlab.components.tasks", "Metric": "distlab.components.tasks",
         "Loop": "distlab.training.loops",
         "keras_inputs": "distlab.components.models"}  # they import TensorFlow


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if f"distlab.{name}" in MOVED:  # distlab.tasks.Task after `import distlab`: it warns
        return import_module(f"distlab.{name}")
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")


__all__ = ["train", "run", "Results", "register", "verify", "Report", "DataSplits",
           "DatasetConfig", "Task", "Metric", "Loop", "DistlabError", "keras_inputs", "__version__"]
