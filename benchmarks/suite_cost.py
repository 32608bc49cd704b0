"""Where the test suite's time goes: a pytest plugin that records, for every test, its time
and what it spent it on, then a report by tier (docs/BENCHMARKS.md, section 29).

    PYTHONPATH=benchmarks python -m pytest -n 2 -m slow -p suite_cost   # writes records
    python benchmarks/suite_cost.py report                               # reads them

Per test (setup, call and teardown together), in the test's own process:
- Hydra compositions (`Hydra.compose_config`): how many, and their seconds;
- in-process distlab runs (`distlab.training.runner.execute`: train, evaluate, verify's
  rows): how many, and their seconds;
- processes the test started itself: `run.py` forked from the TensorFlow-preloaded server
  (tests/processes.py) and fresh interpreters (`subprocess.Popen` of Python). What those
  start in turn (a launcher's workers, a sweep's jobs) is not counted, only timed with
  the test.
The records go to SUITE_COST_DIR (default: /tmp/distlab-suite-cost), one JSON line a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

OUT = Path(os.environ.get("SUITE_COST_DIR", "/tmp/distlab-suite-cost"))
_counts: Counter = Counter()


def _timed(owner: object, name: str, key: str) -> None:
    """Wrap owner.name so that its calls and seconds add to _counts[key, ...]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _counts[key, "n"] += 1
            _counts[key, "s"] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def pytest_configure(config) -> None:
    from hydra._internal.hydra import Hydra

    from distlab.training import runner

    _timed(Hydra, "compose_config", "compose")
    _timed(runner, "execute", "run")
    popen_init = subprocess.Popen.__init__

    def popen(self, args, *rest, **kwargs):
        first = args[0] if isinstance(args, (list, tuple)) and args else args
        if Path(str(first)).name.startswith("python") or str(first) == sys.executable:
            _counts["fresh", "n"] += 1
        popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = popen
    try:
        import processes  # tests/ (on the path once conftest is loaded)
    except ImportError:
        return
    forked_init = processes.Process.__init__

    def forked(self, *args, **kwargs):
        _counts["forked", "n"] += 1
        forked_init(self, *args, **kwargs)

    processes.Process.__init__ = forked


def pytest_runtest_protocol(item, nextitem):
    _counts.clear()
    item._suite_cost_start = time.perf_counter()


def pytest_runtest_makereport(item, call) -> None:
    if call.when != "teardown":
        return
    record = {"test": item.nodeid, "seconds": time.perf_counter() - item._suite_cost_start,
              "slow": item.get_closest_marker("slow") is not None,
              "multiprocess": item.get_closest_marker("multiprocess") is not None,
              **{f"{k}_{kind}": round(v, 3) for (k, kind), v in _counts.items()}}
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def report(folder: Path = OUT) -> list[str]:
    """Totals by tier: test seconds, and how much of it compositions, in-process runs and
    tests that start processes of their own take."""
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text().splitlines()]
    lines = []
    for slow in (False, True):
        mine = [r for r in rows if r["slow"] is slow]
        if not mine:
            continue
        runs, run_s = (sum(r.get(f"run_{k}", 0) for r in mine) for k in ("n", "s"))
        starts = [r for r in mine if r.get("forked_n") or r.get("fresh_n") or r["multiprocess"]]
        inprocess = [r for r in mine if r not in starts and r.get("run_n")]
        lines += [
            f"{'slow' if slow else 'fast'} tier: {len(mine)} tests, "
            f"{sum(r['seconds'] for r in mine):.0f} test-s",
            f"  compositions: {sum(r.get('compose_n', 0) for r in mine)}, "
            f"{sum(r.get('compose_s', 0) for r in mine):.0f} s",
            f"  in-process runs: {runs}, {run_s:.0f} s"
            + (f" (mean {run_s / runs:.2f} s)" if runs else ""),
            f"  tests that start processes: {len(starts)}, "
            f"{sum(r['seconds'] for r in starts):.0f} s (multi-process marked: "
            f"{sum(r['multiprocess'] for r in starts)}); forked run.py "
            f"{sum(r.get('forked_n', 0) for r in starts)}, fresh interpreters "
            f"{sum(r.get('fresh_n', 0) for r in starts)}",
            f"  tests that only run in-process: {len(inprocess)}, "
            f"{sum(r['seconds'] for r in inprocess):.0f} s"]
    return lines


if __name__ == "__main__":
    if sys.argv[1:] != ["report"]:
        sys.exit(__doc__)
    print("\n".join(report()))
