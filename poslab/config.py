"""The one config pipeline: CLI text / YAML -> nested overrides -> merged onto a preset -> ``TrainConfig``.

* values: :func:`poslab.config_keys.coerce` (the one text -> typed value conversion);
* keys: :func:`nest`, the one dotted-key parser (``model.position_config.base``), used by
  :func:`parse_overrides` (``poslab train --KEY VALUE``) and by ``poslab sweep`` (YAML mappings);
* :func:`merge`: overrides on top of a preset;
* :func:`preflight`: what ``train`` would refuse, checked without reading the corpus or writing
  anything (``poslab train --dry-run`` and ``poslab sweep``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from poslab.config_keys import coerce, parse_number
from poslab.data import CORPORA, build_tokenizer
from poslab.nn.config_migration import flat_key_message, flat_keys
from poslab.nn.gpt_config import GROUPS
from poslab.nn.model import GPT, GPTConfig
from poslab.runs import RunFolder
from poslab.safe_load import load_yaml
from poslab.training.config import MODEL_KEYS, TrainConfig, check_model_for_training, model_config, training_device
from poslab.training.lock import interrupted_start

TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "model")


def key_help() -> list[str]:
    groups = [f"model.{g}.{f.name}" for g, cls in GROUPS.items() for f in dataclasses.fields(cls)]
    return list(TRAIN_KEYS) + [f"model.{k}" for k in MODEL_KEYS if k not in GROUPS] + groups


def nest(
    pairs: Iterable[tuple[str, Any]], *, text: bool = False, where: str = "", reserved: dict[str, str] | None = None
) -> dict[str, Any]:
    """Dotted training keys -> the nested overrides :func:`merge` takes.

    ``[("model.position", "rope"), ("model.position_config.base", 500), ("seed", 1)]`` ->
    ``{"model": {"position": "rope", "position_config": {"base": 500}}, "seed": 1}``. A key ``model``
    whose value is a mapping is read as its dotted keys.

    Args:
        pairs: ``(key, value)`` in order (a later key wins).
        text: values are command-line text, converted with :func:`coerce` (``--KEY VALUE``); else
            typed values (YAML) left for ``TrainConfig`` to check.
        where: prefix of error messages (a sweep file's section); empty for the command line.
        reserved: keys that cannot be set here, with the reason.

    Raises:
        ValueError / TypeError: an unknown key (the close one suggested), a reserved key, a value
            that does not convert.
    """
    train_hints = typing.get_type_hints(TrainConfig)
    model_hints = typing.get_type_hints(GPTConfig)
    group_hints = {
        name: {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls)}
        for name, cls in GROUPS.items()
    }
    result: dict[str, Any] = {}
    for raw_key, value in pairs:
        key = str(raw_key).replace("-", "_") if text else str(raw_key)
        parts = key.split(".")
        if key == "model" and isinstance(value, dict) and not text:
            _merge_into(result, nest([(f"model.{k}", v) for k, v in value.items()], where=where, reserved=reserved))
            continue
        if parts[0] == "model" and len(parts) == 2 and parts[1] in GROUPS and isinstance(value, dict) and not text:
            pairs_in = [(f"{key}.{k}", v) for k, v in value.items()]
            _merge_into(result, nest(pairs_in, where=where, reserved=reserved))
            continue
        if parts[0] == "model" and len(parts) == 2 and parts[1] in GROUPS and not isinstance(value, dict):
            if parts[1] in flat_keys({parts[1]: value}):
                raise ValueError(flat_key_message(parts[1], f"{where}: model." if where else "--model."))
            raise ValueError(
                f"{where}{': ' if where else ''}model.{parts[1]} is a group: set its fields as "
                f"model.{parts[1]}.FIELD, got {value!r}"
            )
        if parts[0] == "model" and len(parts) == 2 and parts[1] in flat_keys({parts[1]: value}):
            prefix = f"{where}: model." if where else "--model."
            raise ValueError(flat_key_message(parts[1], prefix))
        if reserved and len(parts) == 1 and key in reserved:
            raise ValueError(f"{where}{': ' if where else ''}{key!r} cannot be set in a sweep ({reserved[key]})")
        if len(parts) == 1 and key in TRAIN_KEYS:
            result[key] = coerce(key, value, train_hints[key], text=True) if text else value
        elif parts[0] == "model" and len(parts) == 2 and parts[1] in MODEL_KEYS:
            value = coerce(key, value, model_hints[parts[1]], text=True) if text else value
            if parts[1] == "position_config":
                if not isinstance(value, dict):
                    raise ValueError(
                        f"{where}{': ' if where else ''}model.position_config must be a mapping, got {value!r}"
                    )
                result.setdefault("model", {}).setdefault("position_config", {}).update(value)
            else:
                result.setdefault("model", {})[parts[1]] = value
        elif parts[0] == "model" and len(parts) == 3 and parts[1] in GROUPS and parts[2] in group_hints[parts[1]]:
            value = coerce(key, value, group_hints[parts[1]][parts[2]], text=True) if text else value
            result.setdefault("model", {}).setdefault(parts[1], {})[parts[2]] = value
        elif parts[0] == "model" and len(parts) == 3 and parts[1] == "position_config":
            if text:
                value = _yaml_scalar(key, value)
            result.setdefault("model", {}).setdefault("position_config", {})[parts[2]] = value
        else:
            raise ValueError(_unknown(raw_key, key, where, reserved))
    return result


def _unknown(raw_key: str, key: str, where: str, reserved: dict[str, str] | None) -> str:
    candidates = [k for k in key_help() if k not in (reserved or {})]
    close = difflib.get_close_matches(key, candidates, n=1) or difflib.get_close_matches(
        f"model.{key}", candidates, n=1
    )
    if not where:  # the command line
        hint = f" (did you mean --{close[0]}?)" if close else ""
        return f"unknown key --{raw_key}{hint}; see `poslab train --help` for the keys"
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"{where}: unknown training key {key!r}{hint}; use TrainConfig fields, model.FIELD "
        f"or model.position_config.KEY (see `poslab train --help`)"
    )


def _yaml_scalar(key: str, text: str) -> Any:
    """A ``--model.position_config.KEY VALUE`` value: a number by the command line's one rule
    (:func:`poslab.config_keys.parse_number`: decimal, so ``1e308`` is the float and ``0x10`` is refused),
    else YAML (``[1, 2]`` -> a list, ``true`` -> a bool), else the text.

    Read through the one guarded reader (:func:`poslab.safe_load.load_yaml`): a deeply nested value
    or an alias bomb is refused in one line naming ``--key``.
    """
    import yaml

    number = parse_number(key, text)
    if number is not None:
        return number

    try:
        return load_yaml(text, f"--{key}")
    except yaml.YAMLError:
        return text


def _merge_into(target: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = value


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--max_steps", "20", "--model.n_head=8"]`` -> ``{"max_steps": 20, "model": {"n_head": 8}}``.

    Raises:
        ValueError: a token that is not ``--KEY``, a missing value, an unknown key (with the close
            one suggested) or a value of the wrong type.
    """
    pairs = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ValueError(f"unexpected argument {token!r}; overrides are written --KEY VALUE (e.g. --max_steps 20)")
        if "=" in token:
            raw_key, value = token[2:].split("=", 1)
            i += 1
        else:
            raw_key = token[2:]
            if i + 1 >= len(tokens):
                raise ValueError(f"--{raw_key} needs a value")
            value = tokens[i + 1]
            i += 2
        pairs.append((raw_key, value))
    return nest(pairs, text=True)


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides on top of a preset config (``model``, ``model.position_config`` and the model's groups
    ``attention``/``norm``/``mlp`` merge key by key)."""
    merged = {**base, **{k: v for k, v in overrides.items() if k != "model"}}
    model = dict(base.get("model", {}))
    for key, value in overrides.get("model", {}).items():
        if key in ("position_config", *GROUPS) and isinstance(model.get(key), dict) and isinstance(value, dict):
            model[key] = {**model[key], **value}
        else:
            model[key] = value
    if "position" in overrides.get("model", {}) and "position_config" not in overrides.get("model", {}):
        model["position_config"] = {}  # a new scheme starts from its own defaults
    merged["model"] = model
    return merged


def _training_device(device: str, world_size: int) -> str:
    """Where ``train`` puts the model: under torchrun CUDA when a GPU is visible, else ``device`` resolved."""
    if world_size > 1:
        return training_device(device, "cuda" if torch.cuda.is_available() else "cpu")
    return training_device(device)


def preflight(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, folder: bool = True) -> str:
    """What ``train`` would refuse about ``cfg``, found before anything is read or written.

    ``cfg`` itself is already checked (its keys, types and ranges, and its model: geometry and position
    config, the scheme built once on the meta device). This checks the tokenizer spec, what the training
    loop refuses about the model (:func:`~poslab.training.config.check_model_for_training`: block size
    past the position table, ``memory`` with a table or mla), that the backend can train on this device,
    that ``init_from``'s weights fit the model, that the corpus is shipped or an existing file and (with
    ``folder``) the run folder against ``resume``/``overwrite``.

    Returns:
        The action ``train`` would take: ``"start"``, ``"resume"`` or ``"overwrite"``.

    Raises:
        ValueError, FileNotFoundError, FileExistsError: what ``train`` would raise.
    """
    build_tokenizer(cfg.tokenizer, "ab")  # the spec only (fitted on a two-character text)
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if os.environ.get("WORLD_SIZE", "").isdigit() else 1
    check_model_for_training(
        cfg, cfg.model.max_positions(), world_size, _training_device(cfg.device, world_size)
    )  # the loop's
    if cfg.init_from is not None:  # the weights must fit the model, as train finds when it loads them
        init = RunFolder(cfg.init_from)
        with torch.device("meta"):
            model = GPT(model_config(cfg, init.model_config().vocab_size))
        with warnings.catch_warnings():  # copying into meta parameters is a no-op, as wanted: names and shapes only
            warnings.simplefilter("ignore", UserWarning)
            init.restore_weights(model)
    if cfg.corpus not in CORPORA and not Path(cfg.corpus).is_file():
        raise ValueError(
            f"corpus {cfg.corpus!r} is neither a shipped corpus ({', '.join(CORPORA)}) nor an existing file"
        )
    if not folder:
        return "start"
    run_dir = cfg.run_dir
    if resume and overwrite:
        raise ValueError("choose one of resume and overwrite, not both")
    occupied = run_dir.is_dir() and any(run_dir.iterdir()) and not interrupted_start(run_dir)
    is_run = RunFolder(run_dir).is_run
    if resume and not is_run:
        raise FileNotFoundError(f"cannot resume: {str(run_dir)!r} has no config.json (not a poslab run)")
    if occupied and not resume and not overwrite:
        raise FileExistsError(
            f"run folder {str(run_dir)!r} already exists; pass --resume to continue it or --overwrite to replace it"
        )
    if occupied and overwrite and not is_run:
        raise FileExistsError(f"refusing to overwrite {str(run_dir)!r}: it is not a poslab run folder (no config.json)")
    return "resume" if resume else ("overwrite" if occupied else "start")


__all__ = ["TRAIN_KEYS", "key_help", "merge", "nest", "parse_overrides", "preflight"]
