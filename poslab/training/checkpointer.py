"""The training's checkpointer (layer 2): what a checkpoint holds of a training, saved and restored.

The training loop hands its state to a :class:`Checkpointer` and gets it back on resume; the
checkpointer packs it into tensors and metadata (format: :mod:`poslab.training.checkpoint`) and writes
them through the :class:`CheckpointStore` it was built with (:class:`poslab.runs.RunFolder`, which
adds the run's config and file digests and verifies each checkpoint on load). The loop is built with
the checkpointer injected (:func:`poslab.training.loop.run_training`), as torchtune's recipes are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from poslab.nn.memory import SegmentMemory
from poslab.training import checkpoint as ckpt
from poslab.training import distributed


class CheckpointStore(Protocol):
    """Where checkpoints are kept (implemented by :class:`poslab.runs.RunFolder`). Under ``torchrun`` only
    rank 0 saves."""

    path: Path

    def save_checkpoint(self, step: int, tensors: dict[str, torch.Tensor], meta: dict, keep: int) -> Path:
        """Write checkpoint ``step`` (keeping the newest ``keep``)."""

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step."""

    def checkpoint_path(self, step: int | None) -> Path:
        """The tensor file of checkpoint ``step`` (for messages)."""

    def resume_checkpoint(self, identity: dict) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The newest checkpoint that verifies and holds the full training state, or ``None`` (none at all)."""


@dataclass
class Progress:
    """What a checkpoint restores besides tensors: the step, the running log sums, the best validation loss,
    counters."""

    step: int = 0
    log_loss_sum: float = 0.0
    log_loss_count: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"val_loss": None, "step": None})
    tokens_seen: int = 0
    skipped: list[int] = field(default_factory=list)  # steps whose batch was dropped as non-finite


@dataclass
class TrainingState:
    """A training as a checkpoint holds it.

    Attributes:
        model: the plain model (not its DDP/compiled wrapper: no wrapper prefixes in the names).
        optimizer: its optimizer.
        data_rng: the generator the batches are drawn from.
        progress: see :class:`Progress`.
        grad_accum: micro-batches per step (the data position counts micro-batches).
        memories: the segment memory of each micro-batch's streams (``None``: none).
        stream_rows: the rows of each micro-batch's streams (the shape a saved memory must have).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    data_rng: torch.Generator
    progress: Progress
    grad_accum: int = 1
    memories: Sequence[SegmentMemory | None] = ()
    stream_rows: Sequence[int] = ()


class Checkpointer:
    """Saves a :class:`TrainingState` as checkpoint ``step`` and restores the newest good one.

    Args:
        store: where the checkpoints are kept.
        keep: how many of the newest checkpoints to keep (0: all).
        dist: the process group (every rank takes part in a save; only rank 0 writes).
    """

    def __init__(self, store: CheckpointStore, keep: int = 0, dist: distributed.DistContext | None = None) -> None:
        self.store, self.keep = store, keep
        self.dist = dist or distributed.DistContext()

    def latest_step(self) -> int | None:
        return self.store.latest_step()

    def path_of(self, step: int | None) -> Path:
        """The tensor file of checkpoint ``step`` (for messages)."""
        return self.store.checkpoint_path(step)

    def save(self, step: int, state: TrainingState, identity: dict) -> Path | None:
        """Checkpoint ``state`` after ``step`` steps, recording the run's ``identity`` (``None`` on ranks > 0)."""
        dist, progress = self.dist, state.progress
        model_t, aliases, optim_t, optim_meta = dist.checkpoint_state(state.model, state.optimizer)
        rank_rng = dist.rng_states()  # {} in a single process
        if not dist.is_main:
            return None
        tensors = {
            **model_t,
            **optim_t,
            "rng.torch": torch.get_rng_state(),
            "rng.data": state.data_rng.get_state(),
            **rank_rng,
            **_memory_tensors(state.memories),
        }
        meta = {
            "config": identity,
            "config_hash": ckpt.config_hash(identity),
            # micro-batches drawn (the generator's state: rng.data)
            "data_position": (step + len(progress.skipped)) * state.grad_accum,
            "tokens_seen": progress.tokens_seen,
            "model_aliases": aliases,
            "optimizer": optim_meta,
            "log_loss_sum": progress.log_loss_sum,
            "log_loss_count": progress.log_loss_count,
            "best": progress.best,
            "torch_version": torch.__version__,
            **dist.checkpoint_meta(),  # world_size under torchrun
            "skipped_nonfinite": progress.skipped,
        }
        return self.store.save_checkpoint(step, tensors, meta, keep=self.keep)

    def restore(self, state: TrainingState, identity: dict) -> list[str] | None:
        """Load the newest good checkpoint into ``state`` (model, optimizer, random streams, memories, progress).

        Returns:
            ``None`` when there is no checkpoint at all (nothing changed), else the notes to print (a
            checkpoint without the segment memories the run uses resumes with empty ones).

        Raises:
            CheckpointError: checkpoints exist but none can resume, or a saved memory of another shape.
        """
        found = self.store.resume_checkpoint(identity)
        if found is None:
            return None
        tensors, meta = found
        dist, path = self.dist, self.store.path
        dist.check_resume(meta, path)  # the same number of processes as the checkpoint's
        dist.restore(state.model, state.optimizer, tensors, meta)  # model + optimizer (FSDP: re-sharded)
        dist.restore_rng(tensors)  # this rank's torch.set_rng_state
        state.data_rng.set_state(tensors["rng.data"])
        notes = _restore_memories(state, tensors, path)
        state.progress = Progress(
            step=meta["step"],
            log_loss_sum=meta["log_loss_sum"],
            log_loss_count=meta["log_loss_count"],
            best=meta["best"],
            tokens_seen=meta["tokens_seen"],
            skipped=list(meta.get("skipped_nonfinite", [])),
        )
        return notes


def _memory_tensors(memories: Sequence[SegmentMemory | None]) -> dict[str, torch.Tensor]:
    """The segment memories as checkpoint tensors ``memory.{micro}.*``: a resume continues bitwise."""
    out: dict[str, torch.Tensor] = {}
    for micro, memory in enumerate(memories):
        if memory is not None:
            out.update(memory.state_tensors(f"memory.{micro}"))
    return out


def _restore_memories(state: TrainingState, tensors: dict[str, torch.Tensor], run_dir: Path) -> list[str]:
    """Load the segment memories a checkpoint saved (one without them resumes with empty ones, said in a note)."""
    memories = [(micro, m) for micro, m in enumerate(state.memories) if m is not None]
    if not memories:
        return []
    if f"memory.{memories[0][0]}.length" not in tensors:
        return [
            f"poslab: note: the checkpoint of {str(run_dir)!r} holds no segment memory: "
            "training resumes with an empty one (not bitwise equal to an uninterrupted run)"
        ]
    cfg = state.model.config
    for micro, memory in memories:
        try:
            memory.load_state(tensors, f"memory.{micro}", cfg.n_layer, state.stream_rows[micro], cfg.n_embd)
        except ValueError as err:
            raise ckpt.CheckpointError(f"cannot resume {str(run_dir)!r}: {err}") from None
    return []


__all__ = ["CheckpointStore", "Checkpointer", "Progress", "TrainingState"]
