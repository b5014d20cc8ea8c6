"""Weight-mapping helpers shared by the modern family modules (Qwen3, Gemma 2/3, gpt-oss, Llama 4).

Each family module converts one ``transformers`` config + checkpoint into ``(GPTConfig values,
state dict)`` and registers itself with :func:`poslab.interop.hf.register_family`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from poslab.interop.hf import _unsupported, _Weights, rope_config_from_hf

#: ``layer_types`` entries the modern families use.
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


def head_dim_of(config: Any) -> int:
    """``config.head_dim`` or ``hidden_size // num_attention_heads``."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_divisible(family: str, config: Any) -> None:
    """poslab's GPT needs ``hidden_size % num_attention_heads == 0`` (``head_dim`` itself is free)."""
    if config.hidden_size % config.num_attention_heads:
        raise _unsupported(family, f"hidden_size={config.hidden_size} not divisible by num_attention_heads={config.num_attention_heads}")


def layer_types(family: str, config: Any, allowed: tuple[str, ...]) -> list[str]:
    """``config.layer_types`` (one per layer), refusing a type poslab does not map."""
    types = list(getattr(config, "layer_types", None) or [FULL] * config.num_hidden_layers)
    if len(types) != config.num_hidden_layers:
        raise _unsupported(family, f"layer_types of length {len(types)} for num_hidden_layers={config.num_hidden_layers}")
    for t in types:
        if t not in allowed:
            raise _unsupported(family, f"layer_types entry {t!r} (supported: {', '.join(allowed)})")
    return types


def rope_config(family: str, config: Any, params: dict | None, head_dim: int, layout: str = "half") -> dict[str, Any]:
    """:func:`rope_config_from_hf` for an explicit ``rope_parameters`` dict (Gemma 3 has one per layer type)."""
    proxy = SimpleNamespace(rope_parameters=params, max_position_embeddings=config.max_position_embeddings)
    return rope_config_from_hf(proxy, head_dim, layout, family)


def refuse_if(family: str, config: Any, field: str, bad: Any) -> None:
    """Refuse ``config.<field>`` when ``bad(value)`` holds, naming the field and its value."""
    value = getattr(config, field, None)
    if bad(value):
        raise _unsupported(family, f"{field}={value!r}")


def attention(w: _Weights, sd: dict[str, Tensor], src: str, dst: str, bias: bool, *, qk_norm: bool = False,
              norm_offset: float = 0.0) -> None:
    """q/k/v/o projections (``src`` = ``layers.{i}.self_attn.``) into poslab's fused ``qkv`` and ``proj``.

    ``qk_norm`` also maps ``q_norm``/``k_norm`` (plus ``norm_offset``: Gemma stores ``w`` for ``1 + w``).
    """
    for name in ("weight", "bias") if bias else ("weight",):
        sd[f"{dst}attn.qkv.{name}"] = torch.cat([w.take(f"{src}{p}_proj.{name}") for p in "qkv"], dim=0)  # rows q | k | v
        sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}o_proj.{name}")
    if qk_norm:
        sd[f"{dst}attn.q_norm.weight"] = w.take(f"{src}q_norm.weight") + norm_offset
        sd[f"{dst}attn.k_norm.weight"] = w.take(f"{src}k_norm.weight") + norm_offset


def swiglu(w: _Weights, sd: dict[str, Tensor], src: str, dst: str) -> None:
    """``gate_proj``/``up_proj``/``down_proj`` (no biases) of ``src`` (``layers.{i}.mlp.``)."""
    for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
        sd[f"{dst}mlp.{ours}.weight"] = w.take(f"{src}{hf}.weight")


def export_attention(src: dict[str, Tensor], sd: dict[str, Tensor], s: str, d: str, q_rows: int, kv_rows: int, bias: bool, *,
                     qk_norm: bool = False, norm_offset: float = 0.0) -> None:
    """Inverse of :func:`attention` (poslab ``blocks.{i}.`` -> HF ``...self_attn.``)."""
    for name in ("weight", "bias") if bias else ("weight",):
        q, k, v = src[f"{s}attn.qkv.{name}"].split((q_rows, kv_rows, kv_rows), dim=0)  # rows of q | k | v
        sd[f"{d}q_proj.{name}"], sd[f"{d}k_proj.{name}"], sd[f"{d}v_proj.{name}"] = q, k, v
        sd[f"{d}o_proj.{name}"] = src[f"{s}attn.proj.{name}"]
    if qk_norm:
        sd[f"{d}q_norm.weight"] = src[f"{s}attn.q_norm.weight"] - norm_offset
        sd[f"{d}k_norm.weight"] = src[f"{s}attn.k_norm.weight"] - norm_offset


# ------------------------------------------------------------------------------------------ export
#: a pre-norm decoder layer's two RMSNorms, HF name -> poslab name
PRE_NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"))


def export_decoder(gpt: Any, *, mlp: str = "mlp", qk_norm: bool = False, norms: tuple[tuple[str, str], ...] = PRE_NORMS,
                   norm_offset: float = 0.0) -> dict[str, Tensor]:
    """The HF state dict (``model.*``, ``lm_head``) of a dense :class:`poslab.GPT` with fused-qkv attention and a SwiGLU MLP.

    Args:
        gpt: the model.
        mlp: the HF name of a layer's MLP (``"mlp"``; Llama 4: ``"feed_forward"``).
        qk_norm: export each layer's ``q_norm``/``k_norm``.
        norms: ``(HF name, poslab name)`` of each layer's norms.
        norm_offset: subtracted from every norm gain (Gemma stores ``w`` where poslab holds ``1 + w``).
    """
    cfg, src = gpt.config, gpt.state_dict()
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    sd = {"model.embed_tokens.weight": src["tok_emb.weight"], "model.norm.weight": src["norm_f.weight"] - norm_offset,
          "lm_head.weight": src["lm_head.weight"]}
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.", f"model.layers.{i}."
        export_attention(src, sd, s, f"{d}self_attn.", q_rows, kv_rows, cfg.bias_of("attn"), qk_norm=qk_norm,
                         norm_offset=norm_offset)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            sd[f"{d}{mlp}.{theirs}.weight"] = src[f"{s}mlp.{ours}.weight"]
        for theirs, ours in norms:
            sd[f"{d}{theirs}.weight"] = src[f"{s}{ours}.weight"] - norm_offset
    return sd


def export_problems(gpt: Any, allowed: set[str], **required: Any) -> list[str]:
    """The ``GPTConfig`` fields of ``gpt`` a family layout cannot hold, as ``field=value`` strings.

    ``required`` pins fields to one value; mechanism fields outside ``allowed`` must keep their
    defaults (the layer_pattern is each family's own business, checked by the caller).
    """
    import dataclasses

    from poslab.nn.model import GPTConfig

    cfg = gpt.config
    defaults = {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.default is not dataclasses.MISSING}
    problems = [f"{key}={getattr(cfg, key)!r} (needs {value!r})" for key, value in required.items() if getattr(cfg, key) != value]
    for key in ("attn_softcap", "final_softcap", "qk_norm", "qk_norm_affine", "attn_sinks", "attn_chunk", "attn_temperature",
                "embed_scale", "embed_norm", "lm_head_bias", "clip_qkv", "window", "layer_pattern"):
        if key not in allowed and getattr(cfg, key) != defaults[key]:
            problems.append(f"{key}={getattr(cfg, key)!r}")
    if cfg.bias_of("mlp") or (cfg.bias_of("norm") and cfg.norm == "layernorm"):
        problems.append("MLP / norm biases")
    return problems


def refuse_export(family: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"to_hf ({family}): this model does not fit the {family} layout: {'; '.join(problems)}")


def hf_rope(family: str, gpt: Any, scheme: Any) -> dict[str, Any]:
    """``rope_parameters`` of one RoPE scheme (``_hf_rope_parameters`` on a model view with that scheme)."""
    from poslab.interop.hf import _hf_rope_parameters

    # the scheme's own head_dim (MLA rotates qk_rope_head_dim dims, not the model's head_dim)
    view = SimpleNamespace(position=scheme, config=SimpleNamespace(head_dim=scheme.config.head_dim, block_size=gpt.config.block_size))
    try:
        params, _ = _hf_rope_parameters(view)
    except ValueError as err:
        raise ValueError(f"to_hf ({family}): {err}") from None
    return params


def finish_export(hf_model: Any, state: dict[str, Tensor], dtype: torch.dtype, out_dir: Any) -> Any:
    """Load ``state`` (strict), cast, and ``save_pretrained`` to a new or empty ``out_dir`` (via a temp folder)."""
    import shutil
    import tempfile
    from pathlib import Path

    target = Path(out_dir) if out_dir is not None else None
    if target is not None and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{str(target)!r} already exists and is not an empty folder; to_hf never overwrites")
    hf_model.load_state_dict({k: v.detach().to(torch.float32) for k, v in state.items()}, strict=True)
    hf_model.to(dtype=dtype).eval()
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            hf_model.save_pretrained(str(tmp))
            if target.exists():
                target.rmdir()
            tmp.replace(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return hf_model


HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
