"""Bloom (``model_type="bloom"``): ALiBi (Bloom's ``+m*j`` bias, equal to ``-m*(i-j)`` after the
softmax), an embedding LayerNorm, fused qkv laid out per head ``[h, 3, d_k]`` (BigScience 2022,
https://arxiv.org/abs/2211.05100). Read only: :func:`poslab.to_hf` does not write this family.
"""

from __future__ import annotations

from typing import Any

from poslab.interop import common as c

FAMILY = "bloom"


def convert(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``BloomForCausalLM``."""
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        raise c.unsupported(FAMILY, "apply_residual_connection_post_layernorm=True")
    d, heads = config.hidden_size, config.n_head
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.n_layer,
        n_head=heads,
        n_embd=d,
        block_size=int(getattr(config, "seq_length", None) or 2048),
        bias=True,
        position="alibi",
        tie_embeddings=bool(config.tie_word_embeddings),
        norm={"kind": "layernorm", "embed": True, "eps": config.layer_norm_epsilon},
        mlp={"kind": "gelu", "hidden": 4 * d, "activation": "gelu_tanh"},
    )
    sd = {"tok_emb.weight": w.take("word_embeddings.weight")}
    for name in ("weight", "bias"):
        sd[f"embed_norm.{name}"] = w.take(f"word_embeddings_layernorm.{name}")
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for name in ("weight", "bias"):
            sd[f"{dst}attn.qkv.{name}"] = c.fused_per_head(w.take(f"{src}self_attention.query_key_value.{name}"), heads)
            sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}self_attention.dense.{name}")
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}input_layernorm.{name}")
            sd[f"{dst}norm2.{name}"] = w.take(f"{src}post_attention_layernorm.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.dense_h_to_4h.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.dense_4h_to_h.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


FAMILIES = (c.Family(FAMILY, "transformer.", "Bloom (ALiBi, embedding LayerNorm)", convert),)
