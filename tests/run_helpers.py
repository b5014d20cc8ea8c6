"""Helpers of the run-folder tests: the tiny run ``A``, consistent forgeries, the table's figures."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import tiny_config

from poslab.training import checkpoint as ckpt
from poslab.training import presets
from poslab.training.config import TrainConfig

#: ``poslab train`` options of a tiny model on one thread
SMALL = [
    "--model.n_layer",
    "1",
    "--model.n_embd",
    "16",
    "--model.block_size",
    "16",
    "--batch_size",
    "2",
    "--eval_iters",
    "1",
    "--threads",
    "1",
    "--no-progress",
]


def tiny_train_argv(corpus: str, out: Path, name: str, steps: int = 8, keep: int = 2) -> list[str]:
    """``poslab train`` arguments of the ``tiny`` preset at block 16 with dropout, checkpoints every 2 steps."""
    return [
        "train",
        "--preset",
        "tiny",
        "--name",
        name,
        "--out_dir",
        str(out),
        "--corpus",
        corpus,
        "--model.block_size",
        "16",
        "--model.dropout",
        "0.1",
        "--batch_size",
        "4",
        "--max_steps",
        str(steps),
        "--eval_interval",
        "4",
        "--eval_iters",
        "1",
        "--log_interval",
        "1",
        "--ckpt_interval",
        "2",
        "--keep_checkpoints",
        str(keep),
        "--seed",
        "5",
        "--threads",
        "1",
        "--no-progress",
    ]


def tiny(out: Path, corpus: Path | str, **overrides) -> TrainConfig:
    """:func:`conftest.tiny_config` named ``A``, with one checkpoint at the end."""
    return tiny_config(out, corpus, **{"name": "A", "ckpt_interval": 0, "seed": 5, **overrides})


def tiny_preset(out: Path | str, corpus: Path | str, **overrides) -> TrainConfig:
    """The ``tiny`` preset's config (2/2/32, block 32, batch 8) on ``corpus``, one thread, writing to ``out``."""
    values = presets.preset_config("tiny")
    values.update(out_dir=str(out), threads=1, corpus=str(corpus))
    values.update(overrides)
    return TrainConfig.from_dict(values)


def record(request, **figures) -> None:
    """Add this case's figures to the reliability table (test-artifacts/reliability.json)."""
    from test_reliability_artifacts import mode
    from test_reliability_artifacts import record as write

    write("run_folder", mode(request), {"cases": 1, **figures})


def rewrite_config(run: Path, edit) -> None:
    doc = json.loads((run / "config.json").read_text(encoding="utf-8"))
    (run / "config.json").write_text(json.dumps(edit(doc)), encoding="utf-8")


def reforge(run: Path, tensors_edit=None, meta_edit=None) -> None:
    """Rewrite the latest checkpoint with its checksums recomputed (a consistent forgery)."""
    tensors, meta = ckpt.load_checkpoint(run)
    step = meta["step"]
    meta = {k: v for k, v in meta.items() if k not in ("sha256", "step", "tensors_file")}
    if tensors_edit:
        tensors = tensors_edit(tensors)
    if meta_edit:
        meta = meta_edit(meta)
    ckpt.save_checkpoint(run, step, tensors, meta)
