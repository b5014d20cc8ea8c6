"""FIRE: functional interpolation for relative positions.

Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context Transformers"
(https://arxiv.org/abs/2310.04418). The bias is an MLP of the normalised, log-compressed distance:
``b(i, j) = f(psi(i - j) / psi(max(i, L)))`` with ``psi(x) = log(c x + 1)``, learned ``c`` (init 0.1)
and learned threshold ``L`` (init 512). Because of the normalisation by ``max(i, L)``, FIRE is
shift-invariant only while query positions stay below ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, ScoreMod, check_positive


@dataclass
class FireConfig:
    """Config of :class:`Fire`.

    Attributes:
        n_heads: number of query heads (filled in by the model).
        hidden: MLP width (32 in the paper).
        c_init: initial ``c`` of ``psi(x) = log(c x + 1)``.
        threshold_init: initial threshold ``L``.
    """

    n_heads: int = 8
    hidden: int = 32
    c_init: float = 0.1
    threshold_init: float = 512.0

    def __post_init__(self) -> None:
        check_positive("n_heads", self.n_heads)
        check_positive("hidden", self.hidden)
        check_positive("c_init", self.c_init)
        check_positive("threshold_init", self.threshold_init)
        c, threshold = (torch.tensor(v, dtype=torch.float32, device="cpu") for v in (self.c_init, self.threshold_init))
        psi = torch.log(c * threshold + 1)  # the bias divides by psi(L): it must be finite and > 0 in fp32
        if not bool(torch.isfinite(psi)) or not float(psi) > 0:
            raise ValueError(
                f"fire needs log(c_init * threshold_init + 1) to be a finite fp32 number > 0 (its bias "
                f"divides by it), got c_init={self.c_init!r}, threshold_init={self.threshold_init!r}"
            )


@register
class Fire(PositionScheme):
    """FIRE (Li et al. 2023, https://arxiv.org/abs/2310.04418): MLP over normalised log distance."""

    name = "fire"
    config_class = FireConfig
    relative = True  # while query positions stay below the threshold L
    paper = "Li et al. 2023, https://arxiv.org/abs/2310.04418"

    def __init__(self, config: FireConfig) -> None:
        super().__init__(config)
        self.mlp = nn.Sequential(nn.Linear(1, config.hidden), nn.ReLU(), nn.Linear(config.hidden, config.n_heads))
        self.c = nn.Parameter(torch.tensor(config.c_init))
        self.threshold = nn.Parameter(torch.tensor(config.threshold_init))

    def _psi(self, x: Tensor) -> Tensor:
        return torch.log(self.c.float().abs() * x + 1)

    def _normalised(self, q_abs: Tensor, distance: Tensor) -> Tensor:
        """``psi(|i-j|) / psi(max(i, L))`` in fp32 for broadcastable query positions and distances."""
        denominator = self._psi(torch.maximum(q_abs, self.threshold.float().abs()))
        return self._psi(distance) / denominator

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        qf = q_pos.to(torch.float32)
        distance = (qf[:, None] - k_pos.to(torch.float32)[None, :]).abs()  # [Tq, Tk]
        x = self._normalised(qf[:, None], distance)  # [Tq, Tk]
        bias = self.mlp(x[..., None].to(self.mlp[0].weight.dtype)).float()  # [Tq, Tk, h]
        return bias.permute(2, 0, 1)[None]  # [1, h, Tq, Tk]

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> ScoreMod:
        w1 = self.mlp[0].weight.float()[:, 0]  # [hidden]
        b1 = self.mlp[0].bias.float()
        w2 = self.mlp[2].weight.float()  # [h, hidden]
        b2 = self.mlp[2].bias.float()

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qf = q_pos[q_idx].to(torch.float32)
            x = self._normalised(qf, (qf - k_pos[kv_idx].to(torch.float32)).abs())
            bias = b2[h]
            for unit in range(w1.shape[0]):  # unrolled: Inductor cannot lower a reduction inside a score_mod
                bias = bias + torch.relu(x * w1[unit] + b1[unit]) * w2[h, unit]
            return score + bias

        return mod
