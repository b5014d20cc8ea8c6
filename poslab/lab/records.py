"""One claim record: what a tested claim holds, and the one rule a verdict obeys (:func:`decide`; docs/lab.md,
"How a verdict is decided"). Deterministic claims (a computation, no seeds) hold when the error is within a stated
tolerance; the seeded tests are in :mod:`poslab.lab.comparisons`, the choice of test in :mod:`poslab.lab.plan`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from poslab.lab.plan import Design

HELD = "held"
DID_NOT_HOLD = "did not hold"
INCONCLUSIVE = "inconclusive"
VERDICTS = (HELD, DID_NOT_HOLD, INCONCLUSIVE)

#: fewest seeds per arm for a seeded comparison to be conclusive
MIN_SEEDS = 3


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
        design: how a seeded claim is tested (:class:`poslab.lab.plan.Design`: the test, the scale,
            the threshold, the family); every seeded record has one, deterministic records none.
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
    design: Design | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {list(VERDICTS)}, got {self.verdict!r}")
        if isinstance(self.premise, dict):
            object.__setattr__(self, "premise", Premise(**self.premise))
        if isinstance(self.design, dict):
            object.__setattr__(self, "design", Design.from_dict(self.design))
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
        data = dataclasses.asdict(self)
        data["design"] = None if self.design is None else self.design.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClaimRecord:
        """A record from its dict form; a missing field or an unknown verdict is a ``ValueError``."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data and n not in ("details", "premise", "design")]
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
