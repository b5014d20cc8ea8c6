"""poslab/checks.py: the one "positive int, not bool" / "positive number" rule and its one-line message."""

from __future__ import annotations

import math
import re

import pytest

from poslab.checks import int_at_least, is_int, is_number, non_negative_int, positive_int, positive_number


@pytest.mark.parametrize("value", [True, False, 0, -1, 2.0, "3", None])
def test_positive_int_refuses_what_is_not_a_positive_int(value):
    with pytest.raises(ValueError, match=re.escape(f"n_heads must be a positive integer, got {value!r}")):
        positive_int("n_heads", value)


def test_the_checks_return_the_value_they_accept():
    assert positive_int("n", 3) == 3
    assert non_negative_int("n", 0) == 0
    assert int_at_least("n", 5, 5) == 5
    assert positive_number("eps", 1e-6) == 1e-6


def test_a_maximum_bounds_the_range_and_is_named():
    assert positive_int("layer", 4, maximum=4) == 4
    with pytest.raises(ValueError, match=re.escape("layer must be an integer in [1, 4], got 5")):
        positive_int("layer", 5, maximum=4)
    with pytest.raises(ValueError, match=re.escape("port must be an integer in [0, 9], got -1")):
        non_negative_int("port", -1, maximum=9)


def test_a_rule_replaces_the_default_wording():
    with pytest.raises(ValueError, match=re.escape("L must be an integer >= 2, got 1")):
        int_at_least("L", 1, 2)
    with pytest.raises(ValueError, match=re.escape("top_k must be a positive integer or None, got 0")):
        positive_int("top_k", 0, rule="a positive integer or None")


@pytest.mark.parametrize("value", [True, 0, -1.0, math.nan, math.inf, "1"])
def test_positive_number_refuses_bools_nan_and_infinity(value):
    with pytest.raises(ValueError, match=re.escape(f"softcap must be a positive finite number, got {value!r}")):
        positive_number("softcap", value)


def test_positive_number_may_allow_infinity():
    assert positive_number("clip", math.inf, finite=False) == math.inf
    with pytest.raises(ValueError, match="clip must be a positive number, got nan"):
        positive_number("clip", math.nan, finite=False)


def test_a_bool_is_neither_an_int_nor_a_number():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(2.5) and not is_number(False) and not is_number("2")
