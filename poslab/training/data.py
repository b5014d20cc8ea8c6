"""A run's data: the corpus split, the tokenizer fitted (or reused) and both splits encoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from poslab.data import build_tokenizer, encode_corpus, load_text, split_text
from poslab.fileio import sha256_bytes
from poslab.training.config import TrainConfig


def data_seed(seed: int) -> int:
    """Seed of a run's batch generator, derived from ``seed`` but not equal to it.

    The global RNG (initialisation, dropout) is seeded with ``seed``; a batch generator seeded with
    the same number would replay the very bits the initial weights were drawn from as batch offsets,
    tying the data order to the initialisation. A fixed odd offset makes the two streams independent
    while keeping one ``seed`` the only knob.
    """
    return (seed + 0x9E3779B97F4A7C15) % (2**63)


@dataclass
class RunData:
    """Tokenizer and the encoded splits of a run."""

    tokenizer: Any
    train: torch.Tensor
    val: torch.Tensor
    info: dict[str, Any]


def prepare_data(cfg: TrainConfig, tokenizer: Any = None) -> RunData:
    """Load the corpus, split it, fit (or reuse) the tokenizer and encode both splits.

    Raises:
        ValueError: bad corpus (missing, empty, binary, non-UTF-8) or a split too short for one block.
    """
    text = load_text(cfg.corpus)
    train_text, val_text = split_text(text, cfg.val_fraction)
    if tokenizer is None:
        # char: the vocabulary of the whole text (nanoGPT); BPE: merges learned on the training split only
        tokenizer = build_tokenizer(cfg.tokenizer, text if cfg.tokenizer == "char" else train_text)
    train_ids, val_ids = encode_corpus(tokenizer, train_text), encode_corpus(tokenizer, val_text)
    block_size = cfg.model.block_size
    for label, ids in (("training", train_ids), ("validation", val_ids)):
        if ids.numel() <= block_size:
            raise ValueError(
                f"corpus {cfg.corpus!r} is too short for block_size {block_size}: its {label} split has "
                f"{ids.numel()} tokens, needs at least {block_size + 1}; use a longer text, a smaller "
                f"--model.block_size or another --val_fraction"
            )
    info = {
        "corpus": cfg.corpus,
        "corpus_sha256": sha256_bytes(text.encode("utf-8")),
        "chars": len(text),
        "split": f"first {1 - cfg.val_fraction:.0%} of the characters train, last {cfg.val_fraction:.0%} validate",
        "train_tokens": int(train_ids.numel()),
        "val_tokens": int(val_ids.numel()),
        "vocab_size": int(tokenizer.vocab_size),
    }
    return RunData(tokenizer, train_ids, val_ids, info)


__all__ = ["RunData", "data_seed", "prepare_data"]
