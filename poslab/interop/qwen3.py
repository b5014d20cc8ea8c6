"""Qwen3 (``model_type="qwen3"``) for :func:`poslab.from_hf` / :func:`poslab.to_hf`.

Qwen3 = Llama (RoPE half-split, GQA, SwiGLU, RMSNorm) + **QK-norm**: an RMSNorm over ``head_dim`` on
every query and key head before RoPE (``q_norm``/``k_norm``), and a ``head_dim`` free of
``hidden_size / num_attention_heads``. Sliding-window layers (``use_sliding_window``, the
``layer_types`` list) map onto ``GPTConfig.layer_pattern`` windows.
Qwen Team 2025, "Qwen3 Technical Report", https://arxiv.org/abs/2505.09388.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from poslab.interop import _modern as m
from poslab.interop.hf import Converted, _activation, _lm_head, _Weights, register_family

FAMILY = "qwen3"


def convert(config: Any, w: _Weights) -> Converted:
    """``(GPTConfig values, state dict)`` of a ``Qwen3ForCausalLM``."""
    m.check_divisible(FAMILY, config)
    head_dim = m.head_dim_of(config)
    bias = bool(config.attention_bias)
    types = m.layer_types(FAMILY, config, (m.FULL, m.SLIDING))
    cfg: dict[str, Any] = dict(
        vocab_size=config.vocab_size, n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
        n_kv_head=config.num_key_value_heads, n_embd=config.hidden_size, block_size=config.max_position_embeddings,
        bias=False, attn_bias=bias, position="rope", position_config=m.rope_config(FAMILY, config, config.rope_parameters, head_dim),
        norm="rmsnorm", mlp="swiglu", mlp_hidden=config.intermediate_size, activation=_activation(FAMILY, config.hidden_act),
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.rms_norm_eps, attn_head_dim=head_dim, qk_norm=True,
        backend="auto",
    )
    if m.SLIDING in types:
        cfg["layer_pattern"] = [{"window": int(config.sliding_window)} if t == m.SLIDING else {} for t in types]
    sd: dict[str, Tensor] = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        m.attention(w, sd, f"{src}self_attn.", dst, bias, qk_norm=True)
        m.swiglu(w, sd, f"{src}mlp.", dst)
        sd[f"{dst}norm1.weight"] = w.take(f"{src}input_layernorm.weight")
        sd[f"{dst}norm2.weight"] = w.take(f"{src}post_attention_layernorm.weight")
    sd["norm_f.weight"] = w.take("norm.weight")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


register_family(FAMILY, "model.", convert, "Qwen3 (Llama + QK-norm, free head_dim, per-layer sliding windows)")
