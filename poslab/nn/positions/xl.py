"""Transformer-XL relative position encoding.

Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context"
(https://arxiv.org/abs/1901.02860). The logit of query ``i`` and key ``j`` is

    (a) q_i.k_j  +  (b) q_i.W_R R_{i-j}  +  (c) u.k_j  +  (d) v.W_R R_{i-j}

with ``R`` the sinusoidal code of the distance ``i - j``, ``W_R`` a learned projection and ``u, v``
learned per-head vectors. Attention computes (a); this scheme returns (b)+(c)+(d), scaled like (a).
The paper computes (b)+(d) with a "relative shift" of a ``[T, T+M]`` matrix; :func:`rel_shift`
implements it, and :class:`TransformerXL` gathers by distance, which also handles arbitrary
positions (KV cache, offsets). The tests check that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.absolute import sinusoid_table
from poslab.nn.positions.base import PositionScheme, check_positive, relative_distance


def rel_shift(x: Tensor) -> Tensor:
    """Transformer-XL's relative shift.

    Args:
        x: ``[..., Tq, Tk]`` where column ``c`` holds distance ``Tk - 1 - c`` (descending distances
            ``Tk-1 .. 0``), for queries that are the last ``Tq`` of ``Tk`` positions.

    Returns:
        ``[..., Tq, Tk]`` where entry ``(i, j)`` holds the value for distance ``(Tk - Tq + i) - j``
        (valid for ``j <= Tk - Tq + i``; the rest is garbage to be masked causally).
    """
    *lead, tq, tk = x.shape
    padded = F.pad(x, (1, 0))  # [..., Tq, Tk+1]: a zero column in front
    padded = padded.reshape(*lead, tk + 1, tq)  # [..., Tk+1, Tq]: reinterpret the memory
    return padded[..., 1:, :].reshape(*lead, tq, tk)  # drop the first row, back to [..., Tq, Tk]


@dataclass
class XLConfig:
    """Config of :class:`TransformerXL`.

    Attributes:
        n_embd: model width, the width of ``R`` (filled in by the model).
        n_heads, head_dim: attention geometry (filled in by the model).
        base: sinusoid base.
        init_std: normal initialisation of ``W_R``, ``u`` and ``v``.
    """

    n_embd: int = 128
    n_heads: int = 4
    head_dim: int = 32
    base: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for key in ("n_embd", "n_heads", "head_dim", "base"):
            check_positive(key, getattr(self, key))
        if self.n_embd % 2:
            raise ValueError(f"xl n_embd must be even (sinusoidal R), got {self.n_embd}")


@register
class TransformerXL(PositionScheme):
    """Transformer-XL relative encoding (Dai et al. 2019, https://arxiv.org/abs/1901.02860).

    One ``W_R, u, v`` shared by all layers of a model (the paper's tied ``u, v``).
    """

    name = "xl"
    config_class = XLConfig
    relative = True
    paper = "Dai et al. 2019, https://arxiv.org/abs/1901.02860"

    def __init__(self, config: XLConfig) -> None:
        super().__init__(config)
        h, dk = config.n_heads, config.head_dim
        self.r_proj = nn.Linear(config.n_embd, h * dk, bias=False)
        self.u = nn.Parameter(torch.randn(h, dk) * config.init_std)  # content bias
        self.v = nn.Parameter(torch.randn(h, dk) * config.init_std)  # position bias
        nn.init.normal_(self.r_proj.weight, std=config.init_std)

    def bias_note(self) -> str:
        return " (with q = 0: terms (c) and (d) only)"

    def projected_r(self, distances: Tensor) -> Tensor:
        """``W_R R_d`` for distances ``[N]`` -> ``[h, N, d_k]``."""
        c = self.config
        r = sinusoid_table(distances, c.n_embd, c.base).to(self.r_proj.weight.dtype)  # [N, d]
        return self.r_proj(r).view(-1, c.n_heads, c.head_dim).transpose(0, 1)  # [N, h*dk] -> [h, N, dk]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        h = self.config.n_heads
        distance = relative_distance(q_pos, k_pos)  # [Tq, Tk]
        d_min, d_max = int(distance.min()), int(distance.max())
        rel = torch.arange(d_min, d_max + 1, device=q.device)  # [N] every distance present
        r = self.projected_r(rel).float()  # [h, N, dk]
        qf = q.float()
        position_term = torch.matmul(qf + self.v.float()[None, :, None, :], r.transpose(-1, -2))  # (b)+(d): [B, h, Tq, N]
        index = (distance - d_min).expand(qf.shape[0], h, -1, -1)  # [B, h, Tq, Tk]
        position_term = torch.gather(position_term, -1, index)  # [B, h, Tq, Tk]
        kf = k.float()
        if kf.shape[1] != h:  # GQA: each query head reads its kv head
            kf = kf.repeat_interleave(h // kf.shape[1], dim=1)
        content_term = torch.einsum("hd,bhkd->bhk", self.u.float(), kf)[:, :, None, :]  # (c): [B, h, 1, Tk]
        return (position_term + content_term) * scale
