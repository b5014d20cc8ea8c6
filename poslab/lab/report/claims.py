"""The claim records the report shows: every experiment's own ``"claims"`` (:func:`evaluate`), an entry that is
not a valid record, or breaks the verdict rule, shown as unusable (:func:`normalize`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from poslab.checks import is_int, is_number
from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    MIN_SEEDS,
    ClaimRecord,
    design_problems,
)


@dataclass
class Verdict:
    """A claim record as the report shows it, with the results folder it came from."""

    experiment: str
    record: ClaimRecord


#: the ``details`` key of a record the report cannot use: why, in one line (the page's "unusable" badge)
UNUSABLE = "unusable"


def _number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def unusable_reason(record: ClaimRecord) -> str | None:
    """Why a record read from a file cannot be shown as it says (``None``: it can): a field of the wrong type, a
    number that is not finite, or a verdict the rule does not give for its margin, noise, seeds and design.
    ``inconclusive`` fits any margin: a premise or the multiple-comparison correction may leave a clear margin
    undecided.
    """
    texts = {"claim": record.claim, "source": record.source, "criterion": record.criterion, "measured": record.measured}
    for name, value in texts.items():
        if not isinstance(value, str):
            return f"{name} is a {type(value).__name__}, not a text"
    if not isinstance(record.details, dict):
        return f"details is a {type(record.details).__name__}, not a mapping"
    margin, noise, n = record.margin, record.noise, record.n_seeds
    if margin is not None and not _number(margin):
        return f"margin {margin!r} is not a finite number"
    if noise is not None and not (_number(noise) and noise >= 0):
        return f"noise {noise!r} is not a finite number >= 0"
    if not is_int(n) or n < 0:
        return f"n_seeds {n!r} is not a non-negative integer"
    p_value = record.details.get("p_value")
    if p_value is not None and not (_number(p_value) and 0 <= p_value <= 1):
        return f"p_value {p_value!r} is not a number in [0, 1]"
    if n > 0 and record.design is None:
        return design_problems(record)[0] + " (results written before the plan: rerun the experiment)"
    if record.verdict == INCONCLUSIVE:
        return None
    if margin is None:
        return f"a {record.verdict!r} verdict without a margin"
    if noise is None and n > 0:
        return f"a {record.verdict!r} verdict of {n} seeds without a measured noise"
    if 0 < n < MIN_SEEDS:
        return f"a {record.verdict!r} verdict of {n} seed(s): a seeded claim needs at least {MIN_SEEDS}"
    plan = design_problems(record)
    if plan:
        return plan[0]
    if record.verdict == HELD and not (margin > noise if noise is not None else margin >= 0):
        rule = f"margin > noise {noise!r}" if noise is not None else "margin >= 0"
        return f"verdict 'held' with margin {margin!r}: the rule needs {rule}"
    if record.verdict == DID_NOT_HOLD and not (margin < -noise if noise is not None else margin < 0):
        rule = f"margin < -noise {noise!r}" if noise is not None else "margin < 0"
        return f"verdict 'did not hold' with margin {margin!r}: the rule needs {rule}"
    return None


def _unusable(claim: Any, source: Any, measured: str, reason: str) -> ClaimRecord:
    """The record the page shows for one it cannot use: no verdict of its own, the reason in ``details``."""
    return ClaimRecord(
        str(claim)[:500], str(source)[:200], "", measured[:300], None, None, 0, INCONCLUSIVE, {UNUSABLE: reason[:300]}
    )


def normalize(entry: Any, experiment: str) -> Verdict:
    """An experiment's own claim entry (a :class:`ClaimRecord` dict) as a :class:`Verdict`.

    An entry that is not a valid record, or whose figures break the rule (:func:`unusable_reason`),
    is shown as an unusable record saying why.
    """
    if isinstance(entry, ClaimRecord):
        record = entry
    else:
        try:
            record = ClaimRecord.from_dict(entry)
        except (ValueError, TypeError, AttributeError) as err:
            claim = entry.get("claim", "(unnamed claim)") if isinstance(entry, dict) else "(unnamed claim)"
            source = entry.get("source", "") if isinstance(entry, dict) else ""
            reason = f"not a claim record: {err}"
            return Verdict(experiment, _unusable(claim, source, f"unusable claim entry: {err}", reason))
    reason = unusable_reason(record)
    if reason is not None:
        measured = record.measured if isinstance(record.measured, str) else ""
        record = _unusable(record.claim, record.source, measured, reason)
    return Verdict(experiment, record)


def evaluate(results: dict[str, dict]) -> list[Verdict]:
    """Each experiment's own ``"claims"`` records as the experiment wrote them: the plan (families, Holm, power)
    was applied once before results.json was written (:func:`poslab.lab.experiments.settle`), so the page shows
    the verdicts of the file.

    Args:
        results: results folder (``"experiments/params"``, ...) -> its results.json.
    """
    verdicts = []
    for experiment, data in results.items():
        entries = data.get("claims", []) if isinstance(data, dict) else []
        if not isinstance(entries, list):
            why = f"unusable claims entry: a {type(entries).__name__}, not a list"
            verdicts.append(Verdict(experiment, _unusable(f"(claims of {experiment})", "", why, why)))
            continue
        for entry in entries:
            verdicts.append(normalize(entry, experiment))
    return verdicts
