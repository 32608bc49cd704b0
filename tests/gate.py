"""`python tests/gate.py ARGS` is `python run.py ARGS` with a test-only gate, so a test can
signal or kill the run at a chosen point whatever the speed of the machine.

Set in the environment:
- DISTLAB_TEST_GATE: where to stop and wait: `step:E:S` (after S steps of epoch E, 0-based,
  before the step's end is handled: its stop check, its callbacks) or `stage:NAME` (once
  the job's stage NAME has begun: `final evaluation`, `export`, ...; see
  distlab.distribute.preemption).
- DISTLAB_TEST_GATE_DIR: the gate writes `reached` (and `reached.<pid>`) there, then waits
  until the test has written `released` (after sending its signal). A signal that cuts the
  stage short ends the wait as it ends the stage; at a step, the job's stop request (a
  signal it was sent) ends it too.
- DISTLAB_TEST_STEP_SLEEP (optional): seconds every step's end sleeps: a slow machine.
- DISTLAB_TEST_GATE_NTH (optional): the gate holds only the Nth time this process reaches it
  (2: job 1 of an in-process sweep, job 0 passing through); unset, every time.

A sweep's job processes (hydra/launcher=joblib, submitit_local) are gated too when the
sweep is given `imports=[gate]` and PYTHONPATH holds this directory: each job process
imports this module, which then installs the gate.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
EXPIRY_S = 300  # a gate never released (its test died) ends the run


def wait_at_gate(folder: Path, stopped=lambda: False) -> None:
    """Say the gate is reached, then wait for the test's release (or, at a step, until the
    job has been asked to stop: `stopped()`)."""
    (folder / f"reached.{os.getpid()}").write_text("")
    (folder / "reached").write_text(str(os.getpid()))
    expiry = time.monotonic() + EXPIRY_S
    while not (folder / "released").exists() and not stopped():
        if time.monotonic() > expiry:
            raise RuntimeError("test gate: never released")
        time.sleep(0.01)


def install() -> None:
    """Patch the Controller's step end or the stop request's stages as the environment says."""
    from distlab.distribute.preemption import StopRequest
    from distlab.training.controller import Controller

    gate, folder = os.environ.get("DISTLAB_TEST_GATE"), os.environ.get("DISTLAB_TEST_GATE_DIR")
    pause = float(os.environ.get("DISTLAB_TEST_STEP_SLEEP", "0"))
    nth = int(os.environ.get("DISTLAB_TEST_GATE_NTH", "0"))  # 0: every time
    reached = [0]  # times this process reached the gate

    def held() -> bool:
        reached[0] += 1
        return nth in (0, reached[0])
    kind, _, where = (gate or "").partition(":")
    step_end, begin = Controller.step_end, StopRequest.begin

    def gated_step_end(self, epoch: int, steps_done: int, loss: float) -> None:
        if pause:
            time.sleep(pause)
        if kind == "step" and f"{epoch}:{steps_done}" == where and held():
            wait_at_gate(Path(folder), lambda: bool(self.stop))
        step_end(self, epoch, steps_done, loss)

    def gated_begin(self, stage: str, polled: bool = False) -> None:
        begin(self, stage, polled)
        if kind == "stage" and stage == where and held():
            wait_at_gate(Path(folder))

    Controller.step_end = gated_step_end
    StopRequest.begin = gated_begin


if __name__ == "gate" and os.environ.get("DISTLAB_TEST_GATE"):  # imports=[gate] in a job
    install()

if __name__ == "__main__":
    install()
    from distlab.cli import main

    main(config_path=str(ROOT / "conf"))
