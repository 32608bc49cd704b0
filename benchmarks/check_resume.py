"""Real-data acceptance for resume and preemption (issue "Reliability"); prints figures.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python benchmarks/check_resume.py OUT_DIR

1. Exact resume, both loops: run A uninterrupted; run B killed with SIGKILL once
   B/history.csv has 2 epoch rows, then rerun with the same command; compare test_loss.
2. SIGTERM: loop=custom, 4 epochs x 200 steps, SIGTERM 1 s after the first epoch row;
   time to exit, status, then the rerun's epochs_completed.
3. NaN: loop=custom optimizer.learning_rate=1e12 -> exit status and message.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["dataset=mnist", "trainer.epochs=3", "trainer.steps_per_epoch=120",
          "trainer.checkpoint_every=1", "trainer.export=false", "deterministic=true", "seed=11",
          "loop.verbose=0"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "run.py", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rows(run_dir: Path) -> int:
    h = run_dir / "history.csv"
    return max(0, len(h.read_text().splitlines()) - 1) if h.exists() else 0


def wait_rows(proc: subprocess.Popen, run_dir: Path, n: int) -> None:
    while rows(run_dir) < n:
        if proc.poll() is not None:
            raise SystemExit(f"run ended early:\n{proc.communicate()[0][-2000:]}")
        time.sleep(0.05)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def main(out: Path) -> None:
    for loop in ("keras_fit", "custom"):
        a, b = out / f"{loop}_A", out / f"{loop}_B"
        subprocess.run([sys.executable, "run.py", *COMMON, f"loop={loop}",
                        f"hydra.run.dir={a}"], cwd=ROOT, capture_output=True, check=True)
        proc = start([*COMMON, f"loop={loop}", f"hydra.run.dir={b}"])
        wait_rows(proc, b, 2)
        proc.kill()
        proc.wait()
        subprocess.run([sys.executable, "run.py", *COMMON, f"loop={loop}",
                        f"hydra.run.dir={b}"], cwd=ROOT, capture_output=True, check=True)
        ra, rb = results(a), results(b)
        print(f"resume {loop}: A test_loss={ra['test_loss']:.9f} acc={ra['test_accuracy']:.6f} | "
              f"B (SIGKILL at 2 rows, rerun) epochs={rb['epochs_completed']} "
              f"test_loss={rb['test_loss']:.9f} acc={rb['test_accuracy']:.6f} | "
              f"|diff|={abs(ra['test_loss'] - rb['test_loss']):.2e}")

    term = out / "sigterm"
    args = ["loop=custom", "trainer.epochs=4", "trainer.steps_per_epoch=200", "loop.verbose=0",
            f"hydra.run.dir={term}"]
    proc = start(args)
    wait_rows(proc, term, 1)
    time.sleep(1.0)
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    took = time.time() - sent
    status = results(term)["status"]
    rerun = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True)
    print(f"sigterm: exit {proc.returncode} after {took:.1f} s, status {status}; rerun exit "
          f"{rerun.returncode}, epochs_completed {results(term)['epochs_completed']}")

    nan = subprocess.run([sys.executable, "run.py", "loop=custom", "optimizer.learning_rate=1e12",
                          "loop.verbose=0", f"hydra.run.dir={out / 'nan'}"], cwd=ROOT,
                         capture_output=True, text=True)
    text = nan.stdout + nan.stderr
    line = next((ln for ln in text.splitlines() if "non-finite" in ln), "(no message)")
    print(f"nan: exit {nan.returncode}, traceback={'Traceback' in text}: {line}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
