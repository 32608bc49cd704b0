"""SIGTERM/SIGINT from a job's start to its end: during training a flag the loops check at
step boundaries (then checkpoint and stop); in every other stage (set-up, final evaluation,
export, best-checkpoint test, finish: results.json and the tracker's close) the stage is cut
short at once. Either way the job ends with `Interrupted`, which names the stage; a second
signal stops it at once, without a checkpoint. (Python runs a handler between bytecodes: a
long TensorFlow op, a data cache being written, ends first.)"""

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
DONE = "end"  # everything is written: a signal now is only noted


# after these, what was trained is on disk: a rerun completes the run without training
AFTER_TRAINING = (FINAL_EVALUATION, EXPORT, BEST_TEST, FINISH)


class Interrupted(DistlabError):
    """The run was asked to stop (SIGTERM/SIGINT) during `stage`; what it finished is kept."""

    def __init__(self, message: str, signum: int, stage: str = TRAINING) -> None:
        super().__init__(message)
        self.signum, self.stage = signum, stage
        self.results: dict[str, Any] | None = None  # results.json of the cut-short job


class Signalled(BaseException):  # noqa: N818 - a signal, as KeyboardInterrupt is
    """A signal in a stage that is cut short at once, or a second signal (a BaseException, as
    KeyboardInterrupt: library code that catches Exception does not swallow it);
    `StopRequest.as_interrupted` makes it an `Interrupted`."""

    def __init__(self, signum: int, second: bool = False) -> None:
        super().__init__(signum)
        self.signum, self.second = signum, second


class StopRequest:
    """Set by the signal handler; read by the loops between steps. A job runs its stages one
    after another (`begin`); `polled`: whether the current stage's code checks the flag
    itself (training: at step boundaries), else a signal ends the stage at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stage, self.polled = SETUP, False
        self.signalled_in: str | None = None  # the stage the first signal came in

    def __bool__(self) -> bool:
        return self.signum is not None

    def begin(self, stage: str, polled: bool = False) -> None:
        """The job's next stage begins (a signal that came before it ends the job now)."""
        self.stage, self.polled = stage, polled
        self.check()

    def check(self) -> None:
        """Raise `Interrupted` if a signal came."""
        if self.signum is not None:
            raise self.interrupted(self.signum)

    def as_interrupted(self, error: Interrupted | Signalled) -> Interrupted:
        """`error` as the `Interrupted` that ends the job."""
        if isinstance(error, Interrupted):
            return error
        return self.interrupted(error.signum, second=error.second)

    def interrupted(self, signum: int, second: bool = False) -> Interrupted:
        """The `Interrupted` of a signal `signum` in the stage it came in (a signal whose
        `Signalled` Python swallowed, raised inside a weakref callback or `__del__`, is
        noted at the next stage's begin: still the stage it came in)."""
        stage = self.stage if second else self.signalled_in or self.stage
        if second:
            what = (f"a second signal ({signum}) during the {stage} stopped the run at "
                    "once, without a checkpoint; the latest checkpoint and history.csv are "
                    "kept. Rerun the same command to resume from them")
        elif stage == TRAINING:  # (mid-epoch the loop stops with a line of its own)
            what = (f"stopped by signal {signum} after the training's last step; training is "
                    "done and kept (checkpoints, history.csv). Rerun the same command to "
                    "complete the run without training again")
        elif stage in AFTER_TRAINING:
            what = (f"stopped by signal {signum} during the {stage}; training is done "
                    "and kept (checkpoints, history.csv). Rerun the same command to complete "
                    "the run without training again")
        else:
            what = (f"stopped by signal {signum} during the {stage}, before anything "
                    "was trained or measured in this attempt. Rerun the same command to run "
                    "it (from the run's latest checkpoint, if any)")
        return Interrupted(what, signum, stage)


@contextlib.contextmanager
def stop_on_signals(sigterm: bool = True) -> Iterator[StopRequest]:
    """While active, the first SIGTERM/SIGINT sets the flag (and ends a stage that is not
    polled, see `StopRequest.begin`); a second one stops at once. `sigterm=False` leaves
    SIGTERM to another handler (TensorFlow's PreemptionCheckpointHandler across workers)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are delivered to the main thread only
        return

    def handler(signum, frame):
        if request.signum is not None:
            raise Signalled(signum, second=True)
        request.signum, request.signalled_in = signum, request.stage
        if not request.polled:
            raise Signalled(signum)

    # a signal the process was started ignoring (nohup, `cmd &` in a script) stays ignored
    signals = [s for s in ((signal.SIGTERM, signal.SIGINT) if sigterm else (signal.SIGINT,))
               if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, handler) for s in signals}
    previous.setdefault(signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # restored after
    try:
        yield request
    except Signalled as e:
        raise request.as_interrupted(e) from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
