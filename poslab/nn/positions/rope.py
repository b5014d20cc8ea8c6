"""Rotary position embedding (RoPE) and its context-extension scalings; xPos.

RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"
(https://arxiv.org/abs/2104.09864). Pairs of query/key coordinates are rotated by ``pos * inv_freq_i``
with ``inv_freq_i = base^(-2i/d)``, so ``<R_m q, R_n k>`` depends only on ``n - m``.

Layouts:
    * ``half``: pairs ``(i, i + d/2)`` -- GPT-NeoX, Hugging Face Llama ``rotate_half``, seed 000's code.
    * ``interleaved``: pairs ``(2i, 2i + 1)`` -- RoFormer, GPT-J ``rotate_every_two``, Meta's Llama.

Scalings (one :class:`Scaling` each in :data:`ROPE_SCALINGS`: a function returning ``(inv_freq,
attention_factor)`` and the config keys it requires and accepts, as transformers validates per
``rope_type``; the attention factor multiplies cos and sin, so logits scale by its square, as in
transformers). :func:`parse_scaling` reads specs (``"yarn:4"``, dicts) and :func:`rescale` swaps a
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

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
from poslab.safe_load import load_json

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


@dataclass(frozen=True)
class Scaling:
    """One context-extension scaling: its frequency function and the config keys it reads.

    Attributes:
        fn: ``fn(cfg, seq_len, device) -> (inv_freq [r/2] fp32, attention_factor)``.
        required: keys a spec must give (``yarn:4`` gives ``factor``).
        optional: further keys it reads (each keeps its :class:`RopeConfig` default unless given).
        length_dependent: the frequencies depend on the current sequence length.
    """

    fn: ScalingFn
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    length_dependent: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return self.required + self.optional


#: One entry per scaling, like transformers' ``ROPE_INIT_FUNCTIONS`` plus its per-type key validation
#: (``modeling_rope_utils._validate_*_rope_parameters``). ``original_max_len`` is not a scaling key:
#: every RoPE model has a training context (``logn_scaling`` reads it too).
ROPE_SCALINGS: dict[str | None, Scaling] = {
    None: Scaling(_scale_default),
    "linear": Scaling(_scale_linear, ("factor",)),
    "ntk": Scaling(_scale_ntk, ("factor",)),
    "dynamic": Scaling(_scale_dynamic, ("factor",), length_dependent=True),
    "yarn": Scaling(
        _scale_yarn,
        ("factor",),
        ("beta_fast", "beta_slow", "yarn_truncate", "mscale", "mscale_all_dim", "attention_factor"),
    ),
    "llama3": Scaling(_scale_llama3, ("factor",), ("low_freq_factor", "high_freq_factor")),
    "longrope": Scaling(
        _scale_longrope, ("long_factor", "short_factor"), ("factor", "attention_factor"), length_dependent=True
    ),
}

#: Every key some scaling reads (replaced together when a new scaling is applied).
SCALING_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for s in ROPE_SCALINGS.values() for k in s.keys))

#: Scalings whose frequencies depend on the current sequence length.
LENGTH_DEPENDENT = tuple(name for name, s in ROPE_SCALINGS.items() if s.length_dependent)


def _scaling_label(name: str | None) -> str:
    return "no scaling" if name is None else f"scaling {name!r}"


def check_scaling_keys(cfg: RopeConfig) -> None:
    """``ValueError`` if a key of another scaling differs from its default (it would be silently ignored)."""
    entry = ROPE_SCALINGS[cfg.scaling]
    defaults = {f.name: f.default for f in dataclasses.fields(RopeConfig)}
    stray = [k for k in SCALING_KEYS if k not in entry.keys and getattr(cfg, k) != defaults[k]]
    if stray:
        accepted = ", ".join(entry.keys) or "no scaling keys"
        given = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in stray)
        raise ValueError(f"RoPE {_scaling_label(cfg.scaling)} does not use {given}; it accepts: {accepted}")


def check_scaling_given(given: dict[str, Any]) -> None:
    """``ValueError`` if a config dict names a scaling but lacks one of its required keys."""
    name = given.get("scaling")
    if name not in ROPE_SCALINGS:
        return  # RopeConfig refuses it, listing the known scalings
    missing = [k for k in ROPE_SCALINGS[name].required if k not in given]
    if missing:
        entry = ROPE_SCALINGS[name]
        raise ValueError(
            f"RoPE scaling {name!r} needs {', '.join(missing)}; it accepts: {', '.join(entry.keys)} "
            f"(e.g. {name}:4 for factor 4)"
        )


# ------------------------------------------------------------------------------ scaling specs
#: the spec words: a scaling name, or ``none`` for no scaling
SPEC_NAMES = ("none", *(name for name in ROPE_SCALINGS if name is not None))


def parse_scaling(spec: str | dict[str, Any] | None, what: str = "RoPE scaling") -> dict[str, Any]:
    """A scaling spec as RoPE config keys, checked against the scaling's own keys.

    Forms (``what`` names the spec's origin in error messages, e.g. ``"--rope-scaling"``):

    * ``None`` or ``"none"``: no scaling, ``{"scaling": None}``.
    * ``"NAME:FACTOR"``: ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3`` (e.g. ``"yarn:4"``).
    * ``"longrope:FACTOR:LONG[:SHORT]"``: comma-separated per-frequency divisors (``rotary_dim/2``
      each; ``SHORT`` defaults to all ones, plain RoPE inside the window).
    * ``"longrope:PATH.json"``: a JSON object with ``factor``, ``long_factor`` and optionally ``short_factor``.
    * a dict ``{"scaling": NAME, ...}`` with that scaling's keys (:data:`ROPE_SCALINGS`).

    Returns:
        ``{"scaling": NAME, <its keys>}``.

    Raises:
        ValueError: unknown scaling, a key the scaling does not accept or lacks, a factor that is
            not a number > 0, malformed LongRoPE lists.
    """
    if spec is None:
        return {"scaling": None}
    if isinstance(spec, dict):
        return _checked_spec(dict(spec), what)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{what} needs NAME:FACTOR (NAME one of {', '.join(SPEC_NAMES)}), got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.lower()
    if name == "none":
        if rest:
            raise ValueError(f"{what} none takes no factor, got {spec!r}")
        return {"scaling": None}
    if name not in ROPE_SCALINGS:
        raise ValueError(f"unknown RoPE scaling {name!r} in {what} {spec!r}; choose one of {', '.join(SPEC_NAMES)}")
    if not rest:
        raise ValueError(f"{what} {spec!r} needs a factor, e.g. {name}:4")
    if name == "longrope" and rest.endswith(".json"):
        return _longrope_from_json(Path(rest), spec, what)
    factor_text, _, lists = rest.partition(":")
    factor = _spec_factor(factor_text, spec, what)
    if name != "longrope":
        if lists:
            raise ValueError(f"{what} {spec!r}: {name} takes only a factor ({name}:FACTOR)")
        return {"scaling": name, "factor": factor}
    if not lists:
        raise ValueError(
            f"{what} {spec!r}: longrope needs per-frequency factors, "
            "longrope:FACTOR:l1,l2,...[:s1,s2,...] (rotary_dim/2 values each) or longrope:PATH.json"
        )
    long_text, _, short_text = lists.partition(":")
    long = _spec_floats(long_text, "long", spec, what)
    short = _spec_floats(short_text, "short", spec, what) if short_text else [1.0] * len(long)
    return {"scaling": "longrope", "factor": factor, "long_factor": long, "short_factor": short}


def _checked_spec(spec: dict[str, Any], what: str) -> dict[str, Any]:
    """A dict spec: known scaling, only its keys, its required keys present."""
    name = spec.get("scaling")
    if name not in ROPE_SCALINGS:
        raise ValueError(f"unknown RoPE scaling {name!r} in {what}; choose one of {', '.join(SPEC_NAMES)}")
    entry = ROPE_SCALINGS[name]
    stray = sorted(set(spec) - {"scaling", *entry.keys})
    if stray:
        raise ValueError(
            f"RoPE {_scaling_label(name)} does not use {', '.join(stray)} (in {what}); "
            f"it accepts: {', '.join(entry.keys) or 'no scaling keys'}"
        )
    check_scaling_given(spec)
    return spec


def _spec_factor(text: str, spec: str, what: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f"RoPE scaling factor {text!r} in {what} {spec!r} is not a number") from None
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"RoPE scaling factor must be > 0, got {text!r} in {what} {spec!r}")
    return factor


def _spec_floats(text: str, label: str, spec: str, what: str) -> list[float]:
    values = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"longrope {label} factor {item!r} in {what} {spec!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"longrope {label} factors must be > 0, got {item!r} in {what} {spec!r}")
        values.append(value)
    return values


def _longrope_from_json(path: Path, spec: str, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{what} {spec!r}: file {str(path)!r} does not exist")
    try:
        data = load_json(path.read_text(encoding="utf-8"), repr(str(path)))
    except ValueError as err:  # not UTF-8, not JSON, or nested too deeply
        raise ValueError(f"{what} {spec!r}: {str(path)!r} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or "factor" not in data or "long_factor" not in data:
        raise ValueError(f"{what} {spec!r}: {str(path)!r} must hold an object with 'factor' and 'long_factor'")
    unknown = set(data) - {"factor", "long_factor", "short_factor"}
    if unknown:
        raise ValueError(f"{what} {spec!r}: unknown keys {sorted(unknown)} in {str(path)!r}")
    out: dict[str, Any] = {"scaling": "longrope", "factor": _spec_factor(str(data["factor"]), spec, what)}
    for key in ("long_factor", "short_factor"):
        if key in data:
            if not isinstance(data[key], list):
                raise ValueError(f"{what} {spec!r}: {key} in {str(path)!r} must be a list of numbers")
            out[key] = _spec_floats(",".join(str(v) for v in data[key]), key.split("_")[0], spec, what)
    out.setdefault("short_factor", [1.0] * len(out["long_factor"]))
    return out


def rescale(
    config: dict[str, Any],
    scaling: str | dict[str, Any] | None = None,
    *,
    logn_scaling: bool | None = None,
    original_max_len: int | None = None,
    what: str = "RoPE scaling",
) -> dict[str, Any]:
    """A RoPE config dict with its scaling replaced by ``scaling`` (a spec, see :func:`parse_scaling`).

    Every key of the old scaling (:data:`SCALING_KEYS`) goes back to its default before the new
    scaling's keys apply; the other keys (``head_dim``, ``base``, ``layout``, ...) stay.

    Args:
        config: the current config (keys of :class:`RopeConfig`).
        scaling: the new scaling spec; ``None`` keeps the current one (``"none"`` removes it).
        logn_scaling: turn log-n query scaling on/off (``None`` keeps it).
        original_max_len: the window ``L0`` the scaling extends from (``None`` keeps the config's; a
            GPT fills a missing one with its ``block_size``).
    """
    out = dict(config)
    if scaling is not None:
        for key in SCALING_KEYS:
            out.pop(key, None)
        out.update(parse_scaling(scaling, what))
    if logn_scaling is not None:
        out["logn_scaling"] = bool(logn_scaling)
    if original_max_len is not None:
        out["original_max_len"] = int(original_max_len)
    return out


def rope_parameters(
    cfg: RopeConfig, seq_len: int | None = None, device: torch.device | None = None
) -> tuple[Tensor, float]:
    """``(inv_freq [rotary_dim/2] fp32, attention_factor)`` for a config at a sequence length.

    ``seq_len`` (the largest position + 1) matters only for ``dynamic`` and ``longrope``; ``None``
    means "within the original window".
    """
    return ROPE_SCALINGS[cfg.scaling].fn(cfg, seq_len if seq_len is not None else 0, device)


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
