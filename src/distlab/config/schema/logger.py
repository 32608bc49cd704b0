"""The `logger` group's keys: experiment tracking beside TensorBoard (`distlab.tracking`)."""

from __future__ import annotations

from dataclasses import dataclass

from distlab.config.schema.rules import (
    checked,
)


@dataclass
class LoggerConfig:
    """logger=tensorboard: no tracker beside TensorBoard, which every run writes (logs/)."""

    name: str = "tensorboard"  # tensorboard, mlflow, or a tracker a plug-in registered


@dataclass
class MlflowLoggerConfig(LoggerConfig):
    """logger=mlflow (pip install "distlab[mlflow]"): the config as params, each history.csv
    row as metrics (step: the epoch), results.json's figures as results/<field>, and
    config.yaml, history.csv, results.json as artifacts; a sweep is a parent run with a child
    per job; a rerun that resumes continues the same MLflow run. The chief only."""

    name: str = "mlflow"
    # any MLflow tracking URI; a relative sqlite:/// path is from the current directory (the
    # default: one store for every run; see them with `mlflow ui --backend-store-uri` it).
    # Artifacts of a sqlite store go to mlartifacts/ beside its file
    tracking_uri: str = checked("sqlite:///outputs/mlflow.db", (
        lambda v: bool(v.strip()), "must be an MLflow tracking URI, e.g. "
        "sqlite:///outputs/mlflow.db or http://host:5000"))
    # the MLflow experiment the runs go to
    experiment_name: str = checked("distlab", (lambda v: bool(v.strip()),
                                               "must name an MLflow experiment"))
