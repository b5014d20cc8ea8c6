"""What every family module shares: the weight map helpers, the RoPE translation, and the declaration
of a family (:class:`Family`: how to read it; :class:`Writes`: what its ``transformers`` config can
express and the function that writes it).

A family module (``poslab/interop/<family>.py``) converts one ``transformers`` config + checkpoint
into ``(GPTConfig values, state dict)`` and declares ``FAMILIES``; :mod:`poslab.interop.hf` collects
them into ``from_hf``'s and ``to_hf``'s dispatch. Family modules import this module and
:mod:`poslab.interop.checkpoint` only, never each other's private names.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from poslab.fileio import atomic_write_folder

#: transformers ``rope_type`` values poslab maps (onto the ``rope`` scheme's ``scaling``).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
#: transformers activation names -> poslab's ``GPTConfig.mlp.activation``.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
#: poslab activation -> the transformers name of the same function (export).
HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
#: what every RoPE + RMSNorm + SwiGLU decoder family's ``transformers`` config requires of a GPT (``Writes.requires``).
ROPE_DECODER = {"position": "rope", "residual": "sequential", "norm.kind": "rmsnorm", "mlp.kind": "swiglu"}
#: ``layer_types`` entries the modern families use.
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"
#: checkpoint entries that are buffers, not weights (old GPT-2 / GPT-J / NeoX checkpoints carry them).
IGNORED = re.compile(
    r"(^|\.)(attn\.bias|attn\.masked_bias|attention\.bias|attention\.masked_bias|rotary_emb\.inv_freq)$"
)

Converted = tuple[dict[str, Any], dict[str, Tensor]]


# ---------------------------------------------------------------------------------- reading
class Weights:
    """A checkpoint's tensors with the base-model prefix removed; every tensor must be used once."""

    def __init__(self, tensors: dict[str, Tensor], prefix: str, family: str) -> None:
        self.family = family
        self.tensors = {(key[len(prefix) :] if key.startswith(prefix) else key): t for key, t in tensors.items()}

    def take(self, key: str) -> Tensor:
        if key not in self.tensors:
            raise ValueError(f"{self.family} checkpoint has no weight {key!r} (is it a {self.family} causal LM?)")
        return self.tensors.pop(key)

    def take_optional(self, *keys: str) -> Tensor | None:
        for key in keys:
            if key in self.tensors:
                return self.tensors.pop(key)
        return None

    def finish(self) -> None:
        """Fail if a weight was left unconverted (a silently dropped weight is a wrong model)."""
        leftover = sorted(k for k in self.tensors if not IGNORED.search(k))
        if leftover:
            shown = ", ".join(leftover[:6]) + (" ..." if len(leftover) > 6 else "")
            raise ValueError(f"{self.family} checkpoint has weights poslab does not map: {shown}")


def unsupported(family: str, what: str) -> ValueError:
    """The error for a config option poslab does not map."""
    return ValueError(f"{family}: {what} is not supported by poslab.from_hf")


def activation(family: str, name: str) -> str:
    """poslab's ``activation`` for a transformers activation name (refusing unknown ones)."""
    if name not in HF_ACTIVATIONS:
        raise unsupported(family, f"activation {name!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[name]


def full_head_dim(family: str, config: Any, hidden: int, heads: int) -> int:
    """``head_dim`` of a family whose heads tile ``hidden_size`` exactly (refusing any other)."""
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if head_dim * heads != hidden:
        raise unsupported(
            family,
            f"head_dim={head_dim} with hidden_size={hidden} and {heads} heads "
            "(poslab needs head_dim * heads == hidden_size)",
        )
    return head_dim


def head_dim_of(config: Any) -> int:
    """``config.head_dim`` or ``hidden_size // num_attention_heads``."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_divisible(family: str, config: Any) -> None:
    """poslab's GPT needs ``hidden_size % num_attention_heads == 0`` (``head_dim`` itself is free)."""
    if config.hidden_size % config.num_attention_heads:
        raise unsupported(
            family,
            f"hidden_size={config.hidden_size} not divisible by num_attention_heads={config.num_attention_heads}",
        )


def layer_types(family: str, config: Any, allowed: tuple[str, ...]) -> list[str]:
    """``config.layer_types`` (one per layer), refusing a type poslab does not map."""
    types = list(getattr(config, "layer_types", None) or [FULL] * config.num_hidden_layers)
    if len(types) != config.num_hidden_layers:
        raise unsupported(
            family, f"layer_types of length {len(types)} for num_hidden_layers={config.num_hidden_layers}"
        )
    for t in types:
        if t not in allowed:
            raise unsupported(family, f"layer_types entry {t!r} (supported: {', '.join(allowed)})")
    return types


def refuse_if(family: str, config: Any, field: str, bad: Any) -> None:
    """Refuse ``config.<field>`` when ``bad(value)`` holds, naming the field and its value."""
    value = getattr(config, field, None)
    if bad(value):
        raise unsupported(family, f"{field}={value!r}")


def rope_config_from_hf(config: Any, head_dim: int, layout: str = "half", family: str = "llama") -> dict[str, Any]:
    """poslab ``rope`` scheme config for a transformers config's ``rope_parameters``.

    Every field is mapped exactly as ``transformers.modeling_rope_utils`` reads it: for ``dynamic``
    the original length ``L0`` is ``max_position_embeddings`` (HF ignores
    ``original_max_position_embeddings`` there); for ``yarn``/``longrope`` a missing ``factor`` is
    ``max_position_embeddings / original_max_position_embeddings``; ``beta_fast``/``beta_slow``
    default to 32/1 and ``truncate`` to True. A field the type needs and the config lacks is a
    ``ValueError`` naming it.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise unsupported(family, f"rope_type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")

    def need(key: str) -> Any:
        if params.get(key) is None:
            raise ValueError(
                f"{family}: rope_parameters of rope_type {rope_type!r} needs {key!r}, which the config lacks"
            )
        return params[key]

    theta = params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    out: dict[str, Any] = {"base": float(theta), "layout": layout}
    if rotary_dim != head_dim:
        out["rotary_dim"] = rotary_dim
    max_pos = config.max_position_embeddings
    if rope_type == "default":
        return out
    out["scaling"] = rope_type
    if rope_type in ("linear", "dynamic"):
        out["factor"] = float(need("factor"))
        if rope_type == "dynamic":
            out["original_max_len"] = int(max_pos)
        return out
    original = int(need("original_max_position_embeddings"))
    out["original_max_len"] = original
    factor = params.get("factor")
    out["factor"] = float(factor if factor is not None else max_pos / original)
    if params.get("attention_factor") is not None and rope_type in ("yarn", "longrope"):
        out["attention_factor"] = float(params["attention_factor"])
    if rope_type == "yarn":
        out["beta_fast"] = float(params.get("beta_fast") or 32)
        out["beta_slow"] = float(params.get("beta_slow") or 1)
        out["yarn_truncate"] = bool(params.get("truncate", True))
        for key in ("mscale", "mscale_all_dim"):
            if params.get(key) is not None:
                out[key] = float(params[key])
    elif rope_type == "llama3":
        out["low_freq_factor"] = float(need("low_freq_factor"))
        out["high_freq_factor"] = float(need("high_freq_factor"))
    else:  # longrope
        out["short_factor"] = [float(x) for x in need("short_factor")]
        out["long_factor"] = [float(x) for x in need("long_factor")]
    return out


def rope_config(family: str, config: Any, params: dict | None, head_dim: int, layout: str = "half") -> dict[str, Any]:
    """:func:`rope_config_from_hf` for an explicit ``rope_parameters`` dict (Gemma 3 has one per layer type)."""
    proxy = SimpleNamespace(rope_parameters=params, max_position_embeddings=config.max_position_embeddings)
    return rope_config_from_hf(proxy, head_dim, layout, family)


def fused_per_head(weight: Tensor, n_heads: int) -> Tensor:
    """GPT-NeoX/Bloom fused qkv rows ``[h, 3, d_k]`` -> poslab's ``[3, h, d_k]`` (q | k | v)."""
    rest = weight.shape[1:]
    head_dim = weight.shape[0] // (3 * n_heads)
    per_head = weight.reshape(n_heads, 3, head_dim, *rest)  # [h, 3, d_k, (in)]
    return per_head.transpose(0, 1).reshape(weight.shape)  # [3, h, d_k, (in)] -> [3*h*d_k, (in)]


def per_head_fused(weight: Tensor, n_heads: int) -> Tensor:
    """Inverse of :func:`fused_per_head`."""
    rest = weight.shape[1:]
    head_dim = weight.shape[0] // (3 * n_heads)
    grouped = weight.reshape(3, n_heads, head_dim, *rest)  # [3, h, d_k, (in)]
    return grouped.transpose(0, 1).reshape(weight.shape)  # [h, 3, d_k, (in)] -> [h*3*d_k, (in)]


def lm_head(w: Weights, sd: dict[str, Tensor], tie: bool, *names: str) -> None:
    """``lm_head.weight`` from the first of ``names`` present, or the tied embedding."""
    if tie:
        w.take_optional(*names)  # a tied checkpoint may or may not store the shared matrix twice
        sd["lm_head.weight"] = sd["tok_emb.weight"]
        return
    head = w.take_optional(*names)
    if head is None:
        raise ValueError(f"{w.family} checkpoint has no LM head ({' or '.join(names)}) and does not tie embeddings")
    sd["lm_head.weight"] = head


def attention(
    w: Weights,
    sd: dict[str, Tensor],
    src: str,
    dst: str,
    bias: bool,
    *,
    qk_norm: bool = False,
    norm_offset: float = 0.0,
) -> None:
    """q/k/v/o projections (``src`` = ``layers.{i}.self_attn.``) into poslab's fused ``qkv`` and ``proj``.

    ``qk_norm`` also maps ``q_norm``/``k_norm`` (plus ``norm_offset``: Gemma stores ``w`` for ``1 + w``).
    """
    for name in ("weight", "bias") if bias else ("weight",):
        sd[f"{dst}attn.qkv.{name}"] = torch.cat(
            [w.take(f"{src}{p}_proj.{name}") for p in "qkv"], dim=0
        )  # rows q | k | v
        sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}o_proj.{name}")
    if qk_norm:
        sd[f"{dst}attn.q_norm.weight"] = w.take(f"{src}q_norm.weight") + norm_offset
        sd[f"{dst}attn.k_norm.weight"] = w.take(f"{src}k_norm.weight") + norm_offset


def swiglu(w: Weights, sd: dict[str, Tensor], src: str, dst: str, bias: bool = False) -> None:
    """``gate_proj``/``up_proj``/``down_proj`` of ``src`` (``layers.{i}.mlp.``), with their biases if ``bias``."""
    for name in ("weight", "bias") if bias else ("weight",):
        for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            sd[f"{dst}mlp.{ours}.{name}"] = w.take(f"{src}{hf}.{name}")


#: a pre-norm decoder layer's two RMSNorms, HF name -> poslab name
PRE_NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"))


def decoder_config(
    family: str, config: Any, position_config: dict[str, Any], *, hidden: int | None = None, act: str | None = None
) -> dict[str, Any]:
    """The GPTConfig values every RoPE + RMSNorm + SwiGLU decoder family reads from its ``transformers`` config the
    same way (no biases: a family adds its own); ``hidden``/``act``: its MLP width/activation where named otherwise."""
    hidden = config.intermediate_size if hidden is None else hidden
    act = activation(family, config.hidden_act if act is None else act)
    return {
        "vocab_size": config.vocab_size,
        "n_layer": config.num_hidden_layers,
        "n_head": config.num_attention_heads,
        "n_kv_head": config.num_key_value_heads,
        "n_embd": config.hidden_size,
        "block_size": config.max_position_embeddings,
        "bias": False,
        "position": "rope",
        "position_config": position_config,
        "tie_embeddings": bool(config.tie_word_embeddings),
        "norm": {"kind": "rmsnorm", "eps": config.rms_norm_eps},
        "mlp": {"kind": "swiglu", "hidden": hidden, "activation": act},
    }


def import_decoder(
    w: Weights,
    cfg: dict[str, Any],
    bias: bool,
    *,
    mlp: str = "mlp",
    mlp_bias: bool = False,
    qk_norm: bool = False,
    norms: tuple[tuple[str, str], ...] = PRE_NORMS,
    norm_offset: float = 0.0,
) -> dict[str, Tensor]:
    """The poslab state dict of a dense decoder with q/k/v projections and a SwiGLU MLP, read from ``w`` for the
    GPTConfig values ``cfg`` (``n_layer``, ``tie_embeddings``): the reverse of :func:`export_decoder`, whose
    arguments it shares (``bias``/``mlp_bias``: the attention/MLP projections carry biases; ``norm_offset`` is
    added to every norm gain)."""
    sd: dict[str, Tensor] = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(cfg["n_layer"]):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        attention(w, sd, f"{src}self_attn.", dst, bias, qk_norm=qk_norm, norm_offset=norm_offset)
        swiglu(w, sd, f"{src}{mlp}.", dst, mlp_bias)
        for hf, ours in norms:
            sd[f"{dst}{ours}.weight"] = w.take(f"{src}{hf}.weight") + norm_offset
    sd["norm_f.weight"] = w.take("norm.weight") + norm_offset
    lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return sd


# ---------------------------------------------------------------------------------- export: weights
def export_attention(
    src: dict[str, Tensor],
    sd: dict[str, Tensor],
    s: str,
    d: str,
    cfg: Any,
    *,
    qk_norm: bool = False,
    norm_offset: float = 0.0,
) -> None:
    """Inverse of :func:`attention` (poslab ``blocks.{i}.`` -> HF ``...self_attn.``); ``cfg``: the model's
    :class:`~poslab.nn.gpt_config.GPTConfig` (its head counts split the fused qkv rows, its attention bias)."""
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for name in ("weight", "bias") if cfg.bias_of("attn") else ("weight",):
        q, k, v = src[f"{s}attn.qkv.{name}"].split((q_rows, kv_rows, kv_rows), dim=0)  # rows of q | k | v
        sd[f"{d}q_proj.{name}"], sd[f"{d}k_proj.{name}"], sd[f"{d}v_proj.{name}"] = q, k, v
        sd[f"{d}o_proj.{name}"] = src[f"{s}attn.proj.{name}"]
    if qk_norm:
        sd[f"{d}q_norm.weight"] = src[f"{s}attn.q_norm.weight"] - norm_offset
        sd[f"{d}k_norm.weight"] = src[f"{s}attn.k_norm.weight"] - norm_offset


def export_decoder(
    gpt: Any,
    *,
    mlp: str = "mlp",
    qk_norm: bool = False,
    norms: tuple[tuple[str, str], ...] = PRE_NORMS,
    norm_offset: float = 0.0,
) -> dict[str, Tensor]:
    """The HF state dict (``model.*``, ``lm_head``) of a dense :class:`poslab.GPT` with fused-qkv attention and a
    SwiGLU MLP.

    Args:
        gpt: the model.
        mlp: the HF name of a layer's MLP (``"mlp"``; Llama 4: ``"feed_forward"``).
        qk_norm: export each layer's ``q_norm``/``k_norm``.
        norms: ``(HF name, poslab name)`` of each layer's norms.
        norm_offset: subtracted from every norm gain (Gemma stores ``w`` where poslab holds ``1 + w``).
    """
    cfg, src = gpt.config, gpt.state_dict()
    sd = {
        "model.embed_tokens.weight": src["tok_emb.weight"],
        "model.norm.weight": src["norm_f.weight"] - norm_offset,
        "lm_head.weight": src["lm_head.weight"],
    }
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.", f"model.layers.{i}."
        export_attention(src, sd, s, f"{d}self_attn.", cfg, qk_norm=qk_norm, norm_offset=norm_offset)
        for name in ("weight", "bias") if cfg.bias_of("mlp") else ("weight",):
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                sd[f"{d}{mlp}.{theirs}.{name}"] = src[f"{s}mlp.{ours}.{name}"]
        for theirs, ours in norms:
            sd[f"{d}{theirs}.weight"] = src[f"{s}{ours}.weight"] - norm_offset
    return sd


def hf_decoder_config(gpt: Any, activation_key: str = "hidden_act") -> dict[str, Any]:
    """The ``transformers`` config values every decoder family writes from a :class:`poslab.GPT` the same way (no
    special token ids); a family adds its own with ``|``. ``activation_key``: its name for the MLP activation."""
    cfg = gpt.config
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": gpt.blocks[0].mlp.up.out_features,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        activation_key: HF_ACT[cfg.mlp.activation],
        "max_position_embeddings": cfg.block_size,
        "rms_norm_eps": cfg.norm.eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.bias_of("attn"),
    } | dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"))


def hf_rope_parameters(scheme: Any, head_dim: int, block_size: int) -> tuple[dict[str, Any], int]:
    """``(rope_parameters, max_position_embeddings)`` of one poslab RoPE scheme, or ``ValueError`` naming what has no
    equivalent."""
    rope = scheme.config
    if rope.logn_scaling:
        raise ValueError("logn_scaling has no transformers equivalent")
    if rope.dim != head_dim:
        raise ValueError(f"transformers rotates the whole head here; this model has rotary_dim={rope.rotary_dim}")
    params: dict[str, Any] = {"rope_theta": float(rope.base)}
    max_pos = block_size
    if rope.scaling is None:
        params["rope_type"] = "default"
        return params, max_pos
    if rope.scaling not in ROPE_TYPES:
        raise ValueError(
            f"rope scaling {rope.scaling!r} has no transformers rope_type (supported: {', '.join(ROPE_TYPES[1:])})"
        )
    params.update(rope_type=rope.scaling, factor=float(rope.factor))
    if rope.scaling == "linear":
        return params, max_pos
    if rope.scaling == "dynamic":
        return params, rope.original_max_len  # transformers' dynamic L0 is max_position_embeddings
    params["original_max_position_embeddings"] = rope.original_max_len
    max_pos = max(max_pos, int(round(rope.original_max_len * rope.factor)))
    if rope.scaling == "yarn":
        params.update(
            beta_fast=float(rope.beta_fast), beta_slow=float(rope.beta_slow), truncate=bool(rope.yarn_truncate)
        )
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(rope, key) is not None:
                params[key] = float(getattr(rope, key))
    elif rope.scaling == "llama3":
        params.update(low_freq_factor=float(rope.low_freq_factor), high_freq_factor=float(rope.high_freq_factor))
    else:  # longrope
        params.update(short_factor=list(rope.short_factor), long_factor=list(rope.long_factor))
        if rope.attention_factor is not None:
            params["attention_factor"] = float(rope.attention_factor)
    return params, max_pos


def hf_rope(family: str, gpt: Any, scheme: Any) -> dict[str, Any]:
    """``rope_parameters`` of one RoPE scheme of ``gpt`` (the scheme's own ``head_dim``: MLA rotates
    ``qk_rope_head_dim``)."""
    try:
        params, _ = hf_rope_parameters(scheme, scheme.config.head_dim, gpt.config.block_size)
    except ValueError as err:
        raise ValueError(f"to_hf ({family}): {err}") from None
    return params


def finish_export(hf_model: Any, state: dict[str, Tensor], dtype: torch.dtype, out_dir: Any) -> Any:
    """Load ``state`` (strict), cast, and ``save_pretrained`` to a new or empty ``out_dir`` (via a temp folder)."""
    from pathlib import Path

    target = Path(out_dir) if out_dir is not None else None
    refuse_taken(target)
    hf_model.load_state_dict({k: v.detach().to(torch.float32) for k, v in state.items()}, strict=True)
    hf_model.to(dtype=dtype).eval()
    if target is not None:
        atomic_write_folder(target, lambda tmp: hf_model.save_pretrained(str(tmp)))
    return hf_model


def refuse_taken(target: Any) -> None:
    """``FileExistsError`` when ``target`` exists and is not an empty folder (an export never overwrites)."""
    if target is not None and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{str(target)!r} already exists and is not an empty folder; to_hf never overwrites")


def refuse_export(family: str, problems: list[Problem]) -> None:
    """``ValueError`` listing ``problems`` (none: return)."""
    if problems:
        raise ValueError(
            f"to_hf ({family}): this model does not fit the {family} layout: {'; '.join(text for _, text in problems)}"
        )


# ---------------------------------------------------------------------------------- export: what a family expresses
#: ``(GPTConfig field, why the family cannot hold its value)``
Problem = tuple[str, str]
#: ``GPTConfig`` fields (a group's as ``GROUP.FIELD``) every exporting family writes whatever their
#: value: sizes, training-only and run-time settings, and fields whose translation each family checks
#: itself (the RoPE config, the activation).
SHAPE_FIELDS = frozenset(
    {
        "vocab_size",
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "dropout",
        "attention.dropout",
        "attention.backend",
        "attention.query_chunk",
        "attention.recompute_threshold",
        "mlp.hidden",
        "norm.eps",
        "tie_embeddings",
        "mlp.activation",
        "position_config",
        "bias",
    }
)


def effective(cfg: Any, field: str) -> Any:
    """``cfg.<field>`` (``GROUP.FIELD`` for a group's) as a model uses it: ``None`` where a field restates
    its default behaviour (``n_kv_head == n_head``, ``attention.head_dim == n_embd // n_head``,
    ``attention.scale == head_dim ** -0.5``, ``attention.qk_norm_eps == norm.eps``), the resolved biases
    (``None`` for the norm bias of an RMSNorm model), and ``attention.qk_norm_affine`` only where some
    layer norms q/k."""
    if field == "n_kv_head":
        return None if cfg.kv_heads == cfg.n_head else cfg.n_kv_head
    if field == "attention.head_dim":
        head_dim = cfg.attention.head_dim
        return None if head_dim in (None, cfg.n_embd // cfg.n_head) else head_dim
    if field == "attention.scale":
        scale = cfg.attention.scale
        return None if scale is None or math.isclose(scale, cfg.head_dim**-0.5, rel_tol=1e-12) else scale
    if field == "attention.qk_norm_eps":
        eps = cfg.attention.qk_norm_eps
        return None if eps is None or eps == cfg.norm.eps else eps
    if field in ("attention.bias", "mlp.bias"):
        return cfg.bias_of(field.split(".")[0])
    if field == "norm.bias":
        return cfg.bias_of("norm") if cfg.norm.kind == "layernorm" else None  # RMSNorm has no bias
    if field == "attention.qk_norm_affine":
        uses = any(cfg.layer_value(i, "qk_norm") for i in range(cfg.n_layer))
        return cfg.attention.qk_norm_affine if uses else True
    if "." in field:
        group, name = field.split(".")
        return getattr(getattr(cfg, group), name)
    return getattr(cfg, field)


def option_fields() -> list[str]:
    """Every ``GPTConfig`` field (a group's as ``GROUP.FIELD``) a family must either carry or see at its
    default (all but :data:`SHAPE_FIELDS`)."""
    from poslab.nn.gpt_config import GROUPS
    from poslab.nn.model import GPTConfig

    names = []
    for f in dataclasses.fields(GPTConfig):
        if f.name in GROUPS:
            names += [f"{f.name}.{g.name}" for g in dataclasses.fields(GROUPS[f.name])]
        else:
            names.append(f.name)
    return [name for name in names if name not in SHAPE_FIELDS]


def default_of(field: str) -> Any:
    """``GPTConfig``'s default of an option field (``GROUP.FIELD``: the group's default; the biases:
    ``None``, so a family that writes biases must name them in ``requires`` or ``carries``)."""
    from poslab.nn.gpt_config import GROUPS
    from poslab.nn.model import GPTConfig

    if field in ("attention.bias", "mlp.bias", "norm.bias"):
        return None
    owner, name = (GROUPS[field.split(".")[0]], field.split(".")[1]) if "." in field else (GPTConfig, field)
    if field == "mlp.activation":
        return None
    spec = {f.name: f for f in dataclasses.fields(owner)}[name]
    return spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()  # type: ignore[misc]


@dataclass(frozen=True)
class Writes:
    """What one ``transformers`` family can express of a :class:`poslab.GPT`, and the function writing it.

    Attributes:
        family: the transformers ``model_type`` written.
        requires: option field -> the value the family needs (a ``tuple`` of values: any of them), compared
            with :func:`effective`.
        carries: option fields the family holds at any value (a group's name: all its fields); every
            other option field (see
            :func:`option_fields`) must keep its default, so a new ``GPTConfig`` option is refused by
            every family until one declares it.
        layer_keys: the ``layer_pattern`` keys the family maps (when it carries ``layer_pattern``).
        checks: family-specific conditions, each ``gpt -> list[Problem]`` (RoPE layout and scaling,
            one window size, ...).
        export: ``(gpt, out_dir) -> transformers model``; ``None`` for a family poslab cannot write
            at all (its ``checks`` say why).
    """

    family: str
    requires: dict[str, Any]
    carries: frozenset[str]
    export: Callable[[Any, Any], Any] | None
    layer_keys: frozenset[str] = frozenset()
    checks: tuple[Callable[[Any], list[Problem]], ...] = ()

    def expresses(self, gpt: Any) -> list[Problem]:
        """What of ``gpt`` this family cannot hold: ``[]`` when its export gives the same logits."""
        cfg = gpt.config
        problems: list[Problem] = []
        for field in option_fields():
            value = effective(cfg, field)
            if field in self.requires:
                want = self.requires[field]
                if value not in (want if isinstance(want, tuple) else (want,)):
                    problems.append((field, f"{field}={value!r} (needs {_spell(want)})"))
            elif field not in self.carries and field.split(".")[0] not in self.carries and value != default_of(field):
                problems.append((field, f"{field}={value!r}"))
        if "layer_pattern" in self.carries and cfg.layer_pattern:
            for i, entry in enumerate(cfg.layer_pattern):
                extra = sorted(set(entry) - self.layer_keys)
                if extra:
                    problems.append(
                        (
                            "layer_pattern",
                            f"layer_pattern entry {i} sets {extra} "
                            f"({self.family} maps {sorted(self.layer_keys) or 'none'})",
                        )
                    )
        for check in self.checks if not problems else ():
            problems = check(gpt)  # each check may assume the ones before it passed
            if problems:
                break
        return problems

    def refuse(self, gpt: Any) -> None:
        """``ValueError`` naming every option of ``gpt`` this family cannot hold."""
        refuse_export(self.family, self.expresses(gpt))


def _spell(want: Any) -> str:
    return " or ".join(repr(w) for w in want) if isinstance(want, tuple) else repr(want)


@dataclass(frozen=True)
class Family:
    """One transformers ``model_type`` poslab reads (and, with ``writes``, writes).

    Attributes:
        model_type: transformers' ``config.model_type``.
        prefix: the base-model prefix of checkpoint keys (``"model."``, ``"transformer."``).
        description: what poslab maps it to (shown in errors and ``SUPPORTED``).
        convert: ``(transformers config, Weights) -> (GPTConfig values, state dict)``.
        writes: what ``poslab.to_hf`` can write as this family (``None``: read only).
    """

    model_type: str
    prefix: str
    description: str
    convert: Callable[[Any, Weights], Converted]
    writes: Writes | None = None


# ---------------------------------------------------------------------------------- checks shared by families
def rope_check(family: str, layout: str | None = "half") -> Callable[[Any], list[Problem]]:
    """A check: every layer's RoPE has a transformers ``rope_parameters`` (and, if given, the family's ``layout``)."""

    def check(gpt: Any) -> list[Problem]:
        problems: list[Problem] = []
        for i in range(gpt.config.n_layer):
            if gpt.config.layer_value(i, "position") != "rope":
                continue
            scheme = gpt.layer_position(i)
            if layout is not None and scheme.config.layout != layout:
                problems.append(
                    (
                        "position_config",
                        f"RoPE layout {scheme.config.layout!r} in layer {i} "
                        f"({family} rotates {'half-split' if layout == 'half' else 'interleaved'} pairs; "
                        "see poslab.interop.relayout_rope)",
                    )
                )
            try:
                hf_rope_parameters(scheme, scheme.config.head_dim, gpt.config.block_size)
            except ValueError as err:
                problems.append(("position_config", str(err)))
            if problems:
                break
        return problems

    return check


def one_window(family: str) -> Callable[[Any], list[Problem]]:
    """A check: the sliding windows of all layers have one size (transformers has one ``sliding_window``)."""

    def check(gpt: Any) -> list[Problem]:
        cfg = gpt.config
        sizes = {cfg.layer_value(i, "window") for i in range(cfg.n_layer)} - {None}
        if len(sizes) > 1:
            return [
                (
                    "attention.window",
                    f"sliding windows of several sizes {sorted(sizes)}; transformers has one sliding_window",
                )
            ]
        return []

    return check


def window_layers(gpt: Any) -> tuple[list[str], int | None]:
    """``(layer_types, sliding_window)`` of a model whose windows have one size."""
    cfg = gpt.config
    windows = [cfg.layer_value(i, "window") for i in range(cfg.n_layer)]
    sizes = {w for w in windows if w is not None}
    return [SLIDING if w is not None else FULL for w in windows], (sizes.pop() if sizes else None)
