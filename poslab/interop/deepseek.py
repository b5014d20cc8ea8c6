"""DeepSeek-V3 (``model_type="deepseek_v3"``) for :func:`poslab.from_hf`: multi-head latent attention, dense layers.

MLA with decoupled RoPE (DeepSeek-AI 2024, https://arxiv.org/abs/2405.04434; V3:
https://arxiv.org/abs/2412.19437) maps onto ``GPTConfig.mla`` (``poslab.nn.mla``): low-rank queries
(``q_lora_rank``) and a compressed KV latent (``kv_lora_rank``) plus one rotary key shared by the
heads (``qk_rope_head_dim``; RoPE interleaved when ``rope_interleave``). The cache holds the latent
and the rotary key. The routed mixture-of-experts layers are refused: the oracle is a config whose
layers are all dense (``first_k_dense_replace = num_hidden_layers``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from poslab.interop import common as m
from poslab.interop.checkpoint import transformers_module

FAMILY = "deepseek_v3"


def _softmax_scale(config: Any) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale**2`` for YaRN with ``mscale_all_dim`` (transformers'
    ``yarn_apply_mscale``)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = config.rope_parameters or {}
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        factor = params["factor"]
        mscale = 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= mscale * mscale
    return scale


def convert(config: Any, w: m.Weights) -> m.Converted:
    """``(GPTConfig values, state dict)`` of an all-dense ``DeepseekV3ForCausalLM``."""
    n = config.num_hidden_layers
    if config.first_k_dense_replace is None or config.first_k_dense_replace < n:
        raise m.unsupported(
            FAMILY,
            f"first_k_dense_replace={config.first_k_dense_replace} with num_hidden_layers={n} "
            "(routed mixture-of-experts layers; poslab maps all-dense DeepSeek-V3 configs: "
            "first_k_dense_replace >= num_hidden_layers)",
        )
    if config.num_key_value_heads != config.num_attention_heads:
        raise m.unsupported(
            FAMILY,
            f"num_key_value_heads={config.num_key_value_heads} != num_attention_heads (MLA expands to every head)",
        )
    m.check_divisible(FAMILY, config)
    bias = bool(config.attention_bias)
    layout = "interleaved" if config.rope_interleave else "half"
    rope = m.rope_config(FAMILY, config, config.rope_parameters, config.qk_rope_head_dim, layout)
    cfg = m.decoder_config(FAMILY, config, rope)
    del cfg["n_kv_head"]  # MLA expands the latent to every head
    cfg |= dict(
        mla={
            "kv_lora_rank": config.kv_lora_rank,
            "q_lora_rank": config.q_lora_rank,
            "qk_nope_head_dim": config.qk_nope_head_dim,
            "qk_rope_head_dim": config.qk_rope_head_dim,
            "v_head_dim": config.v_head_dim,
            "latent_eps": 1e-6,
        },
        attention={"bias": bias, "scale": _softmax_scale(config), "backend": "auto"},
    )  # transformers builds q_a_layernorm / kv_a_layernorm with their default eps 1e-6, whatever rms_norm_eps says
    sd: dict[str, Tensor] = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(n):
        src, dst = f"layers.{i}.self_attn.", f"blocks.{i}.attn."
        if config.q_lora_rank is None:
            sd[f"{dst}q.weight"] = w.take(f"{src}q_proj.weight")
        else:
            sd[f"{dst}q_a.weight"] = w.take(f"{src}q_a_proj.weight")
            if bias:
                sd[f"{dst}q_a.bias"] = w.take(f"{src}q_a_proj.bias")
            sd[f"{dst}q_a_norm.weight"] = w.take(f"{src}q_a_layernorm.weight")
            sd[f"{dst}q_b.weight"] = w.take(f"{src}q_b_proj.weight")
        for name in ("weight", "bias") if bias else ("weight",):
            sd[f"{dst}kv_a.{name}"] = w.take(f"{src}kv_a_proj_with_mqa.{name}")
            sd[f"{dst}proj.{name}"] = w.take(f"{src}o_proj.{name}")
        sd[f"{dst}kv_a_norm.weight"] = w.take(f"{src}kv_a_layernorm.weight")
        sd[f"{dst}kv_b.weight"] = w.take(f"{src}kv_b_proj.weight")
        m.swiglu(w, sd, f"layers.{i}.mlp.", f"blocks.{i}.")
        sd[f"blocks.{i}.norm1.weight"] = w.take(f"layers.{i}.input_layernorm.weight")
        sd[f"blocks.{i}.norm2.weight"] = w.take(f"layers.{i}.post_attention_layernorm.weight")
    sd["norm_f.weight"] = w.take("norm.weight")
    m.lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _mla(gpt: Any) -> list[m.Problem]:
    cfg = gpt.config
    if cfg.mla["latent_eps"] != 1e-6:
        return [("mla", f"mla latent_eps={cfg.mla['latent_eps']} (transformers' latent norms use 1e-6)")]
    expected = _softmax_scale(
        SimpleNamespace(
            qk_nope_head_dim=cfg.mla["qk_nope_head_dim"],
            qk_rope_head_dim=cfg.mla["qk_rope_head_dim"],
            rope_parameters=m.hf_rope(FAMILY, gpt, gpt.position),
        )
    )
    if cfg.attention.scale is not None and abs(cfg.attention.scale - expected) > 1e-12 * expected:
        return [("attention.scale", f"attention.scale={cfg.attention.scale} (transformers derives {expected})")]
    return []


def to_hf(gpt: Any, out_dir: Any = None) -> Any:
    """An all-dense ``DeepseekV3ForCausalLM`` (``first_k_dense_replace = n_layer``) for an MLA :class:`poslab.GPT`.

    The layout: ``mla`` set, RoPE (either layout; any transformers scaling), rmsnorm, swiglu, sequential
    residual, the softmax scale transformers derives (``qk_head_dim ** -0.5``, YaRN's ``mscale**2``).
    """
    WRITES.refuse(gpt)
    transformers = transformers_module()
    cfg = gpt.config
    mla = cfg.mla
    rope_params = m.hf_rope(FAMILY, gpt, gpt.position)
    fields = m.hf_decoder_config(gpt)
    del fields["head_dim"]  # DeepSeek-V3 derives its head widths from the MLA sizes below
    fields |= dict(
        num_key_value_heads=cfg.n_head,
        first_k_dense_replace=cfg.n_layer,
        kv_lora_rank=mla["kv_lora_rank"],
        q_lora_rank=mla["q_lora_rank"],
        qk_rope_head_dim=mla["qk_rope_head_dim"],
        qk_nope_head_dim=mla["qk_nope_head_dim"],
        v_head_dim=mla["v_head_dim"],
        rope_parameters=rope_params,
        rope_interleave=gpt.position.config.layout == "interleaved",
    )
    hf_config = transformers.DeepseekV3Config(**fields)
    hf = transformers.DeepseekV3ForCausalLM(hf_config)
    src = gpt.state_dict()
    bias = cfg.bias_of("attn")
    sd = {
        "model.embed_tokens.weight": src["tok_emb.weight"],
        "model.norm.weight": src["norm_f.weight"],
        "lm_head.weight": src["lm_head.weight"],
    }
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.attn.", f"model.layers.{i}.self_attn."
        if mla["q_lora_rank"] is None:
            sd[f"{d}q_proj.weight"] = src[f"{s}q.weight"]
        else:
            sd[f"{d}q_a_proj.weight"] = src[f"{s}q_a.weight"]
            if bias:
                sd[f"{d}q_a_proj.bias"] = src[f"{s}q_a.bias"]
            sd[f"{d}q_a_layernorm.weight"] = src[f"{s}q_a_norm.weight"]
            sd[f"{d}q_b_proj.weight"] = src[f"{s}q_b.weight"]
        for name in ("weight", "bias") if bias else ("weight",):
            sd[f"{d}kv_a_proj_with_mqa.{name}"] = src[f"{s}kv_a.{name}"]
            sd[f"{d}o_proj.{name}"] = src[f"{s}proj.{name}"]
        sd[f"{d}kv_a_layernorm.weight"] = src[f"{s}kv_a_norm.weight"]
        sd[f"{d}kv_b_proj.weight"] = src[f"{s}kv_b.weight"]
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            sd[f"model.layers.{i}.mlp.{theirs}.weight"] = src[f"blocks.{i}.mlp.{ours}.weight"]
        sd[f"model.layers.{i}.input_layernorm.weight"] = src[f"blocks.{i}.norm1.weight"]
        sd[f"model.layers.{i}.post_attention_layernorm.weight"] = src[f"blocks.{i}.norm2.weight"]
    return m.finish_export(hf, sd, gpt.tok_emb.weight.dtype, out_dir)


WRITES = m.Writes(
    FAMILY,
    requires={**m.ROPE_DECODER, "n_kv_head": None, "mlp.bias": False},
    carries=frozenset({"mla", "attention.bias", "attention.scale", "attention.head_dim"}),
    checks=(
        lambda gpt: (
            []
            if gpt.config.mla is not None
            else [("mla", "mla=None (DeepSeek-V3 attention is multi-head latent attention)")]
        ),
        m.rope_check(FAMILY, layout=None),
        _mla,
    ),
    export=to_hf,
)
FAMILIES = (
    m.Family(
        FAMILY,
        "model.",
        "DeepSeek-V3, all-dense configs (multi-head latent attention with decoupled RoPE, compressed KV cache)",
        convert,
        WRITES,
    ),
)
