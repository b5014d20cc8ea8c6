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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from poslab.lab.verdicts import (
    INCONCLUSIVE,
    ClaimRecord,
    Premise,
    at_least,
    deterministic,
    get,
    holm,
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


def analysed_model_premise(r: dict) -> Premise | None:
    """The premise of a claim read off one analysed model: a language model of its text, its loss at
    least :data:`poslab.lab.premises.BIGRAM_MARGIN` below the text's bigram count model (a bigram-level
    model uses one character of context, so what its heads attend to says nothing about the lesson's
    heads). ``None`` when the results do not say which character-level text the loss was measured on."""
    from poslab.lab.experiments.common import ngram_baselines
    from poslab.lab.premises import below_baseline

    text = r.get("text") if isinstance(r.get("text"), dict) else {}
    if not text.get("corpus") or text.get("tokenizer") != "char" or not isinstance(r.get("base_loss"), (int, float)):
        return None
    bigram = ngram_baselines(str(text["corpus"]), float(text.get("val_fraction", 0.1)))["bigram"]
    return below_baseline({"analysed model": [float(r["base_loss"])]}, bigram, "bigram")


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


def normalize(entry: Any, experiment: str) -> Verdict:
    """An experiment's own claim entry (a :class:`ClaimRecord` dict) as a :class:`Verdict`.

    An entry that is not a valid record is shown as an inconclusive record saying why.
    """
    try:
        record = entry if isinstance(entry, ClaimRecord) else ClaimRecord.from_dict(entry)
    except (ValueError, TypeError, AttributeError) as err:
        text = entry.get("claim", "(unnamed claim)") if isinstance(entry, dict) else "(unnamed claim)"
        record = ClaimRecord(
            str(text),
            str(entry.get("source", "")) if isinstance(entry, dict) else "",
            "not a claim record",
            f"unusable claim entry: {err}"[:200],
            None,
            None,
            0,
            INCONCLUSIVE,
        )
    return Verdict(experiment, record)


def evaluate(results: dict[str, dict]) -> list[Verdict]:
    """Check every claim in :data:`CLAIMS`, add each experiment's own ``"claims"`` records, then correct
    the seeded ones for multiple comparisons (:func:`poslab.lab.verdicts.holm`, Holm–Bonferroni at a
    family-wise 5%): a seeded claim is shown ``held`` / ``did not hold`` only if it survives.

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
            ) as err:  # schema changed
                record = ClaimRecord(
                    claim.text, claim.source, "", f"results.json has no usable {err}", None, None, 0, INCONCLUSIVE
                )
        if data is not None and record.verdict != INCONCLUSIVE:
            premise = analysed_model_premise(data)
            if premise is not None:
                record = with_premise(record, premise)
        verdicts.append(Verdict(claim.experiment, record))
    for experiment, data in results.items():
        entries = data.get("claims", []) if isinstance(data, dict) else []
        if not isinstance(entries, list):
            record = ClaimRecord(
                f"(claims of {experiment})",
                "",
                "not a claim record",
                f"unusable claims entry: a {type(entries).__name__}, not a list",
                None,
                None,
                0,
                INCONCLUSIVE,
            )
            verdicts.append(Verdict(experiment, record))
            continue
        for entry in entries:
            verdicts.append(normalize(entry, experiment))
    adjusted = holm([v.record for v in verdicts])  # the lab's seeded claims as one family (docs/lab.md)
    return [Verdict(v.experiment, record) for v, record in zip(verdicts, adjusted)]
