"""The one owner of the plain value checks: "a positive int, not a bool", "a positive number".

Every part of the package validates its arguments with these, so the rule and its one-line message
("``name`` must be a positive integer, got 0") read the same wherever a value is refused. A ``bool``
is never an integer or a number here, although Python counts ``True`` as ``1``. This module imports
nothing of poslab, so every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    """``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """``value`` is an ``int`` or a ``float`` and not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_at_least(name: str, value: Any, minimum: int, *, maximum: int | None = None, rule: str | None = None) -> int:
    """``value`` returned when it is an int in ``[minimum, maximum]``, else a one-line ``ValueError``.

    The message reads ``"{name} must be {rule}, got {value!r}"``; ``rule`` defaults to
    ``"an integer >= minimum"`` (``"an integer in [minimum, maximum]"`` with a ``maximum``).
    """
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        if rule is None:
            rule = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value


def positive_int(name: str, value: Any, *, maximum: int | None = None, rule: str | None = None) -> int:
    """``value`` returned when it is an int ``>= 1`` (and ``<= maximum``), else a one-line ``ValueError``.

    The message reads ``"{name} must be a positive integer, got {value!r}"`` (``rule`` replaces
    "a positive integer" where a value has more to say, e.g. what ``None`` means).
    """
    if rule is None:
        rule = "a positive integer" if maximum is None else f"an integer in [1, {maximum}]"
    return int_at_least(name, value, 1, maximum=maximum, rule=rule)


def non_negative_int(name: str, value: Any, *, maximum: int | None = None, rule: str | None = None) -> int:
    """``value`` returned when it is an int ``>= 0`` (and ``<= maximum``), else a one-line ``ValueError``."""
    if rule is None:
        rule = "a non-negative integer" if maximum is None else f"an integer in [0, {maximum}]"
    return int_at_least(name, value, 0, maximum=maximum, rule=rule)


def positive_number(name: str, value: Any, *, finite: bool = True, rule: str | None = None) -> float | int:
    """``value`` returned when it is a number ``> 0`` (finite unless ``finite=False``), else a ``ValueError``.

    NaN is refused (it is not ``> 0``); the message reads ``"{name} must be a positive number, got {value!r}"``.
    """
    if not is_number(value) or not value > 0 or (finite and not math.isfinite(value)):
        if rule is None:
            rule = "a positive finite number" if finite else "a positive number"
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value
