r"""What pruning saves in an Optuna search, and what it costs the best configuration.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/pruning.py OUT [TRIALS] [STEPS]

Real MNIST, `model=mlp`, `hparams_search=optuna` over its default space (learning rate
log-uniform 1e-4..1e-2 x batch size per replica 32..256), TRIALS (12) trials of 3 epochs of
STEPS (200) steps, seed 0, whole `python run.py` processes (the basic launcher: trials one
after the other in the search's process), run twice into OUT/: with `pruner=median`
(`pruner_args={n_startup_trials: 3}`) and with `pruner=none`. Then the unpruned search's
best configuration is trained again with seeds 1, 2 and 3 (a `-m` sweep) for the seed-to-seed
spread of its validation accuracy. Prints the epochs each search trained, each best trial's
validation accuracy, and the spread; the acceptance is "at least 40% fewer epochs, best
within the spread".
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["dataset=mnist", "model=mlp", "trainer.epochs=3", "trainer.export=false",
          "loop.verbose=0", "seed=0"]


def run(*args: str) -> float:
    """`python run.py ARGS`; its wall time in seconds."""
    start = time.time()
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"run.py {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return time.time() - start


def jobs(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]


def search(out: Path, name: str, trials: int, steps: int, *pruner: str) -> dict:
    sweep = out / name
    seconds = run(*COMMON, f"trainer.steps_per_epoch={steps}", "hparams_search=optuna",
                  f"hydra.sweeper.n_trials={trials}", *pruner, f"hydra.sweep.dir={sweep}")
    results = jobs(sweep)
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    return {"name": name, "seconds": seconds, "trials": len(results),
            "pruned": sum(r["status"] == "pruned" for r in results),
            "epochs": sum(int(r["epochs_completed"]) for r in results),
            "best_value": float(best.best_value),
            "best_params": dict(best.best_params)}


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    pruned = search(out, "median", trials, steps, "hydra.sweeper.pruner=median",
                    "hydra.sweeper.pruner_args={n_startup_trials: 3}")
    unpruned = search(out, "none", trials, steps, "hydra.sweeper.pruner=none")
    params = [f"{k}={v}" for k, v in unpruned["best_params"].items()]
    run("-m", *[c for c in COMMON if not c.startswith("seed=")], f"trainer.steps_per_epoch={steps}",
        *params, "seed=1,2,3", f"hydra.sweep.dir={out / 'seeds'}")
    seeds = [r["val_accuracy"] for r in jobs(out / "seeds")]
    for s in (pruned, unpruned):
        print(f"pruner={s['name']}: {s['trials']} trials, {s['pruned']} pruned, "
              f"{s['epochs']} epochs trained, best val_accuracy {s['best_value']:.4f} "
              f"({s['best_params']}), {s['seconds']:.0f} s")
    saved = 1 - pruned["epochs"] / unpruned["epochs"]
    low, high = min(seeds), max(seeds)
    diff = unpruned["best_value"] - pruned["best_value"]
    print(f"epochs saved by pruning: {saved:.0%}")
    print(f"unpruned best config, seeds 1-3: val_accuracy {', '.join(f'{v:.4f}' for v in seeds)}"
          f" (mean {statistics.mean(seeds):.4f}, sd {statistics.stdev(seeds):.4f}, "
          f"range {high - low:.4f})")
    print(f"best(none) - best(median) = {diff:.4f}; within the seed range: "
          f"{abs(diff) <= high - low}")


if __name__ == "__main__":
    main()
