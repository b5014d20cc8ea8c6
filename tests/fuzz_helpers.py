"""Shared pieces of the fuzzers: Hypothesis settings per kind (default and slow runs), the counts that
go to docs/reliability.md's table, and the value strategies (weird text, JSON/YAML values, numbers at
the edges of float64 and fp32, deep nesting).
"""

from __future__ import annotations

from conftest import nested
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DEFAULT_EXAMPLES = {
    "train": 150,
    "model": 200,
    "yaml": 60,
    "cli": 150,
    "extreme": 80,
    "hostile_cli": 40,
    "forged": 12,
    "cached": 60,
}


SLOW_EXAMPLES = {
    "train": 2500,
    "model": 3000,
    "yaml": 800,
    "cli": 2000,
    "extreme": 1500,
    "hostile_cli": 400,
    "forged": 150,
    "cached": 1000,
}


COUNTS = {
    "cases": 0,
    "accepted": 0,
    "rejected_one_line": 0,
    "tracebacks": 0,
    "subprocess_cases": 0,
    "models_run": 0,
    "forged_runs": 0,
    "consistent_forgeries_refused": 0,
    "cached_values_checked": 0,
    "remeasured": 0,
}


WEIRD_TEXT = [
    "",
    " ",
    "none",
    "null",
    "nan",
    "-inf",
    "1e309",
    "0x10",
    "٣",
    "１２",
    "🙂",
    "é",
    "a/b",
    "..",
    ".",
    "\x00",
    "\n",
    "--",
    "-1",
    "true",
    "[]",
    "{}",
    "{'a': 1}",
    "rope",
    "alibi",
    "tang5",
    "bpe:٣",
    "bpe:0",
]


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=300),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=16),
    st.sampled_from(WEIRD_TEXT),
)


values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)


def _settings(kind: str, slow: bool):
    examples = (SLOW_EXAMPLES if slow else DEFAULT_EXAMPLES)[kind]
    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


# ------------------------------------------------------------------------------------ hostile values
#: finite numbers at the edges of float64 and fp32 (and past fp32's range), of both signs
EXTREME_NUMBERS = [
    5e-324,
    1e-300,
    1e-46,
    1e-38,
    1e-30,
    1e-6,
    1e6,
    1e30,
    3.4e38,
    1e39,
    1e300,
    1.7e308,
    2**31,
    2**53,
    2**62,
    2**63,
    -1e-300,
    -1e300,
]


extreme_numbers = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) > 1e30 or 0 < abs(x) < 1e-30),
)


deep_values = st.builds(nested, st.integers(1, 6000), st.sampled_from(["[", "{a: ", '{"a": ']))
