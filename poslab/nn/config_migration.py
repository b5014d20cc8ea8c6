"""Reading a model config saved in the flat form (one ``GPTConfig`` field per setting).

A run folder's ``config.json`` in the flat form names each setting as a top-level key
(``qk_norm``, ``norm_eps``, ``attn_chunk``, ...). :func:`migrate_model_config` rewrites such a
mapping into the grouped form, value for value, so the run loads the identical model; the groups'
``None`` defaults ("the model's dropout / norm epsilon / bias") are exactly what the flat form
derived from the model's fields. Anything a user writes (YAML, ``--model.KEY``, Python) uses the
grouped names only: :func:`check_not_flat` names the grouped key of a flat one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: flat ``GPTConfig`` key -> its grouped place ``GROUP.FIELD``
FLAT_KEYS: dict[str, str] = {
    "backend": "attention.backend",
    "window": "attention.window",
    "causal": "attention.causal",
    "attn_bias": "attention.bias",
    "attn_scale": "attention.scale",
    "clip_qkv": "attention.clip_qkv",
    "attn_head_dim": "attention.head_dim",
    "attn_softcap": "attention.softcap",
    "qk_norm": "attention.qk_norm",
    "qk_norm_affine": "attention.qk_norm_affine",
    "attn_sinks": "attention.sinks",
    "attn_chunk": "attention.chunk",
    "attn_temperature": "attention.temperature_tuning",
    "norm": "norm.kind",
    "norm_eps": "norm.eps",
    "norm_bias": "norm.bias",
    "embed_norm": "norm.embed",
    "mlp": "mlp.kind",
    "mlp_hidden": "mlp.hidden",
    "mlp_bias": "mlp.bias",
    "activation": "mlp.activation",
}
#: flat ``layer_pattern`` key -> the :class:`~poslab.nn.attention.config.AttentionConfig` field it sets
FLAT_LAYER_KEYS: dict[str, str] = {"attn_chunk": "chunk", "attn_temperature": "temperature_tuning"}
#: the group names (a flat ``norm``/``mlp`` holds a string, a grouped one a mapping)
_GROUP_NAMES = ("norm", "mlp")


def flat_keys(values: dict[str, Any]) -> list[str]:
    """The keys of ``values`` in the flat form (``norm``/``mlp`` only when they hold a kind name)."""
    found = []
    for key, value in values.items():
        if key in _GROUP_NAMES:
            if isinstance(value, str):
                found.append(key)
        elif key in FLAT_KEYS:
            found.append(key)
    return found


def flat_key_message(key: str, prefix: str = "") -> str:
    """The one-line error for flat key ``key`` (``prefix``: ``"model."`` or ``"--model."``)."""
    return (
        f"{prefix}{key} is {prefix}{FLAT_KEYS[key]}: the model's attention, norm and MLP settings are "
        f"grouped (GPTConfig.attention / .norm / .mlp)"
    )


def check_not_flat(values: dict[str, Any], prefix: str = "") -> None:
    """``ValueError`` naming the grouped key of the first flat key in ``values`` (a model config mapping)."""
    for key in flat_keys(values):
        raise ValueError(flat_key_message(key, prefix))
    for i, entry in enumerate(values.get("layer_pattern") or []):
        if isinstance(entry, dict):
            for key in FLAT_LAYER_KEYS:
                if key in entry:
                    raise ValueError(
                        f"{prefix}layer_pattern[{i}] key {key!r} is {FLAT_LAYER_KEYS[key]!r} "
                        "(the name of the attention setting it overrides)"
                    )


def migrate_model_config(values: dict[str, Any]) -> dict[str, Any]:
    """A saved model config mapping in the grouped form (a grouped one is returned unchanged).

    Each flat key moves to its group under its new name (:data:`FLAT_KEYS`), each flat
    ``layer_pattern`` key is renamed (:data:`FLAT_LAYER_KEYS`); nothing is dropped or re-valued. A
    group field the flat form did not have (``attention.qk_norm_eps``, ...) takes its default, which
    is what the flat form did.
    """
    from poslab.nn.gpt_config import GROUPS

    flat = flat_keys(values)
    pattern = values.get("layer_pattern")
    renamed_layers = isinstance(pattern, list) and any(
        isinstance(entry, dict) and set(entry) & set(FLAT_LAYER_KEYS) for entry in pattern
    )
    if not flat and not renamed_layers:
        return values
    out = {key: value for key, value in values.items() if key not in flat}
    for key in flat:
        group, name = FLAT_KEYS[key].split(".")
        section = out.get(group)
        section = dict(section) if isinstance(section, dict) else {}
        section[name] = values[key]
        out[group] = section
    for group, cls in GROUPS.items():  # the fields the flat form had no key for take their defaults,
        if isinstance(out.get(group), dict):  # so the mapping equals what the grouped config writes
            defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
            out[group] = {**defaults, **out[group]}
    if renamed_layers:
        out["layer_pattern"] = [
            {FLAT_LAYER_KEYS.get(k, k): v for k, v in entry.items()} if isinstance(entry, dict) else entry
            for entry in pattern
        ]
    return out
