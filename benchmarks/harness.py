"""Benchmark harness: distlab (`python run.py ...`) against hand-written TensorFlow scripts.

Every figure comes from whole processes run one at a time, *alternating* the variants,
each round starting one variant later (A B, B A, ... for two; A B C, B C A, C A B, ... for
three; `--fixed-order`: A B C every round), so that the slow drift of a shared, noisy
machine, and any advantage of running first or after another, hits every variant alike.
For each round the ratio of each variant to the first one given is printed; the summary
gives medians over rounds.

    export TFDS_DATA_DIR=../shared/tensorflow_datasets
    python benchmarks/harness.py overhead --pairs 3              # fit tutorial, 2 epochs
    python benchmarks/harness.py overhead --workload custom_fashion --pairs 3
    python benchmarks/harness.py tuned --pairs 2                 # 12-epoch tutorial vs tuned
    python benchmarks/harness.py fast --pairs 3                  # tutorial script vs mnist_fast
    python benchmarks/harness.py fast --workload custom_fashion # custom-loop script vs fashion_fast
    python benchmarks/harness.py floor --pairs 3                 # tuned steady epoch / floor
    python benchmarks/harness.py floor --lockstep --pairs 2 --epochs 12  # epoch by epoch, in turns
    python benchmarks/harness.py reference                       # the two reference tables
    python benchmarks/harness.py scan-steps-per-loop --values 1,10,50,200
    python benchmarks/harness.py scan-steps-per-execution --values 1,10,50 --strategy default
    python benchmarks/harness.py fit-vs-custom --pairs 2
    python benchmarks/harness.py candidates --rounds 2 --epochs 2   # tuned-preset candidates
    python benchmarks/harness.py startup --reps 5                # python run.py --cfg job
    python benchmarks/harness.py --repo A compare-repos --repo-b B experiment=...  # A/B code
    python benchmarks/harness.py metric-cost --pairs 2 experiment=tutorial_keras_mnist  # + a metric

Per run: wall time of the whole process (start-up, TensorFlow import, training,
evaluation, export), peak resident memory of the process (`os.wait4` rusage), the run's
own `results.json` (test accuracy, in-loop `train_examples_per_sec`, time to first step)
and end-to-end examples/sec (training examples / whole-process wall time). Each run gets
its own directory under --out (distlab: `hydra.run.dir`; baselines: `--out`), with the
process's console output in `<run dir>.log`. Results also go to `<out>/<command>.json`
and `<out>/<command>.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lockstep

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
NUM_TRAIN = {"mnist": 60000, "fashion_mnist": 60000}
QUIET = "loop.verbose=2"  # one line per epoch: no progress-bar cost or noise
# --lockstep: a distlab run takes its turns (benchmarks/lockstep.py on PYTHONPATH)
TURN_CALLBACK = "+callbacks.lockstep._target_=lockstep.turn_callback"


@dataclass
class Variant:
    """One command to time. `kind` is "distlab" (run.py + overrides) or "script" (argv)."""

    name: str
    kind: str
    args: list[str]
    dataset: str = "mnist"
    repo: str | None = None  # another checkout's run.py (compare-repos)

    def argv(self, run_dir: Path, repo: Path) -> list[str]:
        if self.kind == "distlab":
            run_py = Path(self.repo or repo) / "run.py"
            return [sys.executable, str(run_py), *self.args, f"hydra.run.dir={run_dir}"]
        return [sys.executable, *self.args, "--out", str(run_dir)]


@dataclass
class Record:
    variant: str
    round: int
    returncode: int
    wall_s: float
    peak_rss_mib: float
    results: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.results.get("status", "completed") == "completed"

    def get(self, key: str) -> Any:
        if key == "train_examples_per_sec" and "train_examples_per_sec_overall" in self.results:
            # distlab's train_examples_per_sec is the steady state; the scripts report the
            # mean over every epoch, which is distlab's _overall
            key = "train_examples_per_sec_overall"
        return self.results.get(key)


# --------------------------------------------------------------------------- running


def run_once(variant: Variant, run_dir: Path, repo: Path, env: dict[str, str],
             round_: int, timeout: float) -> Record:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_name(run_dir.name + ".log")
    argv = variant.argv(run_dir, repo)
    with log.open("w") as out:
        out.write(" ".join(argv) + "\n")
        out.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=variant.repo or repo, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        returncode, usage, _ = lockstep.reap(proc.pid, start + timeout)
        wall = time.perf_counter() - start
    return collect(variant, run_dir, returncode, wall, usage, round_)


def collect(variant: Variant, run_dir: Path, returncode: int, wall: float, usage: Any,
            round_: int) -> Record:
    """The Record of a finished run: its exit status, wall time, peak RSS and results."""
    results = {}
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        pass
    epochs = results.get("epochs_completed") or 0
    results["e2e_examples_per_sec"] = epochs * NUM_TRAIN.get(variant.dataset, 0) / wall
    if variant.kind == "distlab":
        results["end_gap_s"] = end_gap(run_dir / "run.log")
    return Record(variant.name, round_, returncode, wall, usage.ru_maxrss / 1024, results,
                  str(run_dir))


def end_gap(run_log: Path) -> float | None:
    """Seconds from the last epoch's summary line to the test-evaluation line in run.log.

    The evaluation itself takes well under a second here; the rest is the tf.data iterator
    deletion stall at the end of training (docs/BENCHMARKS.md, "Where the time goes").
    """
    last_epoch = test = None
    try:
        lines = run_log.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        match = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]", line)
        if not match:
            continue
        stamp = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1e3
        if re.search(r"\] - epoch (\d+)/\1 - ", line):
            last_epoch = stamp
        elif " - test_loss " in line and last_epoch is not None:
            test = stamp
    return test - last_epoch if test is not None and last_epoch is not None else None


def warm_up(variants: list[Variant], out: Path, repo: Path, env: dict[str, str],
            timeout: float, tag: str) -> None:
    """One untimed epoch of each distlab variant before the rounds, so that every timed run
    finds distlab's data cache warm (a first run on a machine writes it: about 5-6 s for
    MNIST or Fashion-MNIST), as repeated runs do; `--no-warm-up` times a cold first round."""
    for v in variants:
        if v.kind != "distlab":
            continue
        warm = dataclasses.replace(v, args=[*v.args, "trainer.epochs=1"])
        rec = run_once(warm, out / tag / f"warm_up_{_slug(v.name)}", repo, env, 0, timeout)
        print(f"[{tag}] warm-up (untimed, 1 epoch) {v.name}: "
              + ("done" if rec.ok else f"FAILED (exit {rec.returncode})"), flush=True)


def alternate(variants: list[Variant], rounds: int, out: Path, repo: Path,
              env: dict[str, str], timeout: float, tag: str, rotate: bool = True,
              ) -> list[Record]:
    """Rounds of every variant; prints each run and each round's ratios to the first variant.
    `rotate`: round r starts at variant r (A B C, B C A, C A B, ...), so that over as many
    rounds as variants each runs once in each place (a machine that speeds up or slows down
    within a round, or favours the run after another, hits them alike); else A B C each
    round."""
    records: list[Record] = []
    base = variants[0]
    for r in range(1, rounds + 1):
        shift = (r - 1) % len(variants) if rotate else 0
        this_round = {}
        for v in variants[shift:] + variants[:shift]:
            run_dir = out / tag / f"r{r}_{_slug(v.name)}"
            rec = run_once(v, run_dir, repo, env, r, timeout)
            records.append(rec)
            this_round[v.name] = rec
            print(f"[{tag}] round {r} {v.name}: {_describe(rec)}", flush=True)
        first = this_round[base.name]
        if first.ok:
            ratios = ", ".join(f"{x.variant}/{first.variant} = {x.wall_s / first.wall_s:.3f}"
                               for x in this_round.values() if x.ok and x is not first)
            print(f"[{tag}] round {r} wall-time ratios: {ratios}", flush=True)
    return records


def _describe(rec: Record) -> str:
    if not rec.ok:
        status = rec.results.get("status")
        why = "" if status in (None, "completed") else f", {status}"
        return f"FAILED (exit {rec.returncode}{why}; see {rec.run_dir}.log)"
    fmt = lambda key, spec: "-" if rec.get(key) is None else format(rec.get(key), spec)  # noqa: E731
    return (f"wall {rec.wall_s:.1f} s, peak RSS {rec.peak_rss_mib:.0f} MiB, "
            f"test_accuracy {fmt('test_accuracy', '.4f')}, "
            f"train {fmt('train_examples_per_sec', '.0f')} ex/s, "
            f"end-to-end {rec.get('e2e_examples_per_sec'):.0f} ex/s"
            + (f", end gap {rec.get('end_gap_s'):.1f} s" if rec.get("end_gap_s") is not None
               else ""))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]


# --------------------------------------------------------------------------- reporting


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(records: list[Record], variants: list[Variant]) -> list[dict[str, Any]]:
    """One row per variant: medians over rounds and the median of per-round ratios."""
    base = variants[0].name
    by_round: dict[int, dict[str, Record]] = {}
    for rec in records:
        by_round.setdefault(rec.round, {})[rec.variant] = rec
    rows = []
    for v in variants:
        mine = [r for r in records if r.variant == v.name]
        good = [r for r in mine if r.ok]
        ratios = [rnd[v.name].wall_s / rnd[base].wall_s for rnd in by_round.values()
                  if v.name in rnd and base in rnd and rnd[v.name].ok and rnd[base].ok]
        rows.append({
            "variant": v.name,
            "runs": len(mine),
            "failed": len(mine) - len(good),
            "median_wall_s": _median([r.wall_s for r in good]),
            "ratio_to_first_per_round": [round(x, 4) for x in ratios],
            "median_ratio_to_first": _median(ratios),
            "median_train_examples_per_sec": _median(
                [r.get("train_examples_per_sec") for r in good]),
            "median_e2e_examples_per_sec": _median([r.get("e2e_examples_per_sec") for r in good]),
            "median_peak_rss_mib": _median([r.peak_rss_mib for r in good]),
            "median_time_to_first_step_s": _median([r.get("time_to_first_step_s") for r in good]),
            "end_gap_s": [r.get("end_gap_s") for r in good],
            "test_accuracy": [r.get("test_accuracy") for r in good],
        })
    return rows


def markdown(rows: list[dict[str, Any]], variants: list[Variant], title: str,
             meta: dict[str, Any]) -> str:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"### {title}", "",
             f"{meta['date']} - {meta['cpu']} ({meta['cores']} cores) - distlab "
             f"{meta['repo_state']}", "",
             "| variant | runs | median wall (s) | wall / first, per round | median ratio | "
             "train ex/s | end-to-end ex/s | peak RSS (MiB) | first step (s) | end gap (s) | "
             "test acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        accs = ", ".join(f"{a:.4f}" for a in row["test_accuracy"] if a is not None) or "-"
        per_round = ", ".join(f"{x:.3f}" for x in row["ratio_to_first_per_round"]) or "-"
        gaps = ", ".join(f"{g:.1f}" for g in row["end_gap_s"] if g is not None) or "-"
        failed = f" ({row['failed']} failed)" if row["failed"] else ""
        lines.append(
            f"| {row['variant']} | {row['runs']}{failed} | {fmt(row['median_wall_s'], '.1f')} | "
            f"{per_round} | {fmt(row['median_ratio_to_first'], '.3f')} | "
            f"{fmt(row['median_train_examples_per_sec'], '.0f')} | "
            f"{fmt(row['median_e2e_examples_per_sec'], '.0f')} | "
            f"{fmt(row['median_peak_rss_mib'], '.0f')} | "
            f"{fmt(row['median_time_to_first_step_s'], '.1f')} | {gaps} | {accs} |")
    lines += ["", "Commands (run dir / --out added per run):", ""]
    for v in variants:
        cmd = (["python", "run.py", *v.args] if v.kind == "distlab"
               else ["python", *(_rel(x) for x in v.args)])
        lines.append(f"- {v.name}: `{' '.join(cmd)}`")
    return "\n".join(lines) + "\n"


def _rel(arg: str) -> str:
    """A path under this checkout, shown relative to it (as the commands are run)."""
    try:
        return str(Path(arg).relative_to(ROOT)) if Path(arg).is_absolute() else arg
    except ValueError:
        return arg


def machine_meta(repo: Path) -> dict[str, Any]:
    state = "unknown"
    if (repo / "SNAPSHOT").is_file():  # a copy made with `git archive` (see docs/BENCHMARKS.md)
        return {**_meta_base(), "repo": str(repo),
                "repo_state": (repo / "SNAPSHOT").read_text().strip()}
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True).stdout.strip()
        state = f"{head}{' + uncommitted changes' if dirty else ''}" if head else "not a git tree"
    except OSError:
        pass
    return {**_meta_base(), "repo": str(repo), "repo_state": state}


def _meta_base() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version()}


def report(name: str, title: str, records: list[Record], variants: list[Variant],
           out: Path, meta: dict[str, Any], extra: dict[str, Any] | None = None) -> list[dict]:
    rows = summarize(records, variants)
    text = markdown(rows, variants, title, meta)
    print("\n" + text, flush=True)
    (out / f"{name}.md").write_text(text)
    payload = {"meta": meta, "title": title, "summary": rows, **(extra or {}),
               "variants": [v.__dict__ for v in variants],
               "runs": [{**r.__dict__, "ok": r.ok} for r in records]}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str))
    return rows


def rebuild(out: Path, name: str) -> None:
    """Re-summarise saved runs (e.g. after adding a column), without running anything."""
    payload = json.loads((out / f"{name}.json").read_text())
    variants = [Variant(**v) for v in payload["variants"]]
    kinds = {v.name: v.kind for v in variants}
    records = []
    for r in payload["runs"]:
        r = {k: v for k, v in r.items() if k != "ok"}
        rec = Record(**r)
        if kinds.get(rec.variant) == "distlab":
            rec.results["end_gap_s"] = end_gap(Path(rec.run_dir) / "run.log")
        records.append(rec)
    report(name, payload["title"], records, variants, out, payload["meta"])


# --------------------------------------------------------------------------- commands

KERAS_BASELINE = str(BENCH / "baseline_keras_mnist.py")
FLOOR = str(BENCH / "floor.py")
CUSTOM_BASELINE = str(BENCH / "baseline_custom_fashion.py")


def overhead_variants(a: argparse.Namespace) -> list[Variant]:
    e = a.epochs
    if a.workload == "keras_mnist":
        # like the tutorial, neither validates during fit; trainer.export=false <-> no --export
        return [Variant("script", "script", [KERAS_BASELINE, "--epochs", str(e),
                                             "--verbose", "2"]),
                Variant("distlab", "distlab", ["experiment=tutorial_keras_mnist",
                                               f"trainer.epochs={e}", "trainer.export=false",
                                               QUIET, *a.extra])]
    return [Variant("script", "script", [CUSTOM_BASELINE, "--epochs", str(e)], "fashion_mnist"),
            Variant("distlab", "distlab", ["experiment=tutorial_custom_fashion",
                                           f"trainer.epochs={e}", "trainer.export=false", QUIET,
                                           *a.extra],
                    "fashion_mnist")]


def tuned_and_candidates(args: list[str], candidates: list[str]) -> list[Variant]:
    """The tuned preset with `args`, then with each candidate's overrides added."""
    return [Variant("distlab tuned", "distlab", args),
            *(Variant(f"distlab tuned {c}", "distlab", [*args, *c.split()]) for c in candidates)]


def tuned_variants(a: argparse.Namespace) -> list[Variant]:
    # The tutorial as written: no per-epoch validation, SavedModel export; the tuned preset
    # also exports (trainer.export=true) and evaluates at the end.
    return [Variant("script (tutorial)", "script",
                    [KERAS_BASELINE, "--epochs", str(a.epochs), "--export", "--verbose", "2"]),
            *tuned_and_candidates(["experiment=tutorial_keras_mnist_tuned",
                                   f"trainer.epochs={a.epochs}", *a.extra], a.candidate)]


def fast_variants(a: argparse.Namespace) -> list[Variant]:
    # the tutorial script at its full length against the time-to-accuracy preset (no export
    # either): MNIST's 12 epochs without export (its cheapest form); Fashion-MNIST's custom
    # loop as the tutorial runs it (10 epochs, a test pass each, a checkpoint every 2)
    if a.workload == "custom_fashion":
        return [Variant("script (custom-loop tutorial, 10 epochs)", "script",
                        [CUSTOM_BASELINE, "--epochs", "10"], "fashion_mnist"),
                Variant("distlab fashion_fast", "distlab",
                        ["experiment=fashion_fast", QUIET, *a.extra], "fashion_mnist")]
    return [Variant("script (tutorial, 12 epochs)", "script",
                    [KERAS_BASELINE, "--epochs", "12", "--verbose", "2"]),
            Variant("distlab mnist_fast", "distlab", ["experiment=mnist_fast", QUIET, *a.extra])]


def floor_variants(a: argparse.Namespace) -> list[Variant]:
    # benchmarks/floor.py (the same model and steps with nothing around them) against the
    # tuned preset, same epochs; each one's steady epoch is the median of its epochs 2 to the last
    tuned = ["experiment=tutorial_keras_mnist_tuned", f"trainer.epochs={a.epochs}",
             "trainer.export=false", QUIET, *a.extra]
    return [Variant("floor", "script", [FLOOR, "--epochs", str(a.epochs)]),
            *tuned_and_candidates(tuned, a.candidate)]


def epoch_seconds(rec: Record) -> list[float]:
    """A run's training seconds per epoch: the floor's results.json; a distlab run's
    history.csv, examples / examples_per_sec, which leaves out the epoch end (checkpoint,
    TensorBoard, the epoch line)."""
    if not rec.ok:
        return []
    if "epoch_seconds" in rec.results:
        return list(rec.results["epoch_seconds"])
    try:
        rows = (Path(rec.run_dir) / "history.csv").read_text().splitlines()
    except OSError:
        return []
    header = rows[0].split(",")
    return [NUM_TRAIN["mnist"] / float(r.split(",")[header.index("examples_per_sec")])
            for r in rows[1:]]


def steady_epoch(rec: Record) -> float | None:
    """A run's steady epoch in seconds: the median of `epoch_seconds` over epochs 2 to the
    last."""
    steady = epoch_seconds(rec)[1:]
    return statistics.median(steady) if steady else None


def floor_report(records: list[Record], out: Path) -> None:
    """Per round: the floor's and each variant's steady epoch, their ratio, and the median of
    the epoch-by-epoch ratios (epochs 2 to the last; with --lockstep, epochs that ran one
    right after the other)."""
    lines = ["| round | variant | floor epoch (s) | its epoch (s) | its / floor | median of "
             "its / floor epoch by epoch |", "|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    paired: dict[str, list[float]] = {}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for r in sorted({rec.round for rec in records}):
        mine = {x.variant: x for x in records if x.round == r}
        floor_rec = mine.pop("floor", None)
        floor = steady_epoch(floor_rec) if floor_rec else None
        floor_epochs = epoch_seconds(floor_rec)[1:] if floor_rec else []
        for name, rec in mine.items():
            epoch = steady_epoch(rec)
            ratio = epoch / floor if floor and epoch else None
            if ratio:
                ratios.setdefault(name, []).append(ratio)
            pairs = [a / b for a, b in zip(epoch_seconds(rec)[1:], floor_epochs, strict=False)]
            by_epoch = statistics.median(pairs) if pairs else None
            if by_epoch:
                paired.setdefault(name, []).extend(pairs)
            lines.append(f"| {r} | {name} | {fmt(floor)} | {fmt(epoch)} | {fmt(ratio)} | "
                         f"{fmt(by_epoch)} |")
    lines.append("")
    lines += [f"median {name} / floor: {statistics.median(v):.3f} (rounds); epoch by epoch, "
              f"all rounds: median {statistics.median(paired[name]):.3f} of {len(paired[name])}"
              for name, v in ratios.items() if paired.get(name)]
    text = "### Steady epoch: tuned preset against the compute floor\n\n" + "\n".join(lines) + "\n"
    print("\n" + text, flush=True)
    with (out / "floor.md").open("a") as f:
        f.write("\n" + text)


def in_lockstep(variants: list[Variant], runs: int, epochs: int, out: Path, repo: Path,
                env: dict[str, str], timeout: float, tag: str) -> list[Record]:
    """`runs` lockstep runs (benchmarks/lockstep.py): each starts every variant at once, then
    lets one run one epoch at a time, epoch e starting at variant e (run r at variant r)."""
    env = {**env, "PYTHONPATH": os.pathsep.join([str(BENCH), *filter(None, [
        env.get("PYTHONPATH")])])}
    records: list[Record] = []
    for r in range(1, runs + 1):
        shift = (r - 1) % len(variants)
        order = variants[shift:] + variants[:shift]
        children, dirs = [], []
        for v in order:
            run_dir = out / tag / f"r{r}_{_slug(v.name)}"
            timed = (dataclasses.replace(v, args=[*v.args, TURN_CALLBACK])
                     if v.kind == "distlab" else v)
            children.append(lockstep.Child(v.name, timed.argv(run_dir, repo),
                                           str(v.repo or repo), run_dir.with_name(
                                               run_dir.name + ".log")))
            dirs.append(run_dir)
        lockstep.referee(children, epochs, env, timeout,
                         log=lambda line, r=r: print(f"[{tag}] run {r} {line}", flush=True))
        for v, child, run_dir in zip(order, children, dirs, strict=True):
            rec = collect(v, run_dir, child.status, child.wall, child.usage, r)
            if child.timed_out:
                rec.results["status"] = f"timed out (--timeout {timeout:g})"
            elif rec.ok and len(child.turns) < epochs:  # it ran, but not in turns: no figures
                rec.results["status"] = f"not in lockstep ({len(child.turns)} turns taken)"
            records.append(rec)
            print(f"[{tag}] run {r} {v.name}: {_describe(rec)}", flush=True)
    return records


def reference_variants(a: argparse.Namespace) -> list[Variant]:
    return [Variant("tutorial_keras_mnist", "distlab", ["experiment=tutorial_keras_mnist", QUIET]),
            Variant("tutorial_custom_fashion", "distlab",
                    ["experiment=tutorial_custom_fashion", QUIET], "fashion_mnist")]


def scan_variants(a: argparse.Namespace, key: str, loop: str) -> list[Variant]:
    common = [f"loop={loop}", f"strategy={a.strategy}", f"trainer.epochs={a.epochs}",
              "trainer.export=false", f"trainer.validate_every={a.validate_every}", QUIET,
              *a.extra]
    return [Variant(f"{key}={v}", "distlab", [*common, f"loop.{key}={v}"])
            for v in a.values.split(",")]


def fit_vs_custom_variants(a: argparse.Namespace) -> list[Variant]:
    common = [f"dataset={a.dataset}", f"model={a.model}", f"strategy={a.strategy}",
              f"trainer.epochs={a.epochs}", "trainer.export=false",
              f"trainer.validate_every={a.validate_every}", QUIET, *a.extra]
    return [Variant("loop=keras_fit", "distlab", ["loop=keras_fit", *common], a.dataset),
            Variant("loop=custom", "distlab", ["loop=custom", *common], a.dataset)]


def compare_repos_variants(a: argparse.Namespace, repo: Path) -> list[Variant]:
    """The same distlab command in two checkouts (e.g. a framework change against HEAD)."""
    args = [*a.overrides, QUIET] if a.quiet else list(a.overrides)
    return [Variant(f"A {repo}", "distlab", args, a.dataset, str(repo)),
            Variant(f"B {a.repo_b.resolve()}", "distlab", args, a.dataset,
                    str(a.repo_b.resolve()))]


def metric_cost_variants(a: argparse.Namespace, repo: Path) -> list[Variant]:
    """A preset, then the same with one stateful metric added (benchmarks/stateful_metric.py):
    what the stateful path costs per step."""
    args = [*a.overrides, QUIET]
    stateful = [*args, "imports=[benchmarks.stateful_metric]",
                "task.metrics=[accuracy,stateful_accuracy]"]
    return [Variant("A per-example metrics only", "distlab", args, a.dataset, str(repo)),
            Variant("B + a stateful metric", "distlab", stateful, a.dataset, str(repo))]


# Candidates for experiment=tutorial_keras_mnist_tuned, each on top of the reference preset.
CANDIDATES = {
    "reference": [],
    "default": ["strategy=default"],
    "one_device": ["strategy=one_device"],
    "default+val0": ["strategy=default", "trainer.validate_every=0"],
    "default+val0+spe10": ["strategy=default", "trainer.validate_every=0",
                           "loop.steps_per_execution=10"],
    "default+val0+spe50": ["strategy=default", "trainer.validate_every=0",
                           "loop.steps_per_execution=50"],
    "default+val0+spe200": ["strategy=default", "trainer.validate_every=0",
                            "loop.steps_per_execution=200"],
    "default+val0+spe50+xla": ["strategy=default", "trainer.validate_every=0",
                               "loop.steps_per_execution=50", "loop.jit_compile=true"],
    "mirrored+val0+spe50": ["trainer.validate_every=0", "loop.steps_per_execution=50"],
    "custom+default+val0+spl50": ["loop=custom", "strategy=default", "trainer.validate_every=0",
                                  "loop.steps_per_loop=50"],
    "custom+default+val0+spl200": ["loop=custom", "strategy=default", "trainer.validate_every=0",
                                   "loop.steps_per_loop=200"],
}


def candidate_variants(a: argparse.Namespace) -> list[Variant]:
    names = a.names.split(",") if a.names else list(CANDIDATES)
    export = "true" if a.export else "false"
    variants = [Variant(n, "distlab", ["experiment=tutorial_keras_mnist",
                                       f"trainer.epochs={a.epochs}", f"trainer.export={export}",
                                       QUIET, *CANDIDATES[n], *a.extra])
                for n in names]
    if a.with_script:  # the hand-written tutorial first: ratios are then to the script
        script = [KERAS_BASELINE, "--epochs", str(a.epochs), "--verbose", "2"]
        variants.insert(0, Variant("script (tutorial)", "script",
                                   script + (["--export"] if a.export else [])))
    return variants


def startup(a: argparse.Namespace, repo: Path, env: dict[str, str], out: Path,
            meta: dict[str, Any]) -> None:
    """`python run.py --cfg job`: wall time, and whether TensorFlow got imported."""
    probe = ("import runpy, sys; sys.argv = ['run.py', '--cfg', 'job']\n"
             "try:\n    runpy.run_path('run.py', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('TF_IMPORTED', 'tensorflow' in sys.modules, file=sys.stderr)")
    check = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env, capture_output=True,
                           text=True)
    imported = "TF_IMPORTED True" in check.stderr
    times = []
    for _ in range(a.reps):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "run.py", "--cfg", "job"], cwd=repo, env=env,
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode:
            sys.exit(f"python run.py --cfg job failed:\n{proc.stderr[-2000:]}")
    text = (f"### python run.py --cfg job\n\n{meta['date']} - {meta['cpu']} ({meta['cores']} "
            f"cores) - distlab {meta['repo_state']}\n\n"
            "| runs | median (s) | min (s) | max (s) | imports TensorFlow |\n"
            "|---|---|---|---|---|\n"
            f"| {a.reps} | {statistics.median(times):.2f} | {min(times):.2f} | "
            f"{max(times):.2f} | {'yes' if imported else 'no'} |\n")
    print(text)
    (out / "startup.md").write_text(text)
    (out / "startup.json").write_text(json.dumps(
        {"meta": meta, "times_s": times, "imports_tensorflow": imported}, indent=2))


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="results and run dirs (default: a new temp dir)")
    p.add_argument("--repo", type=Path, default=ROOT,
                   help="distlab checkout whose run.py is timed (default: this one)")
    p.add_argument("--data-dir", default=None,
                   help="TFDS_DATA_DIR for every run (default: $TFDS_DATA_DIR, else "
                        "../shared/tensorflow_datasets next to the repo)")
    p.add_argument("--timeout", type=float, default=3600,
                   help="per-run limit, seconds (--lockstep: per lockstep run of every variant)")
    p.add_argument("--fixed-order", dest="rotate", action="store_false",
                   help="every round runs the variants in the order given (default: round r "
                        "starts at variant r, so each runs in each place)")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                   help="no untimed epoch of each distlab variant first (its data cache warm)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("overhead", help="hand-written script vs distlab, same settings")
    s.add_argument("--workload", choices=["keras_mnist", "custom_fashion"], default="keras_mnist")
    s.add_argument("--pairs", type=int, default=3)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("extra", nargs="*", help="extra overrides for the distlab run, e.g. "
                   "dataset.disk_cache=false (the scripts decode the data in every run)")

    s = sub.add_parser("tuned", help="the tutorial script vs experiment=tutorial_keras_mnist_tuned")
    s.add_argument("--pairs", type=int, default=2)
    s.add_argument("--epochs", type=int, default=12)
    s.add_argument("--candidate", action="append", default=[],
                   help="also the tuned preset with these overrides (space-separated)")
    s.add_argument("extra", nargs="*", help="extra overrides for the tuned run")

    s = sub.add_parser("fast", help="the tutorial script vs experiment=mnist_fast (or, with "
                       "--workload custom_fashion, the custom-loop one vs fashion_fast)")
    s.add_argument("--workload", choices=["keras_mnist", "custom_fashion"], default="keras_mnist")
    s.add_argument("--pairs", type=int, default=3)
    s.add_argument("extra", nargs="*", help="extra overrides for the mnist_fast run")

    s = sub.add_parser("floor", help="benchmarks/floor.py vs the tuned preset: steady epochs")
    s.add_argument("--pairs", type=int, default=3)
    s.add_argument("--epochs", type=int, default=6)
    s.add_argument("--candidate", action="append", default=[],
                   help="also the tuned preset with these overrides (space-separated)")
    s.add_argument("--lockstep", action="store_true",
                   help="each round starts every variant at once and runs one epoch at a "
                        "time, in turns, each epoch's order rotated (benchmarks/lockstep.py; "
                        "--fixed-order does not apply)")
    s.add_argument("extra", nargs="*", help="extra overrides for the tuned run")

    s = sub.add_parser("reference", help="the two reference presets, full length")
    s.add_argument("--rounds", type=int, default=1)

    for name, key, loop in [("scan-steps-per-loop", "steps_per_loop", "custom"),
                            ("scan-steps-per-execution", "steps_per_execution", "keras_fit")]:
        s = sub.add_parser(name, help=f"loop={loop} over loop.{key} values")
        s.add_argument("--values", default="1,10,50,200")
        s.add_argument("--strategy", default="default" if loop == "keras_fit" else "mirrored")
        s.add_argument("--epochs", type=int, default=2)
        s.add_argument("--validate-every", type=int, default=0)
        s.add_argument("--rounds", type=int, default=2)
        s.add_argument("extra", nargs="*", help="extra overrides for every run")

    s = sub.add_parser("fit-vs-custom", help="loop=keras_fit vs loop=custom, equal settings")
    s.add_argument("--pairs", type=int, default=2)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--dataset", default="mnist")
    s.add_argument("--model", default="mnist_cnn")
    s.add_argument("--strategy", default="mirrored")
    s.add_argument("--validate-every", type=int, default=1)
    s.add_argument("extra", nargs="*", help="extra overrides for both")

    s = sub.add_parser("candidates", help="tuned-preset candidates on the reference preset")
    s.add_argument("--names", default="", help=f"comma list of: {', '.join(CANDIDATES)}")
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--export", action="store_true", help="trainer.export=true (and the script's)")
    s.add_argument("--with-script", action="store_true",
                   help="add the hand-written tutorial script (no validation) as the first variant")
    s.add_argument("extra", nargs="*", help="extra overrides for every candidate")

    s = sub.add_parser("compare-repos", help="one distlab command, --repo (A) vs --repo-b (B)")
    s.add_argument("--repo-b", type=Path, required=True)
    s.add_argument("--pairs", type=int, default=3)
    s.add_argument("--dataset", default="mnist", help="for end-to-end examples/sec")
    s.add_argument("--no-quiet", dest="quiet", action="store_false",
                   help="do not add loop.verbose=2")
    s.add_argument("overrides", nargs="*", help="run.py overrides for both")

    s = sub.add_parser("metric-cost", help="a preset with and without one stateful metric")
    s.add_argument("--pairs", type=int, default=2)
    s.add_argument("--dataset", default="mnist", help="for end-to-end examples/sec")
    s.add_argument("overrides", nargs="*", help="run.py overrides for both, e.g. the preset")

    s = sub.add_parser("rebuild", help="rewrite <out>/<name>.md from <out>/<name>.json")
    s.add_argument("name", help="overhead, tuned, reference, candidates, ...")

    s = sub.add_parser("startup", help="python run.py --cfg job")
    s.add_argument("--reps", type=int, default=5)

    a = p.parse_args(argv)
    out = (a.out or Path(tempfile.mkdtemp(prefix="distlab-bench-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = a.repo.resolve()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    data_dir = a.data_dir or os.environ.get("TFDS_DATA_DIR")
    if not data_dir and (ROOT.parent / "shared" / "tensorflow_datasets").is_dir():
        data_dir = str(ROOT.parent / "shared" / "tensorflow_datasets")
    if data_dir:
        env["TFDS_DATA_DIR"] = str(Path(data_dir).resolve())
    meta = machine_meta(repo)
    meta["command"] = " ".join(["python", "benchmarks/harness.py", *(argv or sys.argv[1:])])
    print(f"out: {out}\n{json.dumps(meta)}", flush=True)

    if a.command == "startup":
        startup(a, repo, env, out, meta)
        return
    if a.command == "rebuild":
        rebuild(out, a.name)
        return
    if a.command == "overhead":
        variants, rounds = overhead_variants(a), a.pairs
        title = f"Overhead: {a.workload}, {a.epochs} epochs, distlab vs hand-written script"
    elif a.command == "tuned":
        variants, rounds = tuned_variants(a), a.pairs
        title = f"Tuned preset vs the hand-written tutorial script, {a.epochs} epochs"
    elif a.command == "fast":
        variants, rounds = fast_variants(a), a.pairs
        title = ("Time to accuracy: experiment=fashion_fast vs the custom-loop tutorial script"
                 if a.workload == "custom_fashion" else
                 "Time to accuracy: experiment=mnist_fast vs the 12-epoch tutorial script")
    elif a.command == "floor":
        variants, rounds = floor_variants(a), a.pairs
        title = f"Compute floor vs the tuned preset, {a.epochs} epochs"
    elif a.command == "reference":
        variants, rounds = reference_variants(a), a.rounds
        title = "Reference workloads (full length)"
    elif a.command == "scan-steps-per-loop":
        variants, rounds = scan_variants(a, "steps_per_loop", "custom"), a.rounds
        title = f"loop=custom, strategy={a.strategy}: loop.steps_per_loop scan, {a.epochs} epochs"
    elif a.command == "scan-steps-per-execution":
        variants, rounds = scan_variants(a, "steps_per_execution", "keras_fit"), a.rounds
        title = (f"loop=keras_fit, strategy={a.strategy}: loop.steps_per_execution scan, "
                 f"{a.epochs} epochs")
    elif a.command == "compare-repos":
        variants, rounds = compare_repos_variants(a, repo), a.pairs
        title = f"The same command in two checkouts: {' '.join(a.overrides)}"
    elif a.command == "metric-cost":
        variants, rounds = metric_cost_variants(a, repo), a.pairs
        title = f"One stateful metric's cost: {' '.join(a.overrides)}"
    elif a.command == "fit-vs-custom":
        variants, rounds = fit_vs_custom_variants(a), a.pairs
        title = (f"fit vs custom: {a.dataset}/{a.model}, strategy={a.strategy}, {a.epochs} "
                 f"epochs, validate_every={a.validate_every}")
    else:
        variants, rounds = candidate_variants(a), a.rounds
        title = (f"Tuned-preset candidates, {a.epochs} epochs "
                 "(each on experiment=tutorial_keras_mnist)")
    if a.warm_up:
        warm_up(variants, out, repo, env, a.timeout, a.command)
    if getattr(a, "lockstep", False):
        title += (", in lockstep (one epoch per turn: wall, end-to-end ex/s, first step and "
                  "end gap include the waits for the others' turns)")
        records = in_lockstep(variants, rounds, a.epochs, out, repo, env, a.timeout, a.command)
    else:
        records = alternate(variants, rounds, out, repo, env, a.timeout, a.command, a.rotate)
    report(a.command, title, records, variants, out, meta)
    if a.command == "floor":
        floor_report(records, out)
    if any(not r.ok for r in records):
        sys.exit(1)


if __name__ == "__main__":
    main()
