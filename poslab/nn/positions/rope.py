"""Rotary position embedding (RoPE) and its context-extension scalings; xPos.

RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(https://arxiv.org/abs/2104.09864). Pairs of query/key coordinates are rotated by ``pos * inv_freq_i``
with ``inv_freq_i = base^(-2i/d)``, so ``<R_m q, R_n k>`` depends only on ``n - m``.

Layouts:
    * ``half``: pairs ``(i, i + d/2)`` -- GPT-NeoX, Hugging Face Llama ``rotate_half``, seed 000's code.
    * ``interleaved``: pairs ``(2i, 2i + 1)`` -- RoFormer, GPT-J ``rotate_every_two``, Meta's Llama.

Scalings (one function each in :data:`ROPE_SCALINGS`, all returning ``(inv_freq, attention_factor)``;
the attention factor multiplies cos and sin, so logits scale by its square, as in transformers):
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, check_choice, check_positive

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
        original_max_len: the training context ``L0`` the scaling extends from
            (HF ``original_max_position_embeddings``; for ``dynamic`` HF's ``max_position_embeddings``).
        beta_fast, beta_slow: YaRN ramp boundaries in rotations (32 and 1).
        yarn_truncate: floor/ceil the YaRN correction range (HF default ``True``).
        mscale, mscale_all_dim: DeepSeek-style YaRN attention-factor knobs.
        attention_factor: override the scaling's attention factor (YaRN/LongRoPE).
        low_freq_factor, high_freq_factor: Llama 3 band edges.
        short_factor, long_factor: LongRoPE per-frequency divisors (``rotary_dim/2`` values each).
        logn_scaling: scale queries by ``log(n)/log(original_max_len)`` for positions past
            ``original_max_len`` (Chiang & Cholak 2022, https://arxiv.org/abs/2202.12172).
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
                f"llama3 needs high_freq_factor > low_freq_factor, got {self.high_freq_factor} <= {self.low_freq_factor}"
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

    @property
    def dim(self) -> int:
        """The rotary dim (``rotary_dim`` or ``head_dim``)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


# ------------------------------------------------------------------------------------ scalings
def default_inv_freq(base: float, dim: int, device: torch.device | None = None) -> Tensor:
    """``inv_freq_i = 1 / base^(2i/dim)``, ``[dim/2]`` fp32 (bit-equal to transformers)."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    return 1.0 / (base**exponent)


def _scale_default(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    return default_inv_freq(cfg.base, cfg.dim, device), 1.0


def _scale_linear(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """Position interpolation: ``m -> m / s`` (Chen et al. 2023)."""
    return default_inv_freq(cfg.base, cfg.dim, device) / cfg.factor, 1.0


def _scale_ntk(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """Static NTK-aware: ``base' = base * s^(d/(d-2))``."""
    d = cfg.dim
    return default_inv_freq(cfg.base * cfg.factor ** (d / (d - 2)), d, device), 1.0


def _scale_dynamic(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """Dynamic NTK: ``base' = base * (s*L/L0 - (s-1))^(d/(d-2))`` with ``L = max(seq_len, L0)``."""
    d, l0 = cfg.dim, cfg.original_max_len
    length = max(seq_len, l0)
    base = cfg.base * ((cfg.factor * length / l0) - (cfg.factor - 1)) ** (d / (d - 2))
    return default_inv_freq(base, d, device), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(cfg: RopeConfig) -> tuple[float, float]:
    """YaRN's ``(low, high)`` dimension bounds for ``beta_fast``/``beta_slow``."""
    d, base, l0 = cfg.dim, cfg.base, cfg.original_max_len

    def corr(rotations: float) -> float:
        return (d * math.log(l0 / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(cfg.beta_fast), corr(cfg.beta_slow)
    if cfg.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def _scale_yarn(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """YaRN: ramp between extrapolation (high frequencies) and interpolation (low frequencies)."""
    d, s = cfg.dim, cfg.factor
    if cfg.attention_factor is not None:
        attention_factor = cfg.attention_factor
    elif cfg.mscale and cfg.mscale_all_dim:
        attention_factor = float(yarn_mscale(s, cfg.mscale) / yarn_mscale(s, cfg.mscale_all_dim))
    else:
        attention_factor = yarn_mscale(s)
    pos_freqs = cfg.base ** (torch.arange(0, d, 2, device=device).to(torch.float32) / d)
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (s * pos_freqs)
    low, high = yarn_correction_range(cfg)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = (1 - ramp).to(device=device)  # 1 below `low`: keep the frequency
    inv = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight
    return inv, attention_factor


def _scale_llama3(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """Llama 3.1: keep short wavelengths, divide long ones by ``s``, blend in between."""
    inv = default_inv_freq(cfg.base, cfg.dim, device)
    s, l0 = cfg.factor, cfg.original_max_len
    low_wavelen = l0 / cfg.low_freq_factor
    high_wavelen = l0 / cfg.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s, inv)
    smooth = (l0 / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _scale_longrope(cfg: RopeConfig, seq_len: int, device: torch.device | None) -> tuple[Tensor, float]:
    """LongRoPE: per-frequency divisors, ``long_factor`` past ``L0`` else ``short_factor``."""
    s, l0 = cfg.factor, cfg.original_max_len
    if cfg.attention_factor is not None:
        attention_factor = cfg.attention_factor
    elif s <= 1.0:
        attention_factor = 1.0
    else:
        attention_factor = math.sqrt(1 + math.log(s) / math.log(l0))
    factors = cfg.long_factor if seq_len > l0 else cfg.short_factor
    ext = torch.tensor(factors, dtype=torch.float32, device=device)
    shape = torch.arange(0, cfg.dim, 2, dtype=torch.int64, device=device).float() / cfg.dim
    return 1.0 / (ext * cfg.base**shape), attention_factor


ScalingFn = Callable[[RopeConfig, int, "torch.device | None"], tuple[Tensor, float]]

#: One function per scaling, like transformers' ``ROPE_INIT_FUNCTIONS``.
ROPE_SCALINGS: dict[str | None, ScalingFn] = {
    None: _scale_default,
    "linear": _scale_linear,
    "ntk": _scale_ntk,
    "dynamic": _scale_dynamic,
    "yarn": _scale_yarn,
    "llama3": _scale_llama3,
    "longrope": _scale_longrope,
}

#: Scalings whose frequencies depend on the current sequence length.
LENGTH_DEPENDENT = ("dynamic", "longrope")


def rope_parameters(cfg: RopeConfig, seq_len: int | None = None, device: torch.device | None = None) -> tuple[Tensor, float]:
    """``(inv_freq [rotary_dim/2] fp32, attention_factor)`` for a config at a sequence length.

    ``seq_len`` (the largest position + 1) matters only for ``dynamic`` and ``longrope``; ``None``
    means "within the original window".
    """
    return ROPE_SCALINGS[cfg.scaling](cfg, seq_len if seq_len is not None else 0, device)


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
        grad_x = _rotate_into(torch.empty_like(grad, memory_format=torch.contiguous_format), grad, cos, -sin, ctx.layout)
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
    if cos.requires_grad or sin.requires_grad:  # angles that learn: let autograd see every op
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
        # both use the length of the current call (HF semantics for dynamic/longrope)
        seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1 if q_pos.numel() else 0
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


@register
class XPos(RoPE):
    """xPos (Sun et al. 2022, https://arxiv.org/abs/2212.10554): RoPE whose pair ``i`` decays as
    ``zeta_i^((n - m)/scale_base)`` with the query-key distance ``n - m``.

    Queries at position ``n`` are scaled by ``zeta^(n/scale_base)`` and keys at ``m`` by
    ``zeta^(-m/scale_base)`` (positions measured from 0, so cached keys stay valid).
    """

    name = "xpos"
    config_class = XPosConfig
    paper = "Sun et al. 2022, https://arxiv.org/abs/2212.10554"
    fp32_buffers = ("inv_freq", "zeta")

    def __init__(self, config: XPosConfig) -> None:
        super().__init__(config)
        d = config.dim
        zeta = (torch.arange(0, d, 2, dtype=torch.float32) / d + config.gamma) / (1 + config.gamma)
        self.register_buffer("zeta", zeta, persistent=False)  # [r/2]

    def _decay(self, pos: Tensor, sign: float) -> Tensor:
        exponent = sign * pos.to(torch.float32)[:, None] / self.config.scale_base  # [T, 1]
        return self.zeta.to(pos.device)[None, :] ** exponent  # [T, r/2]

    def cos_sin_scaled(self, pos: Tensor, seq_len: int, sign: float) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(pos, seq_len)
        decay = self._decay(pos, sign)
        return cos * decay, sin * decay

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1 if q_pos.numel() else 0
        q = apply_rotary(q, *self.cos_sin_scaled(q_pos, seq_len, 1.0), self.config.layout)
        k = apply_rotary(k, *self.cos_sin_scaled(k_pos, seq_len, -1.0), self.config.layout)
        if self.config.logn_scaling:
            q = q * self._logn(q_pos).to(q.dtype)
        return q, k
