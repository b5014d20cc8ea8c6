"""One way to run many independent trainings: :func:`train_many`.

The lab's workload is many small trainings (schemes x seeds x sizes). Every experiment that trains
more than one model, and ``poslab sweep``, hands its trainings here as :class:`Task` values; the
executor decides where they run. The default is a local pool of spawned processes, one thread each
(what a laptop needs, nothing to install or start).

A task's ``fn`` is a module-level function (so a spawned process or a remote worker can import it by
name) and its ``args`` are plain picklable values; it returns a picklable result.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One training to run somewhere.

    Attributes:
        label: a short name for progress lines (``"rope-s1337"``).
        fn: a module-level function; ``fn(*args)`` trains and returns a picklable result.
        args: its arguments (plain values: dicts, strings, numbers).
        cpus: CPU threads the training uses.
        gpus: GPUs it needs (1 when its device is CUDA).
    """

    label: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default_factory=tuple)
    cpus: int = 1
    gpus: int = 0


def default_workers() -> int:
    """Trainings run side by side by default: one per core, at most two.

    The lab's small GPTs use a second thread poorly, so two one-thread trainings at a time finish a
    set of runs sooner than one two-thread training after another.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def check_workers(workers: Any) -> int:
    """``workers`` as a positive int, or a ``ValueError`` naming the value."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    return workers


def train_many(tasks: Sequence[Task], workers: int | None = None,
               on_done: Callable[[Task, Any], None] | None = None) -> list[Any]:
    """Run every task; the results come back in the order of ``tasks``.

    Args:
        tasks: the trainings.
        workers: trainings at a time (``None``: :func:`default_workers`). With one worker, or one
            task, the tasks run in this process one after another.
        on_done: called as ``on_done(task, result)`` when each task finishes (progress lines).

    Returns:
        ``[task.fn(*task.args) for task in tasks]``, computed wherever the executor put them.

    Raises:
        ValueError: ``workers`` is not a positive integer.
    """
    workers = default_workers() if workers is None else check_workers(workers)
    results: list[Any] = [None] * len(tasks)
    if workers == 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            results[i] = task.fn(*task.args)
            if on_done is not None:
                on_done(task, results[i])
        return results
    # spawn, not fork: a forked child of a process that already ran OpenMP threads can hang
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=context) as pool:
        futures = {pool.submit(task.fn, *task.args): i for i, task in enumerate(tasks)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if on_done is not None:
                on_done(tasks[i], results[i])
    return results
