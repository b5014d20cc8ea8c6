"""GPT-NeoX / Pythia (``model_type="gpt_neox"``): partial rotary, fused qkv laid out per head
``[h, 3, d_k]``, parallel residual with two norms (Black et al. 2022, https://arxiv.org/abs/2204.06745).
Read only: :func:`poslab.to_hf` does not write this family.
"""

from __future__ import annotations

from typing import Any

from poslab.interop import common as c

FAMILY = "gpt_neox"


def convert(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``GPTNeoXForCausalLM``."""
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = c.full_head_dim(FAMILY, config, d, heads)
    attn_bias = bool(getattr(config, "attention_bias", True))
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.num_hidden_layers,
        n_head=heads,
        n_embd=d,
        block_size=config.max_position_embeddings,
        bias=True,
        position="rope",
        position_config=c.rope_config_from_hf(config, head_dim, "half", FAMILY),
        residual="parallel" if config.use_parallel_residual else "sequential",
        tie_embeddings=bool(config.tie_word_embeddings),
        attention={"bias": attn_bias},
        norm={"kind": "layernorm", "eps": config.layer_norm_eps},
        mlp={"kind": "gelu", "hidden": config.intermediate_size, "activation": c.activation(FAMILY, config.hidden_act)},
    )
    sd = {"tok_emb.weight": w.take("embed_in.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        for name in ("weight", "bias") if attn_bias else ("weight",):
            sd[f"{dst}attn.qkv.{name}"] = c.fused_per_head(w.take(f"{src}attention.query_key_value.{name}"), heads)
            sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}attention.dense.{name}")
        for name in ("weight", "bias"):
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}input_layernorm.{name}")
            sd[f"{dst}norm2.{name}"] = w.take(f"{src}post_attention_layernorm.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.dense_h_to_4h.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.dense_4h_to_h.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("final_layer_norm.weight"), w.take("final_layer_norm.bias")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight", "embed_out.weight")
    return cfg, sd


FAMILIES = (c.Family(FAMILY, "gpt_neox.", "GPT-NeoX / Pythia (partial rotary, parallel residual)", convert),)
