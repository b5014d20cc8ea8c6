"""Rotary position embedding (RoPE) and its context-extension scalings; xPos.

RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(https://arxiv.org/abs/2104.09864). Pairs of query/key coordinates are rotated by ``pos * inv_freq_i``
with ``inv_freq_i = base^(-2i/d)``, so ``<R_m q, R_n k>`` depends only on ``n - m``.

Layouts:
    * ``half``: pairs ``(i, i + d/2)`` -- GPT-NeoX, Hugging Face Llama ``rotate_half``, seed 000's code.
    * ``interleaved``: pairs ``(2i, 2i + 1)`` -- RoFormer, GPT-J ``rotate_every_two``, Meta's Llama.

Scalings (one :class:`~poslab.nn.positions.rope_scaling.Scaling` each in
:data:`~poslab.nn.positions.rope_scaling.ROPE_SCALINGS`, in :mod:`poslab.nn.positions.rope_scaling`).
:func:`parse_scaling` reads specs (``"yarn:4"``, dicts) and :func:`rescale` swaps a
config's scaling; ``poslab eval --rope-scaling`` uses both:
    * ``linear``: position interpolation, Chen et al. 2023 (https://arxiv.org/abs/2306.15595).
    * ``ntk``: static NTK-aware base change ``base * s^(d/(d-2))`` (bloc97, 2023,
      https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/).
    * ``dynamic``: dynamic NTK, the base grows with the current length (emozilla, 2023; HF ``dynamic``).
    * ``yarn``: Peng et al. 2023, "YaRN" (https://arxiv.org/abs/2309.00071).
    * ``llama3``: Llama 3.1's wavelength-banded scaling (Dubey et al. 2024, https://arxiv.org/abs/2407.21783).
    * ``longrope``: Ding et al. 2024, "LongRoPE" (https://arxiv.org/abs/2402.13753).

xPos: Sun et al. 2022, "A Length-Extrapolatable Transformer" (https://arxiv.org/abs/2212.10554).

Frequencies are computed in fp32 exactly as ``transformers==5.24.0`` ``modeling_rope_utils`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from poslab.nn.positions import register
from poslab.nn.positions.base import (
    MAX_FREQUENCY,
    PositionScheme,
    check_choice,
    check_positive,
    check_wavelength_base,
    view,
)
from poslab.nn.positions.rope_scaling import (  # noqa: F401  (the scalings' public names, re-exported)
    LENGTH_DEPENDENT,
    ROPE_SCALINGS,
    SCALING_KEYS,
    SPEC_NAMES,
    Scaling,
    check_scaling_given,
    check_scaling_keys,
    default_inv_freq,
    parse_scaling,
    rescale,
    rope_parameters,
    yarn_correction_range,
    yarn_mscale,
)

LAYOUTS = ("half", "interleaved")
SCALINGS = (None, "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


@dataclass
class RopeConfig:
    """Typed config of :class:`RoPE`.

    Attributes:
        head_dim: per-head width ``d_k`` (filled in by the model).
        base: frequency base ``theta`` (10000 in RoFormer, 500000 in Llama 3).
        layout: ``"half"`` or ``"interleaved"`` pairing of coordinates.
        rotary_dim: rotate only the first ``rotary_dim`` coordinates of each head (partial rotary,
            GPT-NeoX / GPT-J); ``None`` rotates all. Must be even.
        scaling: ``None`` or one of ``linear, ntk, dynamic, yarn, llama3, longrope``.
        factor: context-extension factor ``s`` (> 0).
        original_max_len: the training context ``L0`` the scaling (and ``logn_scaling``) extends from
            (HF ``original_max_position_embeddings``; for ``dynamic`` HF's ``max_position_embeddings``).
            One owner: a :class:`~poslab.nn.model.GPT` fills it with its ``block_size`` (the length
            it trains at) unless given, like ``head_dim``; 2048 is only the bare scheme's default.
        beta_fast, beta_slow: YaRN ramp boundaries in rotations (32 and 1).
        yarn_truncate: floor/ceil the YaRN correction range (HF default ``True``).
        mscale, mscale_all_dim: DeepSeek-style YaRN attention-factor knobs.
        attention_factor: override the scaling's attention factor (YaRN/LongRoPE).
        low_freq_factor, high_freq_factor: Llama 3 band edges.
        short_factor, long_factor: LongRoPE per-frequency divisors (``rotary_dim/2`` values each).
        logn_scaling: scale queries by ``log(n)/log(original_max_len)`` for positions past
            ``original_max_len`` (Chiang & Cholak 2022, https://arxiv.org/abs/2202.12172).

    Each scaling accepts only its own keys (:data:`ROPE_SCALINGS`): a key another scaling uses set to
    anything but its default (``scaling="linear", beta_fast=3``) is a ``ValueError`` listing what the
    scaling accepts.
    """

    head_dim: int = 64
    base: float = 10000.0
    layout: str = "half"
    rotary_dim: int | None = None
    scaling: str | None = None
    factor: float = 1.0
    original_max_len: int = 2048
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    yarn_truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    short_factor: list[float] | None = None
    long_factor: list[float] | None = None
    logn_scaling: bool = False

    def __post_init__(self) -> None:
        check_positive("head_dim", self.head_dim)
        check_positive("base", self.base)
        check_choice("layout", self.layout, LAYOUTS)
        check_choice("scaling", self.scaling, SCALINGS)
        check_positive("factor", self.factor)
        check_positive("original_max_len", self.original_max_len)
        rot = self.dim
        if rot % 2:
            label = "head_dim" if self.rotary_dim is None else "rotary_dim"
            raise ValueError(f"rotary dim must be even (RoPE rotates pairs of coordinates), got {label}={rot}")
        if rot > self.head_dim or rot <= 0:
            raise ValueError(f"rotary_dim must be in (0, head_dim={self.head_dim}], got {rot}")
        if self.scaling == "ntk" and rot <= 2:
            raise ValueError(f"ntk scaling needs rotary dim > 2 (the exponent is d/(d-2)), got {rot}")
        if self.scaling == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "llama3 needs high_freq_factor > low_freq_factor, "
                f"got {self.high_freq_factor} <= {self.low_freq_factor}"
            )
        if self.scaling == "longrope":
            for label, values in (("short_factor", self.short_factor), ("long_factor", self.long_factor)):
                if values is None or len(values) != rot // 2:
                    n = None if values is None else len(values)
                    raise ValueError(f"longrope {label} needs rotary_dim/2={rot // 2} values, got {n}")
                if any(not v > 0 for v in values):
                    raise ValueError(f"longrope {label} values must be > 0, got {values}")
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)
        check_scaling_keys(self)  # the value checks above name the more specific problem
        self._check_fp32_frequencies()

    def _check_fp32_frequencies(self) -> None:
        """The frequencies this config gives (fp32, on the CPU) must be finite and at most
        :data:`~poslab.nn.positions.base.MAX_FREQUENCY`; the attention factor finite and > 0.

        ``base=1e-300`` or ``factor=1e-300`` are legal numbers whose frequencies overflow fp32 to inf
        (then NaN angles and scores): refused here, with the rule, not found as a NaN loss later.
        """
        check_wavelength_base("base", self.base, self.dim)
        with torch.device("cpu"):  # a model config is validated under the meta device: values are needed here
            inv_freq, attention_factor = rope_parameters(self, device=torch.device("cpu"))
        largest = float(inv_freq.max()) if inv_freq.numel() else 0.0
        if not bool(torch.isfinite(inv_freq).all()) or largest > MAX_FREQUENCY:
            raise ValueError(
                f"RoPE scaling {self.scaling!r} with base={self.base!r}, factor={self.factor!r} gives "
                f"frequencies up to {largest:g} radians per position in fp32; they must be finite and at most "
                f"{MAX_FREQUENCY:g} (raise factor or base)"
            )
        if not math.isfinite(attention_factor) or not attention_factor > 0:
            raise ValueError(
                f"RoPE scaling {self.scaling!r} with factor={self.factor!r} gives attention factor "
                f"{attention_factor!r}; it must be a finite number > 0"
            )

    @property
    def dim(self) -> int:
        """The rotary dim (``rotary_dim`` or ``head_dim``)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


# ------------------------------------------------------------------------------------ rotation
def _rotate_into(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Write the rotation of ``x`` by angles with ``cos``/``sin`` into ``out`` (same shape): four
    elementwise kernels, no temporaries. Rotating by ``-sin`` is the inverse (and the transpose)."""
    half = cos.shape[-1]
    if layout == "half":
        x1, x2 = x[..., :half], x[..., half : 2 * half]  # [..., T, r/2] each
        o1, o2 = out[..., :half], out[..., half : 2 * half]
    else:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]  # even / odd coordinates
        o1, o2 = out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2]
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1.0)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)  # x2 cos + x1 sin
    if x.shape[-1] > 2 * half:  # partial rotary: the rest passes through
        out[..., 2 * half :].copy_(x[..., 2 * half :])
    return out


class _Rotary(torch.autograd.Function):
    """The rotation as one autograd node: the backward is the inverse rotation of the incoming
    gradient (a rotation's Jacobian is orthogonal), so nothing but ``cos``/``sin`` is saved."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        return _rotate_into(torch.empty_like(x, memory_format=torch.contiguous_format), x, cos, sin, layout)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        cos, sin = ctx.saved_tensors
        grad_x = _rotate_into(
            torch.empty_like(grad, memory_format=torch.contiguous_format), grad, cos, -sin, ctx.layout
        )
        return grad_x, None, None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` coordinates of ``x``; the rest pass through.

    Args:
        x: ``[..., T, d_k]``.
        cos, sin: ``[T, r/2]`` (already multiplied by any attention factor).
        layout: ``"half"`` pairs ``(i, i + r/2)``; ``"interleaved"`` pairs ``(2i, 2i + 1)``.

    Returns:
        ``[..., T, d_k]`` in ``x.dtype`` (contiguous).
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if (
        cos.requires_grad
        or sin.requires_grad
        or torch.compiler.is_compiling()
        or torch._C._functorch.is_batchedtensor(x)
    ):
        # angles that learn: let autograd see every op; under torch.compile the plain ops (inductor
        # fuses them) instead of the out= kernels, which dynamo cannot trace; under vmap (models
        # stacked with torch.func) the plain ops, which have batching rules
        return _rotary_reference(x, cos, sin, layout)
    return _Rotary.apply(x, cos, sin, layout)


def _rotary_reference(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """The rotation written with plain differentiable ops (used when the angles need gradients)."""
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if layout == "half":
        x1, x2 = rot[..., :half], rot[..., half:]  # [..., T, r/2] each
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # [..., T, r]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]  # even / odd coordinates, [..., T, r/2] each
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # [..., T, r/2, 2]
        out = out.flatten(-2)  # [..., T, r]
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


@register
class RoPE(PositionScheme):
    """Rotary position embedding with every context-extension scaling.

    Su et al. 2021, RoFormer (https://arxiv.org/abs/2104.09864); scalings cited in the module docstring.
    Angles are computed in fp32 from explicit positions; the rotation runs in the activations' dtype.
    """

    name = "rope"
    config_class = RopeConfig
    relative = True
    paper = "Su et al. 2021, https://arxiv.org/abs/2104.09864"
    fp32_buffers = ("inv_freq",)

    def __init__(self, config: RopeConfig) -> None:
        super().__init__(config)
        inv_freq, attention_factor = rope_parameters(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor

    @classmethod
    def check_config_keys(cls, given: dict[str, Any]) -> None:
        check_scaling_given(given)

    @classmethod
    def rescaled_config(
        cls,
        config: dict[str, Any],
        scaling: Any = None,
        *,
        logn_scaling: bool | None = None,
        original_max_len: int | None = None,
    ) -> dict[str, Any]:
        """See :func:`rescale` (the rotary schemes hold no trained parameters: weights stay valid)."""
        return rescale(config, scaling, logn_scaling=logn_scaling, original_max_len=original_max_len)

    def describe(self, T: int, n_heads: int | None = None, causal: bool = True) -> list[dict[str, Any]]:
        """RoPE's rotation ``cos(m theta_i)`` per position ``m`` and frequency pair ``i`` (scaling included)."""
        inv_freq, _ = self.frequencies(T)
        angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq.float().cpu()[None, :]  # [T, r/2]
        return [
            view(
                "RoPE rotation cos(m·θ_i)",
                angles.cos(),
                "position m",
                "frequency pair i",
                True,
                "each pair of q/k dimensions turns by m·θ_i; low pairs turn fast, high pairs slowly",
            )
        ]

    def frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` in effect for a sequence of ``seq_len`` positions."""
        if self.config.scaling in LENGTH_DEPENDENT:
            return rope_parameters(self.config, seq_len, self.inv_freq.device)
        return self.inv_freq, self.attention_factor

    def cos_sin(self, pos: Tensor, seq_len: int | None = None) -> tuple[Tensor, Tensor]:
        """fp32 ``cos, sin`` of shape ``[T, r/2]`` (attention factor included) for positions ``[T]``."""
        seq_len = int(pos.max()) + 1 if seq_len is None and pos.numel() else (seq_len or 0)
        inv_freq, attention_factor = self.frequencies(seq_len)
        angles = pos.to(torch.float32)[:, None] * inv_freq.to(pos.device)[None, :]  # [T, r/2]
        cos, sin = angles.cos(), angles.sin()
        if attention_factor != 1.0:
            cos, sin = cos * attention_factor, sin * attention_factor
        return cos, sin

    def _logn(self, pos: Tensor) -> Tensor:
        """Per-query logit multiplier ``max(1, log n / log L0)`` with ``n = pos + 1``, ``[T, 1]`` fp32."""
        n = pos.to(torch.float32) + 1
        return torch.clamp(torch.log(n) / math.log(self.config.original_max_len), min=1.0)[:, None]

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        # both use the length of the current call (HF semantics for dynamic/longrope); only those
        # scalings read it (computed lazily: a host sync, and a graph break under torch.compile)
        seq_len = 0
        if self.config.scaling in LENGTH_DEPENDENT and q_pos.numel():
            seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        cos_q, sin_q = self.cos_sin(q_pos, seq_len)
        cos_k, sin_k = (cos_q, sin_q) if k_pos is q_pos else self.cos_sin(k_pos, seq_len)
        q = apply_rotary(q, cos_q, sin_q, self.config.layout)
        k = apply_rotary(k, cos_k, sin_k, self.config.layout)
        if self.config.logn_scaling:
            q = q * self._logn(q_pos).to(q.dtype)
        return q, k


@dataclass
class XPosConfig(RopeConfig):
    """RoPE config plus xPos decay: ``zeta_i = (2i/d + gamma) / (1 + gamma)``.

    Attributes:
        scale_base: the decay length (512 in the paper).
        gamma: 0.4 in the paper.
    """

    scale_base: float = 512.0
    gamma: float = 0.4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("scale_base", self.scale_base)
        check_positive("gamma", self.gamma)
        tiny = torch.finfo(torch.float32).tiny
        if not math.isfinite(self.gamma) or self.gamma / (1 + self.gamma) < tiny:
            raise ValueError(
                f"xpos gamma={self.gamma!r}: its fastest decay zeta_0 = gamma/(1+gamma) must be a normal "
                f"fp32 number (>= {tiny:.3g}), else its scales are 0 and inf (NaN scores)"
            )
        if not math.isfinite(self.scale_base) or self.scale_base < 1:
            raise ValueError(
                f"xpos scale_base (the decay length, in positions) must be a finite number >= 1, got "
                f"{self.scale_base!r}: below 1 the fp32 scales overflow within a few positions"
            )


#: headroom between xPos's largest query/key scale and the dtype's largest finite value, for the
#: activations it multiplies (|q|, |k| up to 2^8 stay finite)
XPOS_HEADROOM = 2.0**8


@register
class XPos(RoPE):
    """xPos (Sun et al. 2022, https://arxiv.org/abs/2212.10554): RoPE whose pair ``i`` decays as
    ``zeta_i^((n - m)/scale_base)`` with the query-key distance ``n - m``.

    Queries at position ``n`` are scaled by ``zeta^((n - a)/scale_base)`` and keys at ``m`` by
    ``zeta^(-(m - a)/scale_base)``: the anchor ``a`` cancels in every score, so the scores are the
    paper's. The paper's form is ``a = 0``, whose key scale ``(1/zeta)^(m/scale_base)`` overflows fp32
    near position 36,000 (fp16 near 4,500). Here ``a`` is the middle of the positions of the call, so
    only the *span* of one call is bounded (about 68,000 positions in fp32/bf16 and 4,500 in fp16 with
    the defaults; beyond that :meth:`rotate` raises naming the positions and the dtype), never the
    absolute position. Because the anchor depends on every position of the call,
    ``rotate_needs_all_keys`` makes a KV cache store keys before ``rotate``: each call rotates the
    cached keys with the queries' anchor, so decoding equals the full pass.
    """

    name = "xpos"
    config_class = XPosConfig
    paper = "Sun et al. 2022, https://arxiv.org/abs/2212.10554"
    fp32_buffers = ("inv_freq", "zeta")
    rotate_needs_all_keys = True

    def __init__(self, config: XPosConfig) -> None:
        super().__init__(config)
        d = config.dim
        zeta = (torch.arange(0, d, 2, dtype=torch.float32) / d + config.gamma) / (1 + config.gamma)
        self.register_buffer("zeta", zeta, persistent=False)  # [r/2]

    def max_span(self, dtype: torch.dtype) -> int:
        """Largest ``max - min`` of the positions of one call whose scales stay finite in ``dtype``."""
        budget = math.log(torch.finfo(dtype).max / XPOS_HEADROOM)  # ln of the largest scale allowed
        zeta_min = (self.config.gamma) / (1 + self.config.gamma)  # pair 0: the fastest decay
        return int(2 * budget * self.config.scale_base / -math.log(zeta_min))

    def _decay(self, pos: Tensor, anchor: float, sign: float) -> Tensor:
        exponent = sign * (pos.to(torch.float64) - anchor).to(torch.float32)[:, None] / self.config.scale_base  # [T, 1]
        return self.zeta.to(pos.device)[None, :] ** exponent  # [T, r/2]

    def cos_sin_scaled(self, pos: Tensor, seq_len: int, sign: float, anchor: float = 0.0) -> tuple[Tensor, Tensor]:
        """``cos, sin [T, r/2]`` times the decay ``zeta^(sign (pos - anchor) / scale_base)`` (fp32)."""
        cos, sin = self.cos_sin(pos, seq_len)
        decay = self._decay(pos, anchor, sign)
        return cos * decay, sin * decay

    def anchor(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> float:
        """The middle of the call's positions; ``ValueError`` if their span cannot be scaled in ``dtype``."""
        if not q_pos.numel() and not k_pos.numel():
            return 0.0
        both = torch.cat((q_pos.reshape(-1), k_pos.reshape(-1)))
        lo, hi = int(both.min()), int(both.max())
        limit = self.max_span(dtype)
        if hi - lo > limit:
            raise ValueError(
                f"xpos cannot scale positions {lo}..{hi} in one call in {dtype}: "
                f"a span of {hi - lo} positions overflows "
                f"its query/key scales past {limit} (scale_base={self.config.scale_base}, gamma={self.config.gamma}); "
                "use float32/bfloat16, a larger scale_base or shorter calls"
            )
        return (lo + hi) / 2

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1 if q_pos.numel() else 0
        anchor = self.anchor(q_pos, k_pos, q.dtype)
        q = apply_rotary(q, *self.cos_sin_scaled(q_pos, seq_len, 1.0, anchor), self.config.layout)
        k = apply_rotary(k, *self.cos_sin_scaled(k_pos, seq_len, -1.0, anchor), self.config.layout)
        if self.config.logn_scaling:
            q = q * self._logn(q_pos).to(q.dtype)
        return q, k
