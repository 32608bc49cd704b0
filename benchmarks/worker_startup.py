"""Start-up time of a 2-worker run: started by distlab (`strategy.workers=2`, local processes
or Ray actors) against the same run with hand-written TF_CONFIG (two `python run.py`
processes this script starts, as a user's two terminals would).

Start-up = from the launch (the first process started) to the chief's first training step:
the moment its run.log holds the line "time to first step". Whole processes, one variant at
a time, alternating (tf_config, local, ray, tf_config, ...), so that a shared machine's drift
hits every variant alike; per round and as medians: each variant's time, and its difference
and ratio to tf_config.

    export TFDS_DATA_DIR=../shared/tensorflow_datasets
    RAY_AUTH_MODE=disabled python benchmarks/worker_startup.py --rounds 3 --out /tmp/ws
    python benchmarks/worker_startup.py --variants tf_config,local --rounds 5

`ray` starts a local Ray instance per run (strategy.ray.address=null, part of its start-up);
`--ray-address auto` joins a running one instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from distlab.distribute.local_workers import local_cluster, tf_config  # noqa: E402

RUN = ["strategy=multi_worker_mirrored", "loop=custom", "dataset=mnist", "trainer.epochs=1",
       "trainer.steps_per_epoch=5", "trainer.export=false", "loop.verbose=2"]
MARK = "time to first step"
EXPIRY_S = 900


def _command(variant: str, run_dir: Path, ray_address: str | None) -> list[list[str]]:
    """The processes of one run (index 0: the chief's, or the launcher's)."""
    base = [sys.executable, str(ROOT / "run.py"), *RUN, f"hydra.run.dir={run_dir}"]
    if variant == "tf_config":
        return [base, base]
    launched = [*base, "strategy.workers=2"]
    if variant == "ray":
        launched += ["strategy.launcher=ray", f"strategy.ray.address={ray_address or 'null'}"]
    return [launched]


def one_run(variant: str, out: Path, index: int, ray_address: str | None) -> dict:
    """Run `variant` once: seconds to the chief's first step, and in all."""
    run_dir = out / f"{variant}-{index}"
    commands = _command(variant, run_dir, ray_address)
    cluster = local_cluster(2) if variant == "tf_config" else []
    started = time.monotonic()
    procs = []
    for i, command in enumerate(commands):
        env = dict(os.environ)
        if cluster:
            env["TF_CONFIG"] = tf_config(cluster, i)
        log = open(f"{run_dir}.p{i}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=ROOT), log))
    first_step = None
    chief_log = run_dir / "run.log"
    while any(p.poll() is None for p, _ in procs):
        if time.monotonic() - started > EXPIRY_S:
            for p, _ in procs:
                p.kill()
            break
        if first_step is None and chief_log.exists() and MARK in chief_log.read_text(
                errors="replace"):
            first_step = time.monotonic() - started
        time.sleep(0.05)
    total = time.monotonic() - started
    if first_step is None and chief_log.exists() and MARK in chief_log.read_text():
        first_step = total  # (the run ended between two looks)
    codes = [p.wait() for p, _ in procs]
    for _, log in procs:
        log.close()
    return {"variant": variant, "first_step_s": first_step, "total_s": total, "codes": codes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="tf_config,local,ray")
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="worker-startup-"))
    out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    rows = []
    for r in range(args.rounds):
        for variant in variants:
            row = one_run(variant, out, r, args.ray_address)
            rows.append(row)
            print(json.dumps({"round": r, **row}), flush=True)
    base = [r["first_step_s"] for r in rows if r["variant"] == variants[0] and r["first_step_s"]]
    print(f"\nmachine: {platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
          f"; out: {out}")
    print(f"{'variant':10} {'median first step (s)':>22} {'- ' + variants[0]:>14} "
          f"{'/ ' + variants[0]:>14}  runs")
    for variant in variants:
        times = [r["first_step_s"] for r in rows if r["variant"] == variant and r["first_step_s"]]
        if not times:
            print(f"{variant:10} {'(no first step)':>22}")
            continue
        median, ref = statistics.median(times), statistics.median(base) if base else None
        diff = f"{median - ref:+.1f}" if ref else "-"
        ratio = f"{median / ref:.2f}" if ref else "-"
        print(f"{variant:10} {median:22.1f} {diff:>14} {ratio:>14}  "
              + ", ".join(f"{t:.1f}" for t in times))
    (out / "worker_startup.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
