"""Experiment trackers beside TensorBoard: the `logger` config group (logger=mlflow, or a
tracker a plug-in registers). No TensorFlow here; MLflow is imported only when a run uses it.

`tracker`: the interface a tracker implements (`Tracker`: start, log_epoch, log_artifacts,
finish, finish_sweep) and what a run tells it (`RunInfo`); `mlflow_tracker`: logger=mlflow;
`session`: how a job drives its tracker (on the chief only; the tracker's state kept in the
run directory, so a rerun that resumes continues the same tracker run; a tracker's failure
is one warning, and training goes on). A plug-in adds a tracker with
`distlab.register("logger", "mine", MyTracker, schema=MyLoggerConfig)`.
"""

from distlab.tracking.tracker import RunInfo, Tracker

__all__ = ["RunInfo", "Tracker"]
