"""Where the test suite's time goes: a pytest plugin that records, for every test, its time
and what it spent it on, then a report by tier (docs/BENCHMARKS.md, section 29).

    PYTHONPATH=benchmarks python -m pytest -q -n 2 -p suite_cost   # both tiers: records
    python benchmarks/suite_cost.py report                          # reads them

Per test (setup, call and teardown together), in the test's own process:
- Hydra compositions (`ConfigLoaderImpl.load_configuration`: a run's, and each job's of a
  sweep run in that process): how many, and their seconds;
- in-process distlab runs (`distlab.training.runner.execute`: train, evaluate, verify's
  rows): how many, and their seconds;
- processes started from the test's process: `run.py` forked from the TensorFlow-preloaded
  server (tests/processes.py), and fresh Python interpreters (`subprocess.Popen`; Ray's
  daemons, started by the first Ray test, count as that test's). What those start in turn
  (a launcher's workers, a sweep's jobs, joblib's workers) is not counted, only timed with
  the test.
Each session replaces the records in SUITE_COST_DIR (default: /tmp/distlab-suite-cost), one
JSON line a test: to run the tiers as two sessions, give each its own SUITE_COST_DIR and
report each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

OUT = Path(os.environ.get("SUITE_COST_DIR", "/tmp/distlab-suite-cost"))
_counts: Counter = Counter()
_undo: list[Callable[[], None]] = []
_START = pytest.StashKey[float]()


def _patch(owner: object, name: str, replacement: Callable) -> None:
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    _undo.append(lambda: setattr(owner, name, original))


def _timed(key: str) -> Callable[[Callable], Callable]:
    """A wrapper that adds each call and its seconds to _counts[key, "n" | "s"]."""
    def wrap(original: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                _counts[key, "n"] += 1
                _counts[key, "s"] += time.perf_counter() - start
        return wrapper
    return wrap


def install() -> None:
    """Count compositions, in-process runs and the processes started (undone by
    `uninstall`)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from distlab.training import runner

    _patch(ConfigLoaderImpl, "load_configuration", _timed("compose"))
    _patch(runner, "execute", _timed("run"))

    def popen(original: Callable) -> Callable:
        def init(self, args, *rest, **kwargs):
            first = str(args[0] if isinstance(args, (list, tuple)) and args else args)
            if first == sys.executable or Path(first).name.startswith("python"):
                _counts["fresh", "n"] += 1
            original(self, args, *rest, **kwargs)
        return init

    _patch(subprocess.Popen, "__init__", popen)
    processes = sys.modules.get("processes")  # tests/processes.py, once conftest has run
    if processes is not None:
        def forked(original: Callable) -> Callable:
            def init(self, *args, fresh: bool = processes.FRESH, **kwargs):
                if not fresh:  # a fresh one is a Popen, counted there
                    _counts["forked", "n"] += 1
                original(self, *args, fresh=fresh, **kwargs)
            return init

        _patch(processes.Process, "__init__", forked)


def uninstall() -> None:
    while _undo:
        _undo.pop()()


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # xdist's controller, or a run without xdist
        shutil.rmtree(OUT, ignore_errors=True)
        if config.getoption("dist", "no") != "no":
            return  # the controller runs no test (and imports no TensorFlow)
    install()


def pytest_unconfigure(config) -> None:
    uninstall()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> None:
    _counts.clear()
    item.stash[_START] = time.perf_counter()


def pytest_runtest_makereport(item, call) -> None:
    if call.when == "teardown" and _START in item.stash:
        write(record(item.nodeid, time.perf_counter() - item.stash[_START],
                     slow=item.get_closest_marker("slow") is not None,
                     multiprocess=item.get_closest_marker("multiprocess") is not None))


def record(test: str, seconds: float, slow: bool, multiprocess: bool) -> dict:
    """One test's record: its seconds, markers and what _counts gathered since it began."""
    return {"test": test, "seconds": seconds, "slow": slow, "multiprocess": multiprocess,
            **{f"{key}_{kind}": round(v, 3) for (key, kind), v in _counts.items()}}


def write(row: dict, folder: Path = OUT) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _starts(r: dict) -> bool:
    return bool(r.get("forked_n") or r.get("fresh_n") or r["multiprocess"])


def report(folder: Path = OUT) -> list[str]:
    """Totals by tier: test seconds, compositions, in-process runs, and the tests split
    into those that start processes, those that only run in-process, and the others."""
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text().splitlines()]

    def line(label: str, mine: list[dict]) -> str:
        seconds = sum(r["seconds"] for r in mine)
        runs, run_s = (sum(r.get(f"run_{k}", 0) for r in mine) for k in ("n", "s"))
        return (f"{label}: {len(mine)} tests, {seconds:.0f} test-s; in-process runs {runs}, "
                f"{run_s:.0f} s" + (f" (mean {run_s / runs:.2f} s)" if runs else ""))

    lines = []
    for slow in (False, True):
        mine = [r for r in rows if r["slow"] is slow]
        if not mine:
            continue
        starts = [r for r in mine if _starts(r)]
        lines += [
            line(f"{'slow' if slow else 'fast'} tier", mine),
            f"  compositions: {sum(r.get('compose_n', 0) for r in mine)}, "
            f"{sum(r.get('compose_s', 0) for r in mine):.0f} s",
            "  " + line("tests that start processes", starts)
            + f"; multi-process marked {sum(r['multiprocess'] for r in starts)}, forked "
            f"run.py {sum(r.get('forked_n', 0) for r in starts)}, fresh interpreters "
            f"{sum(r.get('fresh_n', 0) for r in starts)}",
            "  " + line("tests that only run in-process",
                        [r for r in mine if not _starts(r) and r.get("run_n")]),
            "  " + line("other tests", [r for r in mine if not _starts(r) and not r.get("run_n")]),
        ]
    return lines


if __name__ == "__main__":
    if sys.argv[1:] != ["report"]:
        sys.exit(__doc__)
    print("\n".join(report()))
