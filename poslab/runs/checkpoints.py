"""A run folder's checkpoints (layer 3): listed, saved with the digests of the run files they depend on,
verified against the run's config on load, the newest resumable one found, and the model built from one.

The file format itself is :mod:`poslab.training.checkpoint`'s; this module adds what only a run folder
knows (its config and tokenizer). Every problem raises
:class:`poslab.training.checkpoint.CheckpointError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.fileio import atomic_write_folder
from poslab.nn.model import GPT
from poslab.runs.files import CONFIG, TOKENIZER, RunFiles
from poslab.training import checkpoint as ckpt
from poslab.training.checkpoint import training_state_missing
from poslab.training.config import resume_identity


class RunCheckpoints(RunFiles):
    """A run folder's checkpoints (a base of :class:`poslab.runs.RunFolder`)."""

    def checkpoints(self) -> list[int]:
        """Steps of the listed checkpoints, ascending (integrity is checked on load)."""
        return ckpt.list_checkpoints(self.path)

    def latest_step(self) -> int | None:
        return ckpt.latest_step(self.path)

    def checkpoint_path(self, step: int | None) -> Path:
        """The tensor file of checkpoint ``step``."""
        return self.path / ckpt.CHECKPOINT_DIR / f"{ckpt.checkpoint_name(step or 0)}.safetensors"

    def save_checkpoint(self, step: int, tensors: dict[str, Tensor], meta: dict[str, Any], keep: int = 0) -> Path:
        """Checkpoint ``step``; its JSON records the digests of the run files it depends on (:meth:`file_digests`)."""
        with self.writing(f"checkpoint step {step}"):
            meta = {**meta, ckpt.RUN_FILES: self.file_digests()}
            return ckpt.save_checkpoint(self.path, step, tensors, meta, keep=keep)

    def file_digests(self) -> dict[str, str | None]:
        """:func:`~poslab.training.checkpoint.run_file_digests` of the folder's config and tokenizer."""
        return ckpt.run_file_digests(self.config() if self.is_run else {}, self.file(TOKENIZER))

    def load_checkpoint(self, step: int | None = None, identity: dict | None = None) -> tuple[dict[str, Tensor], dict]:
        """Checkpoint ``step`` (default ``latest``), verified and checked against the run's config.

        Raises:
            CheckpointError: missing, corrupt, written by another config (the keys listed), or a run file
                it depends on (``tokenizer.json``, ``config.json``'s data) changed since it was written.
        """
        tensors, meta = ckpt.load_checkpoint(self.path, step)
        self._check_checkpoint_config(meta, identity if identity is not None else self.resume_identity(), meta["step"])
        ckpt.check_run_files(meta, self.file_digests(), self.path)
        return tensors, meta

    def _check_checkpoint_config(self, meta: dict, identity: dict, step: int) -> None:
        saved = meta.get("config")
        if saved is None:
            raise ckpt.CheckpointError(f"checkpoint step {step} of {str(self.path)!r} records no config")
        try:
            saved = resume_identity(saved)
        except (TypeError, ValueError, KeyError) as err:
            raise ckpt.CheckpointError(
                f"checkpoint step {step} of {str(self.path)!r} records an unreadable config: {err}"
            ) from None
        if ckpt.config_hash(saved) != ckpt.config_hash(identity):
            mismatch = ckpt.config_mismatch(saved, identity)
            raise ckpt.CheckpointError(
                f"checkpoint step {step} in {str(self.path)!r} was written by a different config: "
                + "; ".join(mismatch)
            )

    def resume_checkpoint(self, identity: dict) -> tuple[dict[str, Tensor], dict] | None:
        """``(tensors, meta)`` of the newest checkpoint that verifies and can continue training.

        A checkpoint that fails (corrupt, unreadable JSON, another config, model weights only) is
        skipped with a warning on stderr naming it and why, and the previous one is tried; ``None``
        when the run has no checkpoint at all.

        Raises:
            CheckpointError: checkpoints exist but none can resume (each one's problem listed; for
                model-only ones, ``--init_from`` offered).
        """
        latest = self.latest_step()
        candidates = self.checkpoints()
        if latest is None and not candidates:
            return None
        order = ([latest] if latest is not None else []) + [
            s for s in reversed(candidates) if latest is None or s < latest
        ]
        problems, model_only = [], False
        for step in order:
            try:
                tensors, meta = self.load_checkpoint(step, identity)
                missing = training_state_missing(tensors, meta)
                if not missing:
                    problem = ckpt.training_state_problem(tensors, meta)
                    if problem:
                        raise ckpt.CheckpointError(f"checkpoint {str(self.checkpoint_path(step))!r} {problem}")
                if missing:
                    model_only = True
                    raise ckpt.CheckpointError(
                        f"checkpoint {str(self.checkpoint_path(step))!r} holds the model only "
                        f"(no {', '.join(missing)}): "
                        "it cannot resume the optimizer and the data order"
                    )
            except ckpt.CheckpointError as err:
                problems.append(str(err))
                continue
            if problems:
                print(
                    f"poslab: warning: {'; '.join(problems)}; resuming from the previous good checkpoint, step {step}",
                    file=sys.stderr,
                )
            return tensors, meta
        hint = (
            f"; to train on from its weights start a new run with --init_from {self.path}"
            if model_only
            else "; start again with --overwrite"
        )
        raise ckpt.CheckpointError(f"no usable checkpoint in {str(self.path)!r}: " + "; ".join(problems) + hint)

    def _previous_good(self, identity: dict, below: int | None) -> str:
        """A hint naming the newest checkpoint before step ``below`` that verifies (for error messages)."""
        candidates = [s for s in reversed(self.checkpoints()) if below is None or s < below]
        if not candidates:
            return ""
        for step in candidates:
            try:
                self.load_checkpoint(step, identity)
            except ckpt.CheckpointError:
                continue
            return (
                f"; the previous good checkpoint is step {step}: load_run(run, step={step}), "
                f"`poslab sample RUN --step {step}`; `poslab train --resume` falls back to it"
            )
        return "; no earlier checkpoint verifies"

    def restore_weights(self, model: nn.Module) -> None:
        """The latest checkpoint's model weights into ``model`` (``init_from``: names and shapes must
        match)."""
        if not self.is_run:
            raise FileNotFoundError(f"init_from {str(self.path)!r} is not a poslab run folder (no {CONFIG})")
        tensors, meta = self.load_checkpoint()
        try:
            ckpt.restore_model(model, tensors, model_aliases(meta))
        except ckpt.CheckpointError as err:
            raise ckpt.CheckpointError(f"init_from {str(self.path)!r}: {err}") from None

    def checkpoint_model(self, step: int | None = None) -> GPT:
        """The trained :class:`GPT` of checkpoint ``step`` (default ``latest``), eval mode, on CPU.

        Raises:
            FileNotFoundError: not a run folder.
            RunFileError: a config that does not build.
            CheckpointError (a ``ValueError``): no/corrupt checkpoint, one written by a different config
                (the mismatched keys listed, the previous good checkpoint named), or non-finite weights.
        """
        model_cfg = self.model_config()
        identity = self.resume_identity(model_cfg)
        with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
            model = GPT(model_cfg)
        try:
            tensors, meta = self.load_checkpoint(step, identity)
        except ckpt.CheckpointError as err:
            below = step if step is not None else self.latest_step()
            raise ckpt.CheckpointError(f"{err}{self._previous_good(identity, below)}") from None
        bad = [
            name
            for name, t in tensors.items()
            if name.startswith("model.") and t.is_floating_point() and not bool(torch.isfinite(t).all())
        ]
        if bad:
            raise ckpt.CheckpointError(
                f"checkpoint {str(self.checkpoint_path(meta['step']))!r} holds non-finite "
                f"weights (NaN/inf) in {', '.join(bad[:4])}; sampling from it is meaningless"
            )
        ckpt.restore_model(model, tensors, model_aliases(meta))
        return model.eval()


def refuse_existing_run(out: str | Path, action: str) -> Path:
    """``out`` as a ``Path``; ``FileExistsError`` if it exists and is not an empty folder (``action`` never
    overwrites)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{str(out)!r} already exists and is not an empty folder; {action} never overwrites a run"
        )
    return out


def write_model_run(
    out: str | Path,
    model: nn.Module,
    tokenizer: Any,
    config_doc: dict[str, Any],
    *,
    step: int,
    meta: dict[str, Any],
    results: dict[str, Any],
) -> Path:
    """Create the run folder ``out`` holding ``model`` as one model-only checkpoint (a converted or averaged run).

    The folder gets the tokenizer, ``config_doc`` as its config (with the tokenizer's digest), the
    checkpoint at ``step`` (its meta: the resume identity, the model's tensor aliases, ``meta`` and the
    torch version) and ``results.json`` (``name``, ``results``, ``n_params``); ``load_run``, ``poslab
    eval`` and ``poslab sample`` read it as any run. It is written aside and renamed at the end, and an
    existing non-empty ``out`` is refused (:func:`refuse_existing_run`).
    """
    out = refuse_existing_run(out, "writing a run")

    def fill(folder: Path) -> None:
        run = RunCheckpoints(folder)
        run.write_start(tokenizer)
        run.write_config(config_doc)  # records the tokenizer's digest
        tensors, aliases = ckpt.model_tensors(model)
        identity = run.resume_identity()
        run.save_checkpoint(
            step,
            tensors,
            {
                "config": identity,
                "config_hash": ckpt.config_hash(identity),
                "model_aliases": aliases,
                **meta,
                "torch_version": torch.__version__,
            },
        )
        run.write_results({"name": out.name, **results, "n_params": sum(p.numel() for p in model.parameters())})

    atomic_write_folder(out, fill)
    return out


def model_aliases(meta: dict[str, Any]) -> dict[str, str]:
    aliases = meta.get("model_aliases", {})
    return aliases if isinstance(aliases, dict) else {}
