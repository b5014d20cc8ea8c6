"""Gemma 2 (``gemma2``) and Gemma 3 text (``gemma3_text``) for :func:`poslab.from_hf`.

What they exercise (Gemma Team 2024, https://arxiv.org/abs/2408.00118; Gemma Team 2025,
https://arxiv.org/abs/2503.19786):

* **logit soft-capping** ``c * tanh(x / c)`` on the attention logits (``attn_logit_softcapping``)
  and the final logits (``final_logit_softcapping``) -- Gemma 2 (``GPTConfig.attention.softcap`` /
  ``final_softcap``; soft-capped attention runs in the eager/flex backends);
* **QK-norm** (Gemma 3): RMSNorm on every q/k head before RoPE;
* **local/global alternation** from ``layer_types``: sliding-window layers (``i - W < j <= i``)
  between global ones, and for Gemma 3 a different RoPE base on the local layers
  (``rope_parameters["sliding_attention"]``) -- one ``GPTConfig.layer_pattern`` entry per layer;
* sandwich norms (``residual="sandwich"``), embeddings times ``sqrt(hidden_size)``
  (``embed_scale``), the ``query_pre_attn_scalar ** -0.5`` softmax scale, tanh-GELU SwiGLU.

Gemma's RMSNorm multiplies by ``1 + w``; poslab's by ``w``: the gains are shifted by one on the way.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from poslab.interop import common as m
from poslab.interop.checkpoint import transformers_module

NORMS = (
    ("input_layernorm", "norm1"),
    ("post_attention_layernorm", "post_attn_norm"),
    ("pre_feedforward_layernorm", "norm2"),
    ("post_feedforward_layernorm", "post_mlp_norm"),
)


def _convert(config: Any, w: m.Weights, family: str) -> m.Converted:
    m.check_divisible(family, config)
    m.refuse_if(family, config, "use_bidirectional_attention", bool)
    head_dim = m.head_dim_of(config)
    bias = bool(getattr(config, "attention_bias", False))
    types = m.layer_types(family, config, (m.FULL, m.SLIDING))
    gemma3 = family == "gemma3_text"
    rope = config.rope_parameters
    if gemma3:
        global_rope = m.rope_config(family, config, rope.get(m.FULL), head_dim)
        local_rope = m.rope_config(family, config, rope.get(m.SLIDING), head_dim)
    else:
        global_rope = local_rope = m.rope_config(family, config, rope, head_dim)
    pattern = []
    for t in types:
        entry: dict[str, Any] = {}
        if t == m.SLIDING:
            entry["window"] = int(config.sliding_window)
            if local_rope != global_rope:
                entry["position_config"] = local_rope
        pattern.append(entry)
    attn_cap = _cap(family, config, "attn_logit_softcapping")
    if gemma3 and attn_cap is not None:
        warnings.warn(
            f"gemma3_text: attn_logit_softcapping={attn_cap}, but transformers 5.24's Gemma3Attention never applies it "
            "(only Gemma 2 soft-caps attention logits); poslab follows transformers so the logits match. Set "
            f"GPTConfig.attention.softcap={attn_cap} on the result for a model that caps them",
            UserWarning,
            stacklevel=4,
        )
        attn_cap = None
    cfg = m.decoder_config(family, config, global_rope, act=config.hidden_activation) | dict(
        residual="sandwich",
        embed_scale=float(config.hidden_size**0.5),
        final_softcap=_cap(family, config, "final_logit_softcapping"),
        layer_pattern=pattern if any(pattern) else None,
        attention={
            "bias": bias,
            "head_dim": head_dim,
            "scale": float(config.query_pre_attn_scalar**-0.5),
            "softcap": attn_cap,
            "qk_norm": gemma3,
            "backend": "auto",
        },
    )
    sd = m.import_decoder(w, cfg, bias, qk_norm=gemma3, norms=NORMS, norm_offset=1.0)  # RMSNorm scales by 1 + w
    return cfg, sd


def _cap(family: str, config: Any, field: str) -> float | None:
    value = getattr(config, field, None)
    if value is None:
        return None
    if not value > 0:
        raise m.unsupported(family, f"{field}={value!r} (a soft-cap must be > 0 or None)")
    return float(value)


def convert_gemma2(config: Any, w: m.Weights) -> m.Converted:
    """``(GPTConfig values, state dict)`` of a ``Gemma2ForCausalLM``."""
    return _convert(config, w, "gemma2")


def convert_gemma3(config: Any, w: m.Weights) -> m.Converted:
    """``(GPTConfig values, state dict)`` of a ``Gemma3ForCausalLM`` (text only)."""
    return _convert(config, w, "gemma3_text")


def _scale(gpt: Any) -> list[m.Problem]:
    cfg = gpt.config
    scale = cfg.attention.scale if cfg.attention.scale is not None else cfg.head_dim**-0.5
    if not math.isclose(round(scale**-2) ** -0.5, scale, rel_tol=1e-9):
        return [
            (
                "attention.scale",
                f"attention.scale={cfg.attention.scale} "
                "(Gemma's is query_pre_attn_scalar ** -0.5 for an integer scalar)",
            )
        ]
    return []


def _embed_scale(gpt: Any) -> list[m.Problem]:
    cfg = gpt.config
    if cfg.embed_scale is None or not math.isclose(cfg.embed_scale, cfg.n_embd**0.5, rel_tol=1e-12):
        return [
            (
                "embed_scale",
                f"embed_scale={cfg.embed_scale!r} (Gemma multiplies the embeddings by sqrt(n_embd)={cfg.n_embd**0.5})",
            )
        ]
    return []


def _ropes(gpt: Any, family: str) -> tuple[dict[str, dict], list[m.Problem]]:
    """``{layer type: rope_parameters}`` of the model, and what transformers' one-RoPE-per-type cannot hold."""
    types, _ = m.window_layers(gpt)
    ropes: dict[str, dict] = {}
    for i, t in enumerate(types):
        params = m.hf_rope(family, gpt, gpt.layer_position(i))
        if ropes.setdefault(t, params) != params:
            return ropes, [
                (
                    "layer_pattern",
                    f"the {t} layers use different RoPE configurations; transformers has one per layer type",
                )
            ]
    if family == "gemma2" and len({str(p) for p in ropes.values()}) > 1:
        return ropes, [
            ("layer_pattern", "local and global layers with different RoPE; Gemma 2 has one (Gemma 3 has two)")
        ]
    return ropes, []


def _export(gpt: Any, family: str, out_dir: Any) -> Any:
    gemma3 = family == "gemma3_text"
    (GEMMA3 if gemma3 else GEMMA2).refuse(gpt)
    transformers = transformers_module()
    cfg = gpt.config
    scale = cfg.attention.scale if cfg.attention.scale is not None else cfg.head_dim**-0.5
    types, window = m.window_layers(gpt)
    ropes, _ = _ropes(gpt, family)
    common = m.hf_decoder_config(gpt, activation_key="hidden_activation") | dict(
        query_pre_attn_scalar=round(scale**-2),
        sliding_window=window or 4096,
        layer_types=types,
        final_logit_softcapping=cfg.final_softcap,
    )
    if gemma3:
        full = ropes.get(m.FULL) or ropes[m.SLIDING]
        hf_config = transformers.Gemma3TextConfig(
            rope_parameters={m.FULL: full, m.SLIDING: ropes.get(m.SLIDING) or full},
            attn_logit_softcapping=None,
            **common,
        )
        hf = transformers.Gemma3ForCausalLM(hf_config)
    else:
        hf_config = transformers.Gemma2Config(
            rope_parameters=next(iter(ropes.values())), attn_logit_softcapping=cfg.attention.softcap, **common
        )
        hf = transformers.Gemma2ForCausalLM(hf_config)
    sd = m.export_decoder(gpt, qk_norm=gemma3, norms=NORMS, norm_offset=1.0)
    return m.finish_export(hf, sd, gpt.tok_emb.weight.dtype, out_dir)


def to_hf_gemma2(gpt: Any, out_dir: Any = None) -> Any:
    """A ``Gemma2ForCausalLM`` with the weights and logits of a Gemma-2-layout :class:`poslab.GPT`.

    The layout: RoPE (half-split), rmsnorm, swiglu, ``residual="sandwich"``,
    ``embed_scale=sqrt(n_embd)``, optional ``attention.softcap``/``final_softcap``, windows (one size)
    through ``layer_pattern``. Anything else is refused naming the option.
    """
    return _export(gpt, "gemma2", out_dir)


def to_hf_gemma3(gpt: Any, out_dir: Any = None) -> Any:
    """A ``Gemma3ForCausalLM`` for a Gemma-3-layout :class:`poslab.GPT` (Gemma 2's plus ``qk_norm``, no
    attention soft-cap, and one RoPE configuration for the local layers and one for the global ones)."""
    return _export(gpt, "gemma3_text", out_dir)


_CARRIED = frozenset(
    {
        "n_kv_head",
        "attention.head_dim",
        "attention.bias",
        "attention.scale",
        "embed_scale",
        "final_softcap",
        "attention.window",
        "layer_pattern",
    }
)
_REQUIRED = {**m.ROPE_DECODER, "residual": "sandwich", "mlp.bias": False}
GEMMA2 = m.Writes(
    "gemma2",
    requires=_REQUIRED,
    carries=_CARRIED | {"attention.softcap"},
    layer_keys=frozenset({"window"}),
    checks=(m.rope_check("gemma2"), m.one_window("gemma2"), _scale, _embed_scale, lambda gpt: _ropes(gpt, "gemma2")[1]),
    export=to_hf_gemma2,
)
GEMMA3 = m.Writes(
    "gemma3_text",
    requires={**_REQUIRED, "attention.qk_norm": True},
    carries=_CARRIED | {"attention.qk_norm"},
    layer_keys=frozenset({"window", "position_config"}),
    checks=(
        m.rope_check("gemma3_text"),
        m.one_window("gemma3_text"),
        _scale,
        _embed_scale,
        lambda gpt: _ropes(gpt, "gemma3_text")[1],
    ),
    export=to_hf_gemma3,
)
FAMILIES = (
    m.Family(
        "gemma2",
        "model.",
        "Gemma 2 (attention and final-logit soft-capping, local/global layers, sandwich norms)",
        convert_gemma2,
        GEMMA2,
    ),
    m.Family(
        "gemma3_text",
        "model.",
        "Gemma 3 text (QK-norm, 5:1 local/global layers with their own RoPE bases, sandwich norms)",
        convert_gemma3,
        GEMMA3,
    ),
)
