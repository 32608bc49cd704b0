"""distlab's own tasks and their metrics, as the config names them, with the way each metric
ranks: known without building them (no TensorFlow), so the config is checked and the
objective's direction decided before anything is built. `distlab.components.metrics`
builds them."""

from __future__ import annotations

from omegaconf import DictConfig

# name -> (higher_is_better, the built-in tasks that have it)
BUILTIN_METRICS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "accuracy": (True, ("classification", "binary")),
    "auc": (True, ("binary",)),
    "precision": (True, ("binary",)),
    "recall": (True, ("binary",)),
    "f1": (True, ("binary",)),
    "mae": (False, ("regression",)),
    "rmse": (False, ("regression",)),
}
BUILTIN_TASKS = ("classification", "regression", "binary")


def top_k_name(k: int) -> str:
    """The name of the classification task's top-k accuracy metric."""
    return f"top{k}_accuracy"


def builtin_task_metrics(task: DictConfig) -> dict[str, bool] | None:
    """{metric name: higher_is_better} of distlab's own tasks with distlab's own metrics,
    known without building them (None for a user task, or a user metric in task.metrics).
    A test checks it against `distlab.components.tasks`."""
    name = task.get("name")
    if name not in BUILTIN_TASKS:
        return None
    names = list(task.get("metrics") or [])
    if any(n not in BUILTIN_METRICS for n in names):
        return None
    known = {n: BUILTIN_METRICS[n][0] for n in names}
    top_k = task.get("top_k") if name == "classification" else None
    return {**known, **({top_k_name(int(top_k)): True} if top_k else {})}
