"""GPT-2 (``model_type="gpt2"``): learned absolute positions, Conv1D (transposed) weights, tanh GELU.

Radford et al. 2019, "Language Models are Unsupervised Multitask Learners". Read by
:func:`poslab.from_hf`; written by :func:`poslab.to_hf` for the GPT-2 layout (learned positions,
LayerNorm, GELU MLP, biases everywhere, no GQA, no window).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from poslab.interop import common as c
from poslab.interop.checkpoint import transformers_module

FAMILY = "gpt2"
#: ours, theirs, Conv1D (stored ``[in, out]``)
_LAYER = (
    ("norm1", "ln_1", False),
    ("attn.qkv", "attn.c_attn", True),
    ("attn.proj", "attn.c_proj", True),
    ("norm2", "ln_2", False),
    ("mlp.up", "mlp.c_fc", True),
    ("mlp.down", "mlp.c_proj", True),
)


def convert(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``GPT2LMHeadModel``."""
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise c.unsupported(FAMILY, "scale_attn_by_inverse_layer_idx=True")
    if getattr(config, "add_cross_attention", False):
        raise c.unsupported(FAMILY, "add_cross_attention=True")
    d = config.n_embd
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=d,
        block_size=config.n_positions,
        bias=True,
        position="learned",
        tie_embeddings=bool(config.tie_word_embeddings),
        norm={"kind": "layernorm", "eps": config.layer_norm_epsilon},
        mlp={
            "kind": "gelu",
            "hidden": config.n_inner or 4 * d,
            "activation": c.activation(FAMILY, config.activation_function),
        },
        attention={"scale": None if config.scale_attn_weights else 1.0},
    )
    sd = {"tok_emb.weight": w.take("wte.weight"), "position.table.weight": w.take("wpe.weight")}
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for ours, hf, conv1d in _LAYER:
            weight = w.take(f"{src}{hf}.weight")
            sd[f"{dst}{ours}.weight"] = weight.t() if conv1d else weight  # Conv1D stores [in, out]
            sd[f"{dst}{ours}.bias"] = w.take(f"{src}{hf}.bias")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _scale(gpt: Any) -> list[c.Problem]:
    scale = c.effective(gpt.config, "attention.scale")
    if scale not in (None, 1.0):
        return [("attention.scale", f"attention.scale={scale} (GPT-2 scales by 1/sqrt(head_dim) or not at all)")]
    return []


def to_hf(gpt: Any, out_dir: Any = None) -> Any:
    """A ``GPT2LMHeadModel`` with the weights and logits of a GPT-2-layout :class:`poslab.GPT`.

    ``out_dir``: also ``save_pretrained`` there (a new or empty folder). Anything the layout cannot
    hold is refused naming the option (:data:`WRITES`).
    """
    WRITES.refuse(gpt)
    transformers = transformers_module()
    cfg = gpt.config
    hf_config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=gpt.position.config.max_len,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=gpt.blocks[0].mlp.up.out_features,
        activation_function=c.HF_ACT[cfg.mlp.activation],
        layer_norm_epsilon=cfg.norm.eps,
        tie_word_embeddings=cfg.tie_embeddings,
        scale_attn_weights=cfg.attention.scale is None,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=None,
        eos_token_id=None,
    )
    src = gpt.state_dict()
    sd: dict[str, Tensor] = {
        "transformer.wte.weight": src["tok_emb.weight"],
        "transformer.wpe.weight": src["position.table.weight"],
    }
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, hf, conv1d in _LAYER:
            weight = src[f"{s}{ours}.weight"]
            sd[f"{d}{hf}.weight"] = weight.t().contiguous() if conv1d else weight
            sd[f"{d}{hf}.bias"] = src[f"{s}{ours}.bias"]
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = src["norm_f.weight"], src["norm_f.bias"]
    sd["lm_head.weight"] = src["lm_head.weight"]
    return c.finish_export(transformers.GPT2LMHeadModel(hf_config), sd, gpt.tok_emb.weight.dtype, out_dir)


WRITES = c.Writes(
    FAMILY,
    requires={
        "position": "learned",
        "residual": "sequential",
        "norm.kind": "layernorm",
        "norm.bias": True,
        "mlp.kind": "gelu",
        "mlp.bias": True,
        "attention.bias": True,
    },
    carries=frozenset({"attention.scale"}),
    checks=(_scale,),
    export=to_hf,
)
FAMILIES = (c.Family(FAMILY, "transformer.", "GPT-2 (learned absolute positions)", convert, WRITES),)
