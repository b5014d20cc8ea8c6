"""Checkpoint averaging of a run (layer 3): the weighted mean of its newest checkpoints, as a model or as a
new run folder (``poslab average``). The arithmetic is :mod:`poslab.training.averaging`'s."""

from __future__ import annotations

from pathlib import Path

import torch

from poslab.checks import is_int
from poslab.nn.model import GPT
from poslab.runs.checkpoints import RunCheckpoints, model_aliases, refuse_existing_run, write_model_run
from poslab.training import checkpoint as ckpt
from poslab.training.averaging import average_state_dicts, normalised_weights


class RunAveraging(RunCheckpoints):
    """A run's averaged checkpoints (a base of :class:`poslab.runs.RunFolder`)."""

    def averaged_model(self, last: int, weights: list[float] | None = None) -> tuple[GPT, list[int]]:
        """A :class:`GPT` holding the weighted mean of the run's newest ``last`` checkpoints' weights.

        Each checkpoint is verified (sha256, config) as in :meth:`checkpoint_model`, then the model tensors
        are averaged by :func:`poslab.training.averaging.average_state_dicts` (float32 accumulation).

        Args:
            last: how many of the newest checkpoints to average (>= 1; 1 is the latest checkpoint).
            weights: one weight per averaged checkpoint, oldest first (default uniform).

        Returns:
            ``(model in eval mode on CPU, the averaged steps ascending)``.

        Raises:
            ValueError: ``last`` not a positive int, or bad weights.
            CheckpointError: fewer than ``last`` checkpoints (the steps kept named, and the settings that
                keep more), a corrupt one, or one written by another config.
        """
        if not is_int(last) or last < 1:
            raise ValueError(f"last = {last!r}: the number of checkpoints to average must be an int >= 1")
        steps = self.checkpoints()
        if len(steps) < last:
            raise ckpt.CheckpointError(
                f"run {str(self.path)!r} keeps {len(steps)} checkpoint(s) (steps {steps}); "
                f"averaging the last {last} needs "
                f"{last}: train with keep_checkpoints >= {last} and a ckpt_interval that saves them"
            )
        chosen = steps[-last:]
        model_cfg = self.model_config()
        identity = self.resume_identity(model_cfg)
        with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
            model = GPT(model_cfg)
        states, aliases = [], {}
        for step in chosen:
            tensors, meta = self.load_checkpoint(step, identity)
            states.append({name: t for name, t in tensors.items() if name.startswith("model.")})
            aliases = model_aliases(meta)
        averaged = average_state_dicts(states, weights)
        bad = [name for name, t in averaged.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise ckpt.CheckpointError(
                f"the average of checkpoints {chosen} of {str(self.path)!r} holds non-finite "
                f"weights (NaN/inf) in {', '.join(bad[:4])}"
            )
        ckpt.restore_model(model, averaged, aliases)
        return model.eval(), chosen

    def write_average(self, out: str | Path, last: int, weights: list[float] | None = None) -> Path:
        """Create the run folder ``out`` holding the mean of this run's newest ``last`` checkpoints.

        The new run has this run's config (its name and folder changed; ``data.averaged_from`` names
        this run, the steps and the normalised weights), its tokenizer, one model-only checkpoint at the
        newest averaged step and a ``results.json`` with ``status: averaged``: ``load_run``, ``poslab
        eval`` and ``poslab sample`` read it as any run. The folder is written aside and renamed at the
        end; nothing existing is ever overwritten.

        Raises:
            FileExistsError: ``out`` exists and is not an empty folder.
            ValueError, CheckpointError: as :meth:`averaged_model`.
        """
        out = refuse_existing_run(out, "averaging")
        model, steps = self.averaged_model(last, weights)
        normalised = normalised_weights(len(steps), weights)  # the weights the average used
        source = {"run": str(self.path.resolve()), "steps": steps, "weights": normalised}
        doc = self.config()
        doc = {
            **doc,
            "train": {**doc.get("train", {}), "name": out.name, "out_dir": str(out.parent)},
            "data": {**doc.get("data", {}), "averaged_from": source},
        }
        return write_model_run(
            out,
            model,
            self.tokenizer(),
            doc,
            step=steps[-1],
            meta={"averaged_from": source},
            results={"status": "averaged", "steps": steps[-1], "averaged_from": source},
        )
