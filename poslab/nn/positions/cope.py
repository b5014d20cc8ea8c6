"""CoPE: contextual position encoding.

Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's Important"
(https://arxiv.org/abs/2405.18719). Positions are counted by the content instead of by tokens:
each query ``i`` gates every key ``g_ij = sigmoid(q_i . k_j * scale)`` and the contextual position of
key ``j`` is ``p_ij = sum_{t = j..i} g_it`` (a gated count of the keys between them, a real number).
Position embeddings ``e[0..npos_max-1]`` are interpolated at ``p_ij`` and the logit gets
``q_i . e[p_ij] = (1 - w) q_i . e[floor p] + w q_i . e[ceil p]``, ``w = p - floor p``; ``p`` is clipped
at ``npos_max - 1``. As in the paper's code the gates use the scaled logits, the counts are causal
(only keys ``t <= i``; without ``causal`` a key ``j > i`` counts ``i <= t <= j``) and the embedding table is
one ``[d_k, npos_max]`` matrix shared by the heads (one per model in poslab, like the other schemes).

Only positions' *order* enters (which keys lie between ``j`` and ``i``), so CoPE is shift-invariant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, check_init_std, check_positive


@dataclass
class CoPEConfig:
    """Config of :class:`CoPE`.

    Attributes:
        head_dim: per-head width (filled in by the model).
        npos_max: number of position embeddings (contextual positions are clipped below it).
        bidirectional: also position keys after the query, counting ``i <= t <= j`` (filled in by the model).
        init_std: normal initialisation of the embeddings. The paper's code starts them at zero, which
            makes a fresh model exactly NoPE; 0 reproduces that.
    """

    head_dim: int = 64
    npos_max: int = 64
    bidirectional: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_positive("head_dim", self.head_dim)
        check_positive("npos_max", self.npos_max)
        check_init_std(self.init_std)


@register
class CoPE(PositionScheme):
    """Contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719)."""

    name = "cope"
    config_class = CoPEConfig
    relative = True
    has_bias = True
    paper = "Golovneva et al. 2024, https://arxiv.org/abs/2405.18719"

    def __init__(self, config: CoPEConfig) -> None:
        super().__init__(config)
        self.pos_emb = nn.Parameter(torch.randn(config.head_dim, config.npos_max) * config.init_std)  # [d_k, npos_max]

    def contextual_positions(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        """``p_ij`` ``[B, h, Tq, Tk]`` fp32 (clipped at ``npos_max - 1``)."""
        qf, kf = q.float(), k.float()
        if kf.shape[1] != qf.shape[1]:  # GQA: each query head reads its kv head
            kf = kf.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1)
        gates = torch.sigmoid(torch.matmul(qf, kf.transpose(-1, -2)) * scale)  # [B, h, Tq, Tk]
        past = (k_pos[None, :] <= q_pos[:, None]).to(gates.dtype)  # [Tq, Tk]: keys t <= i
        order = torch.argsort(k_pos, stable=True)  # the count runs over positions, whatever the storage order
        counts = (gates * past)[..., order].flip(-1).cumsum(-1).flip(-1)  # sum over j <= t <= i (sorted keys)
        if self.config.bidirectional:  # keys after i: count i <= t <= j
            future = (k_pos[None, :] >= q_pos[:, None]).to(gates.dtype)
            ahead = (gates * future)[..., order].cumsum(-1)
            counts = torch.where(past[:, order].bool(), counts, ahead)
        positions = torch.empty_like(counts).scatter_(-1, order.expand_as(counts), counts)  # back to storage order
        return positions.clamp(max=self.config.npos_max - 1)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        p = self.contextual_positions(q, k, q_pos, k_pos, scale)  # [B, h, Tq, Tk]
        logits = torch.matmul(q.float(), self.pos_emb.float())  # [B, h, Tq, npos_max]: q_i . e[n] for every n
        floor = p.floor()
        w = p - floor
        lo = torch.gather(logits, -1, floor.long())  # [B, h, Tq, Tk]
        hi = torch.gather(logits, -1, p.ceil().long())
        return lo * (1 - w) + hi * w
