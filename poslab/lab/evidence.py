"""What a correction's verdict rests on: a measurement, a source, or nothing any more (withdrawn).

A correction record (``poslab experiment corrections``) carries, in its ``details``:

* ``evidence_kind``: one of :data:`EVIDENCE_KINDS`:

  - ``measured``: a computation decided it; the record has a margin (the measurement against its
    tolerance) and says how it was measured (``details["evidence"]``);
  - ``source``: a citation, a date or the lesson's own text decided it (what a paper reports, which
    lab wrote it, two passages of the lesson side by side); the record names the reference
    (``details["reference"]``) and the page shows it with its own badge, apart from measurements;
  - ``withdrawn``: the test cannot settle the statement (or judged something the lesson does not
    say); the verdict is ``inconclusive`` and ``details["reason"]`` says why.

* ``lesson_claim``: ``False`` on a poslab note, a record that judges no claim of the lessons
  (:func:`lesson_claim`); the page keeps it out of the lessons' tally.
* ``sentence``: the lesson's sentence the record judges, verbatim. Two records that judge the same
  sentence must give it the same verdict (one rule per claim across the page).

:func:`evidence_problems` is the one place these rules are checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

MEASURED = "measured"
SOURCE = "source"
WITHDRAWN = "withdrawn"
EVIDENCE_KINDS = (MEASURED, SOURCE, WITHDRAWN)
#: the keys of a record's ``details`` that carry its evidence kind, the sentence it judges and its reference
KIND_KEY = "evidence_kind"
SENTENCE_KEY = "sentence"
REFERENCE_KEY = "reference"


#: the ``details`` key that marks a record as poslab's own note, not a claim of the lessons (``False``): the page
#: shows it with the "poslab note" badge and leaves it out of every count of the lessons' claims
LESSON_CLAIM_KEY = "lesson_claim"


def lesson_claim(details: Any) -> bool:
    """Whether a record (by its ``details``) judges a claim of the lessons: every record not marked
    ``details["lesson_claim"] = False`` (a poslab note, such as a check of poslab's own beyond the lessons)."""
    return not (isinstance(details, Mapping) and details.get(LESSON_CLAIM_KEY) is False)


def evidence_kind(details: Any) -> str | None:
    """The evidence kind a record's ``details`` declares (``None`` for a record that declares none)."""
    if isinstance(details, Mapping):
        value = details.get(KIND_KEY)
        return value if isinstance(value, str) else None
    return None


def evidence_problems(record: Mapping[str, Any]) -> list[str]:
    """What breaks the evidence rules in one record (a claim-record dict); ``[]`` when it keeps them."""
    details = record.get("details") or {}
    name = str(record.get("claim", "?"))[:80]
    kind = details.get(KIND_KEY)
    problems = []
    if kind not in EVIDENCE_KINDS:
        return [f"{name!r}: evidence kind must be one of {list(EVIDENCE_KINDS)}, got {kind!r}"]
    if not isinstance(details.get(SENTENCE_KEY), str) or not details[SENTENCE_KEY].strip():
        problems.append(f"{name!r}: no lesson sentence ({SENTENCE_KEY!r}) to judge")
    margin = record.get("margin")
    if kind == MEASURED:
        measured = isinstance(margin, (int, float)) and math.isfinite(margin) and str(record.get("measured", ""))
        if not measured or not details.get("evidence"):
            problems.append(f"{name!r}: kind 'measured' without a measurement (a finite margin and its evidence)")
    elif kind == SOURCE:
        if not isinstance(details.get(REFERENCE_KEY), str) or not details[REFERENCE_KEY].strip():
            problems.append(f"{name!r}: kind 'source' without a reference ({REFERENCE_KEY!r})")
    elif record.get("verdict") != "inconclusive" or not details.get("reason"):
        problems.append(f"{name!r}: kind 'withdrawn' needs an inconclusive verdict and a reason")
    return problems


def conflicting_sentences(records: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """The lesson sentences that two or more records judge with different verdicts: sentence -> verdicts."""
    verdicts: dict[str, set[str]] = {}
    for record in records:
        details = record.get("details") or {}
        sentence = details.get(SENTENCE_KEY) if isinstance(details, Mapping) else None
        if isinstance(sentence, str) and sentence:
            verdicts.setdefault(sentence, set()).add(str(record.get("verdict")))
    return {s: v for s, v in verdicts.items() if len(v) > 1}
