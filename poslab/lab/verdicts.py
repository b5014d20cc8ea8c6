"""One claim record and one rule for verdicts, used by every experiment and by the report.

A verdict is one of :data:`VERDICTS`: ``held``, ``did not hold`` or ``inconclusive``.

The rule (one rule, everywhere; docs/lab.md explains it for learners):

* **Seeded comparisons** (training runs): each arm is run with ``n >= 3`` seeds. The *margin* is the
  difference of the two means in the direction the claim predicts (positive = as claimed). The
  *noise* is the half-width of the 95% confidence interval of that difference (Welch's t interval:
  ``t_{0.975, df} * sqrt(s_a^2/n_a + s_b^2/n_b)``). The claim ``held`` when ``margin > noise``, ``did
  not hold`` when ``margin < -noise`` and is ``inconclusive`` otherwise (ties included). With fewer
  than 2 seeds in an arm there is no measured noise: the comparison is ``inconclusive`` unless a seed
  repeat of the same setting measured it (``noise_sd``, the seed-to-seed standard deviation of one run),
  and a comparison with fewer than 3 seeds per arm is never conclusive.
* **Deterministic claims** (parameter counts, the RoPE table, permutation equivariance) have no seed
  noise: they hold when the measured value is within a stated float tolerance (``noise`` is that
  tolerance, ``n_seeds`` is 0).

Every record has the same fields: ``claim``, ``source``, ``criterion`` (in words), ``measured``,
``margin``, ``noise`` (``None`` where not applicable), ``n_seeds``, ``verdict``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

HELD = "held"
DID_NOT_HOLD = "did not hold"
INCONCLUSIVE = "inconclusive"
VERDICTS = (HELD, DID_NOT_HOLD, INCONCLUSIVE)

#: fewest seeds per arm for a seeded comparison to be conclusive
MIN_SEEDS = 3

# two-sided 95% quantiles of Student's t, t_{0.975, df} for df = 1..30 (standard tables)
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: float) -> float:
    """``t_{0.975}`` for (possibly fractional, Welch) degrees of freedom ``df >= 1``; 1.96 as ``df -> inf``."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df!r}")
    if df >= 30:
        return 1.960 + (_T975[-1] - 1.960) * 30 / df  # within 0.002 of the exact quantile past 30
    lo = int(math.floor(df))
    frac = df - lo
    hi = min(lo + 1, 30)
    return _T975[lo - 1] * (1 - frac) + _T975[hi - 1] * frac


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1, got a={a!r}, b={b!r}, x={x!r}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value ``P(|T| >= |t|)`` of Student's t with ``df > 0`` (possibly fractional) degrees of freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class Premise:
    """What the models must be able to do before a claim about them can be tested.

    Fixed before any run (its text and threshold live in the experiment's code, never tuned to the
    result) and measured on the same runs as the claim.

    Attributes:
        text: the requirement in words (``"accuracy at L >= 0.9 in both arms"``).
        measured: what the runs reached, as a short text (``"rope 0.97, nope 0.42"``).
        met: whether every arm met it.
    """

    text: str
    measured: str
    met: bool

    def __post_init__(self) -> None:
        if not isinstance(self.met, bool):
            raise ValueError(f"premise 'met' must be a bool, got {self.met!r}")


#: the start of the reason an unmet premise gives in a record's ``details["reason"]``
PREMISE_NOT_MET = "premise not met"


@dataclass(frozen=True)
class ClaimRecord:
    """One tested claim, as results.json and the report hold it.

    Attributes:
        claim: the claim in words (with its lesson's wording where it has one).
        source: where it is made (``"seed 000 §1.3"``, ``"Press et al. 2022"``).
        criterion: how it is decided, in words (``"mean val loss of none > learned by more than the 95% interval"``).
        measured: the figures, as a short text (``"none 2.31 ± 0.02 vs learned 2.05 ± 0.01 (n=3)"``).
        margin: how far the measurement went in the claim's direction (positive = as claimed); for
            deterministic claims the tolerance left over (``tolerance - error``); ``None`` if unmeasurable.
        noise: the 95% half-width (seeded) or the float tolerance (deterministic); ``None`` if none applies.
        n_seeds: seeds per arm (the smaller arm); 0 for deterministic claims.
        verdict: one of :data:`VERDICTS`.
        details: any further numbers (per-seed values, means, spreads), for plots and the page.
        premise: what the models had to be able to do for the claim to be testable (every claim
            decided on trained models has one); unmet means the verdict is ``inconclusive``.
    """

    claim: str
    source: str
    criterion: str
    measured: str
    margin: float | None
    noise: float | None
    n_seeds: int
    verdict: str
    details: dict[str, Any] = field(default_factory=dict)
    premise: Premise | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {list(VERDICTS)}, got {self.verdict!r}")
        if isinstance(self.premise, dict):
            object.__setattr__(self, "premise", Premise(**self.premise))
        if self.premise is not None and not self.premise.met and self.verdict != INCONCLUSIVE:
            raise ValueError(
                f"a {self.verdict!r} verdict on an unmet premise ({self.premise.text!r}): "
                f"the claim is not testable at this scale ({self.claim!r})"
            )
        if self.verdict != INCONCLUSIVE:
            if self.margin is None:
                raise ValueError(f"a {self.verdict!r} verdict needs a margin ({self.claim!r})")
            if self.noise is not None and abs(self.margin) <= self.noise:
                raise ValueError(
                    f"margin {self.margin!r} is within the noise {self.noise!r}: "
                    f"the verdict must be inconclusive ({self.claim!r})"
                )
            if 0 < self.n_seeds < MIN_SEEDS:
                raise ValueError(f"{self.n_seeds} seed(s) cannot decide a seeded comparison ({self.claim!r})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClaimRecord:
        """A record from its dict form; a missing field or an unknown verdict is a ``ValueError``."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data and n not in ("details", "premise")]
        if missing:
            raise ValueError(f"claim record misses {missing}: {data!r}"[:300])
        return cls(**{n: data[n] for n in names if n in data})


def not_testable(record: ClaimRecord) -> bool:
    """Whether the record's premise was measured and not met ("not testable at this scale")."""
    return record.premise is not None and not record.premise.met


def with_premise(record: ClaimRecord, premise: Premise) -> ClaimRecord:
    """``record`` with its premise; an unmet premise turns the verdict into ``inconclusive``.

    The reason is kept in ``details["reason"]`` (``"premise not met: ..."``) and the verdict the
    comparison alone would have given in ``details["verdict_without_premise"]``.
    """
    if premise.met:
        return dataclasses.replace(record, premise=premise)
    details = dict(
        record.details,
        reason=f"{PREMISE_NOT_MET}: {premise.text} (measured: {premise.measured})",
        verdict_without_premise=record.verdict,
    )
    return dataclasses.replace(record, premise=premise, verdict=INCONCLUSIVE, details=details)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``None`` for one value)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def pm(values: Sequence[float], digits: int = 3) -> str:
    """``"2.314 ± 0.021 (n=3)"``: mean ± sample standard deviation over seeds."""
    mean, sd = mean_sd(values)
    return pm_text(mean, sd, len(values), digits)


def pm_text(mean: float, sd: float | None, n: int | None, digits: int = 3) -> str:
    """The one form of mean ± sd: ``"2.314 ± 0.021 (n=3)"``, no ``± sd`` without one (a single value), no
    ``(n=)`` for ``n=None``."""
    spread = f" ± {sd:.{digits}f}" if sd is not None else ""
    return f"{mean:.{digits}f}{spread}" + (f" (n={n})" if n is not None else "")


def welch_p(a: Sequence[float], b: Sequence[float], shift: float = 0.0) -> float | None:
    """Two-sided p-value of Welch's t-test of ``mean(a) - mean(b) = shift`` (``None`` with fewer than 2 values in an
    arm).

    The same statistic as :func:`interval_halfwidth`: ``p < 0.05`` exactly when the 95% interval of
    the difference excludes ``shift`` (up to the t-table's interpolation in :func:`t975`).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    se2, df = _welch(a, b)
    diff = statistics.fmean(a) - statistics.fmean(b) - shift
    if se2 == 0:
        return 0.0 if diff != 0 else 1.0
    return t_two_sided_p(diff / math.sqrt(se2), df)


def _welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's squared standard error of ``mean(a) - mean(b)`` and its degrees of freedom (at least 1); 2+ values
    each."""
    na, nb = len(a), len(b)
    va, vb = statistics.variance(a), statistics.variance(b)
    se2 = va / na + vb / nb
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)) if va and vb else min(na, nb) - 1
    return se2, max(df, 1.0)


def one_sample_p(values: Sequence[float], limit: float) -> float | None:
    """Two-sided p-value of the one-sample t-test of ``mean(values) = limit`` (``None`` for one value)."""
    n = len(values)
    if n < 2:
        return None
    sd = statistics.stdev(values)
    diff = statistics.fmean(values) - limit
    if sd == 0:
        return 0.0 if diff != 0 else 1.0
    return t_two_sided_p(diff / (sd / math.sqrt(n)), n - 1)


def interval_halfwidth(a: Sequence[float], b: Sequence[float], noise_sd: float | None = None) -> float | None:
    """95% half-width of ``mean(a) - mean(b)`` (Welch), or from a measured seed sd when an arm has one value."""
    na, nb = len(a), len(b)
    if na >= 2 and nb >= 2:
        se2, df = _welch(a, b)
        return 0.0 if se2 == 0 else t975(df) * math.sqrt(se2)
    if noise_sd is not None:
        return 1.96 * noise_sd * math.sqrt(1 / na + 1 / nb)
    return None


def decide(margin: float, noise: float | None, n_seeds: int) -> str:
    """The one rule: ``held`` when ``margin > noise``, ``did not hold`` when ``margin < -noise``, else
    ``inconclusive`` (also with no measured noise, fewer than :data:`MIN_SEEDS` seeds, or a tie)."""
    if noise is None or n_seeds < MIN_SEEDS or margin == 0:
        return INCONCLUSIVE
    if margin > noise:
        return HELD
    if margin < -noise:
        return DID_NOT_HOLD
    return INCONCLUSIVE


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
) -> ClaimRecord:
    """A seeded comparison: the claim is that ``better`` beats ``worse`` on ``metric`` (by more than ``offset``).

    Args:
        claim, source: the claim and where it is made.
        better: the per-seed values of the arm the claim says wins; worse: the other arm's.
        better_label, worse_label: names of the arms for the text.
        metric: what the values are (``"val loss"``, ``"accuracy at 2L"``).
        lower_is_better: the metric's direction.
        noise_sd: a seed-to-seed sd measured by a repeat of the same setting (used when an arm has one seed).
        offset: the claim is that the advantage exceeds ``offset`` (metric units; negative: "at most
            ``-offset`` worse", a non-inferiority claim). The margin is the advantage minus ``offset``.
        criterion: the criterion in words (default: generated from the labels and the rule).

    Returns:
        The record with the verdict of the module docstring's rule.
    """
    mb, _ = mean_sd(better)
    mw, _ = mean_sd(worse)
    margin = ((mw - mb) if lower_is_better else (mb - mw)) - offset
    noise = interval_halfwidth(list(better), list(worse), noise_sd)
    n_seeds = min(len(better), len(worse))
    word = "lower" if lower_is_better else "higher"
    if criterion is None:
        if offset == 0:
            gap = f"{word} than {worse_label}"
        elif offset > 0:
            gap = f"{word} than {worse_label} by more than {offset:.{digits}g}"
        else:
            gap = f"at most {-offset:.{digits}g} {'higher' if lower_is_better else 'lower'} than {worse_label}"
        criterion = f"{metric} of {better_label} {gap}"
    criterion += (
        f"; decided when the margin exceeds the 95% interval of the difference of the means "
        f"(Welch, at least {MIN_SEEDS} seeds each)"
    )
    verdict = decide(margin, noise, n_seeds)
    measured = f"{better_label} {pm(better, digits)} vs {worse_label} {pm(worse, digits)}"
    details = {
        "better": [float(v) for v in better],
        "worse": [float(v) for v in worse],
        "better_label": better_label,
        "worse_label": worse_label,
        "metric": metric,
        "lower_is_better": lower_is_better,
        "offset": float(offset),
        "p_value": welch_p(list(better), list(worse), (-offset if lower_is_better else offset)),
    }
    return ClaimRecord(
        claim,
        source,
        criterion,
        measured,
        float(margin),
        None if noise is None else float(noise),
        n_seeds,
        verdict,
        details,
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
) -> ClaimRecord:
    """A seeded one-sample claim: the mean over seeds of ``values`` lies below (or above) ``limit``.

    The margin is ``limit - mean`` (``below``) or ``mean - limit``; the noise is the 95% half-width of
    the mean, ``t_{0.975, n-1} * sd / sqrt(n)``. Per-seed ratios or differences of two measurements of
    the same model (``ppl(4L) / ppl(L)``; :func:`paired`) are tested this way.

    Args:
        values: one value per seed.
        limit: the bound the claim states.
        below: the claim is ``mean < limit`` (else ``mean > limit``).
        label, metric: what the values are, for the text (``"ALiBi"``, ``"ppl(4L) / ppl(L)"``).
    """
    values = [float(v) for v in values]
    mean, sd = mean_sd(values)
    n = len(values)
    margin = (limit - mean) if below else (mean - limit)
    noise = None if sd is None else t975(n - 1) * sd / math.sqrt(n)
    if criterion is None:
        criterion = f"{metric} of {label} {'below' if below else 'above'} {limit:.{digits}g}"
    criterion += f"; decided when the margin exceeds the 95% interval of the mean (at least {MIN_SEEDS} seeds)"
    verdict = decide(margin, noise, n)
    measured = f"{metric} of {label} {pm(values, digits)} (limit {limit:.{digits}g})"
    info = dict(
        details or {},
        values=values,
        label=label,
        metric=metric,
        limit=float(limit),
        below=below,
        p_value=one_sample_p(values, limit),
    )
    return ClaimRecord(
        claim, source, criterion, measured, float(margin), None if noise is None else float(noise), n, verdict, info
    )


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
) -> ClaimRecord:
    """A paired comparison: ``better[i]`` and ``worse[i]`` share seed ``i``.

    Two measurements of the same seed's model, or two models trained with the same seed (the same
    batches in the same order). The per-seed differences (in the claim's direction, minus ``offset`` as
    in :func:`compare`) are tested against 0 with :func:`bound`, so the variation common to both arms
    of a seed cancels.
    """
    if len(better) != len(worse):
        raise ValueError(f"paired measurements need one value per seed in each arm, got {len(better)} and {len(worse)}")
    diffs = [((w - b) if lower_is_better else (b - w)) - offset for b, w in zip(better, worse)]
    word = "lower" if lower_is_better else "higher"
    if criterion is None:
        if offset == 0:
            gap = f"{word} than {worse_label}"
        elif offset > 0:
            gap = f"{word} than {worse_label} by more than {offset:.{digits}g}"
        else:
            gap = f"at most {-offset:.{digits}g} {'higher' if lower_is_better else 'lower'} than {worse_label}"
        criterion = f"{metric} of {better_label} {gap}"
    record = bound(
        claim,
        source,
        diffs,
        0.0,
        below=False,
        label=f"{worse_label} - {better_label}" if lower_is_better else f"{better_label} - {worse_label}",
        metric=metric,
        digits=digits,
        criterion=f"{criterion} (paired by seed: the per-seed differences)",
        details={
            "better": [float(v) for v in better],
            "worse": [float(v) for v in worse],
            "better_label": better_label,
            "worse_label": worse_label,
            "lower_is_better": lower_is_better,
        },
    )
    measured = (
        f"{better_label} {pm(better, digits)} vs {worse_label} {pm(worse, digits)}; "
        f"paired difference {pm([d + offset for d in diffs], digits)}"
    )
    record.details.update(offset=float(offset), paired=True)
    return dataclasses.replace(record, measured=measured)


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
    details = {
        "arms": {a: [float(x) for x in v] for a, v in arms.items()},
        "predicted": list(predicted),
        "metric": metric,
        "lower_is_better": lower_is_better,
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
    if not others:
        return ClaimRecord(
            claim, source, criterion, table, None, None, min(len(v) for v in arms.values()), INCONCLUSIVE, details
        )
    top = min(predicted, key=means.get)
    rival = min(others, key=means.get)
    wins = [pair(top, o) for o in others]
    if all(r.verdict == HELD for r in wins):
        decide = min(wins, key=lambda r: r.margin - r.noise)
        verdict = HELD
        tests = wins
    else:
        beaten = [o for o in others if all(pair(p, o).verdict == DID_NOT_HOLD for p in predicted)]
        if beaten:
            losses = [pair(p, beaten[0]) for p in predicted]
            decide = max(losses, key=lambda r: r.margin + r.noise)  # the closest predicted arm
            verdict = DID_NOT_HOLD
            tests = losses
        else:
            decide = pair(top, rival)
            verdict = INCONCLUSIVE
            tests = [decide]
    # every pair must be decided for the ranking to be: its p-value is the largest of the pairs' (intersection-union)
    ps = [r.details.get("p_value") for r in tests]
    details.update(
        deciding_pair=[decide.details["better_label"], decide.details["worse_label"]],
        p_value=None if any(p is None for p in ps) else max(ps),
    )
    measured = f"{table}; deciding pair {decide.details['better_label']} vs {decide.details['worse_label']}"
    return ClaimRecord(
        claim, source, criterion, measured, decide.margin, decide.noise, decide.n_seeds, verdict, details
    )


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
    verdict = HELD if error <= tolerance else DID_NOT_HOLD
    return ClaimRecord(
        claim,
        source,
        criterion,
        measured,
        float(tolerance - error),
        None,
        0,
        verdict,
        dict(details or {}, error=float(error), tolerance=float(tolerance)),
    )


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
    verdict = HELD if value >= floor else DID_NOT_HOLD
    return ClaimRecord(
        claim,
        source,
        criterion,
        measured,
        float(value - floor),
        None,
        0,
        verdict,
        dict(details or {}, value=float(value), floor=float(floor)),
    )


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
    return problems


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


#: the family-wise error rate the lab's multiple-comparison correction keeps (:func:`holm`)
FAMILY_ALPHA = 0.05


def holm(records: Sequence[dict[str, Any] | ClaimRecord], alpha: float = FAMILY_ALPHA) -> list[ClaimRecord]:
    """Holm–Bonferroni over the seeded claims: ``records`` with the decisions that survive the correction.

    Each seeded comparison is decided at 95% on its own; over ``m`` of them, about ``0.05 m`` false
    decisions are expected when no claim is true. The family is every seeded record (``n_seeds > 0``)
    with a p-value (``details["p_value"]``, two-sided, from the comparison's t-test) whose premise was
    not found unmet (a claim that cannot be tested is not a test). Sorted by p-value, the ``i``-th
    (from 0) is kept decided only while every p-value up to it is at most ``alpha / (m - i)``; from the
    first that is not, every later one is ``inconclusive``. That keeps the chance of even one false
    decision in the family at most ``alpha``, whatever the dependence between the claims.

    A record the correction turns inconclusive keeps its own verdict in
    ``details["unadjusted_verdict"]`` and says why in ``details["reason"]``; every record of the family
    gets ``details["holm"]`` (``m``, its rank, its threshold). Deterministic records, unmet premises
    and seeded records without a p-value pass through unchanged, in their places.

    Raises:
        ValueError: ``alpha`` is not in (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    out = [r if isinstance(r, ClaimRecord) else ClaimRecord.from_dict(r) for r in records]
    family = [
        i for i, r in enumerate(out) if r.n_seeds > 0 and r.details.get("p_value") is not None and not not_testable(r)
    ]
    m = len(family)
    order = sorted(family, key=lambda i: out[i].details["p_value"])
    rejecting = True
    for rank, i in enumerate(order):
        record = out[i]
        p = float(record.details["p_value"])
        threshold = alpha / (m - rank)
        rejecting = rejecting and p <= threshold
        details = dict(
            record.details,
            holm={"m": m, "rank": rank + 1, "threshold": threshold, "alpha": alpha, "survives": rejecting},
        )
        if record.verdict != INCONCLUSIVE and not rejecting:
            details.update(
                unadjusted_verdict=record.verdict,
                reason=f"not significant after Holm–Bonferroni over {m} seeded claims: p = {p:.3g} > "
                f"{alpha:g}/{m - rank} = {threshold:.3g} (or a smaller p-value before it failed)",
            )
            out[i] = dataclasses.replace(record, verdict=INCONCLUSIVE, details=details)
        else:
            out[i] = dataclasses.replace(record, details=details)
    return out


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
