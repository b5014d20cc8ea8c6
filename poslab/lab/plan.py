"""The lab's statistical plan: which test decides a seeded claim, in which family, with what power.

The plan is code, fixed before any run and never tuned on results (docs/lab.md, "How a verdict is
decided"; ``tests/test_plan.py`` pins it):

* **The test follows the design.** Arms that are the same trained models read differently, or trained from the
  same seed by design (the same batches in the same order), are compared **paired** (:data:`Test.PAIRED`), so what
  the arms of one seed share cancels; independently trained arms with **Welch's** t-test (:data:`Test.WELCH`); a
  bound on one arm with a one-sample t-test (:data:`Test.ONE_SAMPLE`); "within x" / "close to" with two one-sided
  tests of the paired differences (:data:`Test.EQUIVALENCE`, TOST). Perplexity ratios are tested on ln-perplexity.
* **Families by question.** Holm–Bonferroni (:func:`adjust`) runs within one experiment's claims at a family-wise
  :data:`ALPHA`; a literature fact, a premise check or a timing stays out of every family.
* **Power you can see.** Every seeded record gets the minimum effect its test detects at its measured noise (80%
  power at its Holm step) and the seeds that would detect the measured effect (:func:`power`).
* **Seeds per arm from a pilot.** The quick lab's seed counts (:data:`QUICK_SEEDS`) follow one rule
  (:func:`arm_seeds`) from a pilot lab (:data:`PILOT`).

The adjustment is made once, by the pipeline before the console, ``results.json`` and the report see the records
(:func:`poslab.lab.experiments.run_experiment`), and recorded in each record's ``details["holm"]``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scipy import optimize, stats

if TYPE_CHECKING:
    from poslab.lab.verdicts import ClaimRecord

#: the family-wise error rate each family keeps (two-sided tests; one-sided tests of an equivalence)
ALPHA = 0.05
#: the power at which :func:`power` states the minimum detectable effect and the seeds that decide
POWER = 0.8
#: the most seeds :func:`power` searches for the seeds that would decide a claim
MAX_SEEDS = 200


class Test(str, enum.Enum):
    """How a seeded claim is tested (the value is what the page prints)."""

    __test__ = False  # a statistical test, not a pytest class

    PAIRED = "paired t-test"
    WELCH = "Welch t-test"
    ONE_SAMPLE = "one-sample t-test"
    EQUIVALENCE = "paired TOST"
    RANKING = "pairwise t-tests (every pair)"


@dataclass(frozen=True)
class Design:
    """A seeded claim's design, recorded on its :class:`~poslab.lab.verdicts.ClaimRecord`.

    ``log``: tested on the natural log of the values; ``threshold``: the offset, bound or equivalence margin the
    claim states, on the tested scale; ``family``: the Holm family (empty until :func:`adjust` assigns it).
    """

    test: Test
    log: bool = False
    threshold: float = 0.0
    family: str = ""
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if isinstance(self.test, str) and not isinstance(self.test, Test):
            object.__setattr__(self, "test", Test(self.test))
        if not isinstance(self.log, bool):
            raise ValueError(f"design 'log' must be a bool, got {self.log!r}")
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold)):
            raise ValueError(f"design threshold must be a finite number, got {self.threshold!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"design alpha must be in (0, 1), got {self.alpha!r}")

    @property
    def paired(self) -> bool:
        """Whether the test uses the pairing of the arms by seed."""
        return self.test in (Test.PAIRED, Test.EQUIVALENCE)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "test": self.test.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Design:
        return cls(**data)


# ----------------------------------------------------------------------------------------- the tests
@dataclass(frozen=True)
class Estimate:
    """A difference (in the claim's direction, minus its threshold) with its standard error.

    Attributes:
        value: the estimate (positive = as claimed).
        se: its standard error (0 when every seed gave the same value).
        df: the degrees of freedom of its t distribution.
    """

    value: float
    se: float
    df: float

    def halfwidth(self, confidence: float = 0.95) -> float:
        """Half-width of the two-sided ``confidence`` interval."""
        return 0.0 if self.se == 0 else float(stats.t.ppf(0.5 + confidence / 2, self.df)) * self.se

    def p_two_sided(self) -> float:
        """Two-sided p-value of ``value = 0``."""
        if self.se == 0:
            return 0.0 if self.value != 0 else 1.0
        return float(2 * stats.t.sf(abs(self.value) / self.se, self.df))

    def p_greater(self) -> float:
        """One-sided p-value of ``value <= 0`` against ``value > 0``."""
        if self.se == 0:
            return 0.0 if self.value > 0 else 1.0
        return float(stats.t.sf(self.value / self.se, self.df))


def one_sample(values: Sequence[float]) -> Estimate:
    """The mean of ``values`` (two or more) with its standard error, ``n - 1`` degrees of freedom."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a t-test needs at least 2 values, got {n}")
    return Estimate(math.fsum(values) / n, statistics.stdev(values) / math.sqrt(n), n - 1)


def welch(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """``mean(a) - mean(b)`` with Welch's standard error and Welch–Satterthwaite degrees of freedom."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs at least 2 values per arm, got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = va + vb
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va and vb else min(len(a), len(b)) - 1
    return Estimate(math.fsum(a) / len(a) - math.fsum(b) / len(b), math.sqrt(se2), max(float(df), 1.0))


def welch_p(a: Sequence[float], b: Sequence[float], shift: float = 0.0) -> float | None:
    """Two-sided p-value of Welch's test of ``mean(a) - mean(b) = shift`` (the statistic of :func:`welch`, the t
    distribution of scipy.stats; equal to ``scipy.stats.ttest_ind(equal_var=False)``); ``None`` below 2 values an
    arm."""
    if len(a) < 2 or len(b) < 2:
        return None
    return welch([x - shift for x in a], b).p_two_sided()


def one_sample_p(values: Sequence[float], limit: float) -> float | None:
    """Two-sided p-value of the one-sample t-test of ``mean(values) = limit`` (:func:`one_sample`; equal to
    ``scipy.stats.ttest_1samp``); ``None`` for one value."""
    if len(values) < 2:
        return None
    return one_sample([v - limit for v in values]).p_two_sided()


def tost(diffs: Sequence[float], margin: float) -> tuple[Estimate, float, float]:
    """Two one-sided tests that the mean of ``diffs`` lies within ``(-margin, margin)``.

    Returns ``(estimate of margin - |mean|, p_equivalent, p_outside)``: ``p_equivalent`` is TOST's
    p-value (the larger of the two one-sided tests' p-values; small = within the margin);
    ``p_outside`` the one-sided p-value that the mean lies beyond the margin on its side (small =
    significantly outside). The estimate's 90% interval is TOST's decision interval.
    """
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin!r}")
    est = one_sample(diffs)
    inside = Estimate(margin - abs(est.value), est.se, est.df)
    lower = Estimate(est.value + margin, est.se, est.df).p_greater()  # mean > -margin
    upper = Estimate(margin - est.value, est.se, est.df).p_greater()  # mean < margin
    outside = Estimate(abs(est.value) - margin, est.se, est.df).p_greater()
    return inside, max(lower, upper), outside


# ----------------------------------------------------------------------------------------- power
def _power(effect: float, sd: float, n: int, test: Test, alpha: float) -> float:
    """Power of the two-sided t-test (one-sided at ``alpha`` per side for TOST) to detect ``effect``."""
    if test == Test.WELCH:
        df, nc = 2 * n - 2, effect / (sd * math.sqrt(2 / n))
    else:
        df, nc = n - 1, effect / (sd / math.sqrt(n))
    crit = float(stats.t.ppf(1 - alpha if test == Test.EQUIVALENCE else 1 - alpha / 2, df))
    upper = float(stats.nct.sf(crit, df, nc))
    if not math.isfinite(upper):  # scipy's noncentral t returns nan where the power is 1 to many digits
        upper = 1.0 if nc > crit else 0.0
    if test == Test.EQUIVALENCE:
        return upper
    lower = float(stats.nct.cdf(-crit, df, nc))
    return upper + (lower if math.isfinite(lower) else 0.0)


def detectable(sd: float, n: int, test: Test, alpha: float, power: float = POWER) -> float | None:
    """The smallest effect detected with ``power`` by ``n`` seeds an arm at noise ``sd`` (``None``: n < 2)."""
    if n < 2 or not sd > 0:
        return None if n < 2 else 0.0
    hi = sd
    while _power(hi, sd, n, test, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: _power(e, sd, n, test, alpha) - power, 0.0, hi, xtol=sd * 1e-6))


def seeds_to_decide(effect: float, sd: float, test: Test, alpha: float, power: float = POWER) -> int | None:
    """The fewest seeds an arm that detect ``effect`` with ``power`` at noise ``sd`` (``None``: more than
    :data:`MAX_SEEDS`, or no effect)."""
    if not effect > 0 or not sd > 0:
        return None if not effect > 0 else 2
    for n in range(2, MAX_SEEDS + 1):
        if _power(effect, sd, n, test, alpha) >= power:
            return n
    return None


# ----------------------------------------------------------------------------------------- families
def holm_thresholds(p_values: Sequence[float], alpha: float = ALPHA) -> list[tuple[int, float, bool]]:
    """Holm–Bonferroni step-down over one family: per p-value, ``(rank, threshold, survives)``.

    Sorted by p-value, the ``i``-th (from 0) of ``m`` is rejected while every p-value up to it is at
    most ``alpha / (m - i)``; the chance of even one false decision in the family stays at most
    ``alpha``, whatever the dependence between the claims.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out: list[tuple[int, float, bool]] = [(0, 0.0, False)] * m
    rejecting = True
    for rank, i in enumerate(order):
        threshold = alpha / (m - rank)
        rejecting = rejecting and p_values[i] <= threshold
        out[i] = (rank + 1, threshold, rejecting)
    return out


def own_family(record: ClaimRecord, family: str) -> ClaimRecord:
    """``record`` in a family of its own name (a timing or premise-like claim kept out of the lesson's)."""
    if record.design is None:
        raise ValueError(f"a claim without a design has no family: {record.claim!r}")
    return dataclasses.replace(record, design=dataclasses.replace(record.design, family=family))


def adjust(records: Sequence[ClaimRecord | dict[str, Any]], family: str) -> list[ClaimRecord]:
    """One experiment's records with the plan applied, once: families assigned, Holm within each, power.

    Every seeded record with a design and no family of its own joins ``family`` (the experiment's
    question). Within each family, the records with a p-value whose premise was not found unmet are
    corrected by Holm–Bonferroni (:func:`holm_thresholds`): a decision that does not survive becomes
    ``inconclusive``, keeping its own verdict in ``details["unadjusted_verdict"]`` and saying why in
    ``details["reason"]``; each gets ``details["holm"]`` (family, m, rank, threshold, survives).
    Every seeded record with a measured noise gets ``details["power"]`` (:func:`power_of`).
    Deterministic records pass through unchanged, in their places.
    """
    from poslab.lab.verdicts import INCONCLUSIVE, ClaimRecord, not_testable

    out = [r if isinstance(r, ClaimRecord) else ClaimRecord.from_dict(r) for r in records]
    for i, r in enumerate(out):
        if r.design is not None and not r.design.family:
            out[i] = dataclasses.replace(r, design=dataclasses.replace(r.design, family=family))
    families: dict[str, list[int]] = {}
    for i, r in enumerate(out):
        if r.design is not None and r.n_seeds > 0 and r.details.get("p_value") is not None and not not_testable(r):
            families.setdefault(r.design.family, []).append(i)
    for name, members in families.items():
        steps = holm_thresholds([float(out[i].details["p_value"]) for i in members], out[members[0]].design.alpha)
        for i, (rank, threshold, survives) in zip(members, steps):
            record = out[i]
            m = len(members)
            details = dict(
                record.details,
                holm={"family": name, "m": m, "rank": rank, "threshold": threshold, "survives": survives},
            )
            if record.verdict != INCONCLUSIVE and not survives:
                details.update(
                    unadjusted_verdict=record.verdict,
                    reason=f"not significant after Holm–Bonferroni within {name!r} ({m} claims): "
                    f"p = {record.details['p_value']:.3g} > {record.design.alpha:g}/{m - rank + 1} = {threshold:.3g} "
                    f"(or a smaller p-value before it failed)",
                )
                record = dataclasses.replace(record, verdict=INCONCLUSIVE)
            out[i] = dataclasses.replace(record, details=details)
    return [with_power(r) for r in out]


def with_power(record: ClaimRecord) -> ClaimRecord:
    """``record`` with ``details["power"]``: at its measured noise ``sd`` (``details["sd"]``) and its Holm
    step's threshold (``alpha`` outside a family), the effect its seeds detect with :data:`POWER`
    (``mde``) and the seeds an arm that would detect the measured effect ``|margin|``
    (``seeds_to_decide``; ``None`` past :data:`MAX_SEEDS`). Records without a design or a noise pass
    unchanged."""
    sd = record.details.get("sd")
    if record.design is None or record.n_seeds < 2 or not isinstance(sd, (int, float)) or record.margin is None:
        return record
    holm = record.details.get("holm")
    alpha = float(holm["threshold"]) if isinstance(holm, dict) else record.design.alpha
    test = record.design.test if record.design.test != Test.RANKING else Test.PAIRED
    effect = abs(record.margin)
    info = {
        "alpha": alpha,
        "power": POWER,
        "sd": float(sd),
        "mde": detectable(float(sd), record.n_seeds, test, alpha),
        "seeds_to_decide": seeds_to_decide(effect, float(sd), test, alpha),
    }
    return dataclasses.replace(record, details=dict(record.details, power=info))


# ----------------------------------------------------------------------------------------- seeds per arm
#: the most seeds an arm of the quick lab trains
QUICK_SEED_CAP = 6
#: the pilot the quick lab's seed counts are chosen from: a quick lab at 3 seeds an arm, each seeded claim's
#: measured effect, one seed's noise and the seeds that detect that effect with :data:`POWER` at its Holm step
#: (``benchmarks/pilot_seeds.py``). The experiments on the quick language models (position-training,
#: extrapolation, context-extension, attention-entropy) are piloted at the quick recipe they train
#: (``poslab lab --quick --seeds 3 --only ...``); the heads' and the probes' rows come from a pilot of their own
#: recipes, which that recipe does not touch (``pilot_seeds.py --keep``)
PILOT = "benchmarks/results/pilot_seeds.json"
#: the arms trained anyway at 3 seeds by another experiment of the quick lab (position-training's five schemes),
#: kept in a reader's tables at those seeds even where none of its claims needs them
SHARED_ARMS = ("none", "learned", "sinusoidal", "rope", "alibi")

#: Seeds per arm of the quick lab, by experiment and arm (``"*"``: every other arm of the experiment), fixed from
#: :data:`PILOT` before the run by one rule (:func:`arm_seeds`, pinned by ``tests/test_plan.py``): an arm trains
#: the most seeds any testable pilot claim it enters needs to decide, when that is at most :data:`QUICK_SEED_CAP`,
#: and at least :data:`~poslab.lab.records.MIN_SEEDS`; an arm that no such claim needs trains only in the full form
#: (0 here), unless another quick experiment trains it anyway (:data:`SHARED_ARMS`). ``poslab lab --seeds N`` gives
#: every arm, those of the full form included, ``N`` seeds. The pilot's seeds are among the run's (an internal
#: pilot: its three seeds are the first three of every arm).
QUICK_SEEDS: dict[str, dict[str, int]] = {
    "position-training": {"none": 6, "learned": 6, "*": 3},
    "heads": {"*": 4},
    "extrapolation": {"rope": 4, "sinusoidal": 4, "learned": 5, "alibi": 3, "none": 3},
    "context-extension": {"rope": 5},
    "attention-entropy": {"rope": 3},
    "probes": {"rope": 5, "sinusoidal": 5, "*": 0},  # "heads": the MQAR head-count runs
}


def arm_seeds(needs: Sequence[int | None], shared: bool = False, cap: int = QUICK_SEED_CAP) -> int:
    """An arm's quick seeds from the pilot's ``seeds_to_decide`` of the testable claims it enters (``None``: more
    than :data:`MAX_SEEDS`): the largest within ``cap``, at least ``MIN_SEEDS``; 0 (the full form only) when none
    is within ``cap``, unless the arm is ``shared`` (trained anyway, at ``MIN_SEEDS``)."""
    from poslab.lab.records import MIN_SEEDS

    within = [n for n in needs if n is not None and n <= cap]
    if within:
        return max(MIN_SEEDS, *within)
    return MIN_SEEDS if shared else 0


def quick_seeds(experiment: str, arm: str = "*") -> int:
    """The seeds ``arm`` of ``experiment`` trains in the quick lab (:data:`QUICK_SEEDS`; 0: the full form only;
    :data:`~poslab.lab.records.MIN_SEEDS` for an experiment the table does not name)."""
    from poslab.lab.records import MIN_SEEDS

    arms = QUICK_SEEDS.get(experiment, {})
    return arms.get(arm, arms.get("*", MIN_SEEDS))
