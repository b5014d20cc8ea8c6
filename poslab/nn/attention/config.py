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
from collections.abc import Callable
from typing import Any

from torch import Tensor

from poslab.checks import is_number, positive_int, positive_number
from poslab.config_keys import reject_unknown_keys
from poslab.nn.attention.backends import check_backend_name
from poslab.nn.attention.inputs import validate_head_dim, validate_temperature_tuning
from poslab.nn.attention.spec import check_mechanisms, check_scale, validate_window

#: queries per block in the blocked path
DEFAULT_QUERY_CHUNK = 128
#: key count from which the blocked path recomputes float biases in backward instead of keeping them
DEFAULT_RECOMPUTE_THRESHOLD = 2048


#: the largest softmax scale / embedding scale / soft-cap (its inverse the smallest): scores of |q.k| ~ 1e4
#: and activations squared by the norms stay well inside fp32 (3.4e38, and above its 1.2e-38) between them
MAX_SCALE = 1e6


def check_fp32_factor(key: str, value: float | None) -> None:
    """Raise ``ValueError`` unless a positive factor of scores or activations lies in ``[1/MAX_SCALE, MAX_SCALE]``."""
    if is_number(value) and not 1 / MAX_SCALE <= value <= MAX_SCALE:
        raise ValueError(
            f"{key} must be at most {MAX_SCALE:g} and at least {1 / MAX_SCALE:g} (a larger factor "
            f"overflows fp32 scores or activations to inf, a smaller one underflows them to 0; "
            f"either gives NaN), got {value!r}"
        )


def check_flag(name: str, value: Any) -> None:
    """``TypeError`` unless ``value`` is a ``bool``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_dropout(value: Any) -> None:
    """``ValueError`` unless ``value`` is a probability in ``[0, 1)``."""
    if not is_number(value) or not 0.0 <= value < 1.0:
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
        positive_int("query_chunk", self.query_chunk)
        positive_int("recompute_threshold", self.recompute_threshold)
        if self.increasing is not None:
            check_flag("increasing", self.increasing)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """A :class:`~poslab.nn.attention.module.MultiHeadAttention` layer's attention settings; also
    :class:`~poslab.nn.gpt_config.GPTConfig`'s ``attention`` group (the same names at every layer).

    Three fields take ``None`` for "the model's value": inside a GPT they follow its ``dropout``,
    ``norm.eps`` and ``bias``; in a layer built on its own they are 0, 1e-6 and True
    (:meth:`resolved`).

    Attributes:
        causal: mask future keys (by position).
        window: sliding window ``W``: query ``i`` sees keys ``j`` with ``i - W < j <= i``
            (Mistral; ``|i - j| < W`` when not causal).
        chunk: chunked local attention: query ``i`` sees keys ``j`` with ``j // C == i // C`` (Llama 4).
        softcap: attention-logit soft-capping ``c * tanh(s / c)`` (Gemma 2, https://arxiv.org/abs/2408.00118);
            eager and flex only (``auto`` picks one, an explicit ``sdpa`` is refused).
        scale: softmax scale (``None``: ``1/sqrt(d_k)``; MPT's ``softmax_scale``).
        sinks: a learned per-head sink logit in the softmax denominator (gpt-oss; Xiao et al. 2023,
            https://arxiv.org/abs/2309.17453), parameter ``sinks [h]``.
        dropout: attention-weight dropout (training only; ``None``: the model's).
        qk_norm: RMSNorm over ``d_k`` on every query and key head before ``rotate`` (Qwen3, Gemma 3;
            Dehghani et al. 2023, https://arxiv.org/abs/2302.05442); modules ``q_norm``/``k_norm``.
        qk_norm_eps: epsilon of those norms (``None``: the model's norm epsilon).
        qk_norm_affine: learned gains on them (False: Llama 4's weightless L2 norm).
        temperature_tuning: ``(floor_scale, attn_scale)``: queries at position ``p`` are multiplied by
            ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` after ``rotate`` (Llama 4's
            attention-temperature tuning on its NoPE layers).
        head_dim: per-head width ``d_k`` (``None``: ``d_model // n_heads``; Gemma and Qwen3 decouple
            it: the projections are then ``d -> h*d_k`` and ``h*d_k -> d``).
        bias: biases on the qkv and output projections (``None``: the model's ``bias``).
        clip_qkv: clamp the fused q/k/v projection to ``[-clip_qkv, clip_qkv]`` (MPT).
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
    dropout: float | None = None
    qk_norm: bool = False
    qk_norm_eps: float | None = None
    qk_norm_affine: bool = True
    temperature_tuning: tuple[float, float] | None = None
    head_dim: int | None = None
    bias: bool | None = None
    clip_qkv: float | None = None
    backend: str = "auto"
    query_chunk: int = DEFAULT_QUERY_CHUNK
    recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("causal", "sinks", "qk_norm", "qk_norm_affine"):
            check_flag(name, getattr(self, name))
        if self.bias is not None:
            check_flag("bias", self.bias)
        validate_window(self.window)
        check_mechanisms(0, self.softcap, None, self.chunk)
        check_scale(self.scale)
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be a positive number or None, got {self.scale!r}")
        check_fp32_factor("scale", self.scale)
        check_fp32_factor("softcap", self.softcap)
        if self.dropout is not None:
            check_dropout(self.dropout)
        eps = self.qk_norm_eps
        if eps is not None:
            positive_number("qk_norm_eps", eps, rule="a positive number")
        if self.head_dim is not None:
            validate_head_dim(self.head_dim)
        clip = self.clip_qkv
        if clip is not None:
            positive_number("clip_qkv", clip, finite=False, rule="a positive number or None")
        check_backend_name(self.backend)
        positive_int("query_chunk", self.query_chunk)
        positive_int("recompute_threshold", self.recompute_threshold)
        object.__setattr__(self, "temperature_tuning", validate_temperature_tuning(self.temperature_tuning))
        if self.softcap is not None:
            object.__setattr__(self, "softcap", float(self.softcap))

    def with_(self, **changes: Any) -> AttentionConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def resolved(self, dropout: float = 0.0, qk_norm_eps: float = 1e-6, bias: bool = True) -> AttentionConfig:
        """This config with its ``None`` "the model's value" fields (dropout, QK-norm epsilon, bias) filled in."""
        return self.with_(
            dropout=dropout if self.dropout is None else self.dropout,
            qk_norm_eps=qk_norm_eps if self.qk_norm_eps is None else self.qk_norm_eps,
            bias=bias if self.bias is None else self.bias,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``temperature_tuning`` as a list)."""
        out = dataclasses.asdict(self)
        if out["temperature_tuning"] is not None:
            out["temperature_tuning"] = list(out["temperature_tuning"])
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any], prefix: str = "attention.") -> AttentionConfig:
        """Build from a dict; an unknown key raises ``ValueError`` suggesting the close key."""
        if not isinstance(values, dict):
            raise TypeError(f"{prefix.rstrip('.')} must be a mapping of AttentionConfig fields, got {values!r}")
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "attention key", prefix=prefix)
        return cls(**values)


def require_config(value: Any) -> AttentionConfig:
    """``value`` if it is an :class:`AttentionConfig`, else ``TypeError`` naming what came instead."""
    if not isinstance(value, AttentionConfig):
        raise TypeError(f"attention must be an AttentionConfig, got {type(value).__name__}")
    return value
