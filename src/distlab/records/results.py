"""results.json assembled from `FIELDS`: every key a field, in the list's order, and the
objective a sweeper gets. `run_dir.RunDir.write_results` writes only what `assemble` gives,
so no writer invents a key."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from distlab.records.fields import FIELDS, field_of

_ORDER = {f.name: i for i, f in enumerate(FIELDS)}


def assemble(values: Mapping[str, Any]) -> dict[str, Any]:
    """results.json's content: `values` in `FIELDS`' order (a family such as `val_<metric>`
    in the order given), `objective_value` the value of the field `objective` names. A key
    that is no field is a ValueError (add the field to `FIELDS` first)."""
    unknown = [k for k in values if field_of(k) is None]
    if unknown:
        raise ValueError(f"results.json has no field {unknown[0]!r} "
                         "(distlab.records.fields.FIELDS lists them)")
    out = dict(sorted(values.items(), key=lambda kv: _ORDER[field_of(kv[0]).name]))
    if "objective" in out:
        field = out["objective"]
        value = out.get(field) if field else None
        out["objective_value"] = value if finite(value) else None
        out = dict(sorted(out.items(), key=lambda kv: _ORDER[field_of(kv[0]).name]))
    return out


def with_objective_value(results: dict[str, Any]) -> dict[str, Any]:
    """`results` assembled, with `objective_value` (the value of the field `objective`
    names) after `objective_direction`."""
    return assemble({**results, "objective_value": None})


# the class name (the field's value in a run that made its strategy) that an option always
# makes; `auto` and a user's option: null in a failed run, which may not have made one
_STRATEGY_CLASSES = {"default": "DefaultStrategy", "one_device": "OneDeviceStrategy",
                     "mirrored": "MirroredStrategy",
                     "multi_worker_mirrored": "MultiWorkerMirroredStrategy"}


def failed_results(cfg: DictConfig, error: str, started: float) -> dict[str, Any]:
    """A failed job's results.json: the fields its config knows, and the error."""
    dataset = cfg.get("dataset", {})
    return assemble({
        "status": "failed",
        "error": error,
        "mode": cfg.get("mode"),
        "loop": cfg.get("loop", {}).get("name"),
        "strategy": _STRATEGY_CLASSES.get(cfg.get("strategy", {}).get("name")),
        "dataset": dataset.get("name"),
        "batch_size_per_replica": dataset.get("batch_size_per_replica"),
        "wall_time_s": time.time() - started,
    })


def objective_value(results: Mapping[str, Any], objective: str | None) -> float | None:
    """The number a sweeper gets from a job's results."""
    field = objective or results.get("objective")
    value = results.get(field) if field else None
    return float(value) if value is not None else None


def finite(value: Any) -> bool:
    """A real number that is neither NaN nor infinite."""
    return isinstance(value, int | float) and math.isfinite(value)
