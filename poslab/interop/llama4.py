"""Llama 4 text (``model_type="llama4_text"``) for :func:`poslab.from_hf`, dense layers only.

iRoPE (Meta 2025, "The Llama 4 herd", https://ai.meta.com/blog/llama-4-multimodal-intelligence/):
RoPE (interleaved, complex pairs) on three layers of every four with **chunked local attention**
(``attention_chunk_size``: ``j // C == i // C``) and a weightless L2 **QK-norm**
(``use_qk_norm``); every fourth layer (``no_rope_layers[i] == 0``) is **NoPE** with global
attention and **attention-temperature tuning**: queries times
``log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1``. All of it is one
``GPTConfig.layer_pattern`` entry per layer.

transformers applies the L2 norm after RoPE, poslab before it: a rotation keeps every pair's norm,
so both orders give the same vectors (up to rounding). The routed mixture-of-experts layers
(``moe_layers``) are refused: build the model with ``moe_layers=[]`` (every layer dense, width
``intermediate_size_mlp``).
"""

from __future__ import annotations

from typing import Any

from poslab.interop import common as m
from poslab.interop.checkpoint import transformers_module

FAMILY = "llama4_text"


def convert(config: Any, w: m.Weights) -> m.Converted:
    """``(GPTConfig values, state dict)`` of a dense ``Llama4ForCausalLM``."""
    if config.moe_layers:
        raise m.unsupported(
            FAMILY,
            f"moe_layers={list(config.moe_layers)} (routed mixture-of-experts layers; "
            "poslab maps dense Llama 4 layers only: moe_layers=[])",
        )
    m.check_divisible(FAMILY, config)
    head_dim = m.head_dim_of(config)
    bias = bool(config.attention_bias)
    types = m.layer_types(FAMILY, config, (m.FULL, m.CHUNKED))
    rope = m.rope_config(FAMILY, config, config.rope_parameters, head_dim, layout="interleaved")
    chunk = config.attention_chunk_size
    pattern = []
    for t, use_rope in zip(types, config.no_rope_layers, strict=True):
        entry: dict[str, Any] = {"qk_norm": bool(config.use_qk_norm and use_rope)}
        if t == m.CHUNKED:
            entry["chunk"] = int(chunk)
        if not use_rope:
            entry["position"] = "none"
            if config.attn_temperature_tuning:
                entry["temperature_tuning"] = [float(config.floor_scale), float(config.attn_scale)]
        pattern.append(entry)
    cfg = m.decoder_config(FAMILY, config, rope, hidden=config.intermediate_size_mlp) | dict(
        layer_pattern=pattern,
        attention={"bias": bias, "head_dim": head_dim, "qk_norm_affine": False, "backend": "auto"},
    )
    return cfg, m.import_decoder(w, cfg, bias, mlp="feed_forward")


def _plan(gpt: Any) -> tuple[dict[str, Any], list[m.Problem]]:
    """The Llama 4 config fields of ``gpt``'s layers, and what Llama 4's one setting per kind of layer cannot hold."""
    cfg = gpt.config
    use_rope, types, qk, temps, chunks = [], [], set(), set(), set()
    rope_params = None
    for i in range(cfg.n_layer):
        name, chunk = cfg.layer_value(i, "position"), cfg.layer_value(i, "chunk")
        temp, norm = cfg.layer_value(i, "temperature_tuning"), cfg.layer_value(i, "qk_norm")
        if name not in ("rope", "none"):
            return {}, [("position", f"layer {i} has position={name!r} (Llama 4 layers are RoPE or NoPE)")]
        rope = name == "rope"
        if rope and temp is not None:
            return {}, [
                (
                    "attention.temperature_tuning",
                    f"layer {i} tunes the attention temperature on a RoPE layer (Llama 4 does it on NoPE layers)",
                )
            ]
        if not rope and norm:
            return {}, [
                ("attention.qk_norm", f"layer {i} has qk_norm on a NoPE layer (Llama 4 norms RoPE layers only)")
            ]
        if rope:
            qk.add(bool(norm))
            params = m.hf_rope(FAMILY, gpt, gpt.layer_position(i))
            if rope_params not in (None, params):
                return {}, [("layer_pattern", "RoPE layers with different configurations; Llama 4 has one")]
            rope_params = params
        else:
            temps.add(tuple(temp) if temp is not None else None)
        if chunk is not None:
            chunks.add(chunk)
        use_rope.append(int(rope))
        types.append(m.CHUNKED if chunk is not None else m.FULL)
    for field, label, values in (
        ("attention.qk_norm", "qk_norm on the RoPE layers", qk),
        ("attention.temperature_tuning", "temperature_tuning on the NoPE layers", temps),
        ("attention.chunk", "chunk", chunks),
    ):
        if len(values) > 1:
            return {}, [
                (field, f"{label} differs between layers ({sorted(map(str, values))}); Llama 4 has one setting")
            ]
    temp = next(iter(temps)) if temps else None
    if temp is not None and float(int(temp[0])) != temp[0]:
        return {}, [
            (
                "attention.temperature_tuning",
                f"temperature_tuning floor_scale={temp[0]} (transformers takes an integer)",
            )
        ]
    return dict(
        rope_parameters=rope_params or {"rope_type": "default", "rope_theta": 500000.0},
        no_rope_layers=use_rope,
        layer_types=types,
        attention_chunk_size=next(iter(chunks)) if chunks else None,
        use_qk_norm=bool(qk and qk.pop()),
        attn_temperature_tuning=temp is not None,
        floor_scale=int(temp[0]) if temp is not None else 8192,
        attn_scale=float(temp[1]) if temp is not None else 0.1,
    ), []


def _weightless(gpt: Any) -> list[m.Problem]:
    cfg = gpt.config
    if cfg.attention.qk_norm_affine and any(cfg.layer_value(i, "qk_norm") for i in range(cfg.n_layer)):
        return [
            (
                "attention.qk_norm_affine",
                "attention.qk_norm_affine=True (Llama 4's QK-norm is a weightless L2 norm: qk_norm_affine=False)",
            )
        ]
    return []


def to_hf(gpt: Any, out_dir: Any = None) -> Any:
    """A dense ``Llama4ForCausalLM`` (``moe_layers=[]``) for a Llama-4-layout :class:`poslab.GPT`.

    The layout: interleaved RoPE on some layers and ``position="none"`` on the others (through
    ``layer_pattern``), weightless QK-norm on all RoPE layers or none, one temperature tuning on all
    NoPE layers or none, one ``attention.chunk`` size; rmsnorm, swiglu, sequential residual. Anything
    else is refused naming the option (:data:`WRITES`).
    """
    WRITES.refuse(gpt)
    transformers = transformers_module()
    plan, _ = _plan(gpt)
    fields = m.hf_decoder_config(gpt)
    fields |= dict(intermediate_size_mlp=fields["intermediate_size"], moe_layers=[], **plan)
    hf_config = transformers.Llama4TextConfig(**fields)
    hf = transformers.Llama4ForCausalLM(hf_config)
    sd = m.export_decoder(gpt, mlp="feed_forward")
    return m.finish_export(hf, sd, gpt.tok_emb.weight.dtype, out_dir)


WRITES = m.Writes(
    FAMILY,
    requires={**m.ROPE_DECODER, "mlp.bias": False},
    carries=frozenset(
        {
            "attention.qk_norm_affine",
            "n_kv_head",
            "attention.head_dim",
            "attention.bias",
            "layer_pattern",
            "attention.chunk",
            "attention.temperature_tuning",
            "attention.qk_norm",
        }
    ),
    layer_keys=frozenset({"position", "chunk", "temperature_tuning", "qk_norm"}),
    checks=(_weightless, m.rope_check(FAMILY, layout="interleaved"), lambda gpt: _plan(gpt)[1]),
    export=to_hf,
)
FAMILIES = (
    m.Family(
        FAMILY,
        "model.",
        "Llama 4 text, dense layers (iRoPE: chunked RoPE layers with L2 QK-norm, NoPE layers with "
        "attention-temperature tuning)",
        convert,
        WRITES,
    ),
)
