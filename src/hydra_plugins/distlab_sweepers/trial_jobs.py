"""How a trial's jobs ended, read from what Hydra's launcher returned and their run dirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def job_status(ret: Any) -> tuple[str, dict[str, Any]]:
    """How a trial's job ended, as its results.json says (completed, pruned, interrupted,
    failed; `refused` for a run dir this sweep refused), and that record."""
    from distlab.launch import refusals
    from distlab.records.run_dir import RunDir

    try:
        run_dir = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))
        if str(run_dir.resolve()) in refusals.read(str(ret.hydra_cfg.hydra.sweep.dir)):
            return "refused", {}
        results = RunDir(run_dir).read_results() or {}
    except Exception:  # noqa: BLE001 - no readable results: the job did not finish
        return "failed", {}
    if _raised(ret):
        return "failed", results
    return str(results.get("status") or "failed"), results


def _raised(ret: Any) -> bool:
    from hydra.core.utils import JobStatus

    return getattr(ret, "status", None) == JobStatus.FAILED


def job_value(ret: Any) -> float | None:
    try:
        value = ret.return_value
        return None if value is None else float(value)
    except Exception:  # noqa: BLE001 - a job that raised has no value
        return None
