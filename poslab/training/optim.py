"""nanoGPT's optimizer and learning-rate schedule: AdamW with weight-decay groups, warmup + cosine."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from poslab.training.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup over ``warmup_steps``, cosine to ``min_lr`` at ``decay_steps``.

    Args:
        step: optimizer steps already taken (0 for the first update).
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step > cfg.decay_steps:
        return cfg.min_lr
    span = max(cfg.decay_steps - cfg.warmup_steps, 1)
    ratio = (step - cfg.warmup_steps) / span
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with nanoGPT's groups: weight decay on every parameter with 2+ dims (matmul weights and
    embedding tables), none on biases, norm gains and other 1-D or scalar parameters.

    Uses the fused kernel where torch has one for the parameters' device (CPU included): same fp32
    math, one launch instead of one per tensor.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # a device without a fused kernel
        return torch.optim.AdamW(groups, **kwargs)


__all__ = ["lr_at", "make_optimizer"]
