"""Llama 4 text (``model_type="llama4_text"``) for :func:`poslab.from_hf`, dense layers only.

iRoPE (Meta 2025, "The Llama 4 herd", https://ai.meta.com/blog/llama-4-multimodal-intelligence/):
RoPE (interleaved, complex pairs) on three layers of every four with **chunked local attention**
(``attention_chunk_size``: ``j // C == i // C``) and a weightless L2 **QK-norm**
(``use_qk_norm``); every fourth layer (``no_rope_layers[i] == 0``) is **NoPE** with global
attention and **attention-temperature tuning**: queries times
``log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1``. All of it is one
``GPTConfig.layer_pattern`` entry per layer.

transformers applies the L2 norm after RoPE, poslab before it: a rotation keeps every pair's norm,
so both orders give the same vectors (up to rounding). The routed mixture-of-experts layers
(``moe_layers``) are refused: build the model with ``moe_layers=[]`` (every layer dense, width
``intermediate_size_mlp``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from poslab.interop import _modern as m
from poslab.interop.hf import Converted, _activation, _lm_head, _unsupported, _Weights, register_family

FAMILY = "llama4_text"


def convert(config: Any, w: _Weights) -> Converted:
    """``(GPTConfig values, state dict)`` of a dense ``Llama4ForCausalLM``."""
    if config.moe_layers:
        raise _unsupported(FAMILY, f"moe_layers={list(config.moe_layers)} (routed mixture-of-experts layers; "
                                   "poslab maps dense Llama 4 layers only: moe_layers=[])")
    m.check_divisible(FAMILY, config)
    head_dim = m.head_dim_of(config)
    bias = bool(config.attention_bias)
    types = m.layer_types(FAMILY, config, (m.FULL, m.CHUNKED))
    rope = m.rope_config(FAMILY, config, config.rope_parameters, head_dim, layout="interleaved")
    chunk = config.attention_chunk_size
    pattern = []
    for t, use_rope in zip(types, config.no_rope_layers, strict=True):
        entry: dict[str, Any] = {"qk_norm": bool(config.use_qk_norm and use_rope)}
        if t == m.CHUNKED:
            entry["attn_chunk"] = int(chunk)
        if not use_rope:
            entry["position"] = "none"
            if config.attn_temperature_tuning:
                entry["attn_temperature"] = [float(config.floor_scale), float(config.attn_scale)]
        pattern.append(entry)
    cfg: dict[str, Any] = dict(
        vocab_size=config.vocab_size, n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
        n_kv_head=config.num_key_value_heads, n_embd=config.hidden_size, block_size=config.max_position_embeddings,
        bias=False, attn_bias=bias, position="rope", position_config=rope, norm="rmsnorm", mlp="swiglu",
        mlp_hidden=config.intermediate_size_mlp, activation=_activation(FAMILY, config.hidden_act),
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.rms_norm_eps, attn_head_dim=head_dim,
        qk_norm_affine=False, layer_pattern=pattern, backend="auto",
    )
    sd: dict[str, Tensor] = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        m.attention(w, sd, f"{src}self_attn.", dst, bias)
        m.swiglu(w, sd, f"{src}feed_forward.", dst)
        sd[f"{dst}norm1.weight"] = w.take(f"{src}input_layernorm.weight")
        sd[f"{dst}norm2.weight"] = w.take(f"{src}post_attention_layernorm.weight")
    sd["norm_f.weight"] = w.take("norm.weight")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


register_family(FAMILY, "model.", convert,
                "Llama 4 text, dense layers (iRoPE: chunked RoPE layers with L2 QK-norm, NoPE layers with "
                "attention-temperature tuning)")
