"""``train(cfg)``: one training run into its run folder (layer 4: it builds the :class:`RunFolder` of layer 3).

The loop itself (:mod:`poslab.training.loop`, layer 2) writes through the folder object it is given;
this module takes the run's lock, prepares the folder (``resume`` / ``overwrite``), calls the loop and
cleans up after a start that never got going.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable

import torch

from poslab.runs import RunFolder
from poslab.training import distributed
from poslab.training.config import RESUME_FREE_KEYS, TrainConfig
from poslab.training.loop import Hooks, TrainingDiverged, run_training


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    callback: Callable[[int, dict], None] | None = None,
    fsdp: bool = False,
) -> dict:
    """Train a GPT as ``cfg`` says, writing the run folder ``cfg.out_dir/cfg.name``.

    Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) this is data-parallel training on every
    process: DDP (or FSDP2 with ``fsdp``), ``batch_size`` per process, only rank 0 writes; see
    :mod:`poslab.training.distributed` and ``docs/scaling.md``.

    Args:
        cfg: the run's configuration.
        resume: continue the run in the existing folder from its newest good checkpoint (the config
            must match the saved one except for :data:`RESUME_FREE_KEYS`); bitwise the same curve on
            CPU. A folder that does not exist yet is started (with a note on stderr).
        overwrite: replace an existing run folder of the same name.
        progress: draw the live progress bar on stderr (the final summary prints regardless).
        callback: called as ``callback(step, record)`` after every optimizer step (``record`` is the
            metrics line of a logged step, else ``{"step", "loss", "lr"}``). Raising
            ``KeyboardInterrupt`` in it acts like Ctrl-C.
        fsdp: under torchrun, shard the model with FSDP2 ``fully_shard`` instead of DDP.

    Returns:
        The results dict (also written to ``results.json``).

    Raises:
        FileExistsError: the folder exists and neither ``resume`` nor ``overwrite`` was given;
            :class:`poslab.training.lock.RunLockedError` (a subclass): another live process trains
            this folder (under any name: the lock is taken on the resolved folder).
        PermissionError / OSError: the run folder is read-only (checked before training), or the
            disk filled up (the last complete checkpoint is kept; ``resume`` continues once there is space).
        CheckpointError: on ``resume``, no checkpoint of the run can continue training (a bad newest
            one is skipped with a warning and the previous good one used).
        ValueError: bad config or corpus, a config mismatch on resume (lists the keys), a changed
            tokenizer or corpus.
        TrainingDiverged: NaN/inf loss or gradient norm (names the step and the last good checkpoint).
        KeyboardInterrupt: after Ctrl-C, once the checkpoint of the last completed step is saved.
    """
    hooks = Hooks(progress=progress, callback=callback, wall_start=time.perf_counter())  # a bad callback: no folder
    run = RunFolder(cfg.run_dir)
    init = RunFolder(cfg.init_from) if cfg.init_from is not None else None
    dist_ctx = distributed.setup(fsdp=fsdp)  # under torchrun: a gloo/nccl process group; else one plain process
    lock = run.lock().acquire()  # another live process on this run folder: RunLockedError
    try:
        # rank 0 prepares the folder; its outcome (or its error) reaches every rank
        resuming, displaced = dist_ctx.run_on_main(run.prepare, resume, overwrite)
        lock.hold_folder()  # the folder as prepared (new, replaced or resumed) is locked too
    except BaseException:
        lock.release()
        distributed.teardown(dist_ctx)
        raise

    def started() -> None:
        if displaced is not None and dist_ctx.is_main:
            shutil.rmtree(displaced, ignore_errors=True)  # --overwrite: the new run is under way

    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        hooks = dataclasses.replace(hooks, on_started=started)
        return run_training(cfg, run, resuming=resuming, dist_ctx=dist_ctx, hooks=hooks, init_from=init)
    except BaseException:
        if dist_ctx.is_main and not resuming and not run.is_run and run.in_place():
            # nothing was written yet: leave no half folder (one put at its name by someone else is not ours)
            shutil.rmtree(run.path, ignore_errors=True)
            if displaced is not None and displaced.exists():
                os.replace(displaced, run.path)  # the new run never started: give the old one back
        raise
    finally:
        torch.set_num_threads(threads_before)
        lock.release()
        distributed.teardown(dist_ctx)


__all__ = ["RESUME_FREE_KEYS", "TrainConfig", "TrainingDiverged", "train"]
