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
    cfg = c.decoder_config(family, config, c.rope_config_from_hf(config, head_dim, "half", family))
    cfg["n_kv_head"] = config.num_key_value_heads or heads
    cfg["attention"] = {"bias": attn_bias}
    cfg["mlp"]["bias"] = mlp_bias
    if family == "mistral":
        cfg["attention"]["window"] = config.sliding_window
    return cfg, c.import_decoder(w, cfg, attn_bias, mlp_bias=mlp_bias)


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
    common = c.hf_decoder_config(gpt) | dict(
        max_position_embeddings=max_pos, rope_parameters=rope_parameters, attention_dropout=cfg.dropout
    )
    attention_bias = common.pop("attention_bias")  # Mistral's config has none
    if family == "mistral":
        hf_model = transformers.MistralForCausalLM(
            transformers.MistralConfig(sliding_window=cfg.attention.window, **common)
        )
    else:
        hf_model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(attention_bias=attention_bias, mlp_bias=cfg.bias_of("mlp"), **common)
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


LLAMA = c.Writes(
    "llama",
    requires=c.ROPE_DECODER,
    carries=frozenset({"n_kv_head", "attention.head_dim", "attention.bias", "mlp.bias"}),
    checks=(c.rope_check("llama", layout=None),),
    export=to_hf_llama,
)
MISTRAL = c.Writes(
    "mistral",
    requires={**c.ROPE_DECODER, "attention.bias": False, "mlp.bias": False},
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
