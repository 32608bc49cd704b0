"""SIGTERM/SIGINT from a job's start to its end: during training a flag the loops check at
step boundaries (then checkpoint and stop); in every other stage (set-up, final evaluation,
best-checkpoint test, export, the tracker's close) the stage is cut short at once. Either
way the job ends with `Interrupted`, which names the stage."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from distlab.errors import DistlabError

# the stages of a job, as results.json's `interrupted_stage` names them (finish: writing
# results.json and closing the tracker's run)
SETUP, TRAINING, FINAL_EVALUATION, BEST_TEST, EXPORT, FINISH, EVALUATION = (
    "set-up", "training", "final evaluation", "best-checkpoint test", "export", "finish",
    "evaluation")


class Interrupted(DistlabError):
    """The run was asked to stop (SIGTERM/SIGINT) during `stage`; what it finished is kept."""

    def __init__(self, message: str, signum: int, stage: str = TRAINING) -> None:
        super().__init__(message)
        self.signum, self.stage = signum, stage
        self.results: dict[str, Any] | None = None  # results.json of the cut-short job


class Signalled(BaseException):  # noqa: N818 - a signal, as KeyboardInterrupt is
    """A signal in a stage that is cut short at once (a BaseException, as KeyboardInterrupt:
    library code that catches Exception does not swallow it). `StopRequest.during` turns it
    into `Interrupted`; outside any stage, `StopRequest.interrupted` does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class StopRequest:
    """Set by the signal handler; read by the loops between steps. `stage`: the job's stage
    now; `polled`: whether its code checks the flag itself (training), else a signal ends the
    stage at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stage, self.polled = SETUP, False

    def __bool__(self) -> bool:
        return self.signum is not None

    @contextlib.contextmanager
    def during(self, stage: str, polled: bool = False) -> Iterator[None]:
        """Run `stage`: a signal before it or during it ends it with `Interrupted` (a polled
        stage's code raises that itself, at its next check; one that comes after its last
        check is raised when the stage ends)."""
        outer = (self.stage, self.polled)
        self.stage, self.polled = stage, polled
        try:
            self.check()
            yield
            self.check()
        except Signalled as e:
            raise self.interrupted(e.signum) from None
        finally:
            self.stage, self.polled = outer

    def check(self) -> None:
        """Raise `Interrupted` if a signal came."""
        if self.signum is not None:
            raise self.interrupted(self.signum)

    def interrupted(self, signum: int) -> Interrupted:
        """The `Interrupted` of a signal `signum` in the current stage."""
        return Interrupted(
            f"stopped by signal {signum} during the {self.stage}; what the run finished is "
            f"kept (checkpoints, history.csv). Rerun the same command to complete it "
            f"(nothing trained is trained again)", signum, self.stage)


@contextlib.contextmanager
def stop_on_signals(sigterm: bool = True) -> Iterator[StopRequest]:
    """While active, the first SIGTERM/SIGINT sets the flag (and ends a stage that is not
    polled, see `StopRequest.during`); a second one aborts at once. `sigterm=False` leaves
    SIGTERM to another handler (TensorFlow's PreemptionCheckpointHandler across workers)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are delivered to the main thread only
        return

    def handler(signum, frame):
        if request.signum is not None:
            raise KeyboardInterrupt(f"second signal {signum}: stopping without a checkpoint")
        request.signum = signum
        if not request.polled:
            raise Signalled(signum)

    signals = (signal.SIGTERM, signal.SIGINT) if sigterm else (signal.SIGINT,)
    previous = {s: signal.signal(s, handler) for s in signals}
    previous.setdefault(signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # restored after
    try:
        yield request
    except Signalled as e:  # outside any stage
        raise request.interrupted(e.signum) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
