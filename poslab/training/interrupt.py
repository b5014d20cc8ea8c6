"""Ctrl-C during a training: a flag the loop checks between steps, and :func:`request_stop` to set it from anywhere."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


class InterruptFlag:
    """SIGINT -> a flag checked between steps (the step in flight completes, then a checkpoint is saved).

    A second Ctrl-C raises ``KeyboardInterrupt`` at once. Only installed in the main thread;
    :func:`request_stop` sets the flag of the training running in this process from anywhere.
    """

    #: the flag of the training running in this process (``None`` between trainings)
    active: InterruptFlag | None = None

    def __init__(self, notify: Callable[[str], None]) -> None:
        self.requested = False
        self.notify = notify
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.notify("Ctrl-C: finishing this step and saving a checkpoint (press Ctrl-C again to abort at once)")

    def __enter__(self) -> InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        InterruptFlag.active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        InterruptFlag.active = None
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def request_stop() -> bool:
    """Ask the training running in this process to stop as one Ctrl-C does: after its step, with a checkpoint.

    Asking again changes nothing (a second Ctrl-C aborts at once; this never cuts a save short), so a
    stop that arrives twice (a signal from the terminal and one from the parent) still saves. Safe in
    a signal handler.

    Returns:
        Whether a training was running to receive it.
    """
    flag = InterruptFlag.active
    if flag is None:
        return False
    flag.requested = True
    return True


__all__ = ["InterruptFlag", "request_stop"]
