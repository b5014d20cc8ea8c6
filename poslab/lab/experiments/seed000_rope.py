"""Seed 000 §3.4's RoPE experiment as the lesson writes it: its ``q, k``, its ``apply_rope`` and its printout.

Experiment rope-relative reproduces the printout with poslab's rope; the corrections judge its "1e-6" spread.
"""

from __future__ import annotations

import torch
from torch import Tensor

HEAD_DIM, MAX_POS, STRIDE = 16, 200, 20
OFFSETS = (0, 1, 2, 4, 8, 16, 32)
# what seed 000 §3.4 printed ("实测输出") per offset: the inner product and its spread over positions
LESSON_VALUES = {0: 2.9839, 1: 2.8449, 2: 1.2160, 4: -0.6933, 8: -2.6004, 16: -3.5409, 32: -2.6989}
LESSON_SPREADS = {0: 1.2e-06, 1: 3.1e-06, 2: 2.4e-06, 4: 8.6e-06, 8: 1.0e-05, 16: 1.2e-05, 32: 3.3e-06}


def apply_rope(x: Tensor, pos: Tensor, base: float = 10000) -> Tensor:
    """Seed 000's ``apply_rope``, verbatim: ``x [d]`` or ``[seq, d]``, ``pos [seq]`` -> ``[seq, d]``."""
    d = x.shape[-1] // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, d).float() / d))
    angles = pos[:, None].float() * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def q_and_k() -> tuple[Tensor, Tensor]:
    """The lesson's ``q, k`` (``torch.manual_seed(0)``; ``q = randn(16)``, ``k = randn(16)``)."""
    torch.manual_seed(0)
    q = torch.randn(HEAD_DIM)
    k = torch.randn(HEAD_DIM)
    return q, k


def inner_products(Q: Tensor, K: Tensor) -> dict[int, list[float]]:
    """``<Q[i], K[i + off]>`` for each offset, ``i`` every ``STRIDE`` positions (the lesson's sampling).

    Args:
        Q, K: ``[MAX_POS, d]`` query and key placed at every position.
    """
    return {off: [(Q[i] * K[i + off]).sum().item() for i in range(0, MAX_POS - off, STRIDE)] for off in OFFSETS}
