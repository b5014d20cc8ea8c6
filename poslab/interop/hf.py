"""The Hugging Face registry: :func:`from_hf` and :func:`to_hf` over the family modules.

Each family lives in its own module (``poslab/interop/<family>.py``) and declares ``FAMILIES``: how to
read its checkpoints (:class:`~poslab.interop.common.Family`) and, when poslab can write it, what
its ``transformers`` config expresses (:class:`~poslab.interop.common.Writes`). This module lists
the family modules once (:data:`MODULES`) and dispatches on them:

* ``from_hf(model_or_dir)`` maps a ``transformers==5.24.0`` causal LM (a model object, or a local
  folder read offline) onto a :class:`poslab.GPT` with the same weights and logits, by ``model_type``.
* ``to_hf(gpt)`` writes the first family (in :data:`MODULES` order) whose ``Writes.expresses(gpt)``
  is empty, and otherwise refuses in one line naming the option and the families that carry it.

Unsupported families and options raise ``ValueError`` naming them and listing what is supported.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from poslab.interop.checkpoint import load_hf_source
from poslab.interop.common import ROPE_TYPES, Family, Weights, Writes, effective
from poslab.nn.model import GPT, GPTConfig

#: the family modules, in export preference order (the simplest layout that expresses a model wins)
MODULES = ("gpt2", "llama", "gpt_neox", "gptj", "bloom", "mpt", "qwen3", "gemma", "gpt_oss", "llama4", "deepseek")
_MODULE_FILES = {"gpt_neox": "neox"}


def _families() -> list[Family]:
    found = []
    for name in MODULES:
        module = importlib.import_module(f"poslab.interop.{_MODULE_FILES.get(name, name)}")
        found.extend(module.FAMILIES)
    return found


FAMILIES: dict[str, Family] = {f.model_type: f for f in _families()}
#: model_type -> what poslab maps it to (shown in errors).
SUPPORTED: dict[str, str] = {t: f.description for t, f in FAMILIES.items()}
#: model_type -> the module that maps it.
FAMILY_MODULES: dict[str, str] = {t: f.convert.__module__ for t, f in FAMILIES.items()}
#: what ``to_hf`` can write, in the order it tries.
WRITERS: tuple[Writes, ...] = tuple(f.writes for f in FAMILIES.values() if f.writes is not None)

__all__ = ["FAMILIES", "FAMILY_MODULES", "ROPE_TYPES", "SUPPORTED", "WRITERS", "from_hf", "to_hf"]


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
        ValueError: unsupported family or option (the message lists what is supported), missing,
            unmapped or misshapen weights, a path that is not a local model folder.
        TypeError: an object that is neither a transformers model nor a path.
    """
    config, tensors = load_hf_source(model_or_dir)
    family = config.model_type
    if family not in FAMILIES:
        raise ValueError(f"model_type {family!r} is not supported by poslab.from_hf; supported: {_supported_list()}")
    entry = FAMILIES[family]
    weights = Weights(tensors, entry.prefix, family)
    values, state = entry.convert(config, weights)
    weights.finish()
    gpt = GPT(GPTConfig(**values)).to(dtype or state["tok_emb.weight"].dtype)  # RoPE/ALiBi buffers stay fp32
    expected = gpt.state_dict()
    for key, tensor in state.items():
        if key in expected and tensor.shape != expected[key].shape:
            raise ValueError(
                f"{family} checkpoint: the weights mapped to poslab's {key!r} have shape {list(tensor.shape)}; "
                f"the config's sizes need {list(expected[key].shape)}"
            )
    gpt.load_state_dict(state, strict=True)  # copies (and casts) into the parameters
    return gpt.eval()


def refusal(gpt: GPT) -> str | None:
    """``None`` when some family expresses ``gpt``, else the one-line reason :func:`to_hf` refuses it.

    The line names the nearest writable family (fewest problems) and what it cannot hold, then each
    family that carries that option and the first thing of the model it does not hold.
    """
    tried = [(w, w.expresses(gpt)) for w in WRITERS]
    if any(not problems for _, problems in tried):
        return None
    nearest, problems = min(((w, p) for w, p in tried if w.export is not None), key=lambda t: len(t[1]))
    field, text = problems[0]
    value = effective(gpt.config, field) if hasattr(gpt.config, field.split(".")[0]) else None
    carriers = [(w, p) for w, p in tried if w is not nearest and (field in w.carries or _requires(w, field, value))]
    if carriers:
        tail = "; ".join(f"{w.family} carries {field} but not {p[0][1]}" for w, p in carriers[:3])
    else:
        tail = f"no family poslab writes carries {field}={value!r}"
    rest = (
        f" (also {'; '.join(t for _, t in problems[1:3])}{'; ...' if len(problems) > 3 else ''})"
        if len(problems) > 1
        else ""
    )
    return (
        f"to_hf cannot write this model exactly: {nearest.family}, the nearest family, cannot hold {text}{rest}; {tail}"
    )


def _requires(writes: Writes, field: str, value: Any) -> bool:
    want = writes.requires.get(field, object())
    return value in (want if isinstance(want, tuple) else (want,))


def to_hf(gpt: GPT, out_dir: str | os.PathLike | None = None) -> Any:
    """A ``transformers`` model with the weights and logits of a :class:`poslab.GPT`.

    The model goes to the first family of :data:`WRITERS` whose config expresses every option it
    uses: GPT-2 (learned positions, layernorm, gelu, biases), Llama (RoPE with any transformers
    scaling, rmsnorm, swiglu, GQA, biases; an interleaved-RoPE model is re-laid out with
    :func:`poslab.interop.permute_rope`), Mistral (one window), Qwen3 (QK-norm, windows), Gemma 2
    (soft-capping, sandwich norms, local/global layers), Gemma 3 (QK-norm, a RoPE per layer type),
    Llama 4 (chunked attention, NoPE layers, temperature tuning, weightless QK-norm), DeepSeek-V3
    (multi-head latent attention). A model no family expresses is refused: never a silently
    different export.

    Args:
        gpt: the poslab model.
        out_dir: if given, also ``save_pretrained`` there (a new or empty folder; written to a temporary
            folder first and renamed, so a failure leaves nothing half-written). The result loads with
            ``AutoModelForCausalLM.from_pretrained(out_dir)``.

    Returns:
        The transformers model (eval mode, the poslab model's dtype).

    Raises:
        ValueError: no family expresses the model (one line naming the option and the families that carry it).
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    from pathlib import Path

    from poslab.interop.common import refuse_taken

    if not isinstance(gpt, GPT):
        raise TypeError(f"to_hf takes a poslab.GPT, got {type(gpt).__name__}")
    refuse_taken(Path(out_dir) if out_dir is not None else None)
    for writes in WRITERS:
        if not writes.expresses(gpt):
            assert writes.export is not None  # a family poslab cannot write always has a problem
            return writes.export(gpt, out_dir)
    raise ValueError(refusal(gpt))
