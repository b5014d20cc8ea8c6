"""RoPE's context-extension scalings: one :class:`Scaling` per variant, the spec language and :func:`rescale`.

Each entry of :data:`ROPE_SCALINGS` is a function returning ``(inv_freq, attention_factor)`` and the
config keys it requires and accepts, as transformers validates per ``rope_type``; the attention
factor multiplies cos and sin, so logits scale by its square, as in transformers. The variants and
their papers are listed in :mod:`poslab.nn.positions.rope`. Frequencies are computed in fp32 exactly
as ``transformers==5.24.0`` ``modeling_rope_utils`` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from poslab.safe_load import load_json

if TYPE_CHECKING:
    from poslab.nn.positions.rope import RopeConfig


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


ScalingFn = Callable[["RopeConfig", int, "torch.device | None"], tuple[Tensor, float]]


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
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
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


def _spec_factor(text: str, spec: str, what: str, name: str = "RoPE scaling factor") -> float:
    """``text`` (one factor of the spec ``spec`` given in ``what``) as a finite float > 0, or a ``ValueError``."""
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} in {what} {spec!r} is not a number") from None
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"{name} must be > 0, got {text!r} in {what} {spec!r}")
    return factor


def _spec_floats(text: str, label: str, spec: str, what: str) -> list[float]:
    return [_spec_factor(item, spec, what, f"longrope {label} factor") for item in text.split(",")]


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
