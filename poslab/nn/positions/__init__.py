"""Position-scheme registry: ``register``, ``build``, ``names``.

Adding a scheme = one file defining a :class:`PositionScheme` subclass with a config dataclass,
plus one line in :data:`_MODULES` below. The contract tests then cover it automatically.

Example::

    >>> from poslab import positions
    >>> rope = positions.build("rope", head_dim=64, scaling="yarn", factor=4.0)
    >>> "alibi" in positions.names()
    True
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import typing
from typing import Any

from poslab.checks import is_int, is_number
from poslab.config_keys import reject_unknown_keys
from poslab.nn.positions.base import PositionScheme

_REGISTRY: dict[str, type[PositionScheme]] = {}

# One line per scheme family (module path); importing a module registers its schemes.
_MODULES = (
    "poslab.nn.positions.nope",
    "poslab.nn.positions.absolute",
    "poslab.nn.positions.rope",
    "poslab.nn.positions.alibi",
    "poslab.nn.positions.t5",
    "poslab.nn.positions.kerple",
    "poslab.nn.positions.fire",
    "poslab.nn.positions.xl",
    "poslab.nn.positions.prope",
    "poslab.nn.positions.cope",
    "poslab.nn.positions.forgetting",
)


def register(cls: type[PositionScheme]) -> type[PositionScheme]:
    """Class decorator adding a scheme to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"position scheme {cls.name!r} is already registered")
    if not dataclasses.is_dataclass(cls.config_class):
        raise TypeError(f"{cls.__name__}.config_class must be a dataclass")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    for module in _MODULES:
        importlib.import_module(module)
    # Registration order follows import order (``from poslab.nn.positions.rope import ...`` registers rope
    # before none): keep the listing in _MODULES order whatever was imported first; schemes registered
    # from other modules follow, in registration order.
    rank = {module: i for i, module in enumerate(_MODULES)}
    ordered = sorted(_REGISTRY.items(), key=lambda item: rank.get(item[1].__module__, len(rank)))
    if list(_REGISTRY) != [name for name, _ in ordered]:
        _REGISTRY.clear()
        _REGISTRY.update(ordered)


def names() -> list[str]:
    """Registered scheme names: the built-in ones in :data:`_MODULES` order, then any others."""
    _load()
    return list(_REGISTRY)


def get(name: str) -> type[PositionScheme]:
    """The scheme class registered as ``name``; unknown names raise ``ValueError`` listing the known."""
    _load()
    if not isinstance(name, str):
        raise TypeError(f"position scheme name must be a string, got {name!r}")
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown position scheme {name!r}{hint}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def make_config(name: str, config: Any = None, /, **overrides: Any) -> Any:
    """Build the typed config of scheme ``name`` from a dataclass, a dict and/or keyword overrides.

    Unknown keys raise ``ValueError`` naming the key and listing the allowed ones.
    """
    values = _config_values(name, config, overrides)
    built = _checked(name, get(name).config_class(**values))
    get(name).check_config_keys(values)  # after the config's own checks, whose messages are more specific
    return built


def _config_values(name: str, config: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """The config fields given as a dataclass, a dict and/or overrides, keys validated (no values checked)."""
    cls = get(name)
    config_class = cls.config_class
    if config is None:
        values: dict[str, Any] = {}
    elif isinstance(config, config_class):
        values = dataclasses.asdict(config)
    elif isinstance(config, dict):
        values = dict(config)
    else:
        raise TypeError(f"config for {name!r} must be a dict or {config_class.__name__}, got {type(config).__name__}")
    values.update(overrides)
    reject_unknown_keys(
        values, [f.name for f in dataclasses.fields(config_class)], "config key", where=f" for position scheme {name!r}"
    )
    return values


def _checked(name: str, config: Any) -> Any:
    """``config`` (built, so the scheme's own checks and messages came first) with every field's type checked."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        _check_type(name, field.name, getattr(config, field.name), hints.get(field.name))
    return config


#: integer config fields (dimensions, lengths, bucket counts) above this are refused before any table is built
_MAX_INT = 2**31 - 1
#: float config fields feed fp32 computations: the largest finite fp32
_MAX_FLOAT = 3.4028234663852886e38


def _check_type(name: str, key: str, value: Any, hint: Any) -> None:
    """``value`` against a config field's annotation (int, float, bool, str, ``list[float]``, ``X | None``).

    Ranges are each scheme's own checks; this only rules out the wrong type, ``bool`` for a number,
    NaN/inf and integers too large for any tensor, with one clear message naming the key.
    """
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    where = f"position_config {key!r} of {name!r}"
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = is_int(value)
        if ok and abs(value) > _MAX_INT:
            raise ValueError(f"{where} is too large: {value!r} (at most {_MAX_INT})")
    elif hint is float:
        ok = is_number(value)
        limit = 2**53 if isinstance(value, int) else _MAX_FLOAT  # an int beyond 2**53 is not a float's exact value
        if ok and not (math.isfinite(value) and abs(value) <= limit):
            raise ValueError(f"{where} must be finite and at most {limit:.3g} in size, got {value!r}")
    elif hint is str:
        ok = isinstance(value, str)
    elif origin is list:
        ok = isinstance(value, (list, tuple))
        if ok:
            for item in value:
                _check_type(name, f"{key}[]", item, typing.get_args(hint)[0] if typing.get_args(hint) else None)
    else:
        return  # not a simple annotation: left to the scheme
    if not ok:
        expected = getattr(hint, "__name__", str(hint))
        raise TypeError(f"{where} must be {expected}, got {value!r} ({type(value).__name__})")


def build(name: str, config: Any = None, /, **cfg: Any) -> PositionScheme:
    """Build scheme ``name`` from its config (dataclass or dict) and/or keyword arguments."""
    return get(name)(make_config(name, config, **cfg))


def build_for_model(name: str, config: Any, context: dict[str, Any]) -> PositionScheme:
    """Build a scheme for a model, filling config fields the scheme has from ``context``.

    ``context`` holds the model's dimensions (``n_embd``, ``n_heads``, ``head_dim``, ``n_layer``, ``max_len``,
    ``original_max_len``, ``bidirectional``); a scheme takes only the ones its config has. A field the user set
    explicitly wins for ``max_len``, ``original_max_len`` and ``bidirectional``; dimension fields must agree with the
    model.
    """
    cls = get(name)
    # validate the keys only: values such as longrope factors are checked once the model's dims are in
    given = _config_values(name, config, {})
    fields = {f.name for f in dataclasses.fields(cls.config_class)}
    values = dict(given)
    for key, value in context.items():
        if key not in fields:
            continue
        if key in given and key in ("n_embd", "n_heads", "head_dim", "n_layer") and given[key] != value:
            raise ValueError(f"position_config {key}={given[key]!r} disagrees with the model's {key}={value!r}")
        if given.get(key) is None:  # missing or None ("follow the model", e.g. T5's bidirectional)
            values[key] = value
    built = _checked(name, cls.config_class(**values))
    cls.check_config_keys(given)
    return cls(built)


__all__ = ["PositionScheme", "build", "build_for_model", "get", "make_config", "names", "register"]
