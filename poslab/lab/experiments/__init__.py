"""The lessons' experiments, one module each, run by ``poslab experiment NAME``.

Each module defines ``NAME`` (CLI name), ``DESCRIPTION``, ``IN_ALL`` (part of ``poslab experiment all``)
and ``run(out: Path, quick: bool = False) -> dict``; ``run`` prints a readable table, and the caller
writes the returned dict to ``out/results.json``. Adding an experiment = one module + one line here.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

from poslab.fileio import atomic_write_json

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
    "poslab.lab.experiments.sparse",
    "poslab.lab.experiments.head_map",
    "poslab.lab.experiments.streaming",
    "poslab.lab.experiments.rope_frequency_usage",
    "poslab.lab.experiments.bidirectional",
    "poslab.lab.experiments.transformer_xl",
)


def registry() -> dict[str, ModuleType]:
    """Experiment name -> module, in listing order."""
    modules = [importlib.import_module(m) for m in _MODULES]
    return {m.NAME: m for m in modules}


def run_experiment(name: str, out: Path | None = None, quick: bool = False, workers: int | None = None,
                   size: str | None = None) -> dict:
    """Run one experiment, write ``out/results.json`` (default ``runs/experiments/NAME``), return the results.

    ``workers`` (trainings at a time) goes to the experiments whose ``run`` takes it; the others
    ignore it. ``size`` names a size of :data:`poslab.lab.sizes.SIZES` (or defines one,
    :func:`poslab.lab.sizes.define_size`) for the experiments whose ``run`` takes it; the others refuse it.
    """
    experiments = registry()
    if name not in experiments:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(experiments)}, all")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    out = Path(out) if out is not None else Path("runs") / "experiments" / name
    out.mkdir(parents=True, exist_ok=True)
    module = experiments[name]
    options = {"workers": workers} if workers is not None and "workers" in inspect.signature(module.run).parameters else {}
    if size is not None:
        if "size" not in inspect.signature(module.run).parameters:
            raise ValueError(f"--size {size!r}: experiment {name!r} has no sizes (those with sizes: "
                             f"{', '.join(n for n, m in experiments.items() if 'size' in inspect.signature(m.run).parameters)})")
        from poslab.lab.sizes import define_size

        options["size"] = define_size(size).name
    results = module.run(out, quick=quick, **options)
    atomic_write_json(out / "results.json", results, default=float)
    return results


def read_results(folder: Path) -> dict:
    """An experiment folder's ``results.json`` (what :func:`run_experiment` wrote), ``{}`` if absent or unreadable.

    Experiment folders are not run folders: their results are the experiment's own dict, read here
    (run folders are read through :class:`poslab.runs.RunFolder`).
    """
    import json

    try:
        data = json.loads((Path(folder) / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
