"""The context-extension experiment's passkey and checkpoint-averaging claims, every claim's premise, and
:func:`all_claims`; the tests and the other claims are :mod:`poslab.lab.experiments.context_extension_claims`'s
(its module docstring says which test decides each claim).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from poslab.lab import verdicts
from poslab.lab.experiments.cells import Evaluation
from poslab.lab.experiments.context_extension_claims import (
    AT_4L,
    AVERAGED,
    AVERAGING,
    BASE_WEIGHT,
    FACTOR,
    FINETUNE,
    INFERENCE,
    PASSKEY_TOLERANCE,
    PPL_TOLERANCE,
    SCALINGS,
    SOURCE_AVERAGING,
    SOURCE_PASSKEY,
    SOURCE_WISE,
    Budget,
    context_claims,
    continued_training_claims,
)
from poslab.lab.experiments.context_extension_passkey import CHANCE, PASSKEY_FACTORS
from poslab.lab.experiments.context_extension_result import Passkeys, PasskeySeeds, SeedReadings, ppls
from poslab.lab.plan import ALPHA
from poslab.lab.premises import PASSKEY_SHARE, all_of, below_bigram, retrieves, uses_context
from poslab.lab.records import PREMISE_NOT_MET

#: the passkey comparisons: accuracy at 4x L, higher is better, on the accuracies themselves
PASSKEY_AT_4L = verdicts.Metric(f"passkey accuracy at {FACTOR}x L", lower_is_better=False)


def passkey_claims(passkey: Passkeys, seeds: Sequence[int]) -> list[verdicts.ClaimRecord]:
    """Passkey claims at 4x L, paired by seed; inconclusive where 4x L is too short for the needle (their premise
    is :func:`premise_of`'s)."""
    wanted = [
        (
            f"fine-tuning at 4x L makes {label} retrieve the passkey at 4x L better than {label} without it",
            passkey.finetuned[label][FACTOR],
            passkey.inference[label][FACTOR],
            (f"{label} fine-tuned", f"{label} inference-only"),
        )
        for label in ("PI", "YaRN")
    ]
    wanted.append(
        (
            "without fine-tuning, PI retrieves the passkey at 4x L better than no scaling",
            passkey.inference["PI"][FACTOR],
            passkey.inference["none"][FACTOR],
            ("PI", "no scaling"),
        )
    )
    claims = []
    for claim, better, worse, labels in wanted:
        if None in better or None in worse:
            criterion = f"{PASSKEY_AT_4L.name} of {labels[0]} higher than {labels[1]}"
            claims.append(_does_not_fit(claim, SOURCE_PASSKEY, criterion))
            continue
        arms = verdicts.Arm(labels[0], better, seeds), verdicts.Arm(labels[1], worse, seeds)
        claims.append(verdicts.paired(claim, SOURCE_PASSKEY, *arms, PASSKEY_AT_4L))
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
    tolerances (:data:`PPL_TOLERANCE`, :data:`PASSKEY_TOLERANCE`) were fixed before any run. ``ppl_L``,
    ``ppl_4L``, ``passkey_4L``: variant (:data:`AVERAGING`) -> per-seed value (``None``: the needle does not fit).
    """
    seeds = list(seeds)
    avg, mix, ft, base = "last-k average", "base ⊕ fine-tuned", "fine-tuned", "base"
    at_L = verdicts.Metric("perplexity at L (non-overlapping)", log=True)

    def arm(label: str, values: Sequence[float]) -> verdicts.Arm:
        return verdicts.Arm(label, values, seeds)

    forgets = verdicts.paired(
        f"the plain {AVERAGED} fine-tune forgets (higher perplexity at L than the base model; the premise "
        "of the forgetting claims below)",
        SOURCE_AVERAGING,
        arm("plain fine-tune", ppl_L[ft]),
        arm("base", ppl_L[base]),
        dataclasses.replace(at_L, lower_is_better=False),
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
            verdicts.paired(
                f"averaging the last {last} checkpoints of the {AVERAGED} fine-tune reduces forgetting "
                "(lower perplexity at L than the plain fine-tune)",
                SOURCE_AVERAGING,
                arm(f"mean of the last {last}", ppl_L[avg]),
                arm("plain fine-tune", ppl_L[ft]),
                at_L,
            ),
            forgetting,
        ),
        verdicts.bound(
            f"averaging the last {last} checkpoints does not hurt perplexity at {FACTOR}x L "
            f"(within {PPL_TOLERANCE - 1:.0%} of the plain fine-tune)",
            "seed 000 Q4 (the recipe keeps the extension)",
            arm(f"mean of the last {last} / plain fine-tune", [a / b for a, b in zip(ppl_4L[avg], ppl_4L[ft])]),
            PPL_TOLERANCE,
            verdicts.Metric(f"ratio of {AT_4L.name}", log=True),
            below=True,
            details={"paired": True},
        ),
        verdicts.with_premise(
            verdicts.paired(
                f"base ⊕ fine-tuned ({BASE_WEIGHT:g}/{1 - BASE_WEIGHT:g}) reduces forgetting (lower perplexity "
                "at L than the plain fine-tune)",
                f"{SOURCE_AVERAGING}; {SOURCE_WISE}",
                arm("base ⊕ fine-tuned", ppl_L[mix]),
                arm("plain fine-tune", ppl_L[ft]),
                at_L,
            ),
            forgetting,
        ),
        verdicts.paired(
            f"base ⊕ fine-tuned keeps the extension (lower perplexity at {FACTOR}x L than the base model "
            f"with {AVERAGED} at inference)",
            SOURCE_WISE,
            arm("base ⊕ fine-tuned", ppl_4L[mix]),
            arm(f"base with {AVERAGED}", ppl_4L[base]),
            AT_4L,
        ),
    ]
    claim = (
        f"averaging the last {last} checkpoints keeps passkey retrieval at {FACTOR}x L "
        f"(at most {PASSKEY_TOLERANCE:g} below the plain fine-tune)"
    )
    if None in passkey_4L[avg] or None in passkey_4L[ft]:
        criterion = f"{PASSKEY_AT_4L.name} of the mean at most {PASSKEY_TOLERANCE:g} below"
        claims.append(_does_not_fit(claim, SOURCE_AVERAGING, criterion))
        return claims
    record = verdicts.paired(
        claim,
        SOURCE_AVERAGING,
        arm(f"mean of the last {last}", passkey_4L[avg]),
        arm("plain fine-tune", passkey_4L[ft]),
        PASSKEY_AT_4L,
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


def passkey_premise(base: PasskeySeeds, seeds: Sequence[int]) -> verdicts.Premise:
    """Every base model (each seed) retrieves the key at the shortest length of :data:`PASSKEY_FACTORS` it fits in
    (:func:`poslab.lab.premises.retrieves`, one arm per seed)."""
    first = next((f for f in PASSKEY_FACTORS if all(v is not None for v in base[f])), None)
    if first is None:
        return verdicts.Premise("the passkey fits in some tested length", "it fits in none", False)
    return retrieves_every_seed("the base models", base[first], seeds, first)


def premise_of(per_seed: list[SeedReadings], bigram: float) -> Callable[[verdicts.ClaimRecord], verdicts.Premise]:
    """The premise of each claim, both premises read once: every claim here is about reading past ``L``, so the
    base RoPE models must be language models that use their context within ``L`` (:func:`language_premise`, each
    seed); a passkey claim also needs every base model to retrieve the key (:func:`passkey_premise`)."""
    at_L = [math.log(v) for v in ppls(per_seed, lambda e: e.base["L"])]
    language = language_premise(at_L, [e.loss_by_position for e in per_seed], bigram)
    passkey = all_of(language, passkey_premise(Passkeys.of(per_seed).base, [e.seed for e in per_seed]))
    return lambda record: passkey if "passkey" in record.details.get("metric", "") else language  # a ranking: none


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


def all_claims(per_seed: list[SeedReadings], last: int, steps: int, budget: Budget) -> list[verdicts.ClaimRecord]:
    """The context-extension, continued-training, passkey and checkpoint-averaging claims from the per-seed
    measurements (:func:`poslab.lab.experiments.context_extension_measure.measure_seed`)."""

    def ppl(get: Callable[[SeedReadings], Evaluation]) -> list[float]:
        return ppls(per_seed, get)

    seeds = [e.seed for e in per_seed]
    claims = context_claims(
        {k: ppl(lambda e, k=k: e.inference[k]) for k in INFERENCE},
        {k: ppl(lambda e, k=k: e.finetuned[k].at_4L) for k in FINETUNE},
        ppl(lambda e: e.base["L"]),
        seeds,
        steps,
    )
    claims += continued_training_claims(
        ppl(lambda e: e.finetuned["none"].at_4L),
        {k: ppl(lambda e, k=k: e.control_inference[k]) for k in SCALINGS},
        seeds,
        budget,
    )
    claims += passkey_claims(Passkeys.of(per_seed), seeds)
    claims += averaging_claims(
        {k: ppl(lambda e, k=k: e.averaging.variants()[k].at_L) for k in AVERAGING},
        {k: ppl(lambda e, k=k: e.averaging.variants()[k].at_4L) for k in AVERAGING},
        {k: [e.averaging.variants()[k].passkey[FACTOR] for e in per_seed] for k in AVERAGING},
        last,
        seeds,
    )
    return claims
