"""SIGTERM/SIGINT -> a flag the loops check at step boundaries (then checkpoint and stop)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from distlab.errors import DistlabError


class Interrupted(DistlabError):
    """The run was asked to stop (SIGTERM/SIGINT) and saved a checkpoint."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """Set by the signal handler; read by the loops between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_on_signals(sigterm: bool = True) -> Iterator[StopRequest]:
    """While active, the first SIGTERM/SIGINT only sets the flag; a second one aborts at once.
    `sigterm=False` leaves SIGTERM to another handler (PreemptionCheckpointHandler)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are delivered to the main thread only
        return

    def handler(signum, frame):
        if request.signum is not None:
            raise KeyboardInterrupt(f"second signal {signum}: stopping without a checkpoint")
        request.signum = signum

    signals = (signal.SIGTERM, signal.SIGINT) if sigterm else (signal.SIGINT,)
    previous = {s: signal.signal(s, handler) for s in signals}
    previous.setdefault(signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # restored after
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
