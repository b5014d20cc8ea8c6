"""Transformer-XL relative position encoding.

Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context"
(https://arxiv.org/abs/1901.02860). The logit of query ``i`` and key ``j`` is

    (a) q_i.k_j  +  (b) q_i.W_R R_{i-j}  +  (c) u.k_j  +  (d) v.W_R R_{i-j}

with ``R`` the sinusoidal code of the distance ``i - j``, ``W_R`` a learned projection (one per layer,
the paper's ``W^n_{k,R}``) and ``u, v`` learned per-head vectors (shared by the layers). Attention
computes (a); this scheme returns (b)+(c)+(d), scaled like (a). The segment-level recurrence the
paper pairs it with is a model mechanism (:mod:`poslab.nn.memory`).
The paper computes (b)+(d) with a "relative shift" of a ``[T, T+M]`` matrix; :func:`rel_shift`
implements it, and :class:`TransformerXL` gathers by distance, which also handles arbitrary
positions (KV cache, offsets). The tests check that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import is_int, non_negative_int
from poslab.nn.positions import register
from poslab.nn.positions.absolute import sinusoid_table
from poslab.nn.positions.base import (
    PositionScheme,
    check_init_std,
    check_positive,
    check_wavelength_base,
    relative_distance,
)


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
        n_layer: layers of the model, one ``W_R`` each (filled in by the model; 1 for a standalone scheme).
        base: sinusoid base.
        init_std: normal initialisation of ``W_R``, ``u`` and ``v``.
    """

    n_embd: int = 128
    n_heads: int = 4
    head_dim: int = 32
    n_layer: int = 1
    base: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if not is_int(self.n_layer):
            raise TypeError(f"xl n_layer must be an integer, got {self.n_layer!r}")
        for key in ("n_embd", "n_heads", "head_dim", "n_layer", "base"):
            check_positive(key, getattr(self, key))
        if self.n_embd % 2:
            raise ValueError(f"xl n_embd must be even (sinusoidal R), got {self.n_embd}")
        check_wavelength_base("base", self.base, self.n_embd)
        check_init_std(self.init_std)


@register
class TransformerXL(PositionScheme):
    """Transformer-XL relative encoding (Dai et al. 2019, https://arxiv.org/abs/1901.02860).

    One ``W_R`` per layer (the paper's ``W^n_{k,R}``, appendix B: ``r_proj[n]``) and one ``u, v``
    shared by all layers (tied across layers, as in the official code). The hooks of this object are
    layer 0's; :meth:`for_layer` gives layer ``n``'s view (``GPT.layer_position(n)`` returns it).
    Checkpoints from before the per-layer ``W_R`` (one ``r_proj.weight``) load with that matrix
    copied into every layer's.
    """

    name = "xl"
    config_class = XLConfig
    relative = True
    paper = "Dai et al. 2019, https://arxiv.org/abs/1901.02860"
    #: the layer whose ``W_R`` the hooks use (a :class:`_XLLayer` view sets its own)
    layer: int = 0

    def __init__(self, config: XLConfig) -> None:
        super().__init__(config)
        h, dk = config.n_heads, config.head_dim
        self.r_proj = nn.ModuleList(nn.Linear(config.n_embd, h * dk, bias=False) for _ in range(config.n_layer))
        self.u = nn.Parameter(torch.randn(h, dk) * config.init_std)  # content bias
        self.v = nn.Parameter(torch.randn(h, dk) * config.init_std)  # position bias
        for proj in self.r_proj:
            nn.init.normal_(proj.weight, std=config.init_std)

    def for_layer(self, i: int) -> PositionScheme:
        """Layer ``i``'s view: its own ``W_R`` (``r_proj[i]``), the shared ``u, v``; layer 0 is ``self``.

        The view holds no parameters of its own (it reads this module's), so a model's ``state_dict``
        has each parameter once; views are made once per layer and kept.
        """
        n = len(self.r_proj)
        non_negative_int(
            "xl layer index", i, maximum=n - 1, rule=f"an integer in [0, {n}) (the scheme has n_layer={n})"
        )
        if i == self.layer:
            return self
        views = self.__dict__.setdefault("_layer_views", {})  # a plain dict: views are not submodules
        if i not in views:
            views[i] = _XLLayer(self, i)
        return views[i]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        """Load; a pre-per-layer checkpoint's single ``r_proj.weight`` fills every layer's ``W_R``."""
        shared = state_dict.pop(prefix + "r_proj.weight", None)
        if shared is not None:
            for i in range(len(self.r_proj)):
                state_dict.setdefault(f"{prefix}r_proj.{i}.weight", shared)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def bias_note(self) -> str:
        return " (with q = 0: terms (c) and (d) only)"

    def projected_r(self, distances: Tensor) -> Tensor:
        """``W_R R_d`` for distances ``[N]`` -> ``[h, N, d_k]``."""
        c = self.config
        proj = self.r_proj[self.layer]  # this layer's W_R
        r = sinusoid_table(distances, c.n_embd, c.base).to(proj.weight.dtype)  # [N, d]
        return proj(r).view(-1, c.n_heads, c.head_dim).transpose(0, 1)  # [N, h*dk] -> [h, N, dk]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        h = self.config.n_heads
        distance = relative_distance(q_pos, k_pos)  # [Tq, Tk]
        d_min, d_max = int(distance.min()), int(distance.max())
        rel = torch.arange(d_min, d_max + 1, device=q.device)  # [N] every distance present
        r = self.projected_r(rel).float()  # [h, N, dk]
        qf = q.float()
        position_term = torch.matmul(
            qf + self.v.float()[None, :, None, :], r.transpose(-1, -2)
        )  # (b)+(d): [B, h, Tq, N]
        index = (distance - d_min).expand(qf.shape[0], h, -1, -1)  # [B, h, Tq, Tk]
        position_term = torch.gather(position_term, -1, index)  # [B, h, Tq, Tk]
        kf = k.float()
        if kf.shape[1] != h:  # GQA: each query head reads its kv head
            kf = kf.repeat_interleave(h // kf.shape[1], dim=1)
        content_term = torch.einsum("hd,bhkd->bhk", self.u.float(), kf)[:, :, None, :]  # (c): [B, h, 1, Tk]
        return (position_term + content_term) * scale


class _XLLayer(TransformerXL):
    """Layer ``n``'s view of a :class:`TransformerXL`: ``r_proj[n]`` and the shared ``u, v`` of its parent.

    Not registered (the registry holds :class:`TransformerXL`), and not a submodule of anything: the
    parent is kept outside the module tree, so its parameters appear once in a model's ``state_dict``.
    """

    def __init__(self, parent: TransformerXL, layer: int) -> None:
        PositionScheme.__init__(self, parent.config)
        self.__dict__["_parent"] = parent  # not nn.Module.__setattr__: no submodule
        self.layer = layer

    @property
    def r_proj(self) -> nn.ModuleList:  # type: ignore[override]
        return self._parent.r_proj

    @property
    def u(self) -> nn.Parameter:  # type: ignore[override]
        return self._parent.u

    @property
    def v(self) -> nn.Parameter:  # type: ignore[override]
        return self._parent.v

    def for_layer(self, i: int) -> PositionScheme:
        return self._parent.for_layer(i)
