"""Forgetting Transformer (FoX): a data-dependent decay bias.

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate"
(https://arxiv.org/abs/2503.02130). Every head has a scalar forget gate per token,
``f_t = sigmoid(w . x_t + b)``, and the logit of query ``i`` and key ``j <= i`` gets
``D_ij = sum_{l = j+1..i} log f_l`` -- a learned, data-dependent ALiBi (constant ``f`` is ALiBi with
slope ``-log f``). The paper uses no other position encoding.

poslab's hooks see queries and keys, not the residual stream ``x``: here the gate reads each token
through its key, ``f_l = sigmoid(w_h . k_l + b_h)`` (``k_l`` is a linear map of ``x_l``, so this is
the paper's gate restricted to the key subspace, one ``w_h [d_k]`` and ``b_h`` per query head).
Sums run over positions, so cached keys stored in any order give the same bias. Without ``causal``
the bias is ``-|c_i - c_j|`` with ``c`` the running sum of ``log f`` (decay in both directions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, check_positive


@dataclass
class ForgettingConfig:
    """Config of :class:`ForgettingGate`.

    Attributes:
        n_heads, head_dim: attention geometry (filled in by the model).
        bias_init: initial gate bias ``b`` (``sigmoid(3) = 0.95``: a slow start, about ALiBi's 0.05 slope).
        bidirectional: decay both ways (filled in by the model).
    """

    n_heads: int = 4
    head_dim: int = 64
    bias_init: float = 3.0
    bidirectional: bool = False

    def __post_init__(self) -> None:
        check_positive("n_heads", self.n_heads)
        check_positive("head_dim", self.head_dim)


@register
class ForgettingGate(PositionScheme):
    """FoX's forget-gate decay bias (Lin et al. 2025, https://arxiv.org/abs/2503.02130), gate read from the keys."""

    name = "fox"
    config_class = ForgettingConfig
    relative = True
    paper = "Lin et al. 2025, https://arxiv.org/abs/2503.02130"

    def __init__(self, config: ForgettingConfig) -> None:
        super().__init__(config)
        self.gate_weight = nn.Parameter(torch.randn(config.n_heads, config.head_dim) * config.head_dim**-0.5)
        self.gate_bias = nn.Parameter(torch.full((config.n_heads,), float(config.bias_init)))

    def log_forget(self, k: Tensor) -> Tensor:
        """``log f_l`` per query head ``[B, h, Tk]`` fp32 from keys ``[B, h_kv, Tk, d_k]``."""
        h = self.config.n_heads
        kf = k.float()
        if kf.shape[1] != h:  # GQA: each query head reads its kv head
            kf = kf.repeat_interleave(h // kf.shape[1], dim=1)
        logits = torch.einsum("bhtd,hd->bht", kf, self.gate_weight.float()) + self.gate_bias.float()[None, :, None]
        return F.logsigmoid(logits)  # [B, h, Tk]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        order = torch.argsort(k_pos, stable=True)
        sorted_pos = k_pos[order]
        log_f = self.log_forget(k)[..., order]  # [B, h, Tk]: log f at each key, in position order
        if self.config.bidirectional:
            running = log_f.cumsum(-1)  # c at each key, in position order
            c_k = torch.empty_like(running).scatter_(-1, order.expand_as(running), running)  # back to storage order
            # c at each query: the running sum up to the last key at or before its position
            at = (torch.searchsorted(sorted_pos, q_pos, right=True) - 1).clamp(min=0)  # [Tq]
            c_q = running[..., at]  # [B, h, Tq]
            return -(c_q[..., :, None] - c_k[..., None, :]).abs()  # [B, h, Tq, Tk]
        # causal: sum_{pos_j < pos_l <= pos_i} log f_l summed from l = i downwards, so each entry depends on
        # the gates between j and i only, bitwise (a running sum's difference c_i - c_j would carry the
        # rounding of every earlier gate into windows that never see them)
        seen = sorted_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]: keys at or before each query
        masked = torch.where(seen, log_f[..., None, :], log_f.new_zeros(()))  # [B, h, Tq, Tk]
        from_the_end = masked.flip(-1).cumsum(-1).flip(-1)  # [..., m] = sum over l >= m
        after = torch.cat((from_the_end[..., 1:], torch.zeros_like(from_the_end[..., :1])), dim=-1)  # sum over l > m
        return torch.empty_like(after).scatter_(-1, order.expand_as(after), after)  # [B, h, Tq, Tk], storage order
