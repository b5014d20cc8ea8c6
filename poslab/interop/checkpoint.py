"""Reading a Hugging Face model source: a ``transformers`` model object, or a local checkpoint folder (offline).

A folder is ``config.json`` (read with ``AutoConfig.from_pretrained(dir, local_files_only=True,
trust_remote_code=False)``) plus weights: ``model.safetensors``, a sharded index
(``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``), or ``pytorch_model.bin``
(unpickled with ``weights_only=True``). Every malformed part is a ``ValueError`` naming the file and
the rule it breaks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.checks import is_int

#: ``config.json`` fields that must be positive integers wherever a family reads them (a zero head
#: count divides by zero inside transformers).
POSITIVE_FIELDS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "hidden_size",
    "n_embd",
    "d_model",
    "num_key_value_heads",
    "vocab_size",
)


def transformers_module() -> Any:
    """The ``transformers`` package (imported only when a Hugging Face function runs)."""
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the test extra installs it
        raise ImportError("poslab's Hugging Face interop needs transformers: pip install 'poslab[hf]'") from err
    return transformers


def read_weights(folder: Path) -> dict[str, Tensor]:
    """Tensors of a local checkpoint folder: safetensors (single or sharded), else PyTorch ``.bin``."""
    for index_name, loader in (
        ("model.safetensors.index.json", load_safetensors),
        ("pytorch_model.bin.index.json", load_bin),
    ):
        index = folder / index_name
        if index.is_file():
            tensors: dict[str, Tensor] = {}
            for shard in _shards(index):
                tensors.update(loader(str(folder / shard)))
            return tensors
    if (folder / "model.safetensors").is_file():
        return load_safetensors(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return load_bin(folder / "pytorch_model.bin")
    found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
    raise ValueError(
        f"{str(folder)!r} has no weights: expected model.safetensors (or a sharded index, or pytorch_model.bin); "
        f"found {found}"
    )


def _read_json(path: Path) -> Any:
    """A JSON file's value; unreadable text, bad JSON or nesting too deep for Python is one ``ValueError``."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).splitlines()[0]
        raise ValueError(f"{str(path)!r} is not readable JSON: {reason}") from None


def _shards(index: Path) -> list[str]:
    """The shard file names of a sharded index: ``weight_map`` must map weight names to files in the folder."""
    doc = _read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        found = (
            "no weight_map"
            if not isinstance(doc, dict) or "weight_map" not in doc
            else f"weight_map of type {type(weight_map).__name__}"
        )
        raise ValueError(f'{str(index)!r} has {found}; a sharded index needs "weight_map": {{weight name: shard file}}')
    shards = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise ValueError(f"{str(index)!r} names a shard outside the folder: {shard!r}")
        shards.add(shard)
    return sorted(shards)


def load_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """A safetensors file's tensors; a file that is not valid safetensors is refused with ``ValueError``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise ValueError(f"{str(path)!r} is named by the index but does not exist")
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file: {err}") from None


def load_bin(path: str | os.PathLike) -> dict[str, Tensor]:
    """A PyTorch ``.bin`` state dict, unpickled with ``weights_only=True`` (tensors and plain
    containers only: a file that would run code is refused with ``ValueError``)."""
    import pickle

    if not Path(path).is_file():
        raise ValueError(f"{str(path)!r} is named by the index but does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = [line.split("error:", 1)[1] for line in str(err).splitlines() if "WeightsUnpickler error:" in line]
        reason = found[0].split(". ")[0].strip() if found else type(err).__name__
        raise ValueError(
            f"refusing {str(path)!r}: it holds more than tensors ({reason}); "
            "poslab loads weights only (convert it to safetensors with a tool you trust)"
        ) from None


def _check_config_json(path: Path) -> None:
    """Refuse the ``config.json`` values transformers itself would crash on (a zero head count)."""
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(doc).__name__}")
    for key in POSITIVE_FIELDS:
        value = doc.get(key)
        if key in doc and value is not None and (not is_int(value) or value <= 0):
            raise ValueError(f"{str(path)!r}: {key}={value!r} must be a positive integer")


def _validation_error(err: Exception) -> bool:
    """Whether ``err`` is transformers' refusal of a config value: a ``ValueError``/``TypeError`` or the strict
    dataclass validation of ``huggingface_hub`` (``StrictDataclassFieldValidationError`` and its kin)."""
    return isinstance(err, (ValueError, TypeError)) or any(
        kind.__name__.startswith("StrictDataclass") for kind in type(err).__mro__
    )


def load_hf_source(model_or_dir: Any) -> tuple[Any, dict[str, Tensor]]:
    """``(transformers config, state dict)`` of a model object or a local checkpoint folder (offline)."""
    if isinstance(model_or_dir, nn.Module):
        config = getattr(model_or_dir, "config", None)
        if config is None or not hasattr(config, "model_type"):
            raise TypeError(
                f"from_hf takes a transformers model or a local folder; {type(model_or_dir).__name__} has no HF config"
            )
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
    _check_config_json(folder / "config.json")
    # trust_remote_code=False: a folder's own Python code (auto_map) is refused, never run or prompted for
    try:
        config = transformers_module().AutoConfig.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=False
        )
    except KeyError as err:  # a rope_parameters entry transformers' own validation reads without a default
        reason = err.args[0] if err.args else repr(err)
        raise ValueError(
            f"{str(folder / 'config.json')!r}: transformers cannot read it: {reason} "
            "(each rope_type needs its own fields)"
        ) from None
    except Exception as err:
        if not _validation_error(err):
            raise
        if "trust_remote_code" in str(err):  # custom code the folder asks to run: never run, said in one line
            raise ValueError(
                f"{str(folder)!r} holds custom code that only trust_remote_code=True would run; "
                "poslab never runs a folder's code"
            ) from None
        # the field (or validator), its rule and the value, on one line; not the list of types it tried
        reason = " ".join(str(err).split(" Errors: ")[0].split())
        raise ValueError(f"{str(folder / 'config.json')!r}: transformers refuses it: {reason[:400]}") from None
    return config, read_weights(folder)
