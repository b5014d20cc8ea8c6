"""One attention call's tensors and per-call options (:class:`Call`): what every backend and the blocked
path read besides the :class:`~poslab.nn.attention.spec.AttentionSpec`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from poslab.nn.attention.spec import AttentionSpec


@dataclasses.dataclass
class Call:
    """The tensors and per-call options of one attention call (what the spec does not fix).

    Attributes:
        q: ``[B, h, Tq, d_k]``; k: ``[B, h_kv, Tk, d_k]``; v: ``[B, h_kv, Tk, d_v]``.
        q_pos, k_pos: ``[Tq]``, ``[Tk]`` integer positions.
        attn_mask: checked ``[B|1, h|1, Tq, Tk]`` mask (bool keep or float added) or ``None``.
        scale: the softmax scale.
        dropout: attention-weight dropout probability.
        need_weights: return the ``[B, h, Tq, Tk]`` fp32 weights.
        probe: applied to the eager weights.
        query_chunk: the blocked path's query block.
        recompute_threshold: key count from which blocks recompute their tiles in backward.
        increasing: ``q_pos`` known strictly increasing (``None`` = look at the values).
        device_type: overrides ``q.device.type`` (see :attr:`device`).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    q_pos: Tensor
    k_pos: Tensor
    attn_mask: Tensor | None = None
    scale: float = 1.0
    dropout: float = 0.0
    need_weights: bool = False
    probe: Callable[[Tensor], Tensor] | None = None
    query_chunk: int = 128
    recompute_threshold: int = 2048
    increasing: bool | None = None
    device_type: str = ""

    @property
    def device(self) -> str:
        """The call's device type (``device_type`` when set: resolving for a device without tensors on it)."""
        return self.device_type or self.q.device.type

    def records_grad(self, spec: AttentionSpec) -> bool:
        """Whether autograd would record this call."""
        tensors = (self.q, self.k, self.v) + ((spec.sinks,) if spec.sinks is not None else ())
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def one_run(self, spec: AttentionSpec) -> bool:
        """Causal, and q and k share one increasing run of positions: SDPA's ``is_causal`` is exact."""
        q_pos, k_pos = self.q_pos, self.k_pos
        return (
            spec.causal
            and q_pos.shape[0] == k_pos.shape[0]
            and (q_pos is k_pos or torch.equal(q_pos, k_pos))
            and (self.increasing if self.increasing is not None else _increasing(q_pos))
        )

    def sorted(self) -> bool:
        return _sorted(self.q_pos) and _sorted(self.k_pos)


def _sorted(pos: Tensor) -> bool:
    return pos.numel() <= 1 or bool((pos[1:] >= pos[:-1]).all())


def _increasing(pos: Tensor) -> bool:
    return pos.numel() <= 1 or bool((pos[1:] > pos[:-1]).all())


__all__ = ["Call"]
