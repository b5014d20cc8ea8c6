"""The claim records the report shows: every experiment's own, and the head analysis's.

Every claim on the page is one :class:`poslab.lab.verdicts.ClaimRecord` (claim, source, criterion,
measured, margin, noise, n_seeds, verdict, premise). Experiments decide their claims themselves and
return the records under the key ``"claims"`` of their results. The lab's head analysis
(``poslab heads``, a step of the lab, not an experiment) writes only numbers; a :class:`Claim` here
names its results folder and a ``check`` function that reads them and returns the record (via
:func:`~poslab.lab.verdicts.at_least` / :func:`~poslab.lab.verdicts.deterministic`, with the
tolerance in the criterion). :func:`evaluate` gathers both. Nothing here holds a measured figure:
every number shown comes from the results passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    MIN_SEEDS,
    ClaimRecord,
    Premise,
    at_least,
    design_problems,
    deterministic,
    get,
    num,
    with_premise,
)


@dataclass(frozen=True)
class Claim:
    """A claim about the lab's trained Tang model and how to check it from the head analysis's results.

    Attributes:
        experiment: the results folder holding the evidence (``heads``).
        source: where the claim is made (``"seed 000 §1.3"``).
        text: the claim, quoted (Chinese) with an English gloss.
        check: ``(results, text, source) -> ClaimRecord``.
    """

    experiment: str
    source: str
    text: str
    check: Callable[[dict, str, str], ClaimRecord]


@dataclass
class Verdict:
    """A claim record as the report shows it, with the results folder it came from."""

    experiment: str
    record: ClaimRecord

    @property
    def verdict(self) -> str:
        return self.record.verdict


# ------------------------------------------------------------------------------------------- checks


def _one_model(text: str) -> str:
    return f"{text} (measured on the lab's one trained Tang model: a property of that model, not a seeded comparison)"


def _heads_previous_token(r: dict, text: str, source: str) -> ClaimRecord:
    counts = get(r, "counts")
    total = len(get(r, "heads"))
    best = max(get(r, "heads"), key=lambda h: h["previous_token"])
    threshold = get(r, "thresholds.previous_token") if "previous_token" in get(r, "thresholds") else None
    measured = (
        f"{counts['previous-token']} previous-token, {counts['induction']} induction, "
        f"{counts['positional']} positional "
        f"of {total} heads; strongest previous-token head L{best['layer']}H{best['head']} "
        f"({num(best['previous_token'], 3)} of its attention on the previous token)"
    )
    if threshold is None:
        return at_least(
            text,
            source,
            _one_model("at least one head classified previous-token"),
            measured,
            value=float(counts["previous-token"]),
            floor=1.0,
        )
    return at_least(
        text,
        source,
        _one_model(f"the strongest head's previous-token score ≥ {num(threshold)}"),
        measured,
        value=float(best["previous_token"]),
        floor=float(threshold),
    )


def _heads_punctuation(r: dict, text: str, source: str) -> ClaimRecord:
    heads = get(r, "heads")
    best = max(heads, key=lambda h: h["punctuation"])
    share = get(r, "punctuation_share_of_keys")
    threshold = get(r, "thresholds.punctuation")
    measured = (
        f"{get(r, 'counts.punctuation')} of {len(heads)} heads put ≥ {num(threshold)} of their "
        f"attention on punctuation; strongest L{best['layer']}H{best['head']} ({num(best['punctuation'], 3)}); "
        f"punctuation is {share:.0%} of the text"
    )
    if not get(r, "punctuation_ids"):
        return ClaimRecord(text, source, "needs punctuation in the vocabulary", measured, None, None, 0, INCONCLUSIVE)
    return at_least(
        text,
        source,
        _one_model(f"the strongest head's share of attention on punctuation ≥ {num(threshold)}"),
        measured,
        value=float(best["punctuation"]),
        floor=float(threshold),
    )


def _heads_spare(r: dict, text: str, source: str) -> ClaimRecord:
    base, pruned = get(r, "base_loss"), get(r, "pruned_30")
    relative = pruned["loss_increase"] / base
    measured = (
        f"masking the {pruned['heads_masked']} least important heads (30%) moves the loss "
        f"{num(base)} → {num(pruned['loss'])} ({relative:+.1%}); 60%: {num(get(r, 'pruned_60.loss'))}"
    )
    return deterministic(
        text,
        source,
        _one_model(f"relative loss increase after pruning 30% of heads ≤ {SPARE_HEADS_MAX_INCREASE:.0%}"),
        measured,
        error=float(max(relative, 0.0)),
        tolerance=SPARE_HEADS_MAX_INCREASE,
    )


SPARE_HEADS_MAX_INCREASE = 0.02  # "spare" heads: pruning 30% of heads costs < 2% of the loss


def analysed_model_premise(r: dict) -> Premise:
    """The premise of a claim read off the analysed model: a language model of its text whose loss is at least
    :data:`poslab.lab.premises.BIGRAM_MARGIN` below the text's *trigram* count model
    (:func:`poslab.lab.experiments.common.ngram_baselines`, interpolated Kneser–Ney).

    The claims are about what a trained language model's heads learn (a previous-token head, a head on the
    full stop, heads to spare). A model above the trigram baseline predicts worse than a count of the last two
    characters, so whatever its heads attend to is not yet what the lesson's heads do; the claim is then not
    testable at this scale. The analysed model is one training (the lab's Tang GPT), not seeds: the premise
    and the claims are a property of that one model. Results that do not say which character-level text the
    loss was measured on cannot show the premise, and leave the claim not testable too.
    """
    from poslab.lab.experiments.common import ngram_baselines
    from poslab.lab.premises import BIGRAM_MARGIN, below_baseline

    text = r.get("text") if isinstance(r.get("text"), dict) else {}
    needed = f"the analysed model's loss at least {BIGRAM_MARGIN:g} nats/token below its text's trigram baseline"
    if not text.get("corpus") or text.get("tokenizer") != "char":
        return Premise(needed, "not measurable: the results do not name the character-level text of the loss", False)
    if not isinstance(r.get("base_loss"), (int, float)):
        return Premise(needed, "not measurable: the results hold no loss of the analysed model", False)
    trigram = ngram_baselines(str(text["corpus"]), float(text.get("val_fraction", 0.1)))["trigram"]
    return below_baseline({"analysed model (one training, no seeds)": [float(r["base_loss"])]}, trigram, "trigram")


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "heads",
        "seed 000 Q1",
        "有些头专门做「前一个词」的关注 — some heads specialise in the previous token",
        _heads_previous_token,
    ),
    Claim(
        "heads",
        "seed 000 Q1",
        "有些头做「句号」的关注 — some heads attend to punctuation (the full stop)",
        _heads_punctuation,
    ),
    Claim(
        "heads",
        "seed 002 §6.1",
        '头7/8充当"备用通道" — some heads are spare: pruning the least important 30% costs < 2% of the loss',
        _heads_spare,
    ),
)


#: the ``details`` key of a record the report cannot use: why, in one line (the page's "unusable" badge)
UNUSABLE = "unusable"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def unusable_reason(record: ClaimRecord) -> str | None:
    """Why a record read from a file cannot be shown as it says (``None``: it can).

    The fields must have their types (texts, a ``details`` mapping), ``margin`` and ``noise`` must be
    finite numbers or ``None`` (``noise >= 0``), ``n_seeds`` a non-negative int, a ``p_value`` in
    ``details`` a number in [0, 1], and the verdict must be the one the rule of
    :mod:`poslab.lab.verdicts` allows for the margin and noise: ``held`` needs ``margin > noise``
    (``margin >= 0`` for a deterministic claim, no noise and no seeds), ``did not hold`` needs
    ``margin < -noise`` (``margin < 0``), and a decided seeded claim at least
    :data:`~poslab.lab.verdicts.MIN_SEEDS` seeds. ``inconclusive`` fits any margin: a premise or the
    multiple-comparison correction may leave a clear margin undecided. A seeded record must carry its
    design, and a Welch design arms of different seeds (:func:`~poslab.lab.verdicts.design_problems`).
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
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
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
    """Check every claim in :data:`CLAIMS` and add each experiment's own ``"claims"`` records as the
    experiment wrote them: the plan (families, Holm, power) was applied once before results.json was
    written (:func:`poslab.lab.experiments.settle`), so the page shows the verdicts of the file.

    Args:
        results: results folder (``"experiments/params"``, ``"heads"``, ...) -> its results.json.
    """
    verdicts = []
    for claim in CLAIMS:
        data = results.get(claim.experiment)
        if data is None:
            record = ClaimRecord(claim.text, claim.source, "", "not run in this lab", None, None, 0, INCONCLUSIVE)
        else:
            try:
                record = claim.check(data, claim.text, claim.source)
            except (
                KeyError,
                IndexError,
                TypeError,
                ValueError,
                AttributeError,
                ZeroDivisionError,
            ) as err:  # the results lack what the check reads: shown as unusable, naming it
                why = (
                    f"{claim.experiment}/results.json has no field {err.args[0]!r}"
                    if isinstance(err, KeyError) and err.args
                    else f"{claim.experiment}/results.json: {type(err).__name__}: {err}"
                )
                record = _unusable(claim.text, claim.source, why, why)
        if data is not None and not record.details.get(UNUSABLE):
            record = with_premise(record, analysed_model_premise(data))
        verdicts.append(Verdict(claim.experiment, record))
    for experiment, data in results.items():
        entries = data.get("claims", []) if isinstance(data, dict) else []
        if not isinstance(entries, list):
            why = f"unusable claims entry: a {type(entries).__name__}, not a list"
            verdicts.append(Verdict(experiment, _unusable(f"(claims of {experiment})", "", why, why)))
            continue
        for entry in entries:
            verdicts.append(normalize(entry, experiment))
    return verdicts
