"""Evaluation cells: one model read at one length (:class:`Evaluation`, :func:`poslab.analysis.eval.evaluate_length`'s
reading typed), and the same reading over seeds (:class:`MeanEvaluation`), as results.json holds them. Both read
their perplexity one way (:meth:`Cell.ppl`, :meth:`Cell.shown`); a mode a cell lacks is left out of results.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from poslab.lab.experiments.common import WHEN_SET
from poslab.lab.experiments.declaration import load
from poslab.lab.tables import MeanSd
from poslab.lab.verdicts import mean_sd

#: how perplexity is read at a length: the ALiBi paper's non-overlapping chunks, and a sliding window
NONOVERLAPPING, SLIDING = "nonoverlapping", "sliding"
MODES = (NONOVERLAPPING, SLIDING)


def _when_set() -> Any:
    return field(default=None, metadata=WHEN_SET)


@dataclass(frozen=True)
class Score:
    """One model read in one mode: mean loss (nats per target), its perplexity ``exp(loss)``, the targets scored and
    the sliding window's stride."""

    loss: float
    ppl: float
    n_tokens: int
    stride: int | None = _when_set()


@dataclass(frozen=True)
class SeedsScore:
    """One mode over seeds: the mean perplexity, its sample sd (``None`` for one seed) and each seed's."""

    ppl: float
    ppl_sd: float | None
    ppl_seeds: list[float]


class Cell:
    """The reading every evaluation cell shares (its fields: ``length``, a score per mode, ``cannot``)."""

    length: int
    nonoverlapping: Any
    sliding: Any
    cannot: str | None

    def score(self, mode: str) -> Any:
        """The cell's score in ``mode`` (``None`` where it was not read; ``ValueError`` for a mode not in
        :data:`MODES`)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        return getattr(self, mode)

    def ppl(self, mode: str = NONOVERLAPPING) -> float | None:
        """The perplexity in ``mode`` (a mean over seeds for a :class:`MeanEvaluation`); ``None`` where the model
        cannot read this length or the mode was not read."""
        found = self.score(mode)
        return None if found is None else found.ppl

    def shown(self, mode: str = NONOVERLAPPING) -> float | str | None:
        """:meth:`ppl` as a table shows it: ``"cannot"`` where the model cannot read this length."""
        return "cannot" if self.cannot is not None else self.ppl(mode)


@dataclass(frozen=True)
class Evaluation(Cell):
    """One model read at ``length`` (:func:`poslab.analysis.eval.evaluate_length`), with the RoPE scaling applied
    at inference where one was."""

    length: int
    nonoverlapping: Score | None = _when_set()
    sliding: Score | None = _when_set()
    cannot: str | None = _when_set()
    rope_scaling: str | None = _when_set()

    @classmethod
    def of(cls, found: Mapping[str, Any], rope_scaling: str | None = None) -> Evaluation:
        """:func:`~poslab.analysis.eval.evaluate_length`'s dict as a cell."""
        return load(cls, {**found, **({} if rope_scaling is None else {"rope_scaling": rope_scaling})})


@dataclass(frozen=True)
class MeanEvaluation(Cell):
    """One length's reading over seeds (:meth:`of`); ``cannot`` where a seed cannot read it."""

    length: int
    nonoverlapping: SeedsScore | None = _when_set()
    sliding: SeedsScore | None = _when_set()
    cannot: str | None = _when_set()
    rope_scaling: str | None = _when_set()

    @classmethod
    def of(cls, cells: Sequence[Cell], rope_scaling: str | None = None) -> MeanEvaluation:
        """The seeds' cells of one length as one: for each mode the seeds read, the mean, the sd and the per-seed
        perplexities; ``cannot`` (the first seed's reason) where a seed cannot read that length. A mode only some
        seeds read is a ``ValueError``: its mean would not be over the seeds."""
        blocked = next((c for c in cells if c.cannot is not None), None)
        if blocked is not None:
            return cls(blocked.length, cannot=blocked.cannot, rope_scaling=rope_scaling)
        scores: dict[str, SeedsScore] = {}
        for mode in MODES:
            values = [v for c in cells if (v := c.ppl(mode)) is not None]
            if values and len(values) != len(cells):
                raise ValueError(
                    f"{len(values)} of {len(cells)} seeds read length {cells[0].length} {mode}: a mean "
                    "over seeds needs every seed's reading"
                )
            if values:
                scores[mode] = SeedsScore(*mean_sd(values), values)
        return cls(cells[0].length, **scores, rope_scaling=rope_scaling)

    def spread(self, mode: str = NONOVERLAPPING) -> MeanSd | float | str | None:
        """:meth:`shown` as mean ± sd over the seeds."""
        found = self.score(mode)
        return self.shown(mode) if self.cannot is not None or found is None else MeanSd.of(found.ppl_seeds, 3)
