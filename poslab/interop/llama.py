"""Llama (``model_type="llama"``) and Mistral (``"mistral"``): RoPE half-split, GQA, SwiGLU, RMSNorm.

Llama (Touvron et al. 2023, https://arxiv.org/abs/2302.13971) maps every ``rope_parameters`` type
(default, linear, dynamic, yarn, llama3, longrope) onto the ``rope`` scheme's scaling, with optional
attention and MLP biases. Mistral (Jiang et al. 2023, https://arxiv.org/abs/2310.06825) is Llama
plus one sliding window on every layer (``i - W < j <= i``, the same rule as ``GPTConfig.window``).
:func:`poslab.to_hf` writes a model of this layout as ``LlamaForCausalLM`` (``MistralForCausalLM``
with a window); an interleaved-RoPE model is re-laid out with :func:`poslab.interop.relayout_rope`.
"""

from __future__ import annotations

from typing import Any

from poslab.interop import common as c
from poslab.interop.checkpoint import transformers_module
from poslab.interop.permute import relayout_rope


def _convert(config: Any, w: c.Weights, family: str) -> c.Converted:
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = c.full_head_dim(family, config, d, heads)
    attn_bias = bool(getattr(config, "attention_bias", False))
    mlp_bias = bool(getattr(config, "mlp_bias", False))
    cfg = dict(
        vocab_size=config.vocab_size,
        n_layer=config.num_hidden_layers,
        n_head=heads,
        n_kv_head=config.num_key_value_heads or heads,
        n_embd=d,
        block_size=config.max_position_embeddings,
        bias=False,
        position="rope",
        position_config=c.rope_config_from_hf(config, head_dim, "half", family),
        tie_embeddings=bool(config.tie_word_embeddings),
        attention={"bias": attn_bias},
        mlp={
            "bias": mlp_bias,
            "kind": "swiglu",
            "hidden": config.intermediate_size,
            "activation": c.activation(family, config.hidden_act),
        },
        norm={"kind": "rmsnorm", "eps": config.rms_norm_eps},
    )
    if family == "mistral":
        cfg["attention"]["window"] = config.sliding_window
    sd = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        c.attention(w, sd, f"{src}self_attn.", dst, attn_bias)
        c.swiglu(w, sd, f"{src}mlp.", dst, mlp_bias)
        sd[f"{dst}norm1.weight"] = w.take(f"{src}input_layernorm.weight")
        sd[f"{dst}norm2.weight"] = w.take(f"{src}post_attention_layernorm.weight")
    sd["norm_f.weight"] = w.take("norm.weight")
    c.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def convert_llama(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``LlamaForCausalLM``."""
    return _convert(config, w, "llama")


def convert_mistral(config: Any, w: c.Weights) -> c.Converted:
    """``(GPTConfig values, state dict)`` of a ``MistralForCausalLM`` (Llama + ``window``)."""
    return _convert(config, w, "mistral")


def _export(gpt: Any, out_dir: Any, family: str) -> Any:
    (MISTRAL if family == "mistral" else LLAMA).refuse(gpt)
    transformers = transformers_module()
    if gpt.position.config.layout != "half":
        gpt = relayout_rope(gpt, "half")  # Meta-style interleaved rows -> HF's half-split rows
    cfg = gpt.config
    rope_parameters, max_pos = c.hf_rope_parameters(gpt.position, cfg.head_dim, cfg.block_size)
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        intermediate_size=gpt.blocks[0].mlp.up.out_features,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        hidden_act=c.HF_ACT[cfg.mlp.activation],
        max_position_embeddings=max_pos,
        rms_norm_eps=cfg.norm.eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=rope_parameters,
        attention_dropout=cfg.dropout,
        bos_token_id=None,
        eos_token_id=None,
    )
    if family == "mistral":
        hf_model = transformers.MistralForCausalLM(
            transformers.MistralConfig(sliding_window=cfg.attention.window, **common)
        )
    else:
        hf_model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(attention_bias=cfg.bias_of("attn"), mlp_bias=cfg.bias_of("mlp"), **common)
        )
    return c.finish_export(hf_model, c.export_decoder(gpt), gpt.tok_emb.weight.dtype, out_dir)


def to_hf_llama(gpt: Any, out_dir: Any = None) -> Any:
    """A ``LlamaForCausalLM`` with the weights and logits of a Llama-layout :class:`poslab.GPT`.

    The layout: ``position="rope"`` (either layout; any transformers scaling, the whole head rotated),
    rmsnorm, swiglu, optional GQA, ``attention.head_dim`` and attention/MLP biases, full causal attention.
    ``out_dir``: also ``save_pretrained`` there (a new or empty folder).
    """
    return _export(gpt, out_dir, "llama")


def to_hf_mistral(gpt: Any, out_dir: Any = None) -> Any:
    """A ``MistralForCausalLM``: the Llama layout with one ``window`` on every layer and no biases."""
    return _export(gpt, out_dir, "mistral")


_BASE = {"position": "rope", "residual": "sequential", "norm.kind": "rmsnorm", "mlp.kind": "swiglu"}
LLAMA = c.Writes(
    "llama",
    requires=_BASE,
    carries=frozenset({"n_kv_head", "attention.head_dim", "attention.bias", "mlp.bias"}),
    checks=(c.rope_check("llama", layout=None),),
    export=to_hf_llama,
)
MISTRAL = c.Writes(
    "mistral",
    requires={**_BASE, "attention.bias": False, "mlp.bias": False},
    carries=frozenset({"n_kv_head", "attention.head_dim", "attention.window"}),
    checks=(c.rope_check("mistral", layout=None),),
    export=to_hf_mistral,
)
FAMILIES = (
    c.Family(
        "llama",
        "model.",
        "Llama (RoPE half-split, GQA, rope_parameters: default/linear/dynamic/yarn/llama3/longrope)",
        convert_llama,
        LLAMA,
    ),
    c.Family("mistral", "model.", "Mistral (Llama + sliding window)", convert_mistral, MISTRAL),
)
