"""``poslab sweep CONFIG.yaml [--workers K] [--out DIR] [--dry-run] [--shard i/N] [--cluster ray]``: a grid of
trainings."""

from __future__ import annotations

import argparse

from poslab.checks import positive_int
from poslab.cli import paths
from poslab.jobs import runner, sweep


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of training configurations (e.g. every scheme x 3 seeds), K at a time, resumable",
        description=sweep.__doc__.split("\n\nEvery combination")[0] + "\n\nSee docs/scaling.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="the sweep YAML file")
    p.add_argument("--workers", type=int, default=1, help="trainings running at the same time (default 1)")
    p.add_argument("--out", default=None, help="sweep folder (default: OUT_DIR/NAME from the file, sweeps/<stem>)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state, run nothing")
    add_scaleout_arguments(p, "runs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    positive_int("--workers", args.workers)
    paths.output_folder(args.out, "--out")
    shard = runner.parse_shard(args.shard) if args.shard is not None else None
    executor = runner.executor_for(args.cluster, args.ray_address)
    plan = sweep.load_plan(args.config, args.out)
    if args.dry_run:
        for sweep_run in runner.select_shard(plan.runs, shard):
            state = sweep.run_state(plan.sweep_dir / "runs" / sweep_run.name, sweep_run.max_steps)
            print(f"{state:<9} {sweep_run.name}")
        print(f"{len(plan.runs)} runs -> {plan.sweep_dir}")
        return 0
    with runner.use_executor(executor):
        summary = sweep.run_sweep(plan, args.workers, shard=shard)
    return 1 if summary["status"].get("failed") else 0


def add_scaleout_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--shard i/N``, ``--cluster {local,ray}`` and ``--ray-address`` (shared by sweep, lab and experiment)."""
    p.add_argument(
        "--shard",
        default=None,
        metavar="i/N",
        help=f"run only the i-th of N disjoint slices of the {what} (a job array); a last call without "
        f"--shard collects (docs/scaling.md)",
    )
    p.add_argument(
        "--cluster",
        choices=runner.CLUSTERS,
        default=None,
        help="where the trainings run: local (a process pool, the default) or ray "
        f"(needs pip install '{runner.RAY_EXTRA}')",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to use (default: RAY_ADDRESS, else a local Ray started for the command)",
    )
