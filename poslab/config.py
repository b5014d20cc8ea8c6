"""The one config pipeline: typed values from text, dotted ``--a.b value`` overrides, merging onto presets.

Shared by ``poslab train`` and ``poslab sweep``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

import yaml

from poslab.nn.model import GPTConfig
from poslab.training.loop import TrainConfig

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _parse_value(key: str, text: str, hint: Any) -> Any:
    """Convert ``text`` to the type ``hint`` of field ``key`` or raise ``ValueError`` naming both."""
    args = typing.get_args(hint)
    if type(None) in args:
        if text.lower() in ("none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"--{key} expects true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--{key} expects an integer, got {text!r}") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"--{key} expects a number, got {text!r}") from None
    if hint is str:
        return text
    if typing.get_origin(hint) is list:  # attn_temperature, layer_pattern: a JSON or YAML list
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = None
        if not isinstance(value, list):
            raise ValueError(f"--{key} expects a list such as '[{{window: 4096}}, {{}}]', got {text!r}")
        return value
    # dict / Any (position_config): a JSON or YAML mapping
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"--{key} expects a mapping such as '{{\"base\": 500}}', got {text!r}")
    return value


def key_help() -> list[str]:
    train_keys = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "model"]
    model_keys = [f"model.{f.name}" for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size"]
    return train_keys + model_keys


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--max_steps", "20", "--model.n_head=8"]`` -> ``{"max_steps": 20, "model": {"n_head": 8}}``.

    Raises:
        ValueError: a token that is not ``--KEY``, a missing value, an unknown key (with the close
            one suggested) or a value of the wrong type.
    """
    train_hints = typing.get_type_hints(TrainConfig)
    model_hints = typing.get_type_hints(GPTConfig)
    result: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ValueError(f"unexpected argument {token!r}; overrides are written --KEY VALUE (e.g. --max_steps 20)")
        if "=" in token:
            raw_key, text = token[2:].split("=", 1)
            i += 1
        else:
            raw_key = token[2:]
            if i + 1 >= len(tokens):
                raise ValueError(f"--{raw_key} needs a value")
            text = tokens[i + 1]
            i += 2
        key = raw_key.replace("-", "_")
        parts = key.split(".")
        if parts[0] == "model" and len(parts) >= 2:
            field_name = parts[1]
            if field_name == "position_config" and len(parts) == 3:
                try:
                    value = yaml.safe_load(text)
                except yaml.YAMLError:
                    value = text
                model = result.setdefault("model", {})
                model.setdefault("position_config", {})[parts[2]] = value
                continue
            if len(parts) == 2 and field_name in model_hints and field_name != "vocab_size":
                value = _parse_value(key, text, model_hints[field_name])
                model = result.setdefault("model", {})
                if field_name == "position_config":
                    model.setdefault("position_config", {}).update(value)
                else:
                    model[field_name] = value
                continue
        elif len(parts) == 1 and key in train_hints and key != "model":
            result[key] = _parse_value(key, text, train_hints[key])
            continue
        candidates = key_help()
        close = difflib.get_close_matches(key, candidates, n=1) or difflib.get_close_matches(
            f"model.{key}", candidates, n=1
        )
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise ValueError(f"unknown key --{raw_key}{hint}; see `poslab train --help` for the keys")
    return result


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides on top of a preset config (``model`` and ``model.position_config`` merge key by key)."""
    merged = {**base, **{k: v for k, v in overrides.items() if k != "model"}}
    model = dict(base.get("model", {}))
    for key, value in overrides.get("model", {}).items():
        if key == "position_config" and isinstance(model.get("position_config"), dict):
            model["position_config"] = {**model["position_config"], **value}
        else:
            model[key] = value
    if "position" in overrides.get("model", {}) and "position_config" not in overrides.get("model", {}):
        model["position_config"] = {}  # a new scheme starts from its own defaults
    merged["model"] = model
    return merged
