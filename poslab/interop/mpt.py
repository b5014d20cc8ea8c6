"""MPT (``model_type="mpt"``): ALiBi with ``alibi_bias_max``, ``clip_qkv``, ``softmax_scale``, no biases
(MosaicML 2023). Read only: :func:`poslab.to_hf` does not write this family.
"""

from __future__ import annotations

import warnings
from typing import Any

from poslab.interop import common as c

FAMILY = "mpt"


def convert(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of an ``MptForCausalLM``."""
    # transformers' MPT has no biases anywhere (LayerNorms included) and always uses ALiBi.
    d, heads = config.d_model, config.n_heads
    attn = config.attn_config
    if attn.alibi_bias_max != 8:
        warnings.warn(
            f"mpt: attn_config.alibi_bias_max={attn.alibi_bias_max}, but transformers 5.24's MptModel never passes it "
            "on (its ALiBi always uses 8); poslab follows transformers so the logits match. MosaicML's original code "
            f"uses it: set position_config={{'bias_max': {float(attn.alibi_bias_max)}}} for that model "
            "(docs/interop.md)",
            UserWarning,
            stacklevel=3,
        )
    up = w.tensors.get("blocks.0.ffn.up_proj.weight")  # transformers hard-codes 4*d_model; read it off the weights
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.n_layers,
        n_head=heads,
        n_embd=d,
        block_size=config.max_seq_len,
        bias=False,
        position="alibi",
        tie_embeddings=bool(config.tie_word_embeddings),
        norm={"kind": "layernorm", "eps": config.layer_norm_epsilon},
        mlp={"kind": "gelu", "hidden": up.shape[0] if up is not None else 4 * d, "activation": "gelu"},
        attention={
            "scale": float(attn.softmax_scale) if attn.softmax_scale is not None else None,
            "clip_qkv": float(attn.clip_qkv) if attn.clip_qkv else None,
        },
    )
    sd = {"tok_emb.weight": w.take("wte.weight")}
    for i in range(config.n_layers):
        src, dst = f"blocks.{i}.", f"blocks.{i}."
        sd[f"{dst}attn.qkv.weight"] = w.take(f"{src}attn.Wqkv.weight")  # chunk(3): q | k | v
        sd[f"{dst}attn.proj.weight"] = w.take(f"{src}attn.out_proj.weight")
        sd[f"{dst}norm1.weight"] = w.take(f"{src}norm_1.weight")
        sd[f"{dst}norm2.weight"] = w.take(f"{src}norm_2.weight")
        sd[f"{dst}mlp.up.weight"] = w.take(f"{src}ffn.up_proj.weight")
        sd[f"{dst}mlp.down.weight"] = w.take(f"{src}ffn.down_proj.weight")
    sd["norm_f.weight"] = w.take("norm_f.weight")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


FAMILIES = (c.Family(FAMILY, "transformer.", "MPT (ALiBi with alibi_bias_max, clip_qkv)", convert),)
