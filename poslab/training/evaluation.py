"""Evaluation of a model's loss (layer 2): ``evaluate_loss`` (random or consecutive windows, ``clm`` or
``mlm``) and ``segment_nll`` (streams read segment after segment with a Transformer-XL memory).

The training loop evaluates through these, and so do the analyses and the lab: one definition of a
run's validation loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from poslab.data import get_batch
from poslab.nn.memory import SegmentMemory
from poslab.training.data import mask_id_of, objective_batch, stream_segment, stream_segments
from poslab.training.precision import autocast


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    data: torch.Tensor,
    block_size: int,
    batch_size: int,
    iters: int | None,
    *,
    seed: int = 0,
    dtype: str = "fp32",
    objective: str = "clm",
) -> float:
    """Mean cross-entropy of ``model`` on ``data``: next-token (``clm``) or on masked positions (``mlm``).

    Args:
        model: a :class:`GPT` (put in eval mode for the call, its mode restored after).
        data: token ids ``[N]``.
        block_size, batch_size: window length and windows per forward pass.
        iters: number of random batches, drawn from a generator seeded with ``seed`` (so every call
            sees the same windows: curves are comparable across steps and runs); ``None`` = the
            whole of ``data`` in consecutive non-overlapping windows.
        seed: seed of the random windows.
        dtype: ``"fp32"`` or ``"bf16"`` (autocast).
        objective: ``"clm"`` or ``"mlm"`` (the windows masked as in training, from a generator seeded
            with ``seed + 1``: every call masks the same positions; the ``[MASK]`` id is the model's
            last id, :func:`mask_id_of` of its config's ``vocab_size``, as training uses).

    Returns:
        The mean loss per (predicted) token (float; for ``mlm`` the mean over batches of each batch's
        mean over its masked positions).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    mask_id = mask_id_of(_config_of(model).vocab_size) if objective == "mlm" else None
    mask_rng = torch.Generator().manual_seed(seed + 1)
    try:
        if iters is None:
            n_windows = (data.numel() - 1) // block_size
            if n_windows == 0:
                raise ValueError(f"{data.numel()} tokens cannot fill one block of {block_size} + 1 tokens")
            starts = torch.arange(n_windows) * block_size  # [W]
            for first in range(0, n_windows, batch_size):
                window = starts[first : first + batch_size, None] + torch.arange(block_size + 1)  # [b, T+1]
                chunk = data[window]  # [b, T+1]
                x, y = objective_batch(objective, chunk[:, :-1], chunk[:, 1:], mask_id, mask_rng)  # [b, T] x2
                with autocast(dtype, device.type):
                    _, loss = model(x.to(device), y.to(device))
                total += loss.item() * chunk.shape[0]
                count += chunk.shape[0]
        else:
            generator = torch.Generator().manual_seed(seed)
            for _ in range(iters):
                x, y = get_batch(data, block_size, batch_size, generator)  # [B, T] x2
                x, y = objective_batch(objective, x, y, mask_id, mask_rng)  # [B, T] x2
                with autocast(dtype, device.type):
                    _, loss = model(x.to(device), y.to(device))
                total += loss.item()
                count += 1
    finally:
        model.train(was_training)
    return total / count


@torch.no_grad()
def segment_nll(
    model: nn.Module,
    streams: torch.Tensor,
    seg_len: int,
    mem_len: int,
    segments: int | None = None,
    *,
    dtype: str = "fp32",
) -> torch.Tensor:
    """Per-token next-token loss reading streams segment after segment (Transformer-XL's evaluation).

    Args:
        model: a :class:`GPT` (eval mode for the call, its mode restored after).
        streams: ``[n, S]`` token ids (:func:`~poslab.training.data.batchify`).
        seg_len: segment length ``T``.
        mem_len: segment memory ``M`` carried from segment to segment (0: every segment alone, at
            positions ``0 .. T-1``).
        segments: the first this many segments (``None``: every whole segment of the streams).
        dtype: ``"fp32"`` or ``"bf16"`` (autocast).

    Returns:
        ``[segments, n, T]`` fp32 losses (nats); ``[s, :, t]`` is the loss at place ``t`` of segment ``s``.
    """
    available = stream_segments(streams, seg_len)
    count = available if segments is None else min(segments, available)
    if count <= 0:
        raise ValueError(f"streams of {streams.shape[1]} tokens hold no segment of {seg_len} + 1 tokens")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    memory = SegmentMemory(mem_len) if mem_len else None
    out = []
    try:
        for s in range(count):
            x, y = stream_segment(streams, s, seg_len)  # [n, T] x2
            with autocast(dtype, device.type):
                logits = model(x.to(device), cache=memory)
            out.append(
                torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), y.to(device), reduction="none").cpu()
            )
    finally:
        model.train(was_training)
    return torch.stack(out)  # [segments, n, T]


def _config_of(model: nn.Module) -> Any:
    """The :class:`GPTConfig` of ``model`` or of the model a wrapper holds (``.module``: DDP, ``.model``: sharded
    eval)."""
    while getattr(model, "config", None) is None:
        inner = getattr(model, "module", None) or getattr(model, "model", None)
        if inner is None:
            raise ValueError(
                f"cannot find the model config of {type(model).__name__} (the mlm objective takes the [MASK] id "
                "from its vocab_size); give it a .config or wrap it as .module or .model"
            )
        model = inner
    return model.config


__all__ = ["evaluate_loss", "segment_nll"]
