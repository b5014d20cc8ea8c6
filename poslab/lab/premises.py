"""The premises of the lab's training claims: what the models must be able to do before a claim about them is tested.

Each rule turns measurements of the runs a claim is decided on into a :class:`poslab.lab.verdicts.Premise`;
:func:`poslab.lab.verdicts.with_premise` makes the claim ``inconclusive`` ("not testable at this scale") when it is
unmet. The thresholds are fixed here, before any run, never tuned to a result. Why each:

* :func:`fits_length`: a model that has not learned the task at ``L`` says nothing about how it generalises past
  ``L``; per seed, as a mean would let one such seed in (0.76 beside two at 1.0 has a mean of 0.92).
* :func:`above_chance`: a comparison of accuracies at chance compares noise.
* :func:`below_bigram`: a model at bigram level uses one character of context, so claims about how it uses
  positions or context do not apply to it (:func:`below_baseline` with the unigram for a masked LM, whose
  context is both sides; with the trigram for claims about what a model's heads learn).
* :func:`uses_context`: a bigram-level model has the same loss at every position past 0 and fails it.
* :func:`retrieves` (passkey) and :func:`beats_nope` (the positional arm beats NoPE beyond the noise).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from poslab.lab.tables import Table, values_text
from poslab.lab.verdicts import HELD, Arm, ClaimRecord, Metric, Premise, bound, compare, with_premise

#: a premise's accuracy, tested above chance
ACCURACY = Metric("accuracy", lower_is_better=False)
#: fewest mean accuracy at L of each arm of a length-generalisation claim
LENGTH_ACCURACY = 0.9
#: passkey retrieval at L must reach this share of the way from chance to perfect
PASSKEY_SHARE = 0.5
#: every seed's loss at least this far (nats/token) below the bigram (or, masked LMs, unigram) baseline
BIGRAM_MARGIN = 0.05
#: the late positions of the window at least this far (nats/token) below the early ones, every seed
CONTEXT_MARGIN = 0.1
#: the early positions of the window (0 has no context and is left out)
EARLY = (1, 2, 3, 4)


def _arms(measured: Mapping[str, Sequence[float]], digits: int = 3) -> str:
    return ", ".join(f"{arm} {statistics.fmean(v):.{digits}f}" if v else f"{arm} -" for arm, v in measured.items())


def _seed_name(seeds: Sequence[int] | None, i: int) -> str:
    return f"seed {seeds[i]}" if seeds is not None and i < len(seeds) else f"run {i + 1}"


def fits_length(
    accuracy_at_L: Mapping[str, Sequence[float]],
    threshold: float = LENGTH_ACCURACY,
    seeds: Sequence[int] | None = None,
) -> Premise:
    """Every seed of every arm (``accuracy_at_L``: arm -> per-seed accuracy) reaches ``threshold`` at the training
    length; ``seeds`` name the one that falls short."""
    short = [
        f"{arm} {_seed_name(seeds, i)}: {value:.3f}"
        for arm, values in accuracy_at_L.items()
        for i, value in enumerate(values)
        if value < threshold
    ]
    met = bool(accuracy_at_L) and all(accuracy_at_L.values()) and not short
    worst = ", ".join(f"{arm} {min(v):.3f}" if v else f"{arm} -" for arm, v in accuracy_at_L.items())
    return Premise(
        f"every seed's accuracy at L >= {threshold:g} in every arm",
        f"lowest seed at L: {worst}" + (f"; below {threshold:g}: {'; '.join(short)}" if short else ""),
        met,
    )


def above_chance(accuracy: Mapping[str, Sequence[float]], chance: float, where: str = "") -> Premise:
    """Every arm's per-seed accuracy lies above ``chance`` by more than the 95% interval of its mean (one
    :func:`poslab.lab.verdicts.bound` per arm; fewer than ``MIN_SEEDS`` seeds cannot show it); ``where``: what the
    values are (``"at 2L"``)."""
    parts, met = [], bool(accuracy)
    for arm, values in accuracy.items():
        if not values:
            parts.append(f"{arm} -")
            met = False
            continue
        record = bound("above chance", "premise", Arm(arm, values), chance, ACCURACY, below=False)
        above = record.verdict == HELD
        met = met and above
        noise = "-" if record.noise is None else f"{record.noise:.3f}"
        parts.append(
            f"{arm} {statistics.fmean(values):.3f} (margin {record.margin:.3f}, 95% ±{noise}: "
            f"{'above' if above else 'not above'})"
        )
    return Premise(
        f"every arm's accuracy{' ' + where if where else ''} above chance {chance:.3f} by more than its 95% "
        "interval (one-sample t per arm)",
        ", ".join(parts),
        met,
    )


def retrieves(
    accuracy_at_L: Mapping[str, Sequence[float | None]], chance: float, share: float = PASSKEY_SHARE
) -> Premise:
    """Every arm's mean passkey retrieval at ``L`` is at least ``chance + share * (1 - chance)``."""
    bound = chance + share * (1 - chance)
    values = {arm: [float(x) for x in v if x is not None] for arm, v in accuracy_at_L.items()}
    met = bool(values) and all(v and statistics.fmean(v) >= bound for v in values.values())
    return Premise(
        f"mean passkey retrieval at L >= {bound:.3f} (halfway from chance {chance:.3f} to 1) in every arm",
        f"retrieval at L: {_arms(values)}",
        met,
    )


def below_bigram(losses: Mapping[str, Sequence[float]], bigram: float, margin: float = BIGRAM_MARGIN) -> Premise:
    """Every seed of every arm (``losses``: arm -> per-seed validation loss) at least ``margin`` below the bigram
    baseline (nats/token)."""
    return below_baseline(losses, bigram, "bigram", margin)


def below_baseline(
    losses: Mapping[str, Sequence[float]], baseline: float, name: str, margin: float = BIGRAM_MARGIN
) -> Premise:
    """:func:`below_bigram` against another named baseline (``"unigram"`` for a masked LM)."""
    limit = baseline - margin
    met = bool(losses) and all(v and max(v) <= limit for v in losses.values())
    return Premise(
        f"every seed's loss <= {name} baseline {baseline:.3f} - {margin:g} = {limit:.3f} nats/token",
        "worst seed per arm: " + ", ".join(f"{a} {max(v):.3f}" for a, v in losses.items() if v),
        met,
    )


def context_gain(by_position: Sequence[float]) -> float:
    """Mean loss at :data:`EARLY` minus mean loss at the last quarter of the window (positive: context helps)."""
    n = len(by_position)
    if n < 2 * max(EARLY) + 2:
        raise ValueError(f"a window of {n} positions is too short for early positions {EARLY} and a last quarter")
    early = statistics.fmean(by_position[i] for i in EARLY)
    late = statistics.fmean(by_position[n - max(1, n // 4) :])
    return early - late


def uses_context(by_position: Mapping[str, Sequence[Sequence[float]]], margin: float = CONTEXT_MARGIN) -> Premise:
    """Every seed of every arm: loss at the window's last quarter at least ``margin`` below positions 1-4
    (``by_position``: arm -> per seed, :func:`poslab.analysis.eval.loss_by_position`)."""
    shortest = min((len(c) for curves in by_position.values() for c in curves), default=0)
    if shortest < 2 * max(EARLY) + 2:
        return Premise(
            f"the model uses its context within L (positions {EARLY[0]}-{EARLY[-1]} vs the last quarter)",
            f"not measurable: a window of {shortest} positions is too short",
            False,
        )
    gains = {arm: [context_gain(curve) for curve in curves] for arm, curves in by_position.items()}
    met = bool(gains) and all(g and min(g) >= margin for g in gains.values())
    return Premise(
        f"every seed: mean loss at positions {EARLY[0]}-{EARLY[-1]} minus mean loss at the last quarter of the "
        f"window >= {margin:g} nats/token (the model uses its context within L)",
        "smallest gain per arm: " + ", ".join(f"{a} {min(g):.3f}" for a, g in gains.items() if g),
        met,
    )


def beats_nope(
    arm: str, values: Sequence[float], nope: Sequence[float], *, metric: str, lower_is_better: bool = True
) -> Premise:
    """The positional arm beats NoPE on ``metric`` by more than the 95% interval of the difference."""
    record = compare(
        "premise", "premise", Arm(arm, values), Arm("none", nope), Metric(metric, lower_is_better=lower_is_better)
    )
    return Premise(f"{arm} beats NoPE on {metric} by more than the noise", record.measured, record.verdict == HELD)


def all_of(*premises: Premise) -> Premise:
    """One premise met when every one of ``premises`` is (texts and measurements joined with ``; ``)."""
    if not premises:
        raise ValueError("all_of needs at least one premise")
    return Premise(
        "; ".join(p.text for p in premises), "; ".join(p.measured for p in premises), all(p.met for p in premises)
    )


def arms_of(record: ClaimRecord, known: Iterable[str]) -> list[str]:
    """The arms among ``known`` a record compares (``details``: ``arms``, ``better_label`` / ``worse_label``
    or ``label``); every known arm when none of them is named there."""
    known = list(known)
    d = record.details
    named = list(d.get("arms", {})) or [d.get("better_label"), d.get("worse_label")] + [d.get("label")]
    arms = [a for a in known if a in named]
    return arms or known


def attach(
    records: Sequence[dict[str, Any] | ClaimRecord], premise_for: Callable[[ClaimRecord], Premise]
) -> list[dict[str, Any]]:
    """Every seeded record (``n_seeds > 0``) with its premise (:func:`poslab.lab.verdicts.with_premise`), as dicts.

    ``premise_for(record)`` computes the premise of one claim from measurements of the same runs;
    deterministic records (``n_seeds == 0``) pass through unchanged.
    """
    out = []
    for raw in records:
        record = raw if isinstance(raw, ClaimRecord) else ClaimRecord.from_dict(raw)
        if record.n_seeds > 0:
            record = with_premise(record, premise_for(record))
        out.append(record.to_dict())
    return out


def _gain(curve: Sequence[float] | None) -> float | None:
    """:func:`context_gain` of a per-position curve, ``None`` where it has none (a masked LM) or is too short for
    one."""
    try:
        return context_gain(curve) if curve else None
    except ValueError:
        return None


def language_models(results: dict[str, Any]) -> dict[str, Any]:
    """Position-training's models as the premises read them: each arm's per-seed whole-split loss and
    :func:`context_gain`, and the corpus's n-gram baselines (``KeyError`` naming a field its results.json lacks)."""
    arms = {
        arm: {
            "loss": [r.get("val_loss_all") for r in runs],
            "context_gain": [_gain(r.get("loss_by_position")) for r in runs],
        }
        for arm, runs in results["runs"].items()
    }
    return {"corpus": results.get("corpus"), "baselines": results["ngram_baselines"], "arms": arms}


def premises_table(lm: Mapping[str, Any]) -> Table | None:
    """:func:`language_models`' arms against the language-model premises: below the bigram baseline by
    :data:`BIGRAM_MARGIN`, a context gain of :data:`CONTEXT_MARGIN` (``None`` without arms or baselines)."""
    base = lm.get("baselines") or {}
    if not lm.get("arms") or "bigram" not in base:
        return None
    limit = base["bigram"] - BIGRAM_MARGIN
    rows = []
    for arm, cell in lm["arms"].items():
        loss, gain = cell["loss"], cell["context_gain"]
        below = all(v is not None and v <= limit for v in loss)
        uses = all(g is not None and g >= CONTEXT_MARGIN for g in gain)
        rows.append((arm, values_text(loss), values_text(gain), *("met" if ok else "not met" for ok in (below, uses))))
    return Table(
        "each arm against the premises of the language-model claims",
        (
            "arm",
            "loss per seed (nats/token)",
            "context gain per seed",
            f"bigram premise (≤ {limit:.3f})",
            f"context premise (≥ {CONTEXT_MARGIN:g})",
        ),
        tuple(rows),
        note=f"(count-model baselines of the {lm.get('corpus')!s} validation split: unigram {base['unigram']:.3f}, "
        f"bigram {base['bigram']:.3f}, trigram {base['trigram']:.3f}.)",
        align="lllll",
    )
