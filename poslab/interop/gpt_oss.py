"""gpt-oss (``model_type="gpt_oss"``): its attention layers, loaded into :class:`MultiHeadAttention`.

gpt-oss attention (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card",
https://arxiv.org/abs/2508.10925): GQA with biases, RoPE (YaRN), layers alternating between a
sliding window of ``sliding_window`` keys and full attention (``layer_types``), and **attention
sinks**: one learned logit per head appended to every row of logits before the softmax and dropped
after it (``AttentionConfig(sinks=True)``, parameter ``sinks``).

Every gpt-oss MLP is a routed mixture of experts, which ``poslab.GPT`` does not implement, so
:func:`poslab.from_hf` refuses the whole model (naming ``num_local_experts``) and this module maps
the attention layers alone: :func:`attention_from_hf` returns layer ``i``'s attention (same weights)
and its RoPE scheme; tests feed it the hidden states transformers' own layer receives and compare
outputs, with and without the KV cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from poslab.checks import non_negative_int
from poslab.interop import common as m
from poslab.nn import positions
from poslab.nn.attention import AttentionConfig, MultiHeadAttention
from poslab.nn.positions.base import PositionScheme

FAMILY = "gpt_oss"


def convert(config: Any, w: m.Weights) -> m.Converted:
    """Refuses: every gpt-oss MLP is a mixture of experts (see :func:`attention_from_hf`)."""
    raise ValueError(
        f"gpt_oss: the routed mixture-of-experts MLP (num_local_experts={config.num_local_experts}, "
        f"num_experts_per_tok={config.num_experts_per_tok}) is not supported by poslab.from_hf; "
        "poslab.interop.gpt_oss.attention_from_hf(model, layer) loads its attention layers"
    )


def attention_from_hf(
    model: nn.Module, layer: int, *, backend: str = "auto"
) -> tuple[MultiHeadAttention, PositionScheme]:
    """Layer ``layer``'s attention of a ``GptOssForCausalLM`` (or ``GptOssModel``) with the same weights.

    Args:
        model: the transformers model.
        layer: layer index.
        backend: poslab attention backend of the result.

    Returns:
        ``(attention, rope)``: the attention runs ``rope`` (lent with ``share_position``); call
        ``attention(x, pos, cache=...)`` on the hidden states ``[B, T, hidden_size]`` that enter
        transformers' ``self_attn``.
    """
    config = model.config
    if getattr(config, "model_type", None) != FAMILY:
        raise ValueError(
            f"attention_from_hf takes a gpt_oss model, got model_type {getattr(config, 'model_type', None)!r}"
        )
    n_layers = config.num_hidden_layers
    non_negative_int("layer", layer, maximum=n_layers - 1, rule=f"an integer in [0, {n_layers})")
    m.check_divisible(FAMILY, config)
    head_dim = m.head_dim_of(config)
    kind = m.layer_types(FAMILY, config, (m.FULL, m.SLIDING))[layer]
    rope = positions.build_for_model(
        "rope",
        m.rope_config(FAMILY, config, config.rope_parameters, head_dim),
        {
            "n_embd": config.hidden_size,
            "n_heads": config.num_attention_heads,
            "head_dim": head_dim,
            "max_len": config.max_position_embeddings,
            "bidirectional": False,
        },
    )
    bias = bool(config.attention_bias)
    attn = MultiHeadAttention(
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        AttentionConfig(
            window=int(config.sliding_window) if kind == m.SLIDING else None,
            sinks=True,
            backend=backend,
            bias=bias,
            head_dim=head_dim,
        ),
    )
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    prefix = (
        f"model.layers.{layer}.self_attn."
        if f"model.layers.{layer}.self_attn.sinks" in tensors
        else f"layers.{layer}.self_attn."
    )
    w = m.Weights({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, "", FAMILY)
    sd: dict[str, torch.Tensor] = {}
    m.attention(w, sd, "", "", bias)
    sd = {k[len("attn.") :]: v for k, v in sd.items()}
    sd["sinks"] = w.take("sinks")
    w.finish()
    attn.load_state_dict(sd, strict=True)
    dtype = tensors[f"{prefix}q_proj.weight"].dtype
    attn = attn.to(dtype).eval()
    attn.share_position(rope)
    return attn, rope


def _moe(gpt: Any) -> list[m.Problem]:
    return [
        (
            "mlp",
            f"mlp={gpt.config.mlp.kind!r} (gpt-oss MLPs are routed mixtures of experts with a clamped SwiGLU, "
            "which poslab.GPT does not implement, so poslab writes no gpt-oss model)",
        )
    ]


#: gpt-oss carries attention sinks and alternating windows, but its MLP is one poslab has not: every
#: model is refused, and refusals of ``attention.sinks`` name this family.
WRITES = m.Writes(
    FAMILY,
    requires={"position": "rope", "residual": "sequential", "norm.kind": "rmsnorm"},
    carries=frozenset(
        {
            "mlp",
            "attention.sinks",
            "attention.window",
            "layer_pattern",
            "n_kv_head",
            "attention.head_dim",
            "attention.bias",
            "mlp.bias",
            "norm.bias",
        }
    ),
    layer_keys=frozenset({"window"}),
    checks=(_moe,),
    export=None,
)
FAMILIES = (
    m.Family(
        FAMILY,
        "model.",
        "gpt-oss (attention layers only, via poslab.interop.gpt_oss.attention_from_hf: sinks, "
        "alternating sliding/full; the MoE MLP is refused)",
        convert,
        WRITES,
    ),
)
