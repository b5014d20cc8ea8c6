"""``poslab experiment NAME|all [--out DIR] [--quick]``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from poslab import experiments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="run one of the lessons' experiments (or all)")
    p.add_argument("name", help="experiment name, or 'all'; see `poslab experiment list`")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/experiments/NAME)")
    p.add_argument("--quick", action="store_true", help="the short form (used by tests and the demo)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    registry = experiments.registry()
    if args.name == "list":
        for name, module in registry.items():
            print(f"{name:24s} {module.DESCRIPTION}")
        return 0
    if args.name == "all":
        names = [n for n, m in registry.items() if getattr(m, "IN_ALL", False)]
    else:
        if args.name not in registry:
            raise ValueError(f"unknown experiment {args.name!r}; known: {', '.join(registry)}, all, list")
        names = [args.name]
    for name in names:
        out = (args.out / name if args.out and len(names) > 1 else args.out)
        start = time.perf_counter()
        print(f"\n=== experiment {name}: {registry[name].DESCRIPTION}")
        experiments.run_experiment(name, out, quick=args.quick)
        where = out or Path("runs") / "experiments" / name
        print(f"--- {name}: {time.perf_counter() - start:.1f}s, results in {where}/results.json")
    return 0
