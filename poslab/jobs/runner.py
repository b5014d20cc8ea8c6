"""One way to run many independent trainings: :func:`train_many`, on a local pool or on Ray.

The lab's workload is many small trainings (schemes x seeds x sizes). Every experiment that trains
more than one model, and ``poslab sweep``, hands its trainings here as :class:`Task` values; the
*current executor* decides where they run:

* :class:`LocalExecutor` (the default): a pool of spawned processes on this machine, one thread
  each (nothing to install or start). A task marked ``launches_process`` (its ``fn`` starts the
  training as a child process and waits, as the sweep's do) runs in a thread instead.
* :class:`RayExecutor`: each task is a Ray task (``ray.remote``) that requests ``task.cpus`` CPUs
  and ``task.gpus`` GPUs; Ray places it on any node of the cluster and runs it again when its worker
  dies (``max_retries``) or when it raises :class:`TrainingLost`. Ray is imported only here, only
  when a user asks for it (``pip install 'poslab[ray]'``).

The command line chooses the executor once (``--cluster ray``, ``--ray-address``, ``RAY_ADDRESS``)
with :func:`use_executor`; experiments call :func:`train_many` and need no argument for it.

A task's ``fn`` is a module-level function (so a spawned process or a remote worker can import it by
name) and its ``args`` are plain picklable values; it returns a picklable result. A task that writes
a run folder writes it where the caller can read it: on a cluster, run folders must live on storage
every node sees (NFS, a shared mount); see docs/scaling.md.

:func:`parse_shard` and :func:`select_shard` cut a list of work items into N disjoint slices for a
batch scheduler (``--shard i/N``). Inside :func:`use_shard` (``poslab experiment --shard``, which
``poslab lab --shard`` runs) the lab's training helpers train only their shard's slice of each list
of trainings and stop the step with :class:`ShardFinished` while another shard's are unfinished.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from poslab.checks import positive_int
from poslab.jobs.pool_worker import call_in_pool_worker, die_with_parent, start_pool_worker, stop_pool
from poslab.jobs.ray_connect import connect_ray, ray_connect_timeout

#: ``pip install`` extra that brings Ray
RAY_EXTRA = "poslab[ray]"
#: how many times Ray runs a task again after its worker died or it raised :class:`TrainingLost`
RAY_RETRIES = 3
_T = TypeVar("_T")


@dataclass(frozen=True)
class Task:
    """One training to run somewhere.

    Attributes:
        label: a short name for progress lines (``"rope-s1337"``).
        fn: a module-level function; ``fn(*args)`` trains and returns a picklable result.
        args: its arguments (plain values: dicts, strings, numbers).
        cpus: CPU threads the training uses.
        gpus: GPUs it needs (1 when its device is CUDA).
        launches_process: ``fn`` starts the training as a child process and waits for it (a local
            thread is enough to run it; the child is the training).
    """

    label: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default_factory=tuple)
    cpus: int = 1
    gpus: int = 0
    launches_process: bool = False


class TrainingLost(RuntimeError):
    """Raised by a task's ``fn`` when its training died from outside (a killed process, a lost node).

    Ray runs the task again (up to :data:`RAY_RETRIES` times); a resumable ``fn`` continues from the
    training's last checkpoint. The local pool does not retry: the error reaches the caller.
    """


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
    return positive_int("workers", workers)


# ------------------------------------------------------------------------------------------ local
def _labelled(task: Task, err: BaseException) -> BaseException:
    """A task's ``TrainingDiverged`` (:mod:`poslab.training.loop`) with the task's name in front; others as they are."""
    from poslab.training.loop import TrainingDiverged

    if isinstance(err, TrainingDiverged) and not str(err).startswith(f"run {task.label}: "):
        return TrainingDiverged(f"run {task.label}: {err}")
    return err


class LocalExecutor:
    """Trainings on this machine: a pool of ``workers`` spawned processes (threads for ``launches_process`` tasks).

    ``KeyboardInterrupt`` in the caller (Ctrl-C, or SIGTERM, which ``poslab`` turns into it) stops
    every running training after its step with a checkpoint, starts no other, waits for the pool's
    processes to end and raises again.
    """

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = None if workers is None else check_workers(workers)

    def run(self, tasks: Sequence[Task], workers: int | None, on_done: Callable[[Task, Any], None] | None) -> list[Any]:
        workers = workers if workers is not None else (self.workers or default_workers())
        results: list[Any] = [None] * len(tasks)
        if workers == 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                try:
                    results[i] = task.fn(*task.args)
                except Exception as err:
                    labelled = _labelled(task, err)
                    if labelled is err:
                        raise
                    raise labelled from None
                if on_done is not None:
                    on_done(task, results[i])
            return results
        size = min(workers, len(tasks))
        if all(task.launches_process for task in tasks):
            pool: concurrent.futures.Executor = concurrent.futures.ThreadPoolExecutor(max_workers=size)
            futures = {pool.submit(task.fn, *task.args): i for i, task in enumerate(tasks)}
        else:
            # spawn, not fork: a forked child of a process that already ran OpenMP threads can hang
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_pool_worker,
                initargs=(os.getpid(),),
            )
            futures = {pool.submit(call_in_pool_worker, task.fn, task.args): i for i, task in enumerate(tasks)}
        with pool:
            try:
                for future in concurrent.futures.as_completed(futures):
                    i = futures[future]
                    try:
                        results[i] = future.result()
                    except Exception as err:
                        labelled = _labelled(tasks[i], err)
                        if labelled is err:
                            raise
                        raise labelled from None
                    if on_done is not None:
                        on_done(tasks[i], results[i])
            except BaseException as err:
                if isinstance(err, KeyboardInterrupt):  # trainings launched by threads of this process: SIGINT once
                    children.interrupt()
                # pool processes get SIGTERM, which stops each training once (a checkpoint) however many stops
                # reach it (a Ctrl-C at the terminal reaches them too); a failed task stops the others the same way
                stop_pool(pool)
                raise
        return results


class _Children:
    """The training processes that ``launches_process`` tasks of this process started (see :func:`launch`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def interrupt(self) -> None:
        """Stop starting trainings; SIGINT (once) to each running one: it saves a checkpoint and exits 130."""
        self.stopping.set()
        with self.lock:
            processes = list(self.running)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)


#: the trainings launched from this process (a local sweep's threads share it; a Ray worker has its own)
children = _Children()


def launch(cmd: list[str], **popen: Any) -> int:
    """Run one training as a child process in its own session and wait; returns its exit status.

    Ctrl-C reaches it once, from :meth:`_Children.interrupt` (the local pool on Ctrl-C) or from a
    ``KeyboardInterrupt`` in this thread (``ray.cancel`` of the task), never twice from the terminal.
    """
    process = subprocess.Popen(cmd, start_new_session=True, **popen)
    with children.lock:
        children.running.add(process)
    try:
        try:
            return process.wait()
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)
            process.wait()
            raise
    finally:
        with children.lock:
            children.running.discard(process)


# ------------------------------------------------------------------------------------------ Ray
def import_ray() -> Any:
    """The ``ray`` module, or a one-line ``ValueError`` naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"--cluster ray needs Ray, which is not installed: pip install '{RAY_EXTRA}'") from None
    return ray


def _ray_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, str]:
    """Inside a Ray worker: ``(fn(*args), the node's host name)``."""
    return fn(*args), socket.gethostname()


class RayExecutor:
    """Trainings as Ray tasks on an existing cluster (``address``) or on a local Ray started for the call.

    Each task requests ``task.cpus`` CPUs and ``task.gpus`` GPUs (``ray.remote`` resources), so Ray
    runs as many at a time as the cluster has room for (``workers`` is not used). A task whose worker
    dies, or that raises :class:`TrainingLost`, is run again by Ray up to ``retries`` times.

    Args:
        address: a cluster's address (``ray://host:10001``, ``host:6379``, ``"auto"``); ``None``:
            ``RAY_ADDRESS`` if set, else a local Ray with ``num_cpus`` CPUs, started and stopped here.
            A Ray this process already initialised is used as it is (and left running).
        num_cpus: CPUs of the local Ray (``None``: every core).
        retries: ``max_retries`` of every task.
        connect_timeout: seconds to wait for the cluster of ``address`` (``None``: :func:`ray_connect_timeout`).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        retries: int = RAY_RETRIES,
        connect_timeout: float | None = None,
    ) -> None:
        self.ray = import_ray()
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.num_cpus = num_cpus
        self.retries = retries
        self.connect_timeout = ray_connect_timeout() if connect_timeout is None else connect_timeout
        self.hosts: list[str] = []  # the node of each finished task, in completion order

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        ray = self.ray
        if ray.is_initialized():
            yield
            return
        if self.address:
            connect_ray(ray, self.address, self.connect_timeout)
        else:
            ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()

    def run(self, tasks: Sequence[Task], workers: int | None, on_done: Callable[[Task, Any], None] | None) -> list[Any]:
        ray = self.ray
        results: list[Any] = [None] * len(tasks)
        if not tasks:
            return results
        with self._session():
            remote = ray.remote(_ray_call)
            refs = {}
            for i, task in enumerate(tasks):
                ref = remote.options(
                    num_cpus=task.cpus,
                    num_gpus=task.gpus,
                    max_retries=self.retries,
                    retry_exceptions=[TrainingLost],
                    name=task.label,
                ).remote(task.fn, task.args)
                refs[ref] = i
            pending = list(refs)
            try:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1)
                    i = refs[ready[0]]
                    try:
                        results[i], host = ray.get(ready[0])
                    except ray.exceptions.RayTaskError as err:
                        raise _labelled(tasks[i], err.as_instanceof_cause()) from None  # the task's own exception
                    self.hosts.append(host)
                    if on_done is not None:
                        on_done(tasks[i], results[i])
            except KeyboardInterrupt:
                for ref in pending:
                    ray.cancel(ref)  # KeyboardInterrupt inside each running task: it saves and stops
                with contextlib.suppress(Exception):
                    ray.wait(pending, num_returns=len(pending), timeout=60)
                raise
        return results


# ------------------------------------------------------------------------------------------ the current one
_current: LocalExecutor | RayExecutor | None = None


def current_executor() -> LocalExecutor | RayExecutor:
    """The executor :func:`train_many` uses: the one :func:`use_executor` installed, else a :class:`LocalExecutor`."""
    return _current if _current is not None else LocalExecutor()


@contextlib.contextmanager
def use_executor(executor: LocalExecutor | RayExecutor | None) -> Iterator[None]:
    """Run every :func:`train_many` inside the block on ``executor`` (``None``: the default local pool)."""
    global _current
    previous = _current
    _current = executor
    try:
        yield
    finally:
        _current = previous


CLUSTERS = ("local", "ray")
#: the environment variable through which a command's child steps (``poslab lab`` -> ``poslab experiment``)
#: learn the cluster; Ray's own ``RAY_ADDRESS`` names the cluster to join
CLUSTER_ENV = "POSLAB_CLUSTER"


def executor_for(cluster: str | None, ray_address: str | None = None) -> LocalExecutor | RayExecutor | None:
    """The executor of ``--cluster`` / ``--ray-address`` (``None``: the default local pool).

    Without ``--cluster``, :data:`CLUSTER_ENV` in the environment decides (set by ``poslab lab --cluster``
    for its steps); ``--ray-address`` alone means Ray. A Ray executor joins ``--ray-address``, else
    ``RAY_ADDRESS``, else starts a local Ray.

    Raises:
        ValueError: an unknown cluster, an address with ``--cluster local``, or Ray not installed.
    """
    if cluster is None:
        cluster = os.environ.get(CLUSTER_ENV) or None
    if cluster is not None and cluster not in CLUSTERS:
        raise ValueError(f"--cluster must be one of {', '.join(CLUSTERS)}, got {cluster!r}")
    if ray_address is not None and not ray_address.strip():
        raise ValueError(
            f"--ray-address must name a Ray cluster (host:port, ray://host:port or auto), got {ray_address!r}"
        )
    if cluster == "local":
        if ray_address:
            raise ValueError(f"--ray-address {ray_address!r} needs --cluster ray (or no --cluster), not local")
        return None
    if cluster == "ray" or ray_address:
        return RayExecutor(address=ray_address)
    return None


@contextlib.contextmanager
def for_child_steps(executor: LocalExecutor | RayExecutor | None) -> Iterator[None]:
    """Pass ``executor`` to the ``poslab`` child processes started inside the block (``poslab lab``'s steps).

    For Ray, one Ray serves every step: the cluster of ``--ray-address``/``RAY_ADDRESS``, or a local
    Ray started here for the block; its address goes to the steps in ``RAY_ADDRESS``, and
    :data:`CLUSTER_ENV` tells them to use it (:func:`executor_for`).
    """
    if not isinstance(executor, RayExecutor):
        yield
        return
    saved = {key: os.environ.get(key) for key in (CLUSTER_ENV, "RAY_ADDRESS")}
    with executor._session():
        os.environ[CLUSTER_ENV] = "ray"
        os.environ["RAY_ADDRESS"] = executor.address or executor.ray.get_runtime_context().gcs_address
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def gpus_for(config: dict[str, Any]) -> int:
    """GPUs a training of ``config`` (a training config mapping) requests from Ray: 1 for ``device: cuda``, else 0.

    ``auto`` requests none: it trains on a GPU only where the node it lands on has one free to use.
    """
    return 1 if config.get("device") == "cuda" else 0


def train_many(
    tasks: Sequence[Task],
    workers: int | None = None,
    on_done: Callable[[Task, Any], None] | None = None,
    *,
    sharded: bool = False,
) -> list[Any]:
    """Run every task on the current executor; the results come back in the order of ``tasks``.

    Args:
        tasks: the trainings.
        workers: trainings at a time on the local pool (``None``: :func:`default_workers`). With one
            worker, or one task, the tasks run in this process one after another. Ray ignores it
            (each task's resources decide).
        on_done: called as ``on_done(task, result)`` when each task finishes (progress lines).
        sharded: the caller already kept only its shard's slice of the trainings (:func:`current_shard`);
            without it, a call inside a sharded step trains nothing and stops the step
            (:class:`ShardFinished`): trainings that keep no run folder to reuse are left to the
            collecting call.

    Returns:
        ``[task.fn(*task.args) for task in tasks]``, computed wherever the executor put them.

    Raises:
        ValueError: ``workers`` is not a positive integer.
        ShardFinished: inside a sharded step, without ``sharded``.
    """
    workers = None if workers is None else check_workers(workers)
    if not sharded and current_shard() is not None and tasks:
        end_of_stage(
            f"{len(tasks)} trainings that keep no run folder to reuse (left to the collecting call)",
            trained=0,
            in_shard=0,
            total=len(tasks),
            left=len(tasks),
        )
    return current_executor().run(tasks, workers, on_done)


# ------------------------------------------------------------------------------------------ shards
def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` -> ``(2, 8)``: the 2nd of 8 slices (``i`` counts from 1 to ``N``).

    Raises:
        ValueError: not ``i/N`` with integers ``1 <= i <= N``.
    """
    parts = str(text).split("/")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        index, count = int(parts[0]), int(parts[1])
        if 1 <= index <= count:
            return index, count
    raise ValueError(f"--shard must be i/N with 1 <= i <= N (e.g. 1/4 ... 4/4), got {text!r}")


def select_shard(items: Sequence[_T], shard: tuple[int, int] | None) -> list[_T]:
    """The items of shard ``(i, N)``: every N-th item from the i-th (``None``: all of them).

    The N shards are disjoint and together hold every item once; their sizes differ by at most one.
    """
    if shard is None:
        return list(items)
    index, count = shard
    return list(items[index - 1 :: count])


# ------------------------------------------------------------------------------------------ sharded steps
class ShardFinished(BaseException):
    """A sharded step trained its slice and other shards' trainings are not finished: it stops before its results.

    Raised by the lab's training helpers (:func:`end_of_stage`) inside :func:`use_shard`; ``poslab
    experiment --shard`` catches it and records :attr:`stages`. A ``BaseException`` (as
    ``KeyboardInterrupt``): an experiment's ``except Exception`` does not swallow it.

    Attributes:
        shard: ``(i, N)``.
        stages: one record per training stage the step reached: ``what``, ``trained`` (by this call),
            ``in_shard``, ``total``, ``left`` (not yet finished by any shard).
    """

    def __init__(self, shard: tuple[int, int], stages: list[dict[str, Any]]) -> None:
        self.shard, self.stages = shard, [dict(s) for s in stages]
        last = stages[-1]
        super().__init__(
            f"shard {shard[0]}/{shard[1]}: trained {last['trained']} of {last['total']} {last['what']}; "
            f"{last['left']} left to other shards or the collecting call"
        )


_shard: tuple[int, int] | None = None
_stages: list[dict[str, Any]] = []


def current_shard() -> tuple[int, int] | None:
    """The shard ``(i, N)`` this step trains (:func:`use_shard`), or ``None``: every training."""
    return _shard


def shard_stages() -> list[dict[str, Any]]:
    """The training stages the current sharded step went through so far (see :class:`ShardFinished`)."""
    return [dict(s) for s in _stages]


@contextlib.contextmanager
def use_shard(shard: tuple[int, int] | None) -> Iterator[None]:
    """Inside the block, the lab's training helpers train only shard ``(i, N)`` of each list of trainings.

    Each training belongs to one shard by what it trains (:func:`poslab.lab.experiments.training.shard_key`,
    finished trainings included), so N shards, run in any order or side by side, are disjoint and cover every
    training, and two experiments that ask for the same lab model ask the same shard.
    A stage whose every training is finished once this shard's part is done lets the step go on to
    its next stage; otherwise :class:`ShardFinished` stops the step. ``None``: no sharding.
    """
    global _shard, _stages
    previous = _shard, _stages
    _shard, _stages = shard, []
    try:
        yield
    finally:
        _shard, _stages = previous


#: where a sharded step records its shards: ``STEP_FOLDER/shards/I-of-N.json``
SHARDS_DIR = "shards"


def shard_file(folder: Path | str, shard: tuple[int, int]) -> Path:
    """The record of shard ``(i, N)`` of the step writing into ``folder``: ``folder/shards/I-of-N.json``."""
    return Path(folder) / SHARDS_DIR / f"{shard[0]}-of-{shard[1]}.json"


def end_of_stage(what: str, trained: int, in_shard: int, total: int, left: int) -> None:
    """Record a sharded step's training stage; raise :class:`ShardFinished` when ``left`` trainings are unfinished.

    Args:
        what: the stage's trainings, as progress lines name them (``"lab models"``).
        trained: trainings this call ran; ``in_shard``: the shard's slice; ``total``: the stage's.
        left: trainings of the stage that no shard has finished yet.
    """
    if _shard is None:
        return
    _stages.append({"what": what, "trained": trained, "in_shard": in_shard, "total": total, "left": left})
    print(
        f"--- shard {_shard[0]}/{_shard[1]}: trained {trained} of {total} {what} ({in_shard} in this shard, "
        f"{left} left)",
        flush=True,
    )
    if left:
        raise ShardFinished(_shard, _stages)


__all__ = [
    "CLUSTERS",
    "CLUSTER_ENV",
    "RAY_EXTRA",
    "LocalExecutor",
    "RayExecutor",
    "SHARDS_DIR",
    "ShardFinished",
    "Task",
    "TrainingLost",
    "check_workers",
    "connect_ray",
    "current_executor",
    "current_shard",
    "default_workers",
    "die_with_parent",
    "end_of_stage",
    "executor_for",
    "for_child_steps",
    "gpus_for",
    "import_ray",
    "launch",
    "parse_shard",
    "ray_connect_timeout",
    "select_shard",
    "shard_file",
    "shard_stages",
    "train_many",
    "use_executor",
    "use_shard",
]
