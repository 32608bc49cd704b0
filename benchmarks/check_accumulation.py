"""Real-data acceptance for gradient accumulation and mixed-precision speed; prints figures.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/check_accumulation.py OUT [PART]

PART: 1 or 2 (default: both).

1. MNIST, the tutorial's model, SGD (lr 0.05), deterministic=true: 200 batches of 32
   accumulated 4 at a time (50 updates) against 50 batches of 128, both loops, on 1 device
   (strategy=default) and on 2 replicas (strategy.cpu_devices=2); |test loss difference|
   and the same 200 batches of 32 without accumulation (which must differ).
2. Steady examples/sec of the tutorial preset under float32, mixed_bfloat16 and
   mixed_float16 (30 steps per epoch, 2 epochs; the second epoch is the steady state).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["loop.verbose=0", "experiment=tutorial_keras_mnist", "optimizer=sgd",
          "optimizer.learning_rate=0.05", "schedule=constant", "deterministic=true",
          "trainer.epochs=1", "trainer.export=false"]


def run(out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "run.py", *args, f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {args}\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads((out / "results.json").read_text())


def main(out: Path, parts: str = "12") -> None:
    if "1" in parts:
        accumulation(out)
    if "2" in parts:
        precision(out)


def accumulation(out: Path) -> None:
    print("1. accumulation: 4 x 32 accumulated vs 1 x 128, 50 updates")
    for loop in ("keras_fit", "custom"):
        for replicas in (1, 2):
            strategy = "strategy=default" if replicas == 1 else "strategy.cpu_devices=2"
            tag = f"{loop}-{replicas}"
            acc = run(out / f"acc-{tag}", *COMMON, f"loop={loop}", strategy,
                      f"dataset.batch_size_per_replica={32 // replicas}",
                      "trainer.grad_accum_steps=4", "trainer.steps_per_epoch=200")
            whole = run(out / f"whole-{tag}", *COMMON, f"loop={loop}", strategy,
                        f"dataset.batch_size_per_replica={128 // replicas}",
                        "trainer.steps_per_epoch=50")
            plain = run(out / f"plain-{tag}", *COMMON, f"loop={loop}", strategy,
                        f"dataset.batch_size_per_replica={32 // replicas}",
                        "trainer.steps_per_epoch=200")
            print(f"  {loop:9s} {replicas} replica(s): test loss accumulated "
                  f"{acc['test_loss']:.9f}, one batch of 128 {whole['test_loss']:.9f}, "
                  f"|diff| {abs(acc['test_loss'] - whole['test_loss']):.2e}; 200 plain "
                  f"batches of 32: {plain['test_loss']:.9f}", flush=True)


def precision(out: Path) -> None:
    print("2. precision: steady examples/sec, tutorial preset, 30 steps x 2 epochs")
    for precision in ("float32", "mixed_bfloat16", "mixed_float16"):
        r = run(out / f"speed-{precision}", "loop.verbose=0", "experiment=tutorial_keras_mnist",
                f"precision={precision}", "trainer.epochs=2", "trainer.steps_per_epoch=30",
                "trainer.export=false")
        print(f"  {precision:15s} {r['train_examples_per_sec']:8.0f} examples/sec "
              f"(test accuracy after 60 steps {r['test_accuracy']:.4f})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else "12")
