"""Qwen3 (``model_type="qwen3"``) for :func:`poslab.from_hf` / :func:`poslab.to_hf`.

Qwen3 = Llama (RoPE half-split, GQA, SwiGLU, RMSNorm) + **QK-norm**: an RMSNorm over ``head_dim`` on
every query and key head before RoPE (``q_norm``/``k_norm``), and a ``head_dim`` free of
``hidden_size / num_attention_heads``. Sliding-window layers (``use_sliding_window``, the
``layer_types`` list) map onto ``GPTConfig.layer_pattern`` windows.
Qwen Team 2025, "Qwen3 Technical Report", https://arxiv.org/abs/2505.09388.
"""

from __future__ import annotations

from typing import Any

from poslab.interop import common as m
from poslab.interop.checkpoint import transformers_module

FAMILY = "qwen3"


def convert(config: Any, w: m.Weights) -> m.Converted:
    """``(GPTConfig values, state dict)`` of a ``Qwen3ForCausalLM``."""
    m.check_divisible(FAMILY, config)
    head_dim = m.head_dim_of(config)
    bias = bool(config.attention_bias)
    types = m.layer_types(FAMILY, config, (m.FULL, m.SLIDING))
    rope = m.rope_config(FAMILY, config, config.rope_parameters, head_dim)
    cfg = m.decoder_config(FAMILY, config, rope) | dict(
        attention={"bias": bias, "head_dim": head_dim, "qk_norm": True, "backend": "auto"},
    )
    if m.SLIDING in types:
        cfg["layer_pattern"] = [{"window": int(config.sliding_window)} if t == m.SLIDING else {} for t in types]
    return cfg, m.import_decoder(w, cfg, bias, qk_norm=True)


def to_hf(gpt: Any, out_dir: Any = None) -> Any:
    """A ``Qwen3ForCausalLM`` with the weights and logits of a Qwen3-layout :class:`poslab.GPT`.

    The layout: ``position="rope"`` (half-split, any transformers scaling), rmsnorm, swiglu without
    MLP biases, ``qk_norm=True`` with gains, sequential residual; windows through ``layer_pattern``
    or ``window`` (one size). Anything else is refused naming the option (:data:`WRITES`).
    ``out_dir``: also ``save_pretrained`` there (a new or empty folder).
    """
    WRITES.refuse(gpt)
    transformers = transformers_module()
    types, window = m.window_layers(gpt)
    fields = m.hf_decoder_config(gpt) | dict(
        rope_parameters=m.hf_rope(FAMILY, gpt, gpt.position),
        use_sliding_window=window is not None,
        sliding_window=window or 4096,
        layer_types=types,
    )
    hf_config = transformers.Qwen3Config(**fields)
    hf = transformers.Qwen3ForCausalLM(hf_config)
    sd = m.export_decoder(gpt, qk_norm=True)
    return m.finish_export(hf, sd, gpt.tok_emb.weight.dtype, out_dir)


WRITES = m.Writes(
    FAMILY,
    requires={**m.ROPE_DECODER, "mlp.bias": False, "attention.qk_norm": True},
    carries=frozenset(
        {"n_kv_head", "attention.head_dim", "attention.bias", "attention.qk_norm", "attention.window", "layer_pattern"}
    ),
    layer_keys=frozenset({"window"}),
    checks=(m.rope_check(FAMILY), m.one_window(FAMILY)),
    export=to_hf,
)
FAMILIES = (
    m.Family(FAMILY, "model.", "Qwen3 (Llama + QK-norm, free head_dim, per-layer sliding windows)", convert, WRITES),
)
