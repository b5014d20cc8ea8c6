"""A run's data: the corpus split, the tokenizer fitted (or reused) and both splits encoded; MLM masking.

The masked-LM objective (``TrainConfig.objective = "mlm"``) needs one id that no text encodes: the
model of an MLM run gets one more vocabulary row than the tokenizer has ids, and that last id
(``tokenizer.vocab_size``) is the ``[MASK]`` token (:func:`model_vocab_size`, :func:`mask_id_of`). The
tokenizer has no mask id, so a causal run's ``model.vocab_size`` is the tokenizer's and an MLM run's is
the tokenizer's plus one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from poslab.checks import positive_int
from poslab.data import build_tokenizer, encode_corpus, load_text, split_text
from poslab.fileio import sha256_bytes
from poslab.training.config import OBJECTIVES, TrainConfig

#: BERT's recipe (Devlin et al. 2019, https://arxiv.org/abs/1810.04805, §3.1): 15% of the positions are
#: selected; of those 80% become [MASK], 10% a random token, 10% stay as they are
MLM_SELECT, MLM_MASK, MLM_RANDOM = 0.15, 0.8, 0.1


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


def batchify(data: torch.Tensor, n_streams: int, seg_len: int) -> torch.Tensor:
    """Transformer-XL's ``batchify``: ``data [N]`` cut into ``n_streams`` contiguous streams
    ``[n_streams, N // n_streams]``.

    The tail that does not divide evenly is dropped. Segment ``s`` of every stream is read by
    :func:`stream_segment`.

    Raises:
        ValueError: a stream would be too short for one segment of ``seg_len`` + 1 tokens.
    """
    positive_int("n_streams", n_streams)
    length = data.numel() // n_streams
    if length <= seg_len:
        raise ValueError(
            f"{data.numel()} tokens in {n_streams} streams give {length} tokens each, too few for one "
            f"segment of {seg_len} + 1 tokens; use fewer streams (batch_size) or a longer text"
        )
    return data[: n_streams * length].view(n_streams, length)  # [n_streams, S]


def stream_segments(streams: torch.Tensor, seg_len: int) -> int:
    """Segments of ``seg_len`` (each with its next-token target) in streams ``[n, S]``: ``(S - 1) // seg_len``."""
    return (streams.shape[1] - 1) // seg_len


def stream_segment(streams: torch.Tensor, index: int, seg_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment ``index`` (modulo the segments there are: it wraps around) of every stream.

    Args:
        streams: ``[n, S]`` from :func:`batchify`.
        index: segment number (``index % stream_segments(...)`` is read).
        seg_len: ``T``.

    Returns:
        ``x [n, T]`` and its next-token targets ``y [n, T]``.
    """
    s = index % stream_segments(streams, seg_len)
    chunk = streams[:, s * seg_len : s * seg_len + seg_len + 1]  # [n, T+1]
    return chunk[:, :-1], chunk[:, 1:]


def model_vocab_size(tokenizer_vocab: int, objective: str) -> int:
    """The model's vocabulary: the tokenizer's, plus the ``[MASK]`` id for ``objective="mlm"``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not allowed; choose one of {list(OBJECTIVES)}")
    return tokenizer_vocab + (1 if objective == "mlm" else 0)


def mask_id_of(model_vocab: int) -> int:
    """The ``[MASK]`` id of an MLM model with ``model_vocab`` rows: the last one (the tokenizer has ``model_vocab - 1``
    ids)."""
    if model_vocab < 2:
        raise ValueError(f"an MLM model needs at least one token id and the mask id, got vocab_size {model_vocab}")
    return model_vocab - 1


def mask_tokens(
    ids: torch.Tensor,
    mask_id: int,
    generator: torch.Generator | None = None,
    *,
    select: float = MLM_SELECT,
    replace_mask: float = MLM_MASK,
    replace_random: float = MLM_RANDOM,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT-style masking of a batch: the inputs with selected positions corrupted, and targets only there.

    Every position is selected independently with probability ``select``; a selected position is
    replaced by ``mask_id`` with probability ``replace_mask``, by a token drawn uniformly from
    ``[0, mask_id)`` (the tokenizer's ids, never the mask) with probability ``replace_random``, and
    kept otherwise. If no position of the batch is selected (tiny batches only), one uniformly drawn
    position is, so the loss is always defined.

    Args:
        ids: token ids ``[B, T]`` (all ``< mask_id``).
        mask_id: the ``[MASK]`` id (:func:`mask_id_of`).
        generator: the random source (the training loop's data generator: masks are part of a checkpoint).
        select, replace_mask, replace_random: the probabilities (BERT: 0.15, 0.8, 0.1).

    Returns:
        ``inputs [B, T]`` and ``targets [B, T]``: the original id at selected positions, ``-1`` (ignored
        by the loss) elsewhere.
    """
    if not 0 < select <= 1 or replace_mask < 0 or replace_random < 0 or replace_mask + replace_random > 1:
        raise ValueError(
            f"need 0 < select <= 1 and replace_mask, replace_random >= 0 summing to <= 1, got "
            f"{select!r}, {replace_mask!r}, {replace_random!r}"
        )
    if mask_id < 1:
        raise ValueError(f"mask_id must be >= 1 (the ids below it are the tokens), got {mask_id!r}")
    u = torch.rand(ids.shape, generator=generator)  # [B, T]
    selected = u < select  # [B, T]
    if not selected.any():
        flat = torch.randint(ids.numel(), (1,), generator=generator)
        selected.view(-1)[flat] = True
    action = torch.rand(ids.shape, generator=generator)  # [B, T]: which corruption a selected position gets
    random_ids = torch.randint(mask_id, ids.shape, generator=generator)  # [B, T]
    inputs = ids.clone()
    to_mask = selected & (action < replace_mask)
    to_random = selected & (action >= replace_mask) & (action < replace_mask + replace_random)
    inputs[to_mask] = mask_id
    inputs[to_random] = random_ids[to_random]
    targets = torch.where(selected, ids, torch.full_like(ids, -1))  # [B, T]
    return inputs, targets


def objective_batch(
    objective: str, x: torch.Tensor, y: torch.Tensor, mask_id: int | None, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) an objective trains on, from a window batch ``x, y [B, T]`` of :func:`get_batch`.

    ``"clm"``: ``(x, y)``, next-token prediction. ``"mlm"``: :func:`mask_tokens` of ``x`` (``y`` unused).
    """
    if objective == "clm":
        return x, y
    if objective == "mlm":
        if mask_id is None:
            raise ValueError("objective 'mlm' needs the mask id (mask_id_of(model.config.vocab_size))")
        return mask_tokens(x, mask_id, generator)
    raise ValueError(f"objective={objective!r} is not allowed; choose one of {list(OBJECTIVES)}")


__all__ = [
    "MLM_MASK",
    "MLM_RANDOM",
    "MLM_SELECT",
    "RunData",
    "batchify",
    "data_seed",
    "mask_id_of",
    "mask_tokens",
    "model_vocab_size",
    "objective_batch",
    "prepare_data",
    "stream_segment",
    "stream_segments",
]
