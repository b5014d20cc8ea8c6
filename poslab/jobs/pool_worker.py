"""The worker side of the local process pool (:class:`poslab.jobs.runner.LocalExecutor`): stopping cleanly.

A pool worker runs one training after another in its main thread. It stops the way a ``poslab``
command does: SIGTERM (from its parent stopping, or from the kernel when its parent dies) makes the
running training finish its step, save a checkpoint and raise ``KeyboardInterrupt``
(:func:`poslab.training.interrupt.request_stop`), and the worker starts no other task. It never outlives
its parent: a watcher thread notices the parent's death, SIGKILL included, and ends the process once
its training has saved.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: how often a pool worker looks whether its parent is still alive (seconds)
PARENT_POLL_S = 0.2
#: how long a pool worker whose parent died lets its training finish its step and save before it exits
ORPHAN_GRACE_S = 30.0


def _arm_death_signal() -> None:
    """Linux: the kernel sends this process SIGTERM when its parent dies (``PR_SET_PDEATHSIG``); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def die_with_parent() -> None:
    """Tie this process to its parent: SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``), SIGTERM as Ctrl-C.

    When the process that started this one dies (SIGKILL included) the kernel sends it SIGTERM,
    which raises ``KeyboardInterrupt`` here. Elsewhere than Linux a no-op for the death signal. The
    local pool's workers use :func:`start_pool_worker`, which also stops their training cleanly.
    """
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    _arm_death_signal()
    if os.getppid() == 1:  # the parent died before the prctl: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class _PoolWorker:
    """This process as a worker of the local pool: asked to stop or not, running a task or idle."""

    stopping = threading.Event()
    busy = threading.Event()


def start_pool_worker(parent: int) -> None:
    """Initializer of a local pool worker: SIGTERM stops it cleanly, and it never outlives ``parent``.

    SIGTERM (from the parent stopping, or from the kernel when the parent dies) stops the running
    training after its step with a checkpoint (:func:`poslab.training.interrupt.request_stop`; asked
    twice, still one stop), interrupts a task that is not in a training loop, and refuses every
    later task. A watcher thread notices the parent's death however it happened (SIGKILL too, and
    where ``PR_SET_PDEATHSIG`` does not exist), stops the task the same way and ends the process
    once the task has returned (at most :data:`ORPHAN_GRACE_S` later).
    """
    signal.signal(signal.SIGTERM, _stop_pool_worker)
    _arm_death_signal()
    threading.Thread(target=_watch_parent, args=(parent,), name="poslab-parent-watch", daemon=True).start()


def _stop_pool_worker(signum: int, frame: Any) -> None:
    """SIGTERM in a pool worker: the training saves and stops; other work stops at once; nothing new starts."""
    from poslab.training.interrupt import request_stop

    if _PoolWorker.stopping.is_set():
        return
    _PoolWorker.stopping.set()
    if _PoolWorker.busy.is_set() and not request_stop():
        raise KeyboardInterrupt


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        threading.Event().wait(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # an orphan: stop as the parent would have asked
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while _PoolWorker.busy.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(128 + signal.SIGTERM)


def call_in_pool_worker(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run one task in a pool worker, unless the worker was asked to stop."""
    if _PoolWorker.stopping.is_set():
        raise KeyboardInterrupt
    _PoolWorker.busy.set()
    try:
        return fn(*args)
    finally:
        _PoolWorker.busy.clear()


def stop_pool(pool: concurrent.futures.Executor) -> None:
    """Ask every worker process of ``pool`` to stop (SIGTERM: :func:`_stop_pool_worker`), then wait for them."""
    processes = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        with contextlib.suppress(ProcessLookupError, ValueError, AttributeError):
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
    pool.shutdown(wait=True, cancel_futures=True)


__all__ = [
    "ORPHAN_GRACE_S",
    "PARENT_POLL_S",
    "call_in_pool_worker",
    "die_with_parent",
    "start_pool_worker",
    "stop_pool",
]
