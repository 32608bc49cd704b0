"""benchmarks/suite_cost.py, the pytest plugin behind docs/BENCHMARKS.md's account of the
suite's time: what it counts, and its report of the records it writes."""

from __future__ import annotations

import json
import subprocess
import sys

import processes
from conftest import benchmark_module, compose

suite_cost = benchmark_module("suite_cost")


def test_the_plugin_counts_compositions_and_processes_until_uninstalled(tmp_path):
    """A composition, a fresh Python and a fresh `processes.Process` (one Popen, not also
    a forked run.py); nothing once uninstalled."""
    script = tmp_path / "nothing.py"
    script.write_text("")
    suite_cost.install()
    try:
        suite_cost._counts.clear()
        compose(["seed=1"])
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
        assert processes.Process(script, fresh=True).wait(60) == 0
        row = suite_cost.record("t", 1.0, slow=False, multiprocess=False)
    finally:
        suite_cost.uninstall()
    assert (row["compose_n"], row["fresh_n"], row.get("forked_n")) == (1, 2, None), row
    suite_cost._counts.clear()
    compose(["seed=2"])
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    assert not suite_cost._counts


def test_the_report_sums_each_tier_and_splits_tests_by_what_they_start(tmp_path):
    records = [
        {"test": "a", "seconds": 1.0, "slow": False, "multiprocess": False,
         "compose_n": 3, "compose_s": 0.4},
        {"test": "b", "seconds": 10.0, "slow": True, "multiprocess": False, "run_n": 2,
         "run_s": 6.0, "compose_n": 2, "compose_s": 0.2},
        {"test": "c", "seconds": 30.0, "slow": True, "multiprocess": True, "forked_n": 2},
        {"test": "d", "seconds": 5.0, "slow": True, "multiprocess": False, "run_n": 1,
         "run_s": 2.0, "fresh_n": 1},
        {"test": "e", "seconds": 4.0, "slow": True, "multiprocess": False},
    ]
    (tmp_path / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    (tmp_path / "2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[2:]))
    assert suite_cost.report(tmp_path) == [
        "fast tier: 1 tests, 1 test-s; in-process runs 0, 0 s",
        "  compositions: 3, 0 s",
        "  tests that start processes: 0 tests, 0 test-s; in-process runs 0, 0 s; "
        "multi-process marked 0, forked run.py 0, fresh interpreters 0",
        "  tests that only run in-process: 0 tests, 0 test-s; in-process runs 0, 0 s",
        "  other tests: 1 tests, 1 test-s; in-process runs 0, 0 s",
        "slow tier: 4 tests, 49 test-s; in-process runs 3, 8 s (mean 2.67 s)",
        "  compositions: 2, 0 s",
        "  tests that start processes: 2 tests, 35 test-s; in-process runs 1, 2 s (mean 2.00 s);"
        " multi-process marked 1, forked run.py 2, fresh interpreters 1",
        "  tests that only run in-process: 1 tests, 10 test-s; in-process runs 2, 6 s "
        "(mean 3.00 s)",
        "  other tests: 1 tests, 4 test-s; in-process runs 0, 0 s",
    ]
