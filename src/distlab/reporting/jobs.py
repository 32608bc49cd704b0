"""A sweep's jobs as their run directories left them: `find_jobs` finds every job under a
sweep dir (a job the sweep refused is a failed job with its reason), and the overrides that
set them apart (`swept_keys`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from distlab.launch import refusals
from distlab.records.run_dir import RunDir

NOT_STARTED = "not started"  # a job's status in the summary: a stopped sweep did not start it


@dataclass
class Job:
    """One job of the sweep, as its run directory left it."""

    num: int
    path: Path
    overrides: list[str]
    results: dict[str, Any] = field(default_factory=dict)
    refused: bool = False  # this sweep refused it: its run dir holds another run
    not_started: bool = False  # a stopped sweep did not start it

    @property
    def status(self) -> str:
        if not self.results and self.not_started:
            return NOT_STARTED
        return str(self.results.get("status", "missing"))

    @property
    def failed(self) -> bool:
        """Not completed: failed, refused, interrupted, pruned, not started or missing (no
        figures to rank)."""
        return self.status != "completed"

    @property
    def pruned(self) -> bool:
        """Stopped early by a search's pruner: not ranked, but no failure of the sweep."""
        return self.status == "pruned"

    @property
    def error(self) -> str:
        if self.status == NOT_STARTED:
            return "not started: the sweep was stopped first (a rerun runs it)"
        if self.failed and not self.results:
            return "no results.json: the job did not finish (crashed, killed or still running)"
        return str(self.results.get("error") or "")

    def override(self, key: str) -> str | None:
        return override_values(self.overrides).get(key)


def tally(jobs: list[Job]) -> str:
    """`N jobs: C completed, F failed` (and `, I interrupted` when a signal stopped some,
    `, S not started` for those a stopped sweep did not start, `, P pruned` when a search's
    pruner stopped some): none of these is counted as failed."""
    interrupted = sum(j.status == "interrupted" for j in jobs)
    not_started = sum(j.status == NOT_STARTED for j in jobs)
    pruned = sum(j.pruned for j in jobs)
    completed = sum(not j.failed for j in jobs)
    text = (f"{len(jobs)} job{'' if len(jobs) == 1 else 's'}: {completed} completed, "
            f"{len(jobs) - completed - interrupted - not_started - pruned} failed")
    return (text + (f", {interrupted} interrupted" if interrupted else "")
            + (f", {not_started} not started" if not_started else "")
            + (f", {pruned} pruned" if pruned else ""))


def find_jobs(sweep_dir: str | Path, this_sweep: bool = False) -> list[Job]:
    """Every job dir under `sweep_dir` (any `hydra.sweep.subdir` layout), by job number. A
    job this sweep refused (`distlab.launch.refusals`) is a failed job with its reason and
    its own overrides, not the earlier run its directory holds. `this_sweep`: only the jobs
    this sweep invocation launched, where it recorded them (not an earlier sweep's, into
    the same dir, that this one did not repeat)."""
    jobs = []
    refused = refusals.read(sweep_dir)
    found = {y: refusals.job_path(sweep_dir, y.parent.parent)
             for y in Path(sweep_dir).glob("**/.hydra/hydra.yaml")}
    ours = refusals.launched(sweep_dir) if this_sweep else set()
    if ours.isdisjoint(found.values()):
        ours = set()  # none recorded, or under other paths than these: every job dir
    for hydra_yaml, place in found.items():
        path = hydra_yaml.parent.parent
        if ".distlab" in path.relative_to(sweep_dir).parts:
            continue  # a run dir's own snapshot of .hydra/
        if ours and place not in ours:
            continue  # an earlier sweep's job that this one did not launch
        overrides_yaml = hydra_yaml.parent / "overrides.yaml"
        overrides = OmegaConf.load(overrides_yaml) if overrides_yaml.exists() else []
        run_dir = RunDir(path)
        job = Job(num=_job_num(hydra_yaml, path), path=path,
                  overrides=[str(o) for o in overrides if not _internal(str(o))],
                  results=run_dir.read_results() or {},
                  not_started=run_dir.not_started_mark.exists())
        if (refusal := refused.get(str(path.resolve()))) is not None:
            job.refused = True
            job.overrides = refusal["overrides"] or job.overrides
            job.results = {"status": "failed", "error": f"refused: {refusal['error']}"}
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.num, str(j.path)))


def _job_num(hydra_yaml: Path, path: Path) -> int:
    num = OmegaConf.select(OmegaConf.load(hydra_yaml), "hydra.job.num", default=None)
    if isinstance(num, int):
        return num
    return int(path.name) if path.name.isdigit() else -1


INTERNAL_PREFIX = "search."  # distlab's Optuna sweeper: the job's trial


def _internal(override: str) -> bool:
    """An override the sweeper sets for its own use (`search.*`: the trial's storage, study
    and number), not a setting the user chose: no column, no group key."""
    return override.lstrip("+~").startswith(INTERNAL_PREFIX)


def override_values(overrides: Sequence[str]) -> dict[str, str]:
    """{"dataset.batch_size_per_replica": "32", ...} from `key=value` overrides."""
    values = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep:
            values[key.lstrip("+~")] = value
    return values


def swept_keys(jobs: Sequence[Job]) -> list[str]:
    """The override keys whose values differ between jobs, in command-line order."""
    keys: dict[str, None] = {}
    for job in jobs:
        keys.update(dict.fromkeys(override_values(job.overrides)))
    return [k for k in keys if len({job.override(k) for job in jobs}) > 1]


def common_overrides(jobs: Sequence[Job], swept: Sequence[str]) -> list[str]:
    """The overrides every job shares (the swept ones aside)."""
    if not jobs:
        return []
    return [o for o in jobs[0].overrides
            if override_values([o]) and next(iter(override_values([o]))) not in swept]


def parse_value(text: str | None) -> bool | int | float | str | None:
    """An override's value as Hydra would read it (int, float, bool, null or a string)."""
    if text is None or text == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("'\"")
