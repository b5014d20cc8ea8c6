"""The seeded tests: each turns per-seed values into a :class:`~poslab.lab.records.ClaimRecord` with its design.

Which one a claim uses follows the experiment's design (:mod:`poslab.lab.plan`): :func:`paired` (the same models
read differently, or trained from the same seed), :func:`compare` (independent arms, Welch), :func:`bound` (one arm
against a bound), :func:`equivalent` (TOST) and :func:`best_of` (a ranking, every pair decided).

Each record's margin is the effect in the claim's direction minus the threshold it states, its noise the half-width
of the test's interval (95% two-sided; 90% for TOST, its decision interval), ``details["p_value"]`` the test's
p-value (scipy.stats), ``details["sd"]`` one seed's noise (for the plan's power). A test takes each arm as an
:class:`Arm` (label, per-seed values, their seeds) and what the values are as a :class:`Metric` (name, direction,
digits, and ``log``: test the natural log of the values and of the bound, ln-perplexity for perplexity ratios).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
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


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a claim: its ``label`` in the text, its ``values`` (one per seed) and, where known, the
    ``seeds`` they come from (recorded; a paired test requires both arms' seeds to be the same). Values and
    seeds are kept as tuples of floats and ints."""

    label: str
    values: Sequence[float]
    seeds: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label:
            raise ValueError(f"arm label {self.label!r}: must be a non-empty string")
        values = _numbers(self.label, "values", self.values, float)
        if not values:
            raise ValueError(f"arm {self.label!r}: needs at least one value (one per seed), got none")
        object.__setattr__(self, "values", values)
        if self.seeds is None:
            return
        seeds = _numbers(self.label, "seeds", self.seeds, int)
        if len(seeds) != len(values):
            raise ValueError(
                f"arm {self.label!r}: {len(values)} values and {len(seeds)} seeds {list(seeds)}: one seed per value"
            )
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"arm {self.label!r}: seeds {list(seeds)} repeat a seed: one value per seed")
        object.__setattr__(self, "seeds", seeds)


def _numbers(label: str, what: str, given: Any, kind: type) -> tuple[Any, ...]:
    """``given`` as a tuple of ``kind`` (float or int); anything else: an error naming the arm and the item."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ValueError(f"arm {label!r}: {what} must be a sequence of numbers, one per seed, got {given!r}")
    out = []
    for item in given:
        try:
            out.append(kind(item))
        except (TypeError, ValueError):
            raise ValueError(f"arm {label!r}: {what} hold {item!r}, not a number (one per seed)") from None
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Metric:
    """What an arm's values are: ``name`` in the text (``"val loss"``, ``"ppl at 4x L"``), whether lower is
    better, ``log`` (test the natural log of the values: ln-perplexity) and the ``digits`` shown."""

    name: str
    _: dataclasses.KW_ONLY
    lower_is_better: bool = True
    log: bool = False
    digits: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"metric name {self.name!r}: must be a non-empty string")
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or self.digits < 0:
            raise ValueError(f"metric {self.name!r}: digits {self.digits!r} must be an integer >= 0")


#: the lab's trained-model comparisons: the loss over the whole validation split
VAL_LOSS = Metric("val loss (whole validation split)")


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


def _gap(better: Arm, worse: Arm, metric: Metric, offset: float) -> str:
    word = "lower" if metric.lower_is_better else "higher"
    digits = metric.digits
    if offset == 0:
        gap = f"{word} than {worse.label}"
    elif offset > 0:
        gap = f"{word} than {worse.label} by more than {offset:.{digits}g}"
    else:
        gap = f"at most {-offset:.{digits}g} {'higher' if metric.lower_is_better else 'lower'} than {worse.label}"
    return f"{metric.name} of {better.label} {gap}"


def _arms(better: Arm, worse: Arm) -> dict[str, Any]:
    """A two-arm record's arms as its details hold them."""
    return {
        "better": list(better.values),
        "worse": list(worse.values),
        "better_label": better.label,
        "worse_label": worse.label,
    }


def _scale_text(log: bool) -> str:
    return " (on ln of the values)" if log else ""


def _same_seeds(test: str, a: Arm, b: Arm) -> list[int] | None:
    """The seeds of two arms paired seed by seed (``None`` for neither arm's); arms with other seeds: an error."""
    if a.seeds != b.seeds:
        raise ValueError(
            f"{test} pairs seed by seed: {a.label!r} has seeds {a.seeds and list(a.seeds)} and {b.label!r} "
            f"{b.seeds and list(b.seeds)}; they must be the same seeds in the same order"
        )
    return None if a.seeds is None else list(a.seeds)


def compare(
    claim: str,
    source: str,
    better: Arm,
    worse: Arm,
    metric: Metric,
    *,
    offset: float = 0.0,
    criterion: str | None = None,
    noise_sd: float | None = None,
) -> ClaimRecord:
    """Independently trained arms: the claim is that ``better`` beats ``worse`` on ``metric`` (by more than
    ``offset``), decided by Welch's t-test.

    ``offset`` is on the tested scale (negative: "at most ``-offset`` worse", a non-inferiority claim); the margin
    is the advantage minus it. ``criterion`` defaults to words made from the labels and the rule; ``noise_sd`` is a
    seed-to-seed sd measured by a repeat of the same setting (used when an arm has one seed). ``ValueError`` for arms
    that share their seeds (paired by design: use :func:`paired`) or one arm with seeds and the other without.
    """
    if (better.seeds is None) != (worse.seeds is None):
        raise ValueError(
            f"{claim!r}: {better.label!r} has seeds {better.seeds and list(better.seeds)} and {worse.label!r} "
            f"{worse.seeds and list(worse.seeds)}: give both arms' seeds or neither"
        )
    if better.seeds is not None and worse.seeds is not None:
        if sorted(better.seeds) == sorted(worse.seeds) and len(better.seeds) > 1:
            raise ValueError(
                f"{claim!r}: {better.label} and {worse.label} share the seeds {list(better.seeds)}: the design "
                f"pairs them by seed, so a paired test decides it (poslab.lab.comparisons.paired), not Welch's"
            )
    lower_is_better, digits, log = metric.lower_is_better, metric.digits, metric.log
    b, w = _scaled(better.values, log, better.label), _scaled(worse.values, log, worse.label)
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
        criterion = _gap(better, worse, metric, offset)
    criterion += (
        f"{_scale_text(log)}; decided when the margin exceeds the 95% interval of the difference of the means "
        f"(Welch, at least {MIN_SEEDS} seeds each)"
    )
    sd = math.sqrt(((sb or 0.0) ** 2 + (sw or 0.0) ** 2) / 2) if sb is not None and sw is not None else noise_sd
    details: dict[str, Any] = {
        **_arms(better, worse),
        "metric": metric.name,
        "lower_is_better": lower_is_better,
        "offset": float(offset),
        "p_value": welch_p(b, w, (-offset if lower_is_better else offset)),
        "sd": None if sd is None else float(sd),
    }
    if better.seeds is not None and worse.seeds is not None:
        details["seeds"] = [list(better.seeds), list(worse.seeds)]
    return ClaimRecord(
        claim,
        source,
        criterion,
        f"{better.label} {pm(better.values, digits)} vs {worse.label} {pm(worse.values, digits)}",
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
    arm: Arm,
    limit: float,
    metric: Metric,
    *,
    below: bool,
    criterion: str | None = None,
    details: dict[str, Any] | None = None,
) -> ClaimRecord:
    """A seeded one-sample claim: the mean over seeds of ``arm``'s values lies below (or above) ``limit``.

    The margin is ``limit - mean`` (``below``) or ``mean - limit``; the noise is the 95% half-width of
    the mean, ``t_{0.975, n-1} * sd / sqrt(n)``. Per-seed ratios of two readings of the same model
    (``ppl(4L) / ppl(L)``, best with a ``log`` metric: the ln-ratio against ``ln(limit)``) are tested this way.

    ``limit`` is on the values' own scale (a ``log`` metric takes its ln too); ``below`` states the claim's
    direction (the metric's plays no part); ``details`` are recorded after the arm's seeds.
    """
    digits, log = metric.digits, metric.log
    raw = list(arm.values)
    scaled = _scaled(raw, log, arm.label)
    tested_limit = math.log(limit) if log else float(limit)
    mean, sd = mean_sd(scaled)
    n = len(scaled)
    margin = (tested_limit - mean) if below else (mean - tested_limit)
    noise = None if sd is None else one_sample(scaled).halfwidth()
    if criterion is None:
        criterion = f"{metric.name} of {arm.label} {'below' if below else 'above'} {limit:.{digits}g}"
    criterion += (
        f"{_scale_text(log)}; decided when the margin exceeds the 95% interval of the mean "
        f"(one-sample t, at least {MIN_SEEDS} seeds)"
    )
    p_value = one_sample_p(scaled, tested_limit)
    info = dict(
        {} if arm.seeds is None else {"seeds": list(arm.seeds)},
        **(details or {}),
        values=raw,
        label=arm.label,
        metric=metric.name,
        limit=float(limit),
        below=below,
        p_value=p_value,
        sd=sd,
    )
    return ClaimRecord(
        claim,
        source,
        criterion,
        f"{metric.name} of {arm.label} {pm(raw, digits)} (limit {limit:.{digits}g})",
        float(margin),
        None if noise is None else float(noise),
        n,
        decide(margin, noise, n),
        info,
        design=Design(Test.ONE_SAMPLE, log=log, threshold=float(tested_limit)),
    )


def _paired_diffs(better: Arm, worse: Arm, lower_is_better: bool, log: bool) -> list[float]:
    if len(better.values) != len(worse.values):
        raise ValueError(
            f"paired measurements need one value per seed in each arm, got {len(better.values)} and {len(worse.values)}"
        )
    b, w = _scaled(better.values, log, better.label), _scaled(worse.values, log, worse.label)
    return [(wi - bi) if lower_is_better else (bi - wi) for bi, wi in zip(b, w)]


def paired(
    claim: str,
    source: str,
    better: Arm,
    worse: Arm,
    metric: Metric,
    *,
    offset: float = 0.0,
    criterion: str | None = None,
) -> ClaimRecord:
    """A paired comparison: ``better``'s i-th value and ``worse``'s share a seed.

    Two readings of the same seed's model, or two models trained with the same seed (the same
    batches in the same order). The per-seed differences (in the claim's direction, minus ``offset`` as
    in :func:`compare`) are tested against 0 (paired t-test), so the variation common to both arms
    of a seed cancels. The arms' seeds (recorded) must be the same, or neither arm's given.
    """
    seeds = _same_seeds("a paired test", better, worse)
    lower_is_better, digits, log = metric.lower_is_better, metric.digits, metric.log
    diffs = [d - offset for d in _paired_diffs(better, worse, lower_is_better, log)]
    if criterion is None:
        criterion = _gap(better, worse, metric, offset)
    difference = f"{worse.label} - {better.label}" if lower_is_better else f"{better.label} - {worse.label}"
    record = bound(
        claim,
        source,
        Arm(difference, diffs),
        0.0,
        Metric(metric.name, digits=digits),
        below=False,
        criterion=f"{criterion}{_scale_text(log)} (paired by seed: the per-seed differences, paired t)",
        details={**_arms(better, worse), "lower_is_better": lower_is_better},
    )
    shown = [d + offset for d in diffs]
    measured = (
        f"{better.label} {pm(better.values, digits)} vs {worse.label} {pm(worse.values, digits)}; "
        f"paired difference{' of ln' if log else ''} {pm(shown, digits)}"
    )
    record.details.update(offset=float(offset), paired=True)
    if seeds is not None:
        record.details["seeds"] = seeds
    design = Design(Test.PAIRED, log=log, threshold=float(offset))
    return dataclasses.replace(record, measured=measured, design=design)


def equivalent(claim: str, source: str, arm: Arm, reference: Arm, metric: Metric, *, within: float) -> ClaimRecord:
    """ "``arm`` is within ``±within`` of ``reference``" (paired by seed), decided by TOST on the per-seed differences
    (of the logs with a ``log`` metric: ``within = ln(1.1)`` is "within 10%"): ``held`` when the 90% interval of
    their mean lies inside ``±within``, ``did not hold`` when wholly outside, else ``inconclusive``. The margin is
    ``within - |mean|``, the noise the 90% half-width.
    """
    seeds = _same_seeds("an equivalence test", arm, reference)
    digits, log = metric.digits, metric.log
    diffs = _paired_diffs(arm, reference, False, log)
    if len(diffs) < 2:
        raise ValueError(f"{claim!r}: an equivalence test needs at least 2 seeds, got {len(diffs)}")
    inside, p_equivalent, p_outside = tost(diffs, within)
    noise = inside.halfwidth(0.90)
    margin = inside.value
    verdict = decide(margin, noise, len(diffs))
    details: dict[str, Any] = {
        **_arms(arm, reference),
        "metric": metric.name,
        "within": float(within),
        "paired": True,
        "p_equivalent": p_equivalent,
        "p_outside": p_outside,
        # the p-value of the decision the data point to: equivalence when the mean lies inside the margin
        "p_value": p_equivalent if margin > 0 else p_outside,
        "sd": mean_sd(diffs)[1],
    }
    if seeds is not None:
        details["seeds"] = seeds
    criterion = (
        f"{metric.name} of {arm.label} within ±{within:.{digits}g} of {reference.label}{_scale_text(log)}, paired "
        f"by seed; decided by two one-sided tests (the 90% interval of the mean difference inside "
        f"±{within:.{digits}g}: held; wholly outside: did not hold; at least {MIN_SEEDS} seeds)"
    )
    measured = (
        f"{arm.label} {pm(arm.values, digits)} vs {reference.label} {pm(reference.values, digits)}; "
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
    arms: Mapping[str, Sequence[float]],
    predicted: Sequence[str],
    metric: Metric,
    *,
    paired_seeds: bool = False,
) -> ClaimRecord:
    """A ranking claim: the best arm is one of ``predicted`` (e.g. the head counts nearest a rule).

    Decided pairwise with :func:`compare` (or :func:`paired` when ``paired_seeds``: every arm's i-th
    value comes from seed i): ``held`` when the best predicted arm beats every other arm
    (each by more than its 95% interval); ``did not hold`` when some other arm beats every predicted arm
    so; otherwise ``inconclusive``. The record's margin and noise are those of the deciding (weakest)
    pair: for ``held`` the predicted arm's closest rival, for ``did not hold`` the closest predicted arm,
    for ``inconclusive`` the best predicted arm against the best other arm. The values are ranked as
    given: a ``log`` metric is refused (pass the logs).
    """
    if metric.log:
        raise ValueError(f"{claim!r}: a ranking tests the values as given; metric {metric.name!r} has log=True")
    lower_is_better, digits = metric.lower_is_better, metric.digits
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
        "metric": metric.name,
        "lower_is_better": lower_is_better,
        "pairwise": pairwise.value,
    }

    def pair(b: str, w: str) -> ClaimRecord:
        test = paired if paired_seeds else compare
        return test(claim, source, Arm(b, arms[b]), Arm(w, arms[w]), metric)

    how = "paired by seed" if paired_seeds else "Welch"
    criterion = (
        f"{metric.name}: the best arm is one of {list(predicted)}; decided pairwise (each pair's margin against "
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
