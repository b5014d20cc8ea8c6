"""The two frozen settings objects around :func:`~poslab.nn.attention.core.attend`.

* :class:`AttentionConfig`: everything a :class:`~poslab.nn.attention.module.MultiHeadAttention`
  layer is built with besides its geometry and position scheme (the mechanisms, QK-norm,
  temperature tuning, the backend and the blocked path's thresholds), validated once.
* :class:`AttendOptions`: how one :func:`attend` call runs (backend, dropout, weights, blocking,
  probe); what it computes is the call's :class:`~poslab.nn.attention.spec.AttentionSpec`.

The names are the same at every layer: a field of :class:`AttentionConfig` has the name of the
:class:`AttentionSpec` or :class:`AttendOptions` field it feeds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from torch import Tensor

from poslab.nn.attention.backends import check_backend_name
from poslab.nn.attention.inputs import validate_temperature_tuning
from poslab.nn.attention.spec import check_mechanisms, check_scale, validate_window

#: queries per block in the blocked path
DEFAULT_QUERY_CHUNK = 128
#: key count from which the blocked path recomputes float biases in backward instead of keeping them
DEFAULT_RECOMPUTE_THRESHOLD = 2048


def check_positive_int(name: str, value: Any) -> None:
    """``ValueError`` unless ``value`` is a positive ``int`` (a ``bool`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """``TypeError`` unless ``value`` is a ``bool``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_dropout(value: Any) -> None:
    """``ValueError`` unless ``value`` is a probability in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {value!r}")


@dataclasses.dataclass(frozen=True)
class AttendOptions:
    """How one :func:`~poslab.nn.attention.core.attend` call runs (not what it computes).

    Attributes:
        backend: ``auto`` or a registered backend (``sdpa``, ``eager``, ``flex``).
        dropout: attention-weight dropout probability (0 at eval).
        need_weights: also return the ``[B, h, Tq, Tk]`` fp32 weights (forces ``eager``).
        query_chunk: the blocked path's query block (it runs when there are more queries than this).
        recompute_threshold: key count from which blocks recompute float biases in backward.
        probe: applied to the eager weights (a hook point for visualisation).
        increasing: the caller knows ``q_pos`` is strictly increasing (``True``: the model made it with
            ``arange``); ``None`` = look at the values. Lets ``torch.compile`` trace the fused causal
            path without a data-dependent branch (a graph break).
    """

    backend: str = "auto"
    dropout: float = 0.0
    need_weights: bool = False
    query_chunk: int = DEFAULT_QUERY_CHUNK
    recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD
    probe: Callable[[Tensor], Tensor] | None = None
    increasing: bool | None = None

    def __post_init__(self) -> None:
        check_backend_name(self.backend)
        check_dropout(self.dropout)
        check_flag("need_weights", self.need_weights)
        check_positive_int("query_chunk", self.query_chunk)
        check_positive_int("recompute_threshold", self.recompute_threshold)
        if self.increasing is not None:
            check_flag("increasing", self.increasing)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """A :class:`~poslab.nn.attention.module.MultiHeadAttention` layer's attention settings.

    Attributes:
        causal: mask future keys (by position).
        window: sliding window ``W``: query ``i`` sees keys ``j`` with ``i - W < j <= i``
            (Mistral; ``|i - j| < W`` when not causal).
        chunk: chunked local attention: query ``i`` sees keys ``j`` with ``j // C == i // C`` (Llama 4).
        softcap: attention-logit soft-capping ``c * tanh(s / c)`` (Gemma 2, https://arxiv.org/abs/2408.00118);
            eager and flex only (``auto`` picks one, an explicit ``sdpa`` is refused).
        scale: softmax scale (``None``: ``1/sqrt(d_k)``).
        sinks: a learned per-head sink logit in the softmax denominator (gpt-oss; Xiao et al. 2023,
            https://arxiv.org/abs/2309.17453), parameter ``sinks [h]``.
        dropout: attention-weight dropout (training only).
        qk_norm: RMSNorm over ``d_k`` on every query and key head before ``rotate`` (Qwen3, Gemma 3;
            Dehghani et al. 2023, https://arxiv.org/abs/2302.05442); modules ``q_norm``/``k_norm``.
        qk_norm_eps: epsilon of those norms.
        qk_norm_affine: learned gains on them (False: Llama 4's weightless L2 norm).
        temperature_tuning: ``(floor_scale, attn_scale)``: queries at position ``p`` are multiplied by
            ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` after ``rotate`` (Llama 4's
            attention-temperature tuning on its NoPE layers).
        backend: ``"auto"``, ``"sdpa"``, ``"eager"``, ``"flex"`` or a registered backend.
        query_chunk: query block size of the blocked path (biases, masks and windows on more
            queries than this run in blocks).
        recompute_threshold: key count from which blocked float biases are recomputed in backward
            (memory linear in ``T``) rather than kept.
    """

    causal: bool = True
    window: int | None = None
    chunk: int | None = None
    softcap: float | None = None
    scale: float | None = None
    sinks: bool = False
    dropout: float = 0.0
    qk_norm: bool = False
    qk_norm_eps: float = 1e-6
    qk_norm_affine: bool = True
    temperature_tuning: tuple[float, float] | None = None
    backend: str = "auto"
    query_chunk: int = DEFAULT_QUERY_CHUNK
    recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("causal", "sinks", "qk_norm", "qk_norm_affine"):
            check_flag(name, getattr(self, name))
        validate_window(self.window)
        check_mechanisms(0, self.softcap, None, self.chunk)
        check_scale(self.scale)
        check_dropout(self.dropout)
        eps = self.qk_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
            raise ValueError(f"qk_norm_eps must be a positive number, got {eps!r}")
        check_backend_name(self.backend)
        check_positive_int("query_chunk", self.query_chunk)
        check_positive_int("recompute_threshold", self.recompute_threshold)
        object.__setattr__(self, "temperature_tuning", validate_temperature_tuning(self.temperature_tuning))
        if self.softcap is not None:
            object.__setattr__(self, "softcap", float(self.softcap))

    def with_(self, **changes: Any) -> AttentionConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


def require_config(value: Any) -> AttentionConfig:
    """``value`` if it is an :class:`AttentionConfig`, else ``TypeError`` naming what came instead."""
    if not isinstance(value, AttentionConfig):
        raise TypeError(f"attention must be an AttentionConfig, got {type(value).__name__}")
    return value
