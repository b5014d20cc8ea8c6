"""The lessons' experiments, one module each, run by ``poslab experiment NAME`` and planned by ``poslab lab``.

Each module ends with ``EXPERIMENT``, its :class:`~poslab.lab.experiments.common.Experiment`: name,
description, tier (``poslab experiment all`` / quick and full lab / full lab only), the experiments it runs
after, time estimates, and ``run(out: Path, quick: bool = False, ...) -> dict``. A declared
experiment (:mod:`poslab.lab.experiments.declaration`: arms, a typed result, claims, tables, figures) gets its
``run`` from the pipeline there. ``run`` prints its tables and returns the results with their claim records under
``"claims"``; :func:`run_experiment` applies the statistical plan to them once (families, Holm,
power: :func:`poslab.lab.plan.adjust`), prints them and writes the dict to ``out/results.json``, so
the console, the file and the report show the same verdicts. Adding an experiment = one module
+ one line here. ``common``, ``training``, ``declaration``, ``lab_models``, ``cells`` and ``seed000_rope`` are
shared modules, not experiments; no experiment imports another or reads another's folder: the lab models several
share come from the lab model store the pipeline gives them (``lab_models``; an experiment that reads the models
another trains names it in ``after``, for order).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from poslab.checks import positive_int
from poslab.fileio import atomic_write_json
from poslab.lab.experiments.common import TIERS, Experiment, Option

# one line per experiment module
_MODULES = (
    "poslab.lab.experiments.params",
    "poslab.lab.experiments.shapes",
    "poslab.lab.experiments.rope_relative",
    "poslab.lab.experiments.permutation",
    "poslab.lab.experiments.causal_leak",
    "poslab.lab.experiments.frequencies",
    "poslab.lab.experiments.pe_cache",
    "poslab.lab.experiments.head_count",
    "poslab.lab.experiments.position_training",
    "poslab.lab.experiments.extrapolation",
    "poslab.lab.experiments.context_extension",
    "poslab.lab.experiments.attention_entropy",
    "poslab.lab.experiments.probes",
    "poslab.lab.experiments.model_zoo",
    "poslab.lab.experiments.corrections",
    "poslab.lab.experiments.bidirectional",
    "poslab.lab.experiments.sparse",
    "poslab.lab.experiments.head_map",
    "poslab.lab.experiments.streaming",
    "poslab.lab.experiments.rope_frequency_usage",
    "poslab.lab.experiments.transformer_xl",
    "poslab.lab.experiments.tang_heads",
)


def registry() -> dict[str, ModuleType]:
    """Experiment name -> module, in listing order (the order ``poslab lab`` runs them in)."""
    modules = [importlib.import_module(m) for m in _MODULES]
    return {m.EXPERIMENT.name: m for m in modules}


def descriptions(tier: str | None = None) -> dict[str, Experiment]:
    """Experiment name -> its :class:`Experiment`, in listing order; only those of ``tier`` if given."""
    if tier is not None and tier not in TIERS:
        raise ValueError(f"tier must be one of {list(TIERS)}, got {tier!r}")
    return {name: m.EXPERIMENT for name, m in registry().items() if tier is None or m.EXPERIMENT.tier == tier}


def run_experiment(
    name: str,
    out: Path | None = None,
    quick: bool = False,
    workers: int | None = None,
    size: str | None = None,
    seeds: int | None = None,
    models: Path | None = None,
) -> dict:
    """Run one experiment, write ``out/results.json`` (default ``runs/experiments/NAME``), return the results.

    Each option goes to the experiments that take it (:attr:`Experiment.options`): ``models``, the lab model store
    (:mod:`poslab.lab.experiments.lab_models`; default ``out/models``), and ``workers`` (trainings at a time) are
    ignored by the others; ``size`` (a size of :data:`poslab.lab.scale.SIZES`, or a new one,
    :func:`poslab.lab.scale.define_size`) and ``seeds`` (seeds per seeded arm, at least 3) are refused by them.
    """
    experiments = registry()
    if name not in experiments:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(experiments)}, all")
    if workers is not None:
        positive_int("--workers", workers)
    out = Path(out) if out is not None else Path("runs") / "experiments" / name
    out.mkdir(parents=True, exist_ok=True)
    experiment = experiments[name].EXPERIMENT
    options: dict = {"workers": workers} if workers is not None and experiment.takes(Option.WORKERS) else {}
    if models is not None and experiment.takes(Option.MODELS):
        options["models"] = Path(models)
    if size is not None:
        if not experiment.takes(Option.SIZE):
            sized = [n for n, m in experiments.items() if m.EXPERIMENT.takes(Option.SIZE)]
            raise ValueError(
                f"--size {size!r}: experiment {name!r} has no sizes (those with sizes: {', '.join(sized)})"
            )
        from poslab.lab.scale import define_size

        options["size"] = define_size(size)
    if seeds is not None:
        from poslab.lab.experiments.training import seeds_for

        chosen = seeds_for(seeds)  # a bad number: one error before any work
        if not experiment.takes(Option.SEEDS):
            seeded = [n for n, m in experiments.items() if m.EXPERIMENT.takes(Option.SEEDS)]
            raise ValueError(
                f"--seeds {seeds!r}: experiment {name!r} trains no seeded arms (those with seeds: {', '.join(seeded)})"
            )
        options["seeds"] = chosen
    results = settle(experiment.run(out, quick=quick, **options), name)
    atomic_write_json(out / "results.json", results, default=float)
    return results


def settle(results: dict, family: str) -> dict:
    """``results`` with its claims under the plan (:func:`poslab.lab.plan.adjust`, family ``family``), as dicts,
    printed as the claims table."""
    from poslab.lab.experiments.training import print_claims
    from poslab.lab.plan import adjust

    if not isinstance(results.get("claims"), list):
        return results
    claims = adjust(results["claims"], family)
    print_claims(claims)
    return {**results, "claims": [c.to_dict() for c in claims]}


def read_results(folder: Path) -> dict:
    """An experiment folder's ``results.json`` (what :func:`run_experiment` wrote), ``{}`` if absent or unreadable.

    Experiment folders are not run folders: their results are the experiment's own dict, read here
    (run folders are read through :class:`poslab.runs.RunFolder`).
    """
    from poslab.safe_load import load_json

    path = Path(folder) / "results.json"
    try:
        data = load_json(path.read_text(encoding="utf-8"), repr(str(path)))  # bounded nesting: no RecursionError
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
