"""The context-extension experiment's claims and premises: which test decides each, fixed before any run.

The test follows the design (:mod:`poslab.lab.plan`):

* The inference-time scalings (no scaling, PI, NTK, dynamic NTK, YaRN, Llama3) are the **same base
  models read differently**: every comparison between them is **paired by seed**, on ln-perplexity.
* Every fine-tune (and the control, more steps at ``L``) starts from its seed's base model **with the
  same seed** (the same batches in the same order): fine-tunes are paired by seed with each other, with
  the base model and with the scalings read on the base or the control.
* Passkey comparisons: the same prompts, the same base models or their fine-tunes: paired by seed.
* A ranking ("the best", "the worst", "beats every") is every pair decided, paired by seed
  (:func:`poslab.lab.verdicts.best_of`, on ln-perplexity).
* "close to" is an equivalence (:func:`poslab.lab.verdicts.equivalent`, TOST) within the margin
  :data:`CLOSE_TO`.
* "continued training is the most reliable" is two claims: it reads ``4 L`` better than every
  inference-only scaling **at an equal token budget** (each scaling read on the control, which trained
  the same steps and tokens at ``L``), and its **spread** across seeds is smaller (a variance test,
  not testable below :data:`VARIANCE_SEEDS` seeds).
* The averaging claims about forgetting presuppose that the plain fine-tune forgets: where the
  forgetting claim does not hold they are not testable (their premise names its result).
* Premises are per seed: every base model below the bigram baseline and using its context; for a
  passkey claim every base model retrieving the key at the shortest length it fits in.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from poslab.analysis.eval import parse_rope_scaling
from poslab.lab import verdicts
from poslab.lab.experiments.context_extension_passkey import CHANCE, PASSKEY_FACTORS
from poslab.lab.plan import ALPHA, POWER
from poslab.lab.premises import PASSKEY_SHARE, all_of, below_bigram, retrieves, uses_context
from poslab.lab.records import PREMISE_NOT_MET

FACTOR = 4
#: inference-time variants: label -> --rope-scaling spec
INFERENCE = {
    "none": "none",
    "PI": "linear:4",
    "NTK": "ntk:4",
    "dynamic NTK": "dynamic:4",
    "YaRN": "yarn:4",
    "Llama3": "llama3:4",
}
#: the inference-only scalings (every variant whose spec sets a scaling)
SCALINGS = tuple(k for k, spec in INFERENCE.items() if parse_rope_scaling(spec)["scaling"] is not None)
#: fine-tuned variants: label -> --rope-scaling spec
FINETUNE = {"none": "none", "PI": "linear:4", "YaRN": "yarn:4"}
#: the fine-tune whose checkpoints are averaged (seed 000 Q4's first choice, YaRN)
AVERAGED = "YaRN"
#: weight of the base model in base ⊕ fine-tune (the fine-tune gets ``1 - BASE_WEIGHT``)
BASE_WEIGHT = 0.5
#: the averaging variants: label -> what it is (the order of the tables and the plot)
AVERAGING = {
    "base": "the base model (no fine-tuning)",
    "fine-tuned": "the plain fine-tune (its final checkpoint)",
    "last-k average": "the mean of the fine-tune's last k checkpoints",
    "base ⊕ fine-tuned": "base and final fine-tune weights averaged",
}
#: non-inferiority tolerances of the averaging claims (stated before any measurement)
PPL_TOLERANCE = 1.01
PASSKEY_TOLERANCE = 0.05
#: "close to the base model's in-length perplexity": ln-perplexity within ±ln(1.05). The PI paper's
#: own result (Chen et al. 2023, LLaMA 7B, PG-19) puts PI after 1000 fine-tuning steps at 6.95 at
#: 8k against the base model's 7.20 at 2k (3.5% apart), and the direct fine-tune it rejects at 7.69
#: (6.8% above): 5% keeps the first "close" and the second not.
CLOSE_TO = math.log(1.05)
#: the fine-tuning steps of the PI paper's closeness result (200 already reach the target window)
PAPER_FINETUNE_STEPS = 1000
#: the smallest difference in spread a reliability claim must detect: one arm's seed-to-seed sd half
#: the other's ("more reliable" means at least that much steadier)
SD_RATIO = 2.0
SOURCE_SCALINGS = "Chen et al. 2023 (PI); bloc97 2023 (NTK); Peng et al. 2023 (YaRN)"
SOURCE_PASSKEY = "Mohtashami & Jaggi 2023; Chen et al. 2023 (PI); Peng et al. 2023 (YaRN)"
SOURCE_CONTINUED = "seed 000 Q4 (继续预训练 ★★★ 慢但最可靠: continued pre-training, slow but the most reliable)"
SOURCE_AVERAGING = "seed 000 Q4 (LLaMA3: 平均检查点 avoids catastrophic forgetting)"
SOURCE_WISE = "Wortsman et al. 2022 (WiSE-FT: interpolating base and fine-tuned weights)"
#: where averaging belongs in the Llama 3 recipe (shown with the results and in the report)
LLAMA3_NOTE = (
    'In the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783) checkpoint '
    "averaging belongs to the annealing stage of pre-training (§3.4.3: the final pre-trained model is the "
    "average of checkpoints taken during annealing) and to post-training (§4.1.5: models from runs with "
    "different data or hyperparameters are averaged at each RM, SFT and DPO stage), not to the long-context "
    "pre-training stage (§3.4.2) that seed 000 Q4 ties it to."
)
PPL4 = f"perplexity at {FACTOR}x L (non-overlapping)"
LN_PPL4 = f"ln perplexity (nats/token) at {FACTOR}x L (non-overlapping)"


def variance_seeds(ratio: float = SD_RATIO, alpha: float = ALPHA, power: float = POWER) -> int:
    """The seeds per arm a paired variance test needs to detect an sd ratio of ``ratio`` with ``power``.

    The Pitman–Morgan test of two paired arms tests the correlation of their sums and differences,
    ``ρ = (λ - 1) / (λ + 1)`` for a variance ratio ``λ = ratio²`` and uncorrelated arms; by Fisher's z
    (``atanh(r)`` with standard error ``1 / sqrt(n - 3)``) it detects ``ρ`` when
    ``atanh(ρ) sqrt(n - 3) >= z_{1 - α/2} + z_{power}``.
    """
    lam = ratio**2
    rho = (lam - 1) / (lam + 1)
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    return 3 + math.ceil((z / math.atanh(rho)) ** 2)


#: seeds an arm below which "the most reliable" (a variance comparison) is not testable
VARIANCE_SEEDS = variance_seeds()


@dataclass(frozen=True)
class Budget:
    """The extra training tokens of the two arms of the continued-training claim.

    Attributes:
        steps: extra steps of each arm (the fine-tune at ``4 L``, the control at ``L``).
        finetune_tokens: tokens per step of the fine-tune at ``4 L``.
        control_tokens: tokens per step of the control at ``L``.
    """

    steps: int
    finetune_tokens: int
    control_tokens: int

    @property
    def equal(self) -> bool:
        return self.finetune_tokens == self.control_tokens

    def text(self) -> str:
        both = f"{self.steps} steps x {self.finetune_tokens} tokens = {self.steps * self.finetune_tokens:,} tokens"
        if self.equal:
            return f"{both} each arm"
        return (
            f"unequal: fine-tune {both}, control {self.steps} steps x {self.control_tokens} tokens = "
            f"{self.steps * self.control_tokens:,} tokens"
        )


def _ln(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values]


def _paired(
    claim: str,
    source: str,
    better: Sequence[float],
    worse: Sequence[float],
    labels: tuple[str, str],
    metric: str,
    seeds: Sequence[int],
    *,
    lower: bool = True,
    log: bool = True,
    offset: float = 0.0,
) -> verdicts.ClaimRecord:
    return verdicts.paired(
        claim,
        source,
        better,
        worse,
        better_label=labels[0],
        worse_label=labels[1],
        metric=metric,
        lower_is_better=lower,
        seeds=seeds,
        log=log,
        offset=offset,
    )


def _ranking(
    claim: str,
    source: str,
    arms: dict[str, Sequence[float]],
    predicted: str,
    seeds: Sequence[int],
    *,
    lower: bool = True,
    metric: str = LN_PPL4,
) -> verdicts.ClaimRecord:
    """``predicted`` ranks first among ``arms`` (per-seed values on the tested scale), every pair paired by seed."""
    record = verdicts.best_of(claim, source, arms, [predicted], metric=metric, lower_is_better=lower, paired_seeds=True)
    spreads = {k: verdicts.mean_sd(v)[1] for k, v in arms.items()}
    return dataclasses.replace(record, details=dict(record.details, seeds=list(seeds), sd_per_arm=spreads))


def _close_to(
    claim: str, source: str, arm: Sequence[float], reference: Sequence[float], labels: tuple[str, str], seeds: list[int]
) -> verdicts.ClaimRecord:
    """``arm`` within :data:`CLOSE_TO` of ``reference`` on ln-perplexity (TOST, paired by seed)."""
    metric = "perplexity (non-overlapping)"
    if len(arm) < 2:  # an equivalence needs a measured noise: one seed decides nothing
        return verdicts.ClaimRecord(
            claim,
            source,
            f"{metric} of {labels[0]} within ±{CLOSE_TO:.3g} of {labels[1]} on ln, paired by seed (TOST)",
            f"{labels[0]} {verdicts.pm(arm)} vs {labels[1]} {verdicts.pm(reference)}",
            None,
            None,
            len(arm),
            verdicts.INCONCLUSIVE,
            {"seeds": list(seeds), "within": CLOSE_TO},
            design=verdicts.Design(verdicts.Test.EQUIVALENCE, log=True, threshold=CLOSE_TO),
        )
    return verdicts.equivalent(
        claim, source, arm, reference, labels=labels, metric=metric, within=CLOSE_TO, seeds=seeds, log=True
    )


def context_claims(
    inference: dict[str, list[float]],
    finetuned: dict[str, list[float]],
    base_L: list[float],
    seeds: Sequence[int],
    steps: int = 100,
) -> list[verdicts.ClaimRecord]:
    """The scaling and fine-tuning claims, from per-seed perplexities (the i-th value of every arm is seed i's).

    Args:
        inference: scaling label (:data:`INFERENCE`) -> per-seed perplexity at 4x L of the base models.
        finetuned: fine-tuned label (:data:`FINETUNE`) -> per-seed perplexity at 4x L.
        base_L: per-seed perplexity of the base models at L.
        seeds: the seeds, in the order of the values.
        steps: fine-tuning steps (for the wording).
    """
    seeds = list(seeds)
    out = [
        _paired(
            f"without fine-tuning, {label} reads 4x L better than no scaling",
            SOURCE_SCALINGS,
            inference[label],
            inference["none"],
            (label, "no scaling"),
            PPL4,
            seeds,
        )
        for label in ("PI", "NTK", "dynamic NTK", "YaRN")
    ]
    out += [
        _paired(
            f'without fine-tuning, {label} reads 4x L better than PI ("YaRN or NTK-aware first, much better than PI")',
            "seed 000 §3.5",
            inference[label],
            inference["PI"],
            (label, "PI"),
            PPL4,
            seeds,
        )
        for label in ("NTK", "YaRN")
    ]
    out.append(
        _ranking(
            "YaRN is the best inference-time scaling",
            "seed 000 Q4 (YaRN ★★★)",
            {k: _ln(inference[k]) for k in SCALINGS},
            "YaRN",
            seeds,
        )
    )
    for label in ("PI", "YaRN"):
        record = _close_to(
            f"after {steps} fine-tuning steps at 4x L, {label} is close to the base model's in-length perplexity "
            f"(within {math.exp(CLOSE_TO) - 1:.0%}; the PI paper fine-tunes up to {PAPER_FINETUNE_STEPS} steps, "
            f"this run {steps})",
            SOURCE_SCALINGS,
            finetuned[label],
            base_L,
            (f"{label} fine-tuned at 4x L", "the base model at L"),
            seeds,
        )
        out.append(
            dataclasses.replace(record, details=dict(record.details, steps=steps, paper_steps=PAPER_FINETUNE_STEPS))
        )
    out.append(
        _paired(
            "after fine-tuning, YaRN <= PI",
            "Peng et al. 2023 (YaRN)",
            finetuned["YaRN"],
            finetuned["PI"],
            ("YaRN fine-tuned", "PI fine-tuned"),
            PPL4,
            seeds,
        )
    )
    out.append(
        _ranking(
            "plain fine-tuning (no scaling) is the worst of the three",
            "Chen et al. 2023 (PI)",
            {k: _ln(v) for k, v in finetuned.items()},
            "none",
            seeds,
            lower=False,
            metric=f"{LN_PPL4}, the highest is the worst",
        )
    )
    return out


def continued_training_claims(
    continued: list[float], control_inference: dict[str, list[float]], seeds: Sequence[int], budget: Budget
) -> list[verdicts.ClaimRecord]:
    """Continued training (plain fine-tuning at 4x L, no scaling) against every inference-only scaling.

    Both arms of a seed start from its base model with its seed and train :attr:`Budget.steps` more
    steps: the fine-tune at ``4 L``, the control at ``L`` (then read at ``4 L`` with each scaling), so
    the comparison is at an equal token budget and paired by seed.

    Args:
        continued: per-seed perplexity at 4x L of the plain fine-tune.
        control_inference: scaling label (:data:`SCALINGS`) -> per-seed perplexity at 4x L of the control.
        seeds: the seeds, in the order of the values.
        budget: the extra tokens of each arm (said in the records).
    """
    seeds = list(seeds)
    arms = {"continued training": _ln(continued)}
    arms |= {f"{k} at inference (the same steps at L)": _ln(control_inference[k]) for k in SCALINGS}
    better = _ranking(
        "continued training (plain fine-tuning at 4x L) reads 4x L better than every inference-only scaling "
        "at an equal token budget",
        SOURCE_CONTINUED,
        arms,
        "continued training",
        seeds,
    )
    better = dataclasses.replace(
        better,
        measured=f"{better.measured}; extra training: {budget.text()}",
        details=dict(better.details, budget=dataclasses.asdict(budget)),
    )
    return [better, reliability_claim(arms, seeds)]


def reliability_claim(arms: dict[str, list[float]], seeds: list[int]) -> verdicts.ClaimRecord:
    """ "The most reliable": continued training's spread across seeds below every inference-only scaling's.

    A variance comparison, paired by seed, of the Brown–Forsythe kind: each arm's absolute deviations
    from its median ln-perplexity, every pair compared by a paired t-test. Below :data:`VARIANCE_SEEDS`
    seeds (what the classical paired variance test, Pitman–Morgan's, needs for a :data:`SD_RATIO` x sd
    ratio) it is not testable: its premise (that many seeds) is unmet.
    """
    claim = (
        "continued training is the most reliable: its spread across seeds at 4x L is below every inference-only "
        "scaling's"
    )
    spreads = {k: verdicts.mean_sd(v)[1] for k, v in arms.items()}
    shown = ", ".join(f"{k} {'-' if s is None else f'{s:.3f}'}" for k, s in spreads.items())
    premise = verdicts.Premise(
        f"at least {VARIANCE_SEEDS} seeds: a paired variance test detects a {SD_RATIO:g}x sd ratio with "
        f"{POWER:.0%} power from that many (Pitman–Morgan, Fisher's z); with 3 that test has 1 degree of freedom",
        f"{len(seeds)} seeds",
        len(seeds) >= VARIANCE_SEEDS,
    )
    if not premise.met:
        record = verdicts.ClaimRecord(
            claim,
            SOURCE_CONTINUED,
            "absolute deviation from each arm's median ln perplexity at 4x L, continued training below every "
            "inference-only scaling's; every pair paired by seed (paired t)",
            f"sd of ln perplexity across seeds: {shown}",
            None,
            None,
            len(seeds),
            verdicts.INCONCLUSIVE,
            {"seeds": seeds, "sd_per_arm": spreads, "pairwise": verdicts.Test.PAIRED.value},
            design=verdicts.Design(verdicts.Test.RANKING, log=True),
        )
        return verdicts.with_premise(record, premise)
    deviations = {k: [abs(x - statistics.median(v)) for x in v] for k, v in arms.items()}
    record = _ranking(
        claim,
        SOURCE_CONTINUED,
        deviations,
        "continued training",
        seeds,
        metric=f"absolute deviation from the arm's median {LN_PPL4}",
    )
    return verdicts.with_premise(
        dataclasses.replace(record, measured=f"{record.measured}; sd across seeds: {shown}"), premise
    )


def passkey_claims(passkey: dict[str, Any], seeds: Sequence[int]) -> list[verdicts.ClaimRecord]:
    """Passkey claims at 4x L, paired by seed; inconclusive where 4x L is too short for the needle.

    Their premise (every base model retrieves in length) is :func:`premise_of`'s.

    Args:
        passkey: ``{"inference": {label: {factor: [per seed]}}, "finetuned": {...}, "base": {...}}``.
        seeds: the seeds, in the order of the values.
    """
    acc = f"passkey accuracy at {FACTOR}x L"
    at = str(FACTOR)
    wanted = [
        (
            f"fine-tuning at 4x L makes {label} retrieve the passkey at 4x L better than {label} without it",
            passkey["finetuned"][label][at],
            passkey["inference"][label][at],
            (f"{label} fine-tuned", f"{label} inference-only"),
        )
        for label in ("PI", "YaRN")
    ]
    wanted.append(
        (
            "without fine-tuning, PI retrieves the passkey at 4x L better than no scaling",
            passkey["inference"]["PI"][at],
            passkey["inference"]["none"][at],
            ("PI", "no scaling"),
        )
    )
    claims = []
    for claim, better, worse, labels in wanted:
        if None in better or None in worse:
            claims.append(_does_not_fit(claim, SOURCE_PASSKEY, f"{acc} of {labels[0]} higher than {labels[1]}"))
            continue
        claims.append(_paired(claim, SOURCE_PASSKEY, better, worse, labels, acc, seeds, lower=False, log=False))
    return claims


def _does_not_fit(claim: str, source: str, criterion: str) -> verdicts.ClaimRecord:
    return verdicts.ClaimRecord(
        claim, source, criterion, f"{FACTOR}x L is too short for the needle", None, None, 0, verdicts.INCONCLUSIVE
    )


def averaging_claims(
    ppl_L: dict[str, list[float]],
    ppl_4L: dict[str, list[float]],
    passkey_4L: dict[str, list[float | None]],
    last: int,
    seeds: Sequence[int],
) -> list[verdicts.ClaimRecord]:
    """Claims of the checkpoint-averaging comparison, paired by seed (each seed's four models share its base run
    and seed).

    The claims that averaging reduces forgetting presuppose forgetting: their premise is the forgetting
    claim's own verdict (held at its 5% test; premises are outside the experiment's Holm family). The
    passkey claim presupposes that the plain fine-tune retrieves at 4x L, every seed. The criteria and
    tolerances (:data:`PPL_TOLERANCE`, :data:`PASSKEY_TOLERANCE`) were fixed before any run.

    Args:
        ppl_L: variant (:data:`AVERAGING`) -> per-seed perplexity at L (forgetting).
        ppl_4L: variant -> per-seed perplexity at 4x L.
        passkey_4L: variant -> per-seed passkey accuracy at 4x L (``None``: the needle does not fit).
        last: checkpoints averaged (for the wording).
        seeds: the seeds, in the order of the values.
    """
    seeds = list(seeds)
    avg, mix, ft, base = "last-k average", "base ⊕ fine-tuned", "fine-tuned", "base"
    at_L, at_4L = "perplexity at L (non-overlapping)", PPL4
    forgets = _paired(
        f"the plain {AVERAGED} fine-tune forgets (higher perplexity at L than the base model; the premise "
        "of the forgetting claims below)",
        SOURCE_AVERAGING,
        ppl_L[ft],
        ppl_L[base],
        ("plain fine-tune", "base"),
        at_L,
        seeds,
        lower=False,
    )
    forgetting = verdicts.Premise(
        f"the plain {AVERAGED} fine-tune forgets (its claim held: ln perplexity at L above the base model's, "
        f"paired t at {ALPHA:g})",
        f"forgetting {forgets.verdict}: {forgets.measured}",
        forgets.verdict == verdicts.HELD,
    )
    claims = [
        forgets,
        verdicts.with_premise(
            _paired(
                f"averaging the last {last} checkpoints of the {AVERAGED} fine-tune reduces forgetting "
                "(lower perplexity at L than the plain fine-tune)",
                SOURCE_AVERAGING,
                ppl_L[avg],
                ppl_L[ft],
                (f"mean of the last {last}", "plain fine-tune"),
                at_L,
                seeds,
            ),
            forgetting,
        ),
        verdicts.bound(
            f"averaging the last {last} checkpoints does not hurt perplexity at {FACTOR}x L "
            f"(within {PPL_TOLERANCE - 1:.0%} of the plain fine-tune)",
            "seed 000 Q4 (the recipe keeps the extension)",
            [a / b for a, b in zip(ppl_4L[avg], ppl_4L[ft])],
            PPL_TOLERANCE,
            below=True,
            label=f"mean of the last {last} / plain fine-tune",
            metric=f"ratio of {at_4L}",
            details={"seeds": seeds, "paired": True},
            log=True,
        ),
        verdicts.with_premise(
            _paired(
                f"base ⊕ fine-tuned ({BASE_WEIGHT:g}/{1 - BASE_WEIGHT:g}) reduces forgetting (lower perplexity "
                "at L than the plain fine-tune)",
                f"{SOURCE_AVERAGING}; {SOURCE_WISE}",
                ppl_L[mix],
                ppl_L[ft],
                ("base ⊕ fine-tuned", "plain fine-tune"),
                at_L,
                seeds,
            ),
            forgetting,
        ),
        _paired(
            f"base ⊕ fine-tuned keeps the extension (lower perplexity at {FACTOR}x L than the base model "
            f"with {AVERAGED} at inference)",
            SOURCE_WISE,
            ppl_4L[mix],
            ppl_4L[base],
            ("base ⊕ fine-tuned", f"base with {AVERAGED}"),
            at_4L,
            seeds,
        ),
    ]
    claim = (
        f"averaging the last {last} checkpoints keeps passkey retrieval at {FACTOR}x L "
        f"(at most {PASSKEY_TOLERANCE:g} below the plain fine-tune)"
    )
    metric = f"passkey accuracy at {FACTOR}x L"
    if None in passkey_4L[avg] or None in passkey_4L[ft]:
        claims.append(
            _does_not_fit(claim, SOURCE_AVERAGING, f"{metric} of the mean at most {PASSKEY_TOLERANCE:g} below")
        )
        return claims
    record = _paired(
        claim,
        SOURCE_AVERAGING,
        passkey_4L[avg],
        passkey_4L[ft],
        (f"mean of the last {last}", "plain fine-tune"),
        metric,
        seeds,
        lower=False,
        log=False,
        offset=-PASSKEY_TOLERANCE,
    )
    found = retrieves_every_seed("the plain fine-tunes", passkey_4L[ft], seeds, FACTOR)
    claims.append(verdicts.with_premise(record, found))
    return claims


def language_premise(
    base_loss: Sequence[float], by_position: Sequence[Sequence[float]], bigram: float
) -> verdicts.Premise:
    """Every base model (each seed) clearly below the bigram baseline at L and using its context within L."""
    return all_of(below_bigram({"base RoPE": list(base_loss)}, bigram), uses_context({"base RoPE": list(by_position)}))


def retrieves_every_seed(
    who: str, accuracy: Sequence[float | None], seeds: Sequence[int], factor: int
) -> verdicts.Premise:
    """Every seed's model retrieves the key at ``factor`` x L at least halfway from chance to perfect
    (:func:`poslab.lab.premises.retrieves`, one arm per seed: a mean over seeds would let one seed at chance
    pass)."""
    found = retrieves({f"seed {s}": [v] for s, v in zip(seeds, accuracy)}, CHANCE)
    bound = CHANCE + PASSKEY_SHARE * (1 - CHANCE)
    return verdicts.Premise(
        f"{who} retrieve the passkey at {factor}x L, every seed: accuracy >= {bound:.3f} (halfway from chance "
        f"{CHANCE:.3f} to 1)",
        f"retrieval at {factor}x L: " + found.measured.split(": ", 1)[-1],
        found.met,
    )


def passkey_premise(base: dict[str, list[float | None]], seeds: Sequence[int]) -> verdicts.Premise:
    """Every base model (each seed) retrieves the key at the shortest length of :data:`PASSKEY_FACTORS` it fits in
    (:func:`poslab.lab.premises.retrieves`, one arm per seed)."""
    first = next((f for f in PASSKEY_FACTORS if all(v is not None for v in base[str(f)])), None)
    if first is None:
        return verdicts.Premise("the passkey fits in some tested length", "it fits in none", False)
    return retrieves_every_seed("the base models", base[str(first)], seeds, first)


def premise_of(record: verdicts.ClaimRecord, per_seed: list[dict[str, Any]], bigram: float) -> verdicts.Premise:
    """Every claim here is about reading past ``L``: the base RoPE models must be language models that use
    their context within ``L`` (:func:`language_premise`, each seed). A passkey claim also needs every base
    model to retrieve the key (:func:`passkey_premise`)."""
    language = language_premise(
        [math.log(e["base"]["L"]["nonoverlapping"]["ppl"]) for e in per_seed],
        [e["loss_by_position"] for e in per_seed],
        bigram,
    )
    if "passkey" not in record.details.get("metric", ""):
        return language
    seeds = [e["seed"] for e in per_seed]
    base = {str(f): [e["passkey"]["base"][str(f)] for e in per_seed] for f in PASSKEY_FACTORS}
    return all_of(language, passkey_premise(base, seeds))


def attach_premises(
    records: Sequence[verdicts.ClaimRecord], premise_for: Callable[[verdicts.ClaimRecord], verdicts.Premise]
) -> list[dict[str, Any]]:
    """Every seeded record with ``premise_for(record)`` joined to the premise it already has (a gate such as
    forgetting), as dicts; an unmet premise makes the verdict inconclusive and keeps the verdict the test
    alone gave (:func:`poslab.lab.verdicts.with_premise`)."""
    out = []
    for record in records:
        if record.n_seeds > 0:
            premise = premise_for(record)
            own = record.premise
            if own is not None and not own.met:  # already inconclusive: keep its verdict_without_premise
                joined = all_of(own, premise)
                reason = f"{PREMISE_NOT_MET}: {joined.text} (measured: {joined.measured})"
                record = dataclasses.replace(record, premise=joined, details=dict(record.details, reason=reason))
            else:
                record = verdicts.with_premise(record, premise if own is None else all_of(own, premise))
        out.append(record.to_dict())
    return out


def all_claims(per_seed: list[dict[str, Any]], last: int, steps: int, budget: Budget) -> list[verdicts.ClaimRecord]:
    """The context-extension, continued-training, passkey and checkpoint-averaging claims from the per-seed
    measurements (:func:`poslab.lab.experiments.context_extension.measure_seed`)."""

    def ppls(get: Callable[[dict[str, Any]], dict[str, Any]]) -> list[float]:
        return [get(e)["nonoverlapping"]["ppl"] for e in per_seed]

    seeds = [e["seed"] for e in per_seed]
    claims = context_claims(
        {k: ppls(lambda e, k=k: e["inference"][k]) for k in INFERENCE},
        {k: ppls(lambda e, k=k: e["finetuned"][k]["4L"]) for k in FINETUNE},
        ppls(lambda e: e["base"]["L"]),
        seeds,
        steps,
    )
    claims += continued_training_claims(
        ppls(lambda e: e["finetuned"]["none"]["4L"]),
        {k: ppls(lambda e, k=k: e["control_inference"][k]) for k in SCALINGS},
        seeds,
        budget,
    )

    def passkey(get: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, list[float | None]]:
        return {str(f): [get(e)[str(f)] for e in per_seed] for f in PASSKEY_FACTORS}

    claims += passkey_claims(
        {
            "base": passkey(lambda e: e["passkey"]["base"]),
            "inference": {k: passkey(lambda e, k=k: e["passkey"]["inference"][k]) for k in INFERENCE},
            "finetuned": {k: passkey(lambda e, k=k: e["passkey"]["finetuned"][k]) for k in FINETUNE},
        },
        seeds,
    )
    claims += averaging_claims(
        {k: ppls(lambda e, k=k: e["averaging"][k]["L"]) for k in AVERAGING},
        {k: ppls(lambda e, k=k: e["averaging"][k]["4L"]) for k in AVERAGING},
        {k: [e["averaging"][k]["passkey"][str(FACTOR)] for e in per_seed] for k in AVERAGING},
        last,
        seeds,
    )
    return claims
