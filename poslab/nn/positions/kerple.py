"""KERPLE (logarithmic variant): a learned conditionally positive definite kernel bias.

Chi, Fan, Ramadge & Rudnicky 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation" (https://arxiv.org/abs/2205.09921). Head ``h`` adds ``-r1_h * log(1 + r2_h * |i - j|)``
with learned ``r1, r2 > 0`` (kept positive by clamping, as in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, ScoreMod, check_positive, relative_distance


@dataclass
class KerpleConfig:
    """Config of :class:`Kerple`.

    Attributes:
        n_heads: number of query heads (filled in by the model).
        r1_init_max, r2_init_max: ``r1 ~ U(0, r1_init_max)``, ``r2 ~ U(0, r2_init_max)`` at init.
        eps: lower clamp keeping ``r1, r2`` positive.
    """

    n_heads: int = 8
    r1_init_max: float = 2.0
    r2_init_max: float = 1.0
    eps: float = 1e-2

    def __post_init__(self) -> None:
        check_positive("n_heads", self.n_heads)
        check_positive("r1_init_max", self.r1_init_max)
        check_positive("r2_init_max", self.r2_init_max)
        check_positive("eps", self.eps)


@register
class Kerple(PositionScheme):
    """KERPLE-log (Chi et al. 2022, https://arxiv.org/abs/2205.09921): bias ``-r1 log(1 + r2 |i-j|)``."""

    name = "kerple"
    config_class = KerpleConfig
    relative = True
    paper = "Chi et al. 2022, https://arxiv.org/abs/2205.09921"

    def __init__(self, config: KerpleConfig) -> None:
        super().__init__(config)
        self.r1 = nn.Parameter(torch.rand(config.n_heads) * config.r1_init_max)
        self.r2 = nn.Parameter(torch.rand(config.n_heads) * config.r2_init_max)

    def _coefficients(self) -> tuple[Tensor, Tensor]:
        eps = self.config.eps
        return self.r1.float().clamp(min=eps), self.r2.float().clamp(min=eps)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        r1, r2 = self._coefficients()
        distance = relative_distance(q_pos, k_pos).abs().to(torch.float32)  # [Tq, Tk]
        return -(r1[:, None, None] * torch.log1p(r2[:, None, None] * distance[None]))[None]  # [1, h, Tq, Tk]

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> ScoreMod:
        r1, r2 = self._coefficients()

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            distance = (q_pos[q_idx] - k_pos[kv_idx]).abs().to(torch.float32)
            return score - r1[h] * torch.log1p(r2[h] * distance)

        return mod
