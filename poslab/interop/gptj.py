"""GPT-J (``model_type="gptj"``): interleaved partial rotary, parallel residual with one shared norm,
an LM-head bias (Wang & Komatsuzaki 2021). Read only: :func:`poslab.to_hf` does not write this family.
"""

from __future__ import annotations

from typing import Any

import torch

from poslab.interop import common as c

FAMILY = "gptj"


def convert(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``GPTJForCausalLM``."""
    d, heads = config.n_embd, config.n_head
    head_dim = d // heads
    rotary_dim = config.rotary_dim or head_dim
    position_config: dict[str, Any] = {
        "base": 10000.0,
        "layout": "interleaved",
    }  # GPT-J's base is fixed in transformers
    if rotary_dim != head_dim:
        position_config["rotary_dim"] = rotary_dim
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.n_layer,
        n_head=heads,
        n_embd=d,
        block_size=config.n_positions,
        bias=True,
        lm_head_bias=True,
        position="rope",
        position_config=position_config,
        residual="parallel_shared_norm",
        tie_embeddings=bool(config.tie_word_embeddings),
        attention={"bias": False},
        norm={"kind": "layernorm", "eps": config.layer_norm_epsilon},
        mlp={
            "kind": "gelu",
            "hidden": config.n_inner or 4 * d,
            "activation": c.activation(FAMILY, config.activation_function),
        },
    )
    sd = {"tok_emb.weight": w.take("wte.weight")}
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        sd[f"{dst}attn.qkv.weight"] = torch.cat(
            [w.take(f"{src}attn.{p}_proj.weight") for p in "qkv"], dim=0
        )  # rows q | k | v
        sd[f"{dst}attn.proj.weight"] = w.take(f"{src}attn.out_proj.weight")
        for name in ("weight", "bias"):
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}ln_1.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.fc_in.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.fc_out.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    sd["lm_head.bias"] = w.take("lm_head.bias")
    return cfg, sd


FAMILIES = (
    c.Family(FAMILY, "transformer.", "GPT-J (interleaved partial rotary, parallel residual, one norm)", convert),
)
