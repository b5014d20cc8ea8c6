"""The checks behind every typed config: the "unknown key" error (model, training, position schemes)
and :func:`coerce`, the one conversion of a config value (or its command-line text) to a field's type."""

from __future__ import annotations

import difflib
import math
import re
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from poslab.checks import is_int
from poslab.safe_load import load_yaml


def reject_unknown_keys(
    keys: Iterable[str], allowed: Sequence[str], what: str, *, prefix: str = "", where: str = ""
) -> None:
    """Raise ``ValueError`` for the first key not in ``allowed``, suggesting the closest allowed one.

    Args:
        keys: the keys a user gave.
        allowed: the config's field names.
        what: what a key is called in the message (``"training key"``).
        prefix: written before every key in the message (``"model."`` for nested configs).
        where: appended after the key (``" for position scheme 'rope'"``).

    Raises:
        ValueError: ``unknown {what} '{prefix}{key}'{where} (did you mean '{prefix}{close}'?); allowed: ...``.
    """
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {what} {prefix + str(key)!r}{where}{hint}; allowed: {', '.join(allowed)}")


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def coerce(key: str, value: Any, hint: Any, *, text: bool = False) -> Any:
    """The one typed-value conversion of the config pipeline (CLI text, YAML values, dataclass fields).

    Args:
        key: the field's name, for the message (``"max_steps"``, ``"model.n_head"``).
        value: the value; with ``text`` a string from the command line.
        hint: the field's annotation: ``int``, ``float``, ``str``, ``bool``, ``dict``/``Any`` (a mapping)
            or ``X | None``.
        text: ``value`` is command-line text: ``"none"``/``"null"`` is ``None`` for an optional field,
            ``true/false/yes/no/on/off/1/0`` a bool, a number is parsed, a mapping is read as YAML/JSON.

    Returns:
        The typed value (an ``int`` given for a ``float`` field becomes a ``float``).

    Raises:
        TypeError: a value of the wrong type (``bool`` is not an integer).
        ValueError: text that does not parse, or a non-finite float.
    """
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None or (text and isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        hint = next(a for a in args if a is not type(None))
    if text and isinstance(value, str):
        value = _from_text(key, value, hint)
    if hint is float and is_int(value):
        value = float(value)
    if hint is int and not is_int(value):
        raise TypeError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    if hint in (float, str, bool, dict) and not isinstance(value, hint):
        raise TypeError(f"{key} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
    if hint is float and not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value!r}")
    return value


#: how a number is written on the command line: decimal digits with an optional sign, point and exponent
DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", re.ASCII)
_INTEGER = re.compile(r"[-+]?\d+", re.ASCII)
_NUMBER_START = re.compile(r"[-+]?\.?\d", re.ASCII)


def parse_number(key: str, text: str) -> int | float | None:
    """A command-line number: written in decimal (``500``, ``-3``, ``0.5``, ``1e308``), an ``int`` without a
    point or exponent, else a ``float``; ``None`` for text that does not start like a number.

    One rule for every numeric value of the command line, typed fields and ``position_config`` alike: a
    number in another notation (hex ``0x10``, octal ``0o17``, binary ``0b1``, ``_`` separators ``1_000``)
    is refused rather than read one way here and another way there.

    Raises:
        ValueError: text that starts like a number but is not a decimal one, naming ``--key`` and the rule.
    """
    stripped = text.strip()
    if DECIMAL.fullmatch(stripped):
        return int(stripped) if _INTEGER.fullmatch(stripped) else float(stripped)
    if _NUMBER_START.match(stripped):
        raise ValueError(
            f"--{key} expects a decimal number such as 1000, 0.5 or 1e308, got {text!r} "
            "(hex, octal, binary and '_' separators are not read)"
        )
    return None


def parse_text(key: str, text: str) -> Any:
    """A command-line value read as YAML/JSON through the one guarded reader (``None`` if it is not YAML).

    Raises:
        ValueError: nested too deeply or an alias bomb (:func:`poslab.safe_load.load_yaml`), naming ``--key``.
    """
    import yaml

    try:
        return load_yaml(text, f"--{key}")
    except yaml.YAMLError:
        return None


def _from_text(key: str, text: str, hint: Any) -> Any:
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"--{key} expects true or false, got {text!r}")
    if hint is int:
        number = parse_number(key, text)
        if not isinstance(number, int):
            raise ValueError(f"--{key} expects an integer, got {text!r}")
        return number
    if hint is float:
        number = parse_number(key, text)
        if number is not None:
            return float(number)
        if text.strip().lstrip("+-").lower() in ("inf", "infinity", "nan"):
            return float(text)  # refused by the finite check, with its own message
        raise ValueError(f"--{key} expects a number, got {text!r}")
    if hint is str:
        return text
    value = parse_text(key, text)  # a list (layer_pattern, temperature_tuning) or a mapping (position_config)
    if typing.get_origin(hint) in (list, tuple):
        if not isinstance(value, list):
            example = "[{window: 4096}, {}]" if typing.get_origin(hint) is list else "[8192, 0.1]"
            raise ValueError(f"--{key} expects a list such as '{example}', got {text!r}")
        return value
    if not isinstance(value, dict):
        raise ValueError(f"--{key} expects a mapping such as '{{\"base\": 500}}', got {text!r}")
    return value
