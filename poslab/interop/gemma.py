"""Gemma 2 (``gemma2``) and Gemma 3 text (``gemma3_text``) for :func:`poslab.from_hf`.

What they exercise (Gemma Team 2024, https://arxiv.org/abs/2408.00118; Gemma Team 2025,
https://arxiv.org/abs/2503.19786):

* **logit soft-capping** ``c * tanh(x / c)`` on the attention logits (``attn_logit_softcapping``)
  and the final logits (``final_logit_softcapping``) -- Gemma 2 (``GPTConfig.attn_softcap`` /
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

import warnings
from typing import Any

from torch import Tensor

from poslab.interop import _modern as m
from poslab.interop.hf import Converted, _activation, _lm_head, _unsupported, _Weights, register_family

NORMS = (("input_layernorm", "norm1"), ("post_attention_layernorm", "post_attn_norm"),
         ("pre_feedforward_layernorm", "norm2"), ("post_feedforward_layernorm", "post_mlp_norm"))


def _convert(config: Any, w: _Weights, family: str) -> Converted:
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
            f"GPTConfig.attn_softcap={attn_cap} on the result for a model that caps them",
            UserWarning,
            stacklevel=4,
        )
        attn_cap = None
    cfg: dict[str, Any] = dict(
        vocab_size=config.vocab_size, n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
        n_kv_head=config.num_key_value_heads, n_embd=config.hidden_size, block_size=config.max_position_embeddings,
        bias=False, attn_bias=bias, position="rope", position_config=global_rope, norm="rmsnorm", mlp="swiglu",
        mlp_hidden=config.intermediate_size, activation=_activation(family, config.hidden_activation),
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.rms_norm_eps, attn_head_dim=head_dim,
        residual="sandwich", embed_scale=float(config.hidden_size**0.5), attn_scale=float(config.query_pre_attn_scalar**-0.5),
        attn_softcap=attn_cap, final_softcap=_cap(family, config, "final_logit_softcapping"),
        qk_norm=gemma3, layer_pattern=pattern if any(pattern) else None, backend="auto",
    )
    sd: dict[str, Tensor] = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        m.attention(w, sd, f"{src}self_attn.", dst, bias, qk_norm=gemma3, norm_offset=1.0)
        m.swiglu(w, sd, f"{src}mlp.", dst)
        for hf, ours in NORMS:
            sd[f"{dst}{ours}.weight"] = w.take(f"{src}{hf}.weight") + 1.0  # Gemma's RMSNorm scales by 1 + w
    sd["norm_f.weight"] = w.take("norm.weight") + 1.0
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _cap(family: str, config: Any, field: str) -> float | None:
    value = getattr(config, field, None)
    if value is None:
        return None
    if not value > 0:
        raise _unsupported(family, f"{field}={value!r} (a soft-cap must be > 0 or None)")
    return float(value)


def convert_gemma2(config: Any, w: _Weights) -> Converted:
    """``(GPTConfig values, state dict)`` of a ``Gemma2ForCausalLM``."""
    return _convert(config, w, "gemma2")


def convert_gemma3(config: Any, w: _Weights) -> Converted:
    """``(GPTConfig values, state dict)`` of a ``Gemma3ForCausalLM`` (text only)."""
    return _convert(config, w, "gemma3_text")


register_family("gemma2", "model.", convert_gemma2,
                "Gemma 2 (attention and final-logit soft-capping, local/global layers, sandwich norms)")
register_family("gemma3_text", "model.", convert_gemma3,
                "Gemma 3 text (QK-norm, 5:1 local/global layers with their own RoPE bases, sandwich norms)")
