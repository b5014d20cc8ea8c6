"""The lab's verdicts, one import away: claim records, the seeded tests, the deterministic checks.

A verdict is one of :data:`VERDICTS` (docs/lab.md, "How a verdict is decided"). The records live in
:mod:`poslab.lab.records`, the seeded tests in :mod:`poslab.lab.comparisons`, the plan in :mod:`poslab.lab.plan`;
every experiment imports them from here. This module adds the claims decided by a computation
(:func:`deterministic`, :func:`at_least`: no seeds, no noise) and the checks every list of records must pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from poslab.lab.comparisons import VAL_LOSS, Arm, Metric, best_of, bound, compare, equivalent, on_common_seeds, paired
from poslab.lab.plan import ALPHA, Design, Test, adjust, one_sample_p, welch_p
from poslab.lab.records import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    MIN_SEEDS,
    PREMISE_NOT_MET,
    VERDICTS,
    ClaimRecord,
    Premise,
    decide,
    mean_sd,
    not_testable,
    pm,
    pm_text,
    with_premise,
)

__all__ = [
    "ALPHA",
    "Arm",
    "DID_NOT_HOLD",
    "HELD",
    "INCONCLUSIVE",
    "MIN_SEEDS",
    "Metric",
    "PREMISE_NOT_MET",
    "VAL_LOSS",
    "VERDICTS",
    "ClaimRecord",
    "Design",
    "Premise",
    "Test",
    "adjust",
    "at_least",
    "best_of",
    "bound",
    "check_records",
    "compare",
    "decide",
    "design_problems",
    "deterministic",
    "equivalent",
    "on_common_seeds",
    "get",
    "mean_sd",
    "missed_by",
    "missing_premises",
    "not_testable",
    "num",
    "one_sample_p",
    "paired",
    "pm",
    "pm_text",
    "tally",
    "welch_p",
    "with_premise",
]


def missed_by(record: dict[str, Any] | ClaimRecord) -> str:
    """For the page: how a verdict relates its margin to its noise (``"margin 0.012 < noise 0.031"``)."""
    r = record if isinstance(record, ClaimRecord) else ClaimRecord.from_dict(record)
    if r.margin is None:
        return "not measurable"
    if r.noise is None:
        return f"margin {r.margin:.3g}" + (" (deterministic)" if r.n_seeds == 0 else " (no measured noise)")
    relation = ">" if abs(r.margin) > r.noise else "≤"
    return f"|margin| {abs(r.margin):.3g} {relation} noise {r.noise:.3g}"


def deterministic(
    claim: str,
    source: str,
    criterion: str,
    measured: str,
    error: float,
    tolerance: float,
    details: dict[str, Any] | None = None,
) -> ClaimRecord:
    """A claim decided by a computation, not by training: ``held`` when ``error <= tolerance``, else ``did not hold``.

    ``margin`` is ``tolerance - error`` (negative when it failed), ``noise`` is ``None`` (no seeds; the
    float tolerance is part of ``criterion``) and ``n_seeds`` is 0.
    """
    if not (math.isfinite(error) and math.isfinite(tolerance)) or tolerance < 0:
        raise ValueError(f"error and tolerance must be finite, tolerance >= 0; got {error!r}, {tolerance!r}")
    found = dict(details or {}, error=float(error), tolerance=float(tolerance))
    return _computed(claim, source, criterion, measured, tolerance - error, error <= tolerance, found)


def at_least(
    claim: str,
    source: str,
    criterion: str,
    measured: str,
    value: float,
    floor: float,
    details: dict[str, Any] | None = None,
) -> ClaimRecord:
    """A claim decided by a computation: ``held`` when ``value >= floor`` (margin ``value - floor``), no seeds."""
    if not (math.isfinite(value) and math.isfinite(floor)):
        raise ValueError(f"value and floor must be finite; got {value!r}, {floor!r}")
    found = dict(details or {}, value=float(value), floor=float(floor))
    return _computed(claim, source, criterion, measured, value - floor, value >= floor, found)


def _computed(
    claim: str, source: str, criterion: str, measured: str, margin: float, held: bool, details: dict[str, Any]
) -> ClaimRecord:
    """A record decided by a computation: no seeds, no noise."""
    verdict = HELD if held else DID_NOT_HOLD
    return ClaimRecord(claim, source, criterion, measured, float(margin), None, 0, verdict, details)


def check_records(records: Sequence[dict[str, Any] | ClaimRecord]) -> list[str]:
    """Problems with a list of records (empty = all obey the rule): what the verdict test asserts."""
    problems = []
    for raw in records:
        try:
            record = raw if isinstance(raw, ClaimRecord) else ClaimRecord.from_dict(raw)
        except (ValueError, TypeError) as err:
            problems.append(str(err))
            continue
        if record.verdict != INCONCLUSIVE and record.noise is not None and abs(record.margin) <= record.noise:
            problems.append(f"{record.claim!r}: margin {record.margin} within noise {record.noise}")
        if record.verdict != INCONCLUSIVE and 0 < record.n_seeds < MIN_SEEDS:
            problems.append(f"{record.claim!r}: {record.n_seeds} seeds decided a comparison")
        if record.verdict != INCONCLUSIVE and not_testable(record):
            problems.append(f"{record.claim!r}: decided on an unmet premise")
        problems += design_problems(record)
    return problems


def design_problems(record: ClaimRecord) -> list[str]:
    """What breaks the plan in one record (empty = nothing): a seeded claim without a recorded design, or a
    Welch test of arms that share their seeds (a paired design tested unpaired)."""
    if record.n_seeds == 0:
        return []
    if record.design is None:
        return [f"{record.claim!r}: a seeded claim without a recorded design (test, scale, threshold, family)"]
    seeds = record.details.get("seeds")
    if (
        record.design.test == Test.WELCH
        and isinstance(seeds, list)
        and len(seeds) == 2
        and sorted(seeds[0]) == sorted(seeds[1])
    ):
        return [f"{record.claim!r}: arms sharing the seeds {seeds[0]} tested with Welch's test (the design is paired)"]
    return []


def missing_premises(records: Sequence[dict[str, Any] | ClaimRecord]) -> list[str]:
    """The claims decided on trained models (``n_seeds > 0``) that carry no premise (empty = every one has one)."""
    out = []
    for raw in records:
        record = raw if isinstance(raw, ClaimRecord) else ClaimRecord.from_dict(raw)
        if record.n_seeds > 0 and record.premise is None:
            out.append(record.claim)
    return out


def tally(records: Sequence[dict[str, Any] | ClaimRecord]) -> dict[str, int]:
    """``{"held": n, "did not hold": n, "inconclusive": n}`` for the page's header."""
    counts = dict.fromkeys(VERDICTS, 0)
    for raw in records:
        counts[raw.verdict if isinstance(raw, ClaimRecord) else raw["verdict"]] += 1
    return counts


# ------------------------------------------------------------------------------------------- reading results
def get(results: dict, path: str) -> Any:
    """``results["a"]["b"][0]`` for ``path="a.b.0"`` (``KeyError`` naming the missing key)."""
    value: Any = results
    for part in path.split("."):
        if isinstance(value, list) and part.lstrip("-").isdigit():
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(path)
    return value


def num(value: Any, digits: int = 4) -> str:
    """A number as the report prints it: thousands separators for ints, 4 significant digits, e-notation for
    tiny/huge."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) < 1e-3 or abs(value) >= 1e6:
            return f"{value:.{max(1, digits - 3)}e}"
        text = f"{value:.{digits}g}"
        if "e" in text:  # 4 significant digits of a number in [1e4, 1e6): print it whole
            return f"{value:,.0f}"
        return text
    return str(value)
