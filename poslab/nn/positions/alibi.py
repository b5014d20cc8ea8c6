"""ALiBi: attention with linear biases.

Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation" (https://arxiv.org/abs/2108.12409). Head ``h`` adds ``-m_h * |i - j|`` to the
logit of query ``i`` and key ``j`` (not scaled by ``1/sqrt(d)``). Slopes are a geometric sequence;
for head counts that are not powers of two, the paper interleaves the slopes of the next power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, ScoreMod, check_positive, relative_distance


def alibi_slopes(n_heads: int, bias_max: float = 8.0) -> Tensor:
    """The paper's slopes for ``n_heads`` heads, ``[n_heads]`` fp32.

    Powers of two: ``2^(-8k/n)``, ``k = 1..n``. Otherwise, with ``c = 2^floor(log2 n)``:
    ``slopes(c) + slopes(2c)[0::2][: n - c]`` (12 heads: 2^-1..2^-8, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
    ``bias_max`` replaces the 8 (MPT's ``alibi_bias_max``: its slopes are ``2^(-bias_max k/n)``,
    interleaved the same way for other head counts).
    """
    check_positive("n_heads", n_heads)
    check_positive("bias_max", bias_max)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-bias_max / n)  # = 2^(-(2^-(log2 n - 3))) for bias_max 8
        return [start**k for k in range(1, n + 1)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest != n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


@dataclass
class AlibiConfig:
    """Config of :class:`ALiBi`.

    Attributes:
        n_heads: number of query heads (filled in by the model).
        bias_max: the slopes' range, ``2^(-bias_max k/n)`` (8 in the paper; MPT's ``alibi_bias_max``).
    """

    n_heads: int = 8
    bias_max: float = 8.0

    def __post_init__(self) -> None:
        check_positive("n_heads", self.n_heads)
        check_positive("bias_max", self.bias_max)


@register
class ALiBi(PositionScheme):
    """ALiBi (Press et al. 2022, https://arxiv.org/abs/2108.12409): bias ``-m_h |i - j|``, slopes in fp32."""

    name = "alibi"
    config_class = AlibiConfig
    relative = True
    paper = "Press et al. 2022, https://arxiv.org/abs/2108.12409"
    fp32_buffers = ("slopes",)

    def __init__(self, config: AlibiConfig) -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_heads, config.bias_max), persistent=False)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        distance = relative_distance(q_pos, k_pos).abs().to(torch.float32)  # [Tq, Tk]
        slopes = self.slopes.to(device=distance.device, dtype=torch.float32)
        return -(slopes[:, None, None] * distance[None])[None]  # [1, h, Tq, Tk]

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> ScoreMod:
        slopes = self.slopes.to(q.device)

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            distance = (q_pos[q_idx] - k_pos[kv_idx]).abs().to(torch.float32)
            return score - slopes[h] * distance

        return mod
