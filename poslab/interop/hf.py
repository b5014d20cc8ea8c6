"""Hugging Face ``transformers`` interop: load published model families into :class:`poslab.GPT`, export back.

``from_hf(model_or_dir)`` maps a ``transformers==5.24.0`` causal LM (a model object, or a local
folder with ``config.json`` + safetensors) onto a :class:`poslab.GPT` with the same weights and the
same logits. Families and what each one exercises:

=============  =====================================================================================
``gpt2``       learned absolute positions, Conv1D (transposed) weights, tanh GELU
``llama``      RoPE half-split, GQA, every ``rope_parameters`` type (default, linear, dynamic, yarn,
               llama3, longrope), SwiGLU, RMSNorm
``mistral``    Llama + sliding window (``i - W < j <= i``, the same rule as poslab's ``window``)
``gpt_neox``   partial rotary, fused qkv laid out per head ``[h, 3, d_k]``, parallel residual (2 norms)
``gptj``       interleaved partial rotary, parallel residual with one shared norm, LM-head bias
``bloom``      ALiBi (Bloom's ``+m*j`` bias: equal to ``-m*(i-j)`` after softmax), embedding LayerNorm
``mpt``        ALiBi with ``alibi_bias_max``, ``clip_qkv``, ``softmax_scale``, no biases
=============  =====================================================================================

``to_hf(gpt)`` goes the other way for the GPT-2 layout and the Llama layout (Mistral when the model
has a sliding window; an interleaved-RoPE model is re-laid out with :func:`permute_rope` on the way).

Unsupported families and options raise ``ValueError`` naming them and listing what is supported.
Reading a local folder never touches the network: the config goes through
``AutoConfig.from_pretrained(dir, local_files_only=True)`` and the weights through ``safetensors``.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.fileio import atomic_write_folder
from poslab.interop.permute import relayout_rope
from poslab.nn.model import GPT, GPTConfig

#: model_type -> what poslab maps it to (shown in errors).
SUPPORTED = {
    "gpt2": "GPT-2 (learned absolute positions)",
    "llama": "Llama (RoPE half-split, GQA, rope_parameters: default/linear/dynamic/yarn/llama3/longrope)",
    "mistral": "Mistral (Llama + sliding window)",
    "gpt_neox": "GPT-NeoX / Pythia (partial rotary, parallel residual)",
    "gptj": "GPT-J (interleaved partial rotary, parallel residual, one norm)",
    "bloom": "Bloom (ALiBi, embedding LayerNorm)",
    "mpt": "MPT (ALiBi with alibi_bias_max, clip_qkv)",
}
#: transformers ``rope_type`` values poslab maps (onto the ``rope`` scheme's ``scaling``).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
#: transformers activation names -> poslab's ``GPTConfig.activation``.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
#: checkpoint entries that are buffers, not weights (old GPT-2 / GPT-J / NeoX checkpoints carry them).
_IGNORED = re.compile(r"(^|\.)(attn\.bias|attn\.masked_bias|attention\.bias|attention\.masked_bias|rotary_emb\.inv_freq)$")


# ------------------------------------------------------------------------------------------ reading
class _Weights:
    """A checkpoint's tensors with the base-model prefix removed; every tensor must be used once."""

    def __init__(self, tensors: dict[str, Tensor], prefix: str, family: str) -> None:
        self.family = family
        self.tensors = {(key[len(prefix) :] if key.startswith(prefix) else key): t for key, t in tensors.items()}

    def take(self, key: str) -> Tensor:
        if key not in self.tensors:
            raise ValueError(f"{self.family} checkpoint has no weight {key!r} (is it a {self.family} causal LM?)")
        return self.tensors.pop(key)

    def take_optional(self, *keys: str) -> Tensor | None:
        for key in keys:
            if key in self.tensors:
                return self.tensors.pop(key)
        return None

    def finish(self) -> None:
        """Fail if a weight was left unconverted (a silently dropped weight is a wrong model)."""
        leftover = sorted(k for k in self.tensors if not _IGNORED.search(k))
        if leftover:
            shown = ", ".join(leftover[:6]) + (" ..." if len(leftover) > 6 else "")
            raise ValueError(f"{self.family} checkpoint has weights poslab does not map: {shown}")


def _read_weights(folder: Path) -> dict[str, Tensor]:
    """Tensors of a local checkpoint folder: safetensors (single or sharded), else PyTorch ``.bin``."""
    for index_name, loader in (
        ("model.safetensors.index.json", _load_safetensors),
        ("pytorch_model.bin.index.json", _load_bin),
    ):
        index = folder / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            tensors: dict[str, Tensor] = {}
            for shard in shards:
                if not isinstance(shard, str) or Path(shard).name != shard:
                    raise ValueError(f"{str(index)!r} names a shard outside the folder: {shard!r}")
                tensors.update(loader(str(folder / shard)))
            return tensors
    if (folder / "model.safetensors").is_file():
        return _load_safetensors(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return _load_bin(folder / "pytorch_model.bin")
    found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
    raise ValueError(
        f"{str(folder)!r} has no weights: expected model.safetensors (or a sharded index, or pytorch_model.bin); found {found}"
    )


def _load_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """A safetensors file's tensors; a file that is not valid safetensors is refused with ``ValueError``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {err}") from None


def _load_bin(path: str | os.PathLike) -> dict[str, Tensor]:
    """A PyTorch ``.bin`` state dict, unpickled with ``weights_only=True`` (tensors and plain
    containers only: a file that would run code is refused with ``ValueError``)."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = [line.split("error:", 1)[1] for line in str(err).splitlines() if "WeightsUnpickler error:" in line]
        reason = found[0].split(". ")[0].strip() if found else type(err).__name__
        raise ValueError(f"refusing {str(path)!r}: it holds more than tensors ({reason}); "
                         "poslab loads weights only (convert it to safetensors with a tool you trust)") from None


def _transformers():
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the test extra installs it
        raise ImportError("poslab's Hugging Face interop needs transformers: pip install 'poslab[hf]'") from err
    return transformers


def load_hf_source(model_or_dir: Any) -> tuple[Any, dict[str, Tensor]]:
    """``(transformers config, state dict)`` of a model object or a local checkpoint folder (offline)."""
    if isinstance(model_or_dir, nn.Module):
        config = getattr(model_or_dir, "config", None)
        if config is None or not hasattr(config, "model_type"):
            raise TypeError(f"from_hf takes a transformers model or a local folder; {type(model_or_dir).__name__} has no HF config")
        return config, {k: v.detach() for k, v in model_or_dir.state_dict().items()}
    if not isinstance(model_or_dir, (str, os.PathLike)):
        raise TypeError(f"from_hf takes a transformers model or a local folder path, got {type(model_or_dir).__name__}")
    folder = Path(model_or_dir)
    if not folder.is_dir():
        raise ValueError(
            f"{str(folder)!r} is not a local folder; from_hf reads a folder with config.json + model.safetensors "
            "(download it first; poslab never fetches weights)"
        )
    if not (folder / "config.json").is_file():
        raise ValueError(f"{str(folder)!r} has no config.json: not a Hugging Face model folder")
    # trust_remote_code=False: a folder's own Python code (auto_map) is refused, never run or prompted for
    config = _transformers().AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    return config, _read_weights(folder)


# ------------------------------------------------------------------------------------------ mapping
def _unsupported(family: str, what: str) -> ValueError:
    return ValueError(f"{family}: {what} is not supported by poslab.from_hf")


def _activation(family: str, name: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise _unsupported(family, f"activation {name!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[name]


def _head_dim(family: str, config: Any, hidden: int, heads: int) -> int:
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if head_dim * heads != hidden:
        raise _unsupported(
            family, f"head_dim={head_dim} with hidden_size={hidden} and {heads} heads (poslab needs head_dim * heads == hidden_size)"
        )
    return head_dim


def rope_config_from_hf(config: Any, head_dim: int, layout: str = "half", family: str = "llama") -> dict[str, Any]:
    """poslab ``rope`` scheme config for a transformers config's ``rope_parameters``.

    Every field is mapped exactly as ``transformers.modeling_rope_utils`` reads it: for ``dynamic``
    the original length ``L0`` is ``max_position_embeddings`` (HF ignores
    ``original_max_position_embeddings`` there); for ``yarn``/``longrope`` a missing ``factor`` is
    ``max_position_embeddings / original_max_position_embeddings``; ``beta_fast``/``beta_slow``
    default to 32/1 and ``truncate`` to True.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise _unsupported(family, f"rope_type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    out: dict[str, Any] = {"base": float(theta), "layout": layout}
    if rotary_dim != head_dim:
        out["rotary_dim"] = rotary_dim
    max_pos = config.max_position_embeddings
    if rope_type == "default":
        return out
    out["scaling"] = rope_type
    if rope_type in ("linear", "dynamic"):
        out["factor"] = float(params["factor"])
        if rope_type == "dynamic":
            out["original_max_len"] = int(max_pos)
        return out
    original = int(params["original_max_position_embeddings"])
    out["original_max_len"] = original
    factor = params.get("factor")
    out["factor"] = float(factor if factor is not None else max_pos / original)
    if params.get("attention_factor") is not None and rope_type in ("yarn", "longrope"):
        out["attention_factor"] = float(params["attention_factor"])
    if rope_type == "yarn":
        out["beta_fast"] = float(params.get("beta_fast") or 32)
        out["beta_slow"] = float(params.get("beta_slow") or 1)
        out["yarn_truncate"] = bool(params.get("truncate", True))
        for key in ("mscale", "mscale_all_dim"):
            if params.get(key) is not None:
                out[key] = float(params[key])
    elif rope_type == "llama3":
        out["low_freq_factor"] = float(params["low_freq_factor"])
        out["high_freq_factor"] = float(params["high_freq_factor"])
    else:  # longrope
        out["short_factor"] = [float(x) for x in params["short_factor"]]
        out["long_factor"] = [float(x) for x in params["long_factor"]]
    return out


def _fused_per_head(weight: Tensor, n_heads: int) -> Tensor:
    """GPT-NeoX/Bloom fused qkv rows ``[h, 3, d_k]`` -> poslab's ``[3, h, d_k]`` (q | k | v)."""
    rest = weight.shape[1:]
    head_dim = weight.shape[0] // (3 * n_heads)
    per_head = weight.reshape(n_heads, 3, head_dim, *rest)  # [h, 3, d_k, (in)]
    return per_head.transpose(0, 1).reshape(weight.shape)  # [3, h, d_k, (in)] -> [3*h*d_k, (in)]


def _per_head_fused(weight: Tensor, n_heads: int) -> Tensor:
    """Inverse of :func:`_fused_per_head`."""
    rest = weight.shape[1:]
    head_dim = weight.shape[0] // (3 * n_heads)
    grouped = weight.reshape(3, n_heads, head_dim, *rest)  # [3, h, d_k, (in)]
    return grouped.transpose(0, 1).reshape(weight.shape)  # [h, 3, d_k, (in)] -> [h*3*d_k, (in)]


Converted = tuple[dict[str, Any], dict[str, Tensor]]


def _lm_head(w: _Weights, sd: dict[str, Tensor], tie: bool, *names: str) -> None:
    if tie:
        w.take_optional(*names)  # a tied checkpoint may or may not store the shared matrix twice
        sd["lm_head.weight"] = sd["tok_emb.weight"]
        return
    head = w.take_optional(*names)
    if head is None:
        raise ValueError(f"{w.family} checkpoint has no LM head ({' or '.join(names)}) and does not tie embeddings")
    sd["lm_head.weight"] = head


def _convert_gpt2(config: Any, w: _Weights) -> Converted:
    family = "gpt2"
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise _unsupported(family, "scale_attn_by_inverse_layer_idx=True")
    if getattr(config, "add_cross_attention", False):
        raise _unsupported(family, "add_cross_attention=True")
    d = config.n_embd
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.n_layer, n_head=config.n_head, n_embd=d,
        block_size=config.n_positions, bias=True, position="learned", norm="layernorm", mlp="gelu",
        mlp_hidden=config.n_inner or 4 * d, activation=_activation(family, config.activation_function),
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.layer_norm_epsilon,
        attn_scale=None if config.scale_attn_weights else 1.0,
    )
    sd = {"tok_emb.weight": w.take("wte.weight"), "position.table.weight": w.take("wpe.weight")}
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for hf, ours, conv1d in (
            ("ln_1", "norm1", False), ("attn.c_attn", "attn.qkv", True), ("attn.c_proj", "attn.proj", True),
            ("ln_2", "norm2", False), ("mlp.c_fc", "mlp.up", True), ("mlp.c_proj", "mlp.down", True),
        ):
            weight = w.take(f"{src}{hf}.weight")
            sd[f"{dst}{ours}.weight"] = weight.t() if conv1d else weight  # Conv1D stores [in, out]
            sd[f"{dst}{ours}.bias"] = w.take(f"{src}{hf}.bias")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _convert_llama(config: Any, w: _Weights, family: str = "llama") -> Converted:
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = _head_dim(family, config, d, heads)
    attn_bias = bool(getattr(config, "attention_bias", False))
    mlp_bias = bool(getattr(config, "mlp_bias", False))
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.num_hidden_layers, n_head=heads,
        n_kv_head=config.num_key_value_heads or heads, n_embd=d, block_size=config.max_position_embeddings,
        bias=False, attn_bias=attn_bias, mlp_bias=mlp_bias, position="rope",
        position_config=rope_config_from_hf(config, head_dim, "half", family), norm="rmsnorm", mlp="swiglu",
        mlp_hidden=config.intermediate_size, activation=_activation(family, config.hidden_act),
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.rms_norm_eps,
    )
    if family == "mistral":
        cfg["window"] = config.sliding_window
    sd = {"tok_emb.weight": w.take("embed_tokens.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        names = ("weight", "bias") if attn_bias else ("weight",)
        for name in names:
            sd[f"{dst}attn.qkv.{name}"] = torch.cat([w.take(f"{src}self_attn.{p}_proj.{name}") for p in "qkv"], dim=0)
            sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}self_attn.o_proj.{name}")
        for name in ("weight", "bias") if mlp_bias else ("weight",):
            for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                sd[f"{dst}mlp.{ours}.{name}"] = w.take(f"{src}mlp.{hf}.{name}")
        sd[f"{dst}norm1.weight"] = w.take(f"{src}input_layernorm.weight")
        sd[f"{dst}norm2.weight"] = w.take(f"{src}post_attention_layernorm.weight")
    sd["norm_f.weight"] = w.take("norm.weight")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _convert_mistral(config: Any, w: _Weights) -> Converted:
    return _convert_llama(config, w, family="mistral")


def _convert_gpt_neox(config: Any, w: _Weights) -> Converted:
    family = "gpt_neox"
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = _head_dim(family, config, d, heads)
    attn_bias = bool(getattr(config, "attention_bias", True))
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.num_hidden_layers, n_head=heads, n_embd=d,
        block_size=config.max_position_embeddings, bias=True, attn_bias=attn_bias, position="rope",
        position_config=rope_config_from_hf(config, head_dim, "half", family), norm="layernorm", mlp="gelu",
        mlp_hidden=config.intermediate_size, activation=_activation(family, config.hidden_act),
        residual="parallel" if config.use_parallel_residual else "sequential",
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.layer_norm_eps,
    )
    sd = {"tok_emb.weight": w.take("embed_in.weight")}
    for i in range(config.num_hidden_layers):
        src, dst = f"layers.{i}.", f"blocks.{i}."
        for name in ("weight", "bias") if attn_bias else ("weight",):
            sd[f"{dst}attn.qkv.{name}"] = _fused_per_head(w.take(f"{src}attention.query_key_value.{name}"), heads)
            sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}attention.dense.{name}")
        for name in ("weight", "bias"):
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}input_layernorm.{name}")
            sd[f"{dst}norm2.{name}"] = w.take(f"{src}post_attention_layernorm.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.dense_h_to_4h.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.dense_4h_to_h.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("final_layer_norm.weight"), w.take("final_layer_norm.bias")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight", "embed_out.weight")
    return cfg, sd


def _convert_gptj(config: Any, w: _Weights) -> Converted:
    family = "gptj"
    d, heads = config.n_embd, config.n_head
    head_dim = d // heads
    rotary_dim = config.rotary_dim or head_dim
    position_config = {"base": 10000.0, "layout": "interleaved"}  # GPT-J's base is fixed in transformers
    if rotary_dim != head_dim:
        position_config["rotary_dim"] = rotary_dim
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.n_layer, n_head=heads, n_embd=d, block_size=config.n_positions,
        bias=True, attn_bias=False, lm_head_bias=True, position="rope", position_config=position_config,
        norm="layernorm", mlp="gelu", mlp_hidden=config.n_inner or 4 * d,
        activation=_activation(family, config.activation_function), residual="parallel_shared_norm",
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.layer_norm_epsilon,
    )
    sd = {"tok_emb.weight": w.take("wte.weight")}
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        sd[f"{dst}attn.qkv.weight"] = torch.cat([w.take(f"{src}attn.{p}_proj.weight") for p in "qkv"], dim=0)
        sd[f"{dst}attn.proj.weight"] = w.take(f"{src}attn.out_proj.weight")
        for name in ("weight", "bias"):
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}ln_1.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.fc_in.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.fc_out.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    sd["lm_head.bias"] = w.take("lm_head.bias")
    return cfg, sd


def _convert_bloom(config: Any, w: _Weights) -> Converted:
    family = "bloom"
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        raise _unsupported(family, "apply_residual_connection_post_layernorm=True")
    d, heads = config.hidden_size, config.n_head
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.n_layer, n_head=heads, n_embd=d,
        block_size=int(getattr(config, "seq_length", None) or 2048), bias=True, position="alibi",
        norm="layernorm", mlp="gelu", mlp_hidden=4 * d, activation="gelu_tanh", embed_norm=True,
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.layer_norm_epsilon,
    )
    sd = {"tok_emb.weight": w.take("word_embeddings.weight")}
    for name in ("weight", "bias"):
        sd[f"embed_norm.{name}"] = w.take(f"word_embeddings_layernorm.{name}")
    for i in range(config.n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for name in ("weight", "bias"):
            sd[f"{dst}attn.qkv.{name}"] = _fused_per_head(w.take(f"{src}self_attention.query_key_value.{name}"), heads)
            sd[f"{dst}attn.proj.{name}"] = w.take(f"{src}self_attention.dense.{name}")
            sd[f"{dst}norm1.{name}"] = w.take(f"{src}input_layernorm.{name}")
            sd[f"{dst}norm2.{name}"] = w.take(f"{src}post_attention_layernorm.{name}")
            sd[f"{dst}mlp.up.{name}"] = w.take(f"{src}mlp.dense_h_to_4h.{name}")
            sd[f"{dst}mlp.down.{name}"] = w.take(f"{src}mlp.dense_4h_to_h.{name}")
    sd["norm_f.weight"], sd["norm_f.bias"] = w.take("ln_f.weight"), w.take("ln_f.bias")
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


def _convert_mpt(config: Any, w: _Weights) -> Converted:
    # transformers' MPT has no biases anywhere (LayerNorms included) and always uses ALiBi.
    d, heads = config.d_model, config.n_heads
    attn = config.attn_config
    if attn.alibi_bias_max != 8:
        warnings.warn(
            f"mpt: attn_config.alibi_bias_max={attn.alibi_bias_max}, but transformers 5.24's MptModel never passes it "
            "on (its ALiBi always uses 8); poslab follows transformers so the logits match. MosaicML's original code "
            f"uses it: set position_config={{'bias_max': {float(attn.alibi_bias_max)}}} for that model (docs/interop.md)",
            UserWarning,
            stacklevel=3,
        )
    up = w.tensors.get("blocks.0.ffn.up_proj.weight")  # transformers hard-codes 4*d_model; read it off the weights
    cfg = dict(
        vocab_size=config.vocab_size, n_layer=config.n_layers, n_head=heads, n_embd=d, block_size=config.max_seq_len,
        bias=False, position="alibi", norm="layernorm",
        mlp="gelu", mlp_hidden=up.shape[0] if up is not None else 4 * d, activation="gelu",
        tie_embeddings=bool(config.tie_word_embeddings), norm_eps=config.layer_norm_epsilon,
        attn_scale=float(attn.softmax_scale) if attn.softmax_scale is not None else None,
        clip_qkv=float(attn.clip_qkv) if attn.clip_qkv else None,
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
    _lm_head(w, sd, cfg["tie_embeddings"], "lm_head.weight")
    return cfg, sd


#: model_type -> (base-model prefix in checkpoints, converter)
_FAMILIES: dict[str, tuple[str, Callable[[Any, _Weights], Converted]]] = {
    "gpt2": ("transformer.", _convert_gpt2),
    "llama": ("model.", _convert_llama),
    "mistral": ("model.", _convert_mistral),
    "gpt_neox": ("gpt_neox.", _convert_gpt_neox),
    "gptj": ("transformer.", _convert_gptj),
    "bloom": ("transformer.", _convert_bloom),
    "mpt": ("transformer.", _convert_mpt),
}


#: model_type -> module of the families registered from their own files (poslab/interop/<family>.py)
FAMILY_MODULES: dict[str, str] = {}


def register_family(model_type: str, prefix: str, convert: Callable[[Any, _Weights], Converted], description: str) -> None:
    """Add a family converter to the :func:`from_hf` dispatch (called by each family module)."""
    SUPPORTED[model_type] = description
    _FAMILIES[model_type] = (prefix, convert)
    FAMILY_MODULES[model_type] = convert.__module__


def _supported_list() -> str:
    return "; ".join(f"{k} = {v}" for k, v in SUPPORTED.items())


def from_hf(model_or_dir: Any, *, dtype: torch.dtype | None = None) -> GPT:
    """A :class:`poslab.GPT` with the weights (and logits) of a Hugging Face causal LM.

    Args:
        model_or_dir: a ``transformers`` model object (``...ForCausalLM`` or its base model), or a local
            folder holding ``config.json`` and ``model.safetensors`` (sharded or ``pytorch_model.bin``
            also work). A folder is read offline (``local_files_only``), never downloaded.
        dtype: parameter dtype of the result (default: the checkpoint's). RoPE frequencies and ALiBi
            slopes stay fp32 whatever the dtype.

    Returns:
        A ``poslab.GPT`` in eval mode with dropout 0.

    Raises:
        ValueError: unsupported family or option (the message lists what is supported), missing or
            unmapped weights, a path that is not a local model folder.
        TypeError: an object that is neither a transformers model nor a path.
    """
    config, tensors = load_hf_source(model_or_dir)
    family = config.model_type
    if family not in _FAMILIES:
        raise ValueError(f"model_type {family!r} is not supported by poslab.from_hf; supported: {_supported_list()}")
    prefix, convert = _FAMILIES[family]
    weights = _Weights(tensors, prefix, family)
    values, state = convert(config, weights)
    weights.finish()
    gpt = GPT(GPTConfig(**values)).to(dtype or state["tok_emb.weight"].dtype)  # RoPE/ALiBi buffers stay fp32
    gpt.load_state_dict(state, strict=True)  # copies (and casts) into the parameters
    return gpt.eval()


# ------------------------------------------------------------------------------------------ export
def _hf_rope_parameters(gpt: GPT) -> tuple[dict[str, Any], int]:
    """``(rope_parameters, max_position_embeddings)`` for a RoPE poslab model (Llama layout)."""
    rope = gpt.position.config
    cfg = gpt.config
    if rope.logn_scaling:
        raise ValueError("to_hf: logn_scaling has no transformers equivalent")
    if rope.dim != cfg.head_dim:
        raise ValueError(f"to_hf: the Llama layout rotates the whole head; this model has rotary_dim={rope.rotary_dim}")
    params: dict[str, Any] = {"rope_theta": float(rope.base)}
    max_pos = cfg.block_size
    if rope.scaling is None:
        params["rope_type"] = "default"
        return params, max_pos
    if rope.scaling not in ROPE_TYPES:
        raise ValueError(f"to_hf: rope scaling {rope.scaling!r} has no transformers rope_type (supported: {', '.join(ROPE_TYPES[1:])})")
    params.update(rope_type=rope.scaling, factor=float(rope.factor))
    if rope.scaling == "linear":
        return params, max_pos
    if rope.scaling == "dynamic":
        return params, rope.original_max_len  # transformers' dynamic L0 is max_position_embeddings
    params["original_max_position_embeddings"] = rope.original_max_len
    max_pos = max(max_pos, int(round(rope.original_max_len * rope.factor)))
    if rope.scaling == "yarn":
        params.update(beta_fast=float(rope.beta_fast), beta_slow=float(rope.beta_slow), truncate=bool(rope.yarn_truncate))
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(rope, key) is not None:
                params[key] = float(getattr(rope, key))
    elif rope.scaling == "llama3":
        params.update(low_freq_factor=float(rope.low_freq_factor), high_freq_factor=float(rope.high_freq_factor))
    else:  # longrope
        params.update(short_factor=list(rope.short_factor), long_factor=list(rope.long_factor))
        if rope.attention_factor is not None:
            params["attention_factor"] = float(rope.attention_factor)
    return params, max_pos


def _layout_of(gpt: GPT) -> str:
    """``"gpt2"`` or ``"llama"``, or ``ValueError`` saying which option rules both out."""
    cfg = gpt.config
    common = []
    if cfg.residual != "sequential":
        common.append(f"residual={cfg.residual!r}")
    if cfg.embed_norm:
        common.append("embed_norm=True")
    if cfg.lm_head_bias:
        common.append("lm_head_bias=True")
    if cfg.clip_qkv is not None:
        common.append(f"clip_qkv={cfg.clip_qkv}")
    if not cfg.causal:
        common.append("causal=False")
    gpt2 = list(common)
    if cfg.position != "learned":
        gpt2.append(f"position={cfg.position!r} (GPT-2 needs 'learned')")
    if (cfg.norm, cfg.mlp) != ("layernorm", "gelu"):
        gpt2.append(f"norm={cfg.norm!r}, mlp={cfg.mlp!r} (GPT-2 needs layernorm + gelu)")
    if not all(cfg.bias_of(part) for part in ("attn", "mlp", "norm")):
        gpt2.append("biases off (GPT-2 has biases everywhere)")
    if cfg.n_kv_head not in (None, cfg.n_head):
        gpt2.append(f"n_kv_head={cfg.n_kv_head} (GPT-2 has no GQA)")
    if cfg.window is not None:
        gpt2.append(f"window={cfg.window}")
    if cfg.attn_scale not in (None, 1.0):
        gpt2.append(f"attn_scale={cfg.attn_scale}")
    if not gpt2:
        return "gpt2"
    llama = list(common)
    if cfg.position != "rope":
        llama.append(f"position={cfg.position!r} (Llama needs 'rope')")
    if (cfg.norm, cfg.mlp) != ("rmsnorm", "swiglu"):
        llama.append(f"norm={cfg.norm!r}, mlp={cfg.mlp!r} (Llama needs rmsnorm + swiglu)")
    if cfg.attn_scale is not None and not math.isclose(cfg.attn_scale, cfg.head_dim**-0.5):
        llama.append(f"attn_scale={cfg.attn_scale}")
    if cfg.window is not None and (cfg.bias_of("attn") or cfg.bias_of("mlp")):
        llama.append("a sliding window with biases (Mistral has none)")
    if not llama:
        return "llama"
    raise ValueError(
        "to_hf exports the GPT-2 layout (learned positions, layernorm, gelu MLP, biases) and the Llama layout "
        f"(rope, rmsnorm, swiglu; Mistral with a window); this model is neither: GPT-2 fails on {', '.join(gpt2)}; "
        f"Llama fails on {', '.join(llama)}"
    )


def _gpt2_export(gpt: GPT) -> tuple[Any, dict[str, Tensor]]:
    transformers = _transformers()
    cfg = gpt.config
    activation = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}[cfg.mlp_activation]
    hf_config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=gpt.position.config.max_len, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=gpt.blocks[0].mlp.up.out_features, activation_function=activation,
        layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, scale_attn_weights=cfg.attn_scale is None,
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, bos_token_id=None, eos_token_id=None,
    )
    src = gpt.state_dict()
    sd = {"transformer.wte.weight": src["tok_emb.weight"], "transformer.wpe.weight": src["position.table.weight"]}
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, hf, conv1d in (
            ("norm1", "ln_1", False), ("attn.qkv", "attn.c_attn", True), ("attn.proj", "attn.c_proj", True),
            ("norm2", "ln_2", False), ("mlp.up", "mlp.c_fc", True), ("mlp.down", "mlp.c_proj", True),
        ):
            weight = src[f"{s}{ours}.weight"]
            sd[f"{d}{hf}.weight"] = weight.t().contiguous() if conv1d else weight
            sd[f"{d}{hf}.bias"] = src[f"{s}{ours}.bias"]
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = src["norm_f.weight"], src["norm_f.bias"]
    sd["lm_head.weight"] = src["lm_head.weight"]
    return transformers.GPT2LMHeadModel(hf_config), sd


def _llama_export(gpt: GPT) -> tuple[Any, dict[str, Tensor]]:
    transformers = _transformers()
    if gpt.position.config.layout != "half":
        gpt = relayout_rope(gpt, "half")  # Meta-style interleaved rows -> HF's half-split rows
    cfg = gpt.config
    rope_parameters, max_pos = _hf_rope_parameters(gpt)
    activation = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[cfg.mlp_activation]
    attn_bias, mlp_bias = cfg.bias_of("attn"), cfg.bias_of("mlp")
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=gpt.blocks[0].mlp.up.out_features,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, hidden_act=activation, max_position_embeddings=max_pos, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, rope_parameters=rope_parameters, attention_dropout=cfg.dropout,
        bos_token_id=None, eos_token_id=None,
    )
    if cfg.window is not None:
        hf_model = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=cfg.window, **common))
    else:
        hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(attention_bias=attn_bias, mlp_bias=mlp_bias, **common))
    src = gpt.state_dict()
    q_rows, kv_rows = cfg.n_head * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    sd = {"model.embed_tokens.weight": src["tok_emb.weight"], "model.norm.weight": src["norm_f.weight"]}
    for i in range(cfg.n_layer):
        s, d = f"blocks.{i}.", f"model.layers.{i}."
        for name in ("weight", "bias") if attn_bias else ("weight",):
            q, k, v = src[f"{s}attn.qkv.{name}"].split((q_rows, kv_rows, kv_rows), dim=0)  # rows of q | k | v
            sd[f"{d}self_attn.q_proj.{name}"], sd[f"{d}self_attn.k_proj.{name}"], sd[f"{d}self_attn.v_proj.{name}"] = q, k, v
            sd[f"{d}self_attn.o_proj.{name}"] = src[f"{s}attn.proj.{name}"]
        for name in ("weight", "bias") if mlp_bias else ("weight",):
            for ours, hf in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                sd[f"{d}mlp.{hf}.{name}"] = src[f"{s}mlp.{ours}.{name}"]
        sd[f"{d}input_layernorm.weight"] = src[f"{s}norm1.weight"]
        sd[f"{d}post_attention_layernorm.weight"] = src[f"{s}norm2.weight"]
    sd["lm_head.weight"] = src["lm_head.weight"]
    return hf_model, sd


def to_hf(gpt: GPT, out_dir: str | os.PathLike | None = None) -> Any:
    """A ``transformers`` model with the weights and logits of a :class:`poslab.GPT`.

    Supports the GPT-2 layout (``position="learned"``, layernorm, gelu MLP, biases) exported as
    ``GPT2LMHeadModel``, and the Llama layout (``position="rope"`` with any transformers scaling,
    rmsnorm, swiglu, optional GQA and biases) exported as ``LlamaForCausalLM`` (``MistralForCausalLM``
    when the model has a sliding ``window``). An interleaved-RoPE model is converted to the half-split
    rows transformers expects (:func:`poslab.interop.permute_rope`).

    Args:
        gpt: the poslab model.
        out_dir: if given, also ``save_pretrained`` there (a new or empty folder; written to a temporary
            folder first and renamed, so a failure leaves nothing half-written). The result loads with
            ``AutoModelForCausalLM.from_pretrained(out_dir)``.

    Returns:
        The transformers model (eval mode, the poslab model's dtype).

    Raises:
        ValueError: the model fits neither layout (the message names the offending options).
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    if not isinstance(gpt, GPT):
        raise TypeError(f"to_hf takes a poslab.GPT, got {type(gpt).__name__}")
    target = Path(out_dir) if out_dir is not None else None
    if target is not None and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{str(target)!r} already exists and is not an empty folder; to_hf never overwrites")
    layout = _layout_of(gpt)
    hf_model, state = (_gpt2_export if layout == "gpt2" else _llama_export)(gpt)
    dtype = gpt.tok_emb.weight.dtype
    hf_model.load_state_dict({k: v.detach().to(torch.float32) for k, v in state.items()}, strict=True)
    hf_model.to(dtype=dtype).eval()
    if target is not None:
        atomic_write_folder(target, lambda tmp: hf_model.save_pretrained(str(tmp)))
    return hf_model
