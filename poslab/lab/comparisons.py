"""The seeded tests: each turns per-seed values into a :class:`~poslab.lab.records.ClaimRecord` with its design.

Which one a claim uses follows the experiment's design (:mod:`poslab.lab.plan`):

* :func:`paired`: the arms are the same trained models read differently, or trained from the same
  seed by design; the per-seed differences are tested (paired t-test).
* :func:`compare`: independently trained arms (Welch's t-test); it refuses arms that share their seeds.
* :func:`bound`: one arm's per-seed values against a stated bound (one-sample t-test).
* :func:`equivalent`: "within x" / "close to", paired differences inside ``±x`` (TOST).
* :func:`best_of`: a ranking, every pair decided.

Each record's margin is the effect in the claim's direction minus the threshold it states, its noise
the half-width of the test's interval (95% two-sided; 90% for TOST, its decision interval), its
``details["p_value"]`` the test's p-value (scipy.stats), ``details["sd"]`` the noise of one seed (for
the plan's power) and ``design`` the test. ``log=True`` tests the natural log of the values (and of
the bound): ln-perplexity for perplexity ratios.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

from scipy import stats

from poslab.lab.plan import Design, Test, one_sample, one_sample_p, tost, welch, welch_p
from poslab.lab.records import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    MIN_SEEDS,
    ClaimRecord,
    decide,
    mean_sd,
    pm,
)

S = TypeVar("S", bound=Hashable)


def on_common_seeds(by_arm: Mapping[str, Mapping[S, float]]) -> tuple[list[S], list[list[float]]]:
    """The seeds every arm trained (in the first arm's order) and each arm's values on them, in the arms' order.

    ``by_arm``: arm -> seed -> value. Seed ``s`` of every arm trains on the same batches (:mod:`poslab.lab.plan`),
    so the arms' values on their common seeds are paired, seed by seed; no common seed: an empty list.
    """
    arms = list(by_arm.values())
    seeds = [s for s in arms[0] if all(s in other for other in arms[1:])] if arms else []
    return seeds, [[values[s] for s in seeds] for values in arms]


def _scaled(values: Sequence[float], log: bool, what: str) -> list[float]:
    """``values`` as floats, or their natural logs (every value must then be > 0)."""
    out = [float(v) for v in values]
    if log:
        bad = [v for v in out if not v > 0]
        if bad:
            raise ValueError(f"{what}: ln needs positive values, got {bad[0]!r}")
        return [math.log(v) for v in out]
    return out


def _gap(metric: str, better_label: str, worse_label: str, lower_is_better: bool, offset: float, digits: int) -> str:
    word = "lower" if lower_is_better else "higher"
    if offset == 0:
        gap = f"{word} than {worse_label}"
    elif offset > 0:
        gap = f"{word} than {worse_label} by more than {offset:.{digits}g}"
    else:
        gap = f"at most {-offset:.{digits}g} {'higher' if lower_is_better else 'lower'} than {worse_label}"
    return f"{metric} of {better_label} {gap}"


def _arms(better: Sequence[float], worse: Sequence[float], better_label: str, worse_label: str) -> dict[str, Any]:
    """A two-arm record's arms as its details hold them."""
    return {
        "better": [float(v) for v in better],
        "worse": [float(v) for v in worse],
        "better_label": better_label,
        "worse_label": worse_label,
    }


def _scale_text(log: bool) -> str:
    return " (on ln of the values)" if log else ""


def compare(
    claim: str,
    source: str,
    better: Sequence[float],
    worse: Sequence[float],
    *,
    better_label: str,
    worse_label: str,
    metric: str,
    lower_is_better: bool = True,
    noise_sd: float | None = None,
    digits: int = 3,
    offset: float = 0.0,
    criterion: str | None = None,
    seeds: tuple[Sequence[int], Sequence[int]] | None = None,
    log: bool = False,
) -> ClaimRecord:
    """Independently trained arms: the claim is that ``better`` beats ``worse`` on ``metric`` (by more than
    ``offset``), decided by Welch's t-test.

    Args:
        claim, source: the claim and where it is made.
        better: the per-seed values of the arm the claim says wins; worse: the other arm's.
        better_label, worse_label: names of the arms for the text.
        metric: what the values are (``"val loss"``, ``"accuracy at 2L"``).
        lower_is_better: the metric's direction.
        noise_sd: a seed-to-seed sd measured by a repeat of the same setting (used when an arm has one seed).
        offset: the claim is that the advantage exceeds ``offset`` (on the tested scale; negative: "at
            most ``-offset`` worse", a non-inferiority claim). The margin is the advantage minus ``offset``.
        criterion: the criterion in words (default: generated from the labels and the rule).
        seeds: the seeds of each arm's runs, recorded; arms that share their seeds are paired by design.
        log: test the natural log of the values.

    Raises:
        ValueError: the arms share their seeds (use :func:`paired`).
    """
    if seeds is not None and sorted(seeds[0]) == sorted(seeds[1]) and len(seeds[0]) > 1:
        raise ValueError(
            f"{claim!r}: {better_label} and {worse_label} share the seeds {list(seeds[0])}: the design pairs "
            f"them by seed, so a paired test decides it (poslab.lab.comparisons.paired), not Welch's"
        )
    b, w = _scaled(better, log, better_label), _scaled(worse, log, worse_label)
    mb, sb = mean_sd(b)
    mw, sw = mean_sd(w)
    margin = ((mw - mb) if lower_is_better else (mb - mw)) - offset
    n_seeds = min(len(b), len(w))
    if len(b) >= 2 and len(w) >= 2:
        noise: float | None = welch(b, w).halfwidth()
    elif noise_sd is not None:
        noise = float(stats.norm.ppf(0.975)) * noise_sd * math.sqrt(1 / len(b) + 1 / len(w))
    else:
        noise = None
    if criterion is None:
        criterion = _gap(metric, better_label, worse_label, lower_is_better, offset, digits)
    criterion += (
        f"{_scale_text(log)}; decided when the margin exceeds the 95% interval of the difference of the means "
        f"(Welch, at least {MIN_SEEDS} seeds each)"
    )
    sd = math.sqrt(((sb or 0.0) ** 2 + (sw or 0.0) ** 2) / 2) if sb is not None and sw is not None else noise_sd
    details: dict[str, Any] = {
        **_arms(better, worse, better_label, worse_label),
        "metric": metric,
        "lower_is_better": lower_is_better,
        "offset": float(offset),
        "p_value": welch_p(b, w, (-offset if lower_is_better else offset)),
        "sd": None if sd is None else float(sd),
    }
    if seeds is not None:
        details["seeds"] = [[int(s) for s in seeds[0]], [int(s) for s in seeds[1]]]
    return ClaimRecord(
        claim,
        source,
        criterion,
        f"{better_label} {pm(better, digits)} vs {worse_label} {pm(worse, digits)}",
        float(margin),
        None if noise is None else float(noise),
        n_seeds,
        decide(margin, noise, n_seeds),
        details,
        design=Design(Test.WELCH, log=log, threshold=float(offset)),
    )


def bound(
    claim: str,
    source: str,
    values: Sequence[float],
    limit: float,
    *,
    below: bool,
    label: str,
    metric: str,
    digits: int = 3,
    criterion: str | None = None,
    details: dict[str, Any] | None = None,
    log: bool = False,
) -> ClaimRecord:
    """A seeded one-sample claim: the mean over seeds of ``values`` lies below (or above) ``limit``.

    The margin is ``limit - mean`` (``below``) or ``mean - limit``; the noise is the 95% half-width of
    the mean, ``t_{0.975, n-1} * sd / sqrt(n)``. Per-seed ratios of two readings of the same model
    (``ppl(4L) / ppl(L)``, best with ``log=True``: the ln-ratio against ``ln(limit)``) are tested this way.

    Args:
        values: one value per seed.
        limit: the bound the claim states (on the values' own scale; ``log`` takes its ln too).
        below: the claim is ``mean < limit`` (else ``mean > limit``).
        label, metric: what the values are, for the text (``"ALiBi"``, ``"ppl(4L) / ppl(L)"``).
        log: test the natural log of the values against ``ln(limit)``.
    """
    raw = [float(v) for v in values]
    scaled = _scaled(raw, log, label)
    tested_limit = math.log(limit) if log else float(limit)
    mean, sd = mean_sd(scaled)
    n = len(scaled)
    margin = (tested_limit - mean) if below else (mean - tested_limit)
    noise = None if sd is None else one_sample(scaled).halfwidth()
    if criterion is None:
        criterion = f"{metric} of {label} {'below' if below else 'above'} {limit:.{digits}g}"
    criterion += (
        f"{_scale_text(log)}; decided when the margin exceeds the 95% interval of the mean "
        f"(one-sample t, at least {MIN_SEEDS} seeds)"
    )
    p_value = one_sample_p(scaled, tested_limit)
    info = dict(
        details or {},
        values=raw,
        label=label,
        metric=metric,
        limit=float(limit),
        below=below,
        p_value=p_value,
        sd=sd,
    )
    return ClaimRecord(
        claim,
        source,
        criterion,
        f"{metric} of {label} {pm(raw, digits)} (limit {limit:.{digits}g})",
        float(margin),
        None if noise is None else float(noise),
        n,
        decide(margin, noise, n),
        info,
        design=Design(Test.ONE_SAMPLE, log=log, threshold=float(tested_limit)),
    )


def _paired_diffs(
    better: Sequence[float], worse: Sequence[float], lower_is_better: bool, log: bool, labels: tuple[str, str]
) -> list[float]:
    if len(better) != len(worse):
        raise ValueError(f"paired measurements need one value per seed in each arm, got {len(better)} and {len(worse)}")
    b, w = _scaled(better, log, labels[0]), _scaled(worse, log, labels[1])
    return [(wi - bi) if lower_is_better else (bi - wi) for bi, wi in zip(b, w)]


def paired(
    claim: str,
    source: str,
    better: Sequence[float],
    worse: Sequence[float],
    *,
    better_label: str,
    worse_label: str,
    metric: str,
    lower_is_better: bool = True,
    digits: int = 3,
    offset: float = 0.0,
    criterion: str | None = None,
    seeds: Sequence[int] | None = None,
    log: bool = False,
) -> ClaimRecord:
    """A paired comparison: ``better[i]`` and ``worse[i]`` share seed ``i``.

    Two readings of the same seed's model, or two models trained with the same seed (the same
    batches in the same order). The per-seed differences (in the claim's direction, minus ``offset`` as
    in :func:`compare`) are tested against 0 (paired t-test), so the variation common to both arms
    of a seed cancels. ``seeds`` (recorded) names the seed of each pair.
    """
    diffs = [d - offset for d in _paired_diffs(better, worse, lower_is_better, log, (better_label, worse_label))]
    if criterion is None:
        criterion = _gap(metric, better_label, worse_label, lower_is_better, offset, digits)
    record = bound(
        claim,
        source,
        diffs,
        0.0,
        below=False,
        label=f"{worse_label} - {better_label}" if lower_is_better else f"{better_label} - {worse_label}",
        metric=metric,
        digits=digits,
        criterion=f"{criterion}{_scale_text(log)} (paired by seed: the per-seed differences, paired t)",
        details={**_arms(better, worse, better_label, worse_label), "lower_is_better": lower_is_better},
    )
    shown = [d + offset for d in diffs]
    measured = (
        f"{better_label} {pm(better, digits)} vs {worse_label} {pm(worse, digits)}; "
        f"paired difference{' of ln' if log else ''} {pm(shown, digits)}"
    )
    record.details.update(offset=float(offset), paired=True)
    if seeds is not None:
        record.details["seeds"] = [int(s) for s in seeds]
    design = Design(Test.PAIRED, log=log, threshold=float(offset))
    return dataclasses.replace(record, measured=measured, design=design)


def equivalent(
    claim: str,
    source: str,
    arm: Sequence[float],
    reference: Sequence[float],
    *,
    labels: tuple[str, str],
    metric: str,
    within: float,
    digits: int = 3,
    seeds: Sequence[int] | None = None,
    log: bool = False,
) -> ClaimRecord:
    """ "``arm`` is within ``±within`` of ``reference``" (paired by seed), decided by TOST.

    The per-seed differences ``arm[i] - reference[i]`` (of the logs with ``log``: ``within = ln(1.1)``
    is "within 10%") must lie within ``±within``: ``held`` when the 90% interval of their mean lies
    inside (both one-sided tests reject at 5%), ``did not hold`` when it lies wholly outside (the mean
    is significantly beyond the margin), else ``inconclusive``. The margin is ``within - |mean|``, the
    noise the 90% half-width.
    """
    diffs = _paired_diffs(arm, reference, False, log, labels)
    if len(diffs) < 2:
        raise ValueError(f"{claim!r}: an equivalence test needs at least 2 seeds, got {len(diffs)}")
    inside, p_equivalent, p_outside = tost(diffs, within)
    noise = inside.halfwidth(0.90)
    margin = inside.value
    verdict = decide(margin, noise, len(diffs))
    details: dict[str, Any] = {
        **_arms(arm, reference, *labels),
        "metric": metric,
        "within": float(within),
        "paired": True,
        "p_equivalent": p_equivalent,
        "p_outside": p_outside,
        # the p-value of the decision the data point to: equivalence when the mean lies inside the margin
        "p_value": p_equivalent if margin > 0 else p_outside,
        "sd": mean_sd(diffs)[1],
    }
    if seeds is not None:
        details["seeds"] = [int(s) for s in seeds]
    criterion = (
        f"{metric} of {labels[0]} within ±{within:.{digits}g} of {labels[1]}{_scale_text(log)}, paired by seed; "
        f"decided by two one-sided tests (the 90% interval of the mean difference inside ±{within:.{digits}g}: "
        f"held; wholly outside: did not hold; at least {MIN_SEEDS} seeds)"
    )
    measured = (
        f"{labels[0]} {pm(arm, digits)} vs {labels[1]} {pm(reference, digits)}; "
        f"paired difference{' of ln' if log else ''} {pm(diffs, digits)}"
    )
    return ClaimRecord(
        claim,
        source,
        criterion,
        measured,
        float(margin),
        float(noise),
        len(diffs),
        verdict,
        details,
        design=Design(Test.EQUIVALENCE, log=log, threshold=float(within)),
    )


def best_of(
    claim: str,
    source: str,
    arms: dict[str, Sequence[float]],
    predicted: Sequence[str],
    *,
    metric: str,
    lower_is_better: bool = True,
    digits: int = 3,
    paired_seeds: bool = False,
) -> ClaimRecord:
    """A ranking claim: the best arm is one of ``predicted`` (e.g. the head counts nearest a rule).

    Decided pairwise with :func:`compare` (or :func:`paired` when ``paired_seeds``: every arm's i-th
    value comes from seed i): ``held`` when the best predicted arm beats every other arm
    (each by more than its 95% interval); ``did not hold`` when some other arm beats every predicted arm
    so; otherwise ``inconclusive``. The record's margin and noise are those of the deciding (weakest)
    pair: for ``held`` the predicted arm's closest rival, for ``did not hold`` the closest predicted arm,
    for ``inconclusive`` the best predicted arm against the best other arm.
    """
    unknown = [p for p in predicted if p not in arms]
    if unknown or not predicted:
        raise ValueError(f"predicted arms {list(predicted)} must be among the arms {list(arms)}")
    others = [a for a in arms if a not in predicted]
    sign = 1.0 if lower_is_better else -1.0
    means = {a: sign * mean_sd(v)[0] for a, v in arms.items()}
    table = ", ".join(f"{a}: {pm(v, digits)}" for a, v in arms.items())
    pairwise = Test.PAIRED if paired_seeds else Test.WELCH
    details: dict[str, Any] = {
        "arms": {a: [float(x) for x in v] for a, v in arms.items()},
        "predicted": list(predicted),
        "metric": metric,
        "lower_is_better": lower_is_better,
        "pairwise": pairwise.value,
    }

    def pair(b: str, w: str) -> ClaimRecord:
        test = paired if paired_seeds else compare
        return test(
            claim,
            source,
            arms[b],
            arms[w],
            better_label=b,
            worse_label=w,
            metric=metric,
            lower_is_better=lower_is_better,
            digits=digits,
        )

    how = "paired by seed" if paired_seeds else "Welch"
    criterion = (
        f"{metric}: the best arm is one of {list(predicted)}; decided pairwise (each pair's margin against "
        f"its 95% interval, {how}, at least {MIN_SEEDS} seeds each)"
    )
    design = Design(Test.RANKING)
    if not others:
        n = min(len(v) for v in arms.values())
        return ClaimRecord(claim, source, criterion, table, None, None, n, INCONCLUSIVE, details, design=design)
    top = min(predicted, key=means.get)
    rival = min(others, key=means.get)
    wins = [pair(top, o) for o in others]
    if all(r.verdict == HELD for r in wins):
        deciding = min(wins, key=lambda r: r.margin - r.noise)
        verdict = HELD
        tests = wins
    else:
        beaten = [o for o in others if all(pair(p, o).verdict == DID_NOT_HOLD for p in predicted)]
        if beaten:
            losses = [pair(p, beaten[0]) for p in predicted]
            deciding = max(losses, key=lambda r: r.margin + r.noise)  # the closest predicted arm
            verdict = DID_NOT_HOLD
            tests = losses
        else:
            deciding = pair(top, rival)
            verdict = INCONCLUSIVE
            tests = [deciding]
    # every pair must be decided for the ranking to be: its p-value is the largest of the pairs' (intersection-union)
    ps = [r.details.get("p_value") for r in tests]
    details.update(
        deciding_pair=[deciding.details["better_label"], deciding.details["worse_label"]],
        p_value=None if any(p is None for p in ps) else max(ps),
        sd=deciding.details.get("sd"),
    )
    measured = f"{table}; deciding pair {deciding.details['better_label']} vs {deciding.details['worse_label']}"
    return ClaimRecord(
        claim,
        source,
        criterion,
        measured,
        deciding.margin,
        deciding.noise,
        deciding.n_seeds,
        verdict,
        details,
        design=design,
    )
