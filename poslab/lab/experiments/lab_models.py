"""The lab model store: every lab model in one folder tree that the pipeline owns and hands the experiments.

Not an experiment. A lab model is one position scheme at one size and seed (:func:`poslab.lab.scale.train_config`),
kept at ``MODELS/SIZE/NAME`` (:func:`run_name`); a plan asks for one as an arm's value (:class:`LabModel`). The store
is ``LAB/models`` in a lab, ``OUT/models`` for ``poslab experiment NAME --out OUT`` unless ``--models DIR``: every
experiment of a lab reads the same lab models, and none reads another experiment's folder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.lab.scale import SEED, SEEDS, Scale, train_config

#: the store's folder in an experiment's output folder when none is given (``poslab experiment NAME --out OUT``)
MODELS = "models"


def run_name(scheme: str, seed: int = SEED) -> str:
    """A lab model's folder name: ``SCHEME`` for the first seed (:data:`SEED`), ``SCHEME-sN`` for the others."""
    return scheme if seed == SEED else f"{scheme}-s{seed}"


@dataclass(frozen=True)
class LabModel:
    """One lab model, asked for by scheme, size and seed; :meth:`config` places it in a store."""

    scheme: str
    size: Scale
    seed: int = SEED

    def config(self, models: Path) -> Any:
        """Its :class:`~poslab.training.config.TrainConfig`, trained into ``MODELS/SIZE/NAME``."""
        folder = Path(models) / self.size.name
        return train_config(self.scheme, self.size, folder, name=run_name(self.scheme, self.seed), seed=self.seed)


def lab_model_arms(
    schemes: Sequence[str], size: Scale, seeds: tuple[int, ...] | Mapping[str, tuple[int, ...]] = SEEDS
) -> dict[str, dict[int, LabModel]]:
    """The lab models of every scheme and seed as a declared experiment's arms: scheme -> seed -> :class:`LabModel`.
    ``seeds``: the seeds of every scheme, or scheme -> its seeds."""
    chosen = {s: seeds[s] if isinstance(seeds, Mapping) else seeds for s in schemes}
    return {scheme: {seed: LabModel(scheme, size, seed) for seed in chosen[scheme]} for scheme in schemes}
