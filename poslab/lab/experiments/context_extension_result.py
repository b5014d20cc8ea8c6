"""The context-extension experiment's readings, typed: one seed's (:class:`SeedReadings`) and their means over
seeds, as results.json holds them (under its keys, ``"L"``, ``"4L"``, a variant's label: ``stored_as``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from poslab.lab.experiments.cells import Evaluation, MeanEvaluation
from poslab.lab.experiments.common import INLINE, WHEN_SET, stored_as
from poslab.lab.experiments.context_extension_claims import AVERAGING, Budget
from poslab.lab.experiments.context_extension_passkey import PASSKEY_FACTORS

#: one model's passkey accuracy at each factor of ``L`` (``None``: the needle does not fit that length)
Passkey = dict[int, float | None]
#: factor -> each seed's accuracy
PasskeySeeds = dict[int, list[float | None]]


def _at(key: str) -> Any:
    return field(metadata=stored_as(key))


@dataclass(frozen=True)
class SeedTuned:
    """One seed's fine-tune (or control): its scaling and run, read at ``4 L`` and back at ``L``."""

    rope_scaling: str
    run: str
    at_4L: Evaluation = _at("4L")
    at_L: Evaluation = _at("L")


@dataclass(frozen=True)
class SeedVariant:
    """One seed's model of the checkpoint-averaging comparison, read at ``L``, at ``4 L`` and on the passkey."""

    at_L: Evaluation = _at("L")
    at_4L: Evaluation = _at("4L")
    passkey: Passkey


@dataclass(frozen=True)
class SeedAveraging:
    """One seed's checkpoint averaging: the steps averaged, the four models of :data:`AVERAGING` and each one's
    weight distance to the final fine-tune."""

    steps: list[int]
    base: SeedVariant
    fine_tuned: SeedVariant = _at("fine-tuned")
    weight_distance_to_fine_tuned: dict[str, float]
    last_k: SeedVariant = _at("last-k average")
    mixed: SeedVariant = _at("base ⊕ fine-tuned")

    def variants(self) -> dict[str, SeedVariant]:
        """:data:`AVERAGING`'s label -> its model."""
        return dict(zip(AVERAGING, (self.base, self.fine_tuned, self.last_k, self.mixed)))


@dataclass(frozen=True)
class SeedPasskey:
    """One seed's passkey accuracy: each scaling at inference, each fine-tune (and the control), the base."""

    inference: dict[str, Passkey]
    finetuned: dict[str, Passkey]
    base: Passkey


@dataclass(frozen=True)
class SeedReadings:
    """Every measurement of one seed: the base at ``L`` (``base["L"]``), each scaling at inference at ``4 L``, each
    fine-tune, the passkey, the base's loss by position, the control read with each scaling, checkpoint averaging."""

    seed: int
    base_run: str
    base: dict[str, Evaluation]
    inference: dict[str, Evaluation]
    finetuned: dict[str, SeedTuned]
    passkey: SeedPasskey
    loss_by_position: list[float]
    control_inference: dict[str, Evaluation]
    averaging: SeedAveraging


def ppls(per_seed: Sequence[SeedReadings], cell: Callable[[SeedReadings], Evaluation]) -> list[float]:
    """Each seed's non-overlapping perplexity of ``cell(seed's readings)`` (``ValueError`` where one cannot read)."""
    found = [cell(e).ppl() for e in per_seed]
    if None in found:
        raise ValueError("a seed's model cannot read the length its claim reads")
    return [v for v in found if v is not None]


@dataclass(frozen=True, kw_only=True)
class MeanTuned:
    """A fine-tune (or the control, no scaling recorded) over seeds, read at ``4 L`` and back at ``L``."""

    rope_scaling: str | None = field(default=None, metadata=WHEN_SET)
    at_4L: MeanEvaluation = _at("4L")
    at_L: MeanEvaluation = _at("L")


@dataclass(frozen=True)
class Passkeys:
    """Each seed's passkey accuracy per factor: the base models, each scaling at inference, each fine-tune."""

    base: PasskeySeeds
    inference: dict[str, PasskeySeeds]
    finetuned: dict[str, PasskeySeeds]

    @classmethod
    def of(cls, per_seed: Sequence[SeedReadings]) -> Passkeys:
        def seeds(get: Callable[[SeedReadings], Passkey]) -> PasskeySeeds:
            return {f: [get(e)[f] for e in per_seed] for f in PASSKEY_FACTORS}

        first = per_seed[0].passkey
        return cls(
            seeds(lambda e: e.passkey.base),
            {k: seeds(lambda e, k=k: e.passkey.inference[k]) for k in first.inference},
            {k: seeds(lambda e, k=k: e.passkey.finetuned[k]) for k in first.finetuned},
        )


@dataclass(frozen=True)
class PasskeyResult:
    """:class:`Passkeys`, with the prompts' factors of ``L``, count, key letters and chance level."""

    seeds: Passkeys = field(metadata=INLINE)
    factors: list[int]
    prompts: int
    key_letters: int
    chance: float


@dataclass(frozen=True)
class EqualBudget:
    """The continued-training comparison: the extra training's budget, plain fine-tuning read at ``4 L``, and the
    control read at ``4 L`` with each scaling."""

    budget: Budget
    continued_training: MeanEvaluation
    control_inference: dict[str, MeanEvaluation]


@dataclass(frozen=True)
class MeanVariant:
    """A model of the checkpoint-averaging comparison over seeds, with each seed's weight distance to the
    fine-tune."""

    what: str
    at_L: MeanEvaluation = _at("L")
    at_4L: MeanEvaluation = _at("4L")
    passkey: PasskeySeeds
    weight_distance_to_fine_tuned: list[float]


@dataclass(frozen=True)
class Averaging:
    """Checkpoint averaging of the :data:`~.context_extension_claims.AVERAGED` fine-tune over seeds
    (:func:`~poslab.lab.experiments.context_extension_measure.averaging_summary`)."""

    fine_tune: str
    rope_scaling: str
    last: int
    base_weight: float
    ckpt_interval: int
    steps: list[list[int]]
    variants: dict[str, MeanVariant]
    tolerances: dict[str, float]
    note: str
