"""The lab models several experiments share: where each experiment keeps them, and reusing them across experiments.

Not an experiment. An experiment reads another's models only when its :class:`~poslab.lab.experiments.common.
Experiment` names that experiment in ``reuses`` (the lab then runs the provider first and reruns the reader when
the provider is rebuilt); it passes those names here, and :func:`reused` gives it the provider's folder, a
sibling of its own in the lab. :data:`MODEL_ROOTS` says where in its folder each provider keeps its lab models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from poslab.lab.experiments.training import ensure_trained
from poslab.lab.scale import SEED, SEEDS, Scale, train_config

#: the experiment that trains the lab models at every size (:func:`models_dir`)
EXTRAPOLATION = "extrapolation"
#: the experiment whose quick form trains the quick lab models first (its runs are ``runs/SCHEME-sSEED``)
POSITION_TRAINING = "position-training"


def run_name(scheme: str, seed: int = SEED) -> str:
    """A lab model's folder name: ``SCHEME`` for the first seed (:data:`SEED`), ``SCHEME-sN`` for the others."""
    return scheme if seed == SEED else f"{scheme}-s{seed}"


def models_dir(out: Path, size: Scale) -> Path:
    """Where an experiment keeps the lab models it trains: ``OUT/models/SIZE``."""
    return Path(out) / "models" / size.name


def reused(out: Path, provider: str, reuses: Sequence[str]) -> Path:
    """The folder of ``provider``, an experiment named in ``reuses`` (the reader's own name and its ``reuses``),
    next to the reader's folder ``out`` (``ValueError`` when the reader did not declare it)."""
    if provider not in reuses:
        raise ValueError(f"{provider!r} is not among the experiments this one reuses ({', '.join(reuses)})")
    return Path(out).parent / provider


def model_root(out: Path, provider: str, size: Scale, reuses: Sequence[str]) -> Path:
    """The folder under which ``provider`` (:func:`reused`) keeps its lab models of ``size``."""
    folder = reused(out, provider, reuses)
    if provider == POSITION_TRAINING:
        return folder / "runs"
    return models_dir(folder, size)


def _model_folder(out: Path, provider: str, scheme: str, size: Scale, seed: int, reuses: Sequence[str]) -> Path:
    root = model_root(out, provider, size, reuses)
    return root / (f"{scheme}-s{seed}" if provider == POSITION_TRAINING else run_name(scheme, seed))


def reuse_candidates(scheme: str, size: Scale, out: Path, seed: int, reuses: Sequence[str]) -> tuple[Path, ...]:
    """Where a finished lab model of ``scheme``, ``size`` and ``seed`` may already be: the folders of the
    experiments in ``reuses`` that train lab models, in the order named."""
    providers = [p for p in reuses if p in (EXTRAPOLATION, POSITION_TRAINING)]
    return tuple(_model_folder(out, p, scheme, size, seed, reuses) for p in providers)


def shared_model(scheme: str, size: Scale, out: Path, reuses: Sequence[str], seed: int = SEED) -> Path:
    """The lab model of ``scheme`` for ``size`` and ``seed``: trained into ``OUT/models/SIZE/NAME``, or reused
    from the experiments of ``reuses`` when one there is complete and identical."""
    cfg = train_config(scheme, size, models_dir(out, size), name=run_name(scheme, seed), seed=seed)
    return ensure_trained(cfg, reuse=reuse_candidates(scheme, size, out, seed, reuses))


def lab_model_arms(
    schemes: Sequence[str],
    size: Scale,
    out: Path,
    reuses: Sequence[str],
    seeds: tuple[int, ...] | Mapping[str, tuple[int, ...]] = SEEDS,
) -> tuple[dict[str, dict[int, dict]], dict[str, dict[int, tuple[Path, ...]]]]:
    """The lab models of every scheme and seed as a declared experiment's arms: scheme -> seed -> training config
    (trained into ``OUT/models/SIZE/NAME``), and scheme -> seed -> where a finished identical one may already be
    (:func:`reuse_candidates`). ``seeds``: the seeds of every scheme, or scheme -> its seeds."""
    by_scheme = {s: tuple(seeds[s]) if isinstance(seeds, Mapping) else tuple(seeds) for s in schemes}
    arms = {
        scheme: {
            seed: train_config(scheme, size, models_dir(out, size), name=run_name(scheme, seed), seed=seed).to_dict()
            for seed in by_scheme[scheme]
        }
        for scheme in schemes
    }
    reuse = {s: {seed: reuse_candidates(s, size, out, seed, reuses) for seed in by_scheme[s]} for s in schemes}
    return arms, reuse


def shared_models(
    schemes: Sequence[str],
    size: Scale,
    out: Path,
    reuses: Sequence[str],
    seeds: tuple[int, ...] | Mapping[str, tuple[int, ...]] = SEEDS,
    workers: int | None = None,
) -> dict[str, dict[int, Path]]:
    """:func:`shared_model` for every scheme and seed, training the missing ones ``workers`` at a time
    (:func:`poslab.lab.experiments.declaration.ensure_runs` of :func:`lab_model_arms`).

    Returns:
        scheme -> seed -> run folder.
    """
    from poslab.lab.experiments.declaration import Plan, ensure_runs

    arms, reuse = lab_model_arms(schemes, size, out, reuses, seeds)
    runs = ensure_runs(Plan(None, arms, reuse, summarise=False, what="lab models"), workers)
    return {s: {seed: run.path for seed, run in by_seed.items()} for s, by_seed in runs.by_arm.items()}
