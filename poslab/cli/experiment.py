"""``poslab experiment NAME|all|list [--out DIR] [--models DIR] [--quick] [--workers N] [--size SIZE] [--seeds N]
[--shard i/N]``.

``NAME`` runs one experiment and writes ``DIR/results.json`` (default ``runs/experiments/NAME``); the lab models it
trains or reads are in the lab model store ``--models`` (default ``DIR/models``; the lab passes every step the
shared ``LAB/models``);
with ``--shard i/N`` it trains only the i-th of N slices of its trainings and records what it trained
in ``DIR/shards/I-of-N.json`` (a later call without ``--shard`` reuses them and decides the claims);
``all`` runs every experiment of tier ``all`` (the ones that train nothing), each into ``DIR/NAME`` (default
``runs/experiments/NAME``); ``list`` prints the names and descriptions. An unknown name is a one-line
error (exit 2) listing the known ones.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from poslab.cli import paths
from poslab.jobs import runner
from poslab.lab import experiments

#: what ``poslab experiment`` and ``poslab lab`` add to the line they print when a signal or Ctrl-C stops them
RESUMES = "; run the same command again to continue: every training with a run folder saved a checkpoint to resume"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="run one of the lessons' experiments (or all)",
        description="Run one of the lessons' experiments, print its table and write DIR/results.json.",
    )
    p.add_argument("name", help="experiment name, 'all' or 'list'")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/experiments/NAME; with 'all', one subfolder per experiment)",
    )
    p.add_argument(
        "--models",
        type=Path,
        default=None,
        metavar="DIR",
        help="the lab model store: where the lab models (one per scheme, size and seed) are trained, or reused when "
        "a finished identical one is there (default OUT/models; the lab gives every step LAB/models)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short form of experiments that have a long one (the lessons' experiments take seconds and ignore it)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="trainings at a time for the experiments that train several models (default: one per "
        "core, at most 2; each on one thread)",
    )
    p.add_argument(
        "--size",
        default=None,
        metavar="NAME[=BASE,FIELD=VALUE,...]",
        help="a size of the training experiments (smoke, quick, quick-cosine, full; poslab.lab.scale), or a new one: "
        "e.g. deep=quick,n_layer=4,steps=600",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="N",
        help="seeds per seeded arm, at least 3 (default 3): the lab's seeds 1337, 1338, ... for every arm of "
        "an experiment that trains seeded arms (more seeds, more power; a finished seed is reused)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="i/N",
        help="train only the i-th of N disjoint slices of the trainings (one batch job each) and "
        "stop before the results; the same command without --shard then reuses them",
    )
    p.add_argument(
        "--cluster",
        choices=runner.CLUSTERS,
        default=None,
        help="where the trainings run: local (a process pool, the default) or ray "
        f"(needs pip install '{runner.RAY_EXTRA}'; docs/scaling.md)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to use (default: RAY_ADDRESS, else a local Ray started for the command)",
    )
    p.set_defaults(func=run, on_interrupt=RESUMES)


def seeds_option(text: str | None) -> int | None:
    """The number ``--seeds`` gives (``None`` without it), checked: a whole number of at least 3 (``ValueError``
    naming the value and the rule, :func:`poslab.lab.experiments.training.check_seeds`)."""
    from poslab.lab.experiments.training import check_seeds

    if text is None:
        return None
    try:
        return check_seeds(int(text))
    except ValueError:
        return check_seeds(text)  # not a whole number (or too few): the error names the value as given


def run(args: argparse.Namespace) -> int:
    paths.output_folder(args.out, "--out")
    if args.models is not None:
        paths.writable_folder(args.models, "--models")
    registry = experiments.descriptions()
    if args.name == "list":
        width = max(len(name) for name in [*registry, "all"])
        for name, experiment in registry.items():
            print(f"{name:{width}s}  {experiment.description}")
        print(f"{'all':{width}s}  every experiment that trains nothing (tier 'all'), in the order above")
        return 0
    if args.name == "all":
        names = [n for n, e in registry.items() if e.in_all]
    else:
        if args.name not in registry:
            raise ValueError(f"unknown experiment {args.name!r}; known: {', '.join(registry)}, all, list")
        names = [args.name]
    if args.size is not None:
        from poslab.lab.scale import define_size
        from poslab.training.config import training_device

        training_device(define_size(args.size).device)  # a CUDA size without a GPU: one line before any work
    args.seeds = seeds_option(args.seeds)  # a bad number: one line before any work
    shard = None
    if args.shard is not None:
        shard = runner.parse_shard(args.shard)
        if args.name == "all":
            raise ValueError(f"--shard {args.shard!r} splits one training experiment's trainings; 'all' trains nothing")
    from poslab.training.loop import TrainingDiverged

    executor = runner.executor_for(args.cluster, args.ray_address)
    with runner.use_executor(executor):
        try:
            if shard is None:
                _run_all(args, registry, names)
            else:
                _run_shard(args, registry, names[0], shard)
        except TrainingDiverged as err:  # one line naming the experiment, the run and the step; exit 1 as `train`
            print(f"poslab: error: {err}", file=sys.stderr)
            return 1
    return 0


def _run_one(name: str, where: Path, args: argparse.Namespace) -> None:
    """:func:`poslab.lab.experiments.run_experiment`; a diverged training's error names the experiment too."""
    from poslab.training.loop import TrainingDiverged

    try:
        experiments.run_experiment(
            name, where, quick=args.quick, workers=args.workers, size=args.size, seeds=args.seeds, models=args.models
        )
    except TrainingDiverged as err:
        raise TrainingDiverged(f"experiment {name}: {err}") from None


def _run_shard(args: argparse.Namespace, registry: dict, name: str, shard: tuple[int, int]) -> None:
    """One shard of experiment ``name``: its slice of the trainings, recorded in ``OUT/shards/I-of-N.json``.

    The experiment stops at its first training stage that other shards have not finished
    (:class:`poslab.jobs.runner.ShardFinished`), so it writes no ``results.json`` and decides no claim;
    when every training is already finished it runs to the end as without ``--shard``.
    """
    import dataclasses
    import datetime as dt

    from poslab.fileio import atomic_write_json
    from poslab.lab.scale import define_size

    where = args.out if args.out is not None else Path("runs") / "experiments" / name
    start = time.perf_counter()
    print(f"\n=== experiment {name}, shard {shard[0]}/{shard[1]}: {registry[name].description}")
    with runner.use_shard(shard):
        try:
            _run_one(name, where, args)
            status, stages = "complete", runner.shard_stages()
        except runner.ShardFinished as stop:
            status, stages = "sharded", stop.stages
    record = {
        "experiment": name,
        "shard": f"{shard[0]}/{shard[1]}",
        "status": status,
        "stages": stages,
        "quick": bool(args.quick),
        "size": dataclasses.asdict(define_size(args.size)) if args.size else None,
        "seeds": args.seeds,
        "seconds": round(time.perf_counter() - start, 1),
        "finished": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    path = runner.shard_file(where, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    if status == "complete":
        print(
            f"--- {name}, shard {shard[0]}/{shard[1]}: every training was finished, so the experiment ran to the end; "
            f"results in {where / 'results.json'}"
        )
    else:
        last = stages[-1]
        print(
            f"--- {name}, shard {shard[0]}/{shard[1]}: sharded: trained {last['trained']} of {last['total']} "
            f"{last['what']} in {record['seconds']:.1f}s; no claims yet: run it again without --shard once every "
            f"shard is done (record: {path})"
        )


def _run_all(args: argparse.Namespace, registry: dict, names: list[str]) -> None:
    total = time.perf_counter()
    for name in names:
        out = args.out / name if args.out is not None and args.name == "all" else args.out
        where = out if out is not None else Path("runs") / "experiments" / name
        start = time.perf_counter()
        print(f"\n=== experiment {name}: {registry[name].description}")
        _run_one(name, where, args)
        print(f"--- {name}: {time.perf_counter() - start:.1f}s, results in {where / 'results.json'}")
    if len(names) > 1:
        print(f"\n=== {len(names)} experiments in {time.perf_counter() - total:.1f}s")
