"""Exercises that check themselves: ``poslab check NAME FILE.py``.

For each hands-on part of the lessons, the student writes one function in a file; :func:`check`
runs it on fixed random cases and compares it with poslab's own implementation. One module per
exercise; :data:`EXERCISES` is the registry.
"""

from __future__ import annotations

from poslab.lab.exercises import alibi, causal_leak, heads, local_mask, rope
from poslab.lab.exercises.base import Case, Exercise
from poslab.lab.exercises.check import CheckResult, SolutionError, check, load_function

EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (rope.EXERCISE, alibi.EXERCISE, local_mask.EXERCISE, heads.SPLIT, heads.MERGE, causal_leak.EXERCISE)
}


def get(name: str) -> Exercise:
    """The exercise called ``name``; a ValueError naming the choices for an unknown one."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; choose from: {', '.join(EXERCISES)} (`poslab check list`)")
    return EXERCISES[name]


__all__ = ["EXERCISES", "Case", "CheckResult", "Exercise", "SolutionError", "check", "get", "load_function"]
