"""Real-data acceptance for replica counts, short batches and fit blocks; prints figures.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/check_replicas.py OUT_DIR

1. Workload 2 on 2 devices: experiment=tutorial_custom_fashion strategy.cpu_devices=2
   trainer.epochs=1, both loops (export check included).
2. One checkpoint (from 1) evaluated under strategy=default, cpu_devices=2 and 3.
3. A full Fashion-MNIST epoch with 3 replicas x 64 (60,000 = 312 x 192 + 96) against
   1 replica x 192, both loops, the two-conv model, deterministic=true, with SGD and with
   Adam (whose update g / (sqrt(v) + eps) turns float noise in near-zero gradients into
   lr-sized steps, so the two replica counts drift apart by more than rounding).
4. Batch 33 per replica on 2 replicas, custom loop, one full MNIST epoch.
5. fit with steps_per_execution=7, 300 steps per epoch, 3 epochs: checkpoint names; then
   kill -9 after epoch 1, rerun, and compare test loss with the uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["loop.verbose=0"]


def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "run.py", *QUIET, *args], cwd=ROOT,
                         capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"failed: {args}\n{(out.stdout + out.stderr)[-3000:]}")
    return out


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def show(label: str, r: dict) -> None:
    print(f"{label}: status={r['status']} replicas={r['num_replicas']} "
          f"test_loss={r['test_loss']:.9f} test_accuracy={r['test_accuracy']:.6f} "
          f"export_diff={r.get('export_max_abs_diff')}", flush=True)


def main(out: Path) -> None:
    for loop in ("custom", "keras_fit"):
        d = out / f"seed2_{loop}"
        run(["experiment=tutorial_custom_fashion", "strategy.cpu_devices=2", "trainer.epochs=1",
             f"loop={loop}", f"hydra.run.dir={d}"])
        show(f"1. tutorial_custom_fashion cpu_devices=2 loop={loop}", results(d))

    trained = out / "seed2_custom"
    for replicas in (1, 2, 3):
        d = out / f"eval_{replicas}"
        strategy = ["strategy=default"] if replicas == 1 else [f"strategy.cpu_devices={replicas}"]
        run(["experiment=tutorial_custom_fashion", "mode=evaluate", f"ckpt_path={trained}",
             *strategy, f"hydra.run.dir={d}"])
        show(f"2. evaluate on {replicas} replica(s)", results(d))

    common = ["dataset=fashion_mnist", "model=fashion_cnn", "trainer.epochs=1",
              "deterministic=true", "seed=7", "trainer.export=false", "trainer.validate_every=0"]
    for optimizer in ("sgd", "adam"):
        for loop in ("custom", "keras_fit"):
            figures = {}
            for replicas, batch in ((1, 192), (3, 64)):
                d = out / f"empty_{optimizer}_{loop}_{replicas}"
                run([*common, f"optimizer={optimizer}", f"loop={loop}",
                     f"strategy.cpu_devices={replicas}",
                     f"dataset.batch_size_per_replica={batch}", f"hydra.run.dir={d}"])
                figures[replicas] = results(d)
                show(f"3. {optimizer} {loop} {replicas} x {batch}", figures[replicas])
            print(f"3. {optimizer} {loop}: |test_loss(3x64) - test_loss(1x192)| = "
                  f"{abs(figures[3]['test_loss'] - figures[1]['test_loss']):.3g}", flush=True)

    d = out / "batch33"
    run(["loop=custom", "dataset=mnist", "dataset.batch_size_per_replica=33",
         "strategy.cpu_devices=2", "trainer.epochs=1", "trainer.export=false",
         f"hydra.run.dir={d}"])
    show("4. custom, 2 x 33", results(d))

    blocks = ["strategy=default", "loop.steps_per_execution=7", "trainer.steps_per_epoch=300",
              "trainer.epochs=3", "deterministic=true", "seed=3", "trainer.export=false"]
    a, b = out / "blocks_A", out / "blocks_B"
    run([*blocks, f"hydra.run.dir={a}"])
    names = sorted(p.name for p in (a / "checkpoints").glob("ckpt-*.index"))
    print(f"5. checkpoints: {names}", flush=True)
    proc = subprocess.Popen([sys.executable, "run.py", *QUIET, *blocks, f"hydra.run.dir={b}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (b / "history.csv").exists():
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    run([*blocks, f"hydra.run.dir={b}"])
    ra, rb = results(a), results(b)
    print(f"5. blocks: uninterrupted {ra['test_loss']:.9f}, killed after epoch 1 and rerun "
          f"{rb['test_loss']:.9f}, |diff| {abs(ra['test_loss'] - rb['test_loss']):.3g}",
          flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
