"""``poslab lab [--quick|--full] [--out DIR] [--fresh] [--only STEP ...] [--report-only] [--lang en|zh] [--cluster ray]
[--size SIZE] [--seeds N] [--shard i/N]``: the whole lab (``--shard``: one slice of its trainings; see
:mod:`poslab.lab.lab`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.cli.experiment import RESUMES, seeds_option
from poslab.jobs import runner
from poslab.lab import lab


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "lab",
        help="run every experiment and write one self-contained report.html",
        description="Run every experiment of the lessons and write LAB/report.html.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick", dest="mode", action="store_const", const="quick", help="short forms (the demo; default)"
    )
    group.add_argument("--full", dest="mode", action="store_const", const="full", help="full forms (long)")
    parser.add_argument("--out", type=Path, default=Path("runs/lab"), help="lab folder (default runs/lab)")
    parser.add_argument("--fresh", action="store_true", help="rerun every step instead of reusing finished ones")
    parser.add_argument(
        "--only", action="append", default=None, metavar="STEP", help="run only this experiment's step (repeatable)"
    )
    parser.add_argument("--report-only", action="store_true", help="rebuild report.html from the existing results")
    parser.add_argument(
        "--lang",
        choices=("en", "zh"),
        default="en",
        help="language of the page (default en; zh writes LAB/report.zh.html beside report.html)",
    )
    parser.add_argument(
        "--size",
        default=None,
        metavar="NAME[=BASE,FIELD=VALUE,...]",
        help="the size of every training experiment that takes one (smoke, quick, quick-cosine, full, gpu, gpu-large; "
        "poslab.lab.scale), or a new one, e.g. deep=quick,n_layer=4; a changed size reruns them",
    )
    parser.add_argument(
        "--seeds",
        default=None,
        metavar="N",
        help="seeds per seeded arm of every experiment that trains seeded arms, at least 3 (default 3; more "
        "seeds, more power to decide; the others are unaffected)",
    )
    parser.add_argument(
        "--shard",
        default=None,
        metavar="i/N",
        help="train only the i-th of N disjoint slices of the training experiments' trainings (one "
        "batch job each, same --out); then the same command without --shard collects and reports",
    )
    parser.add_argument(
        "--cluster",
        choices=runner.CLUSTERS,
        default=None,
        help="where the experiments' trainings run: local (a process pool, the default) or ray "
        f"(needs pip install '{runner.RAY_EXTRA}'; docs/scaling.md)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to use (default: RAY_ADDRESS, else one local Ray for the whole lab)",
    )
    parser.set_defaults(func=run, mode="quick", on_interrupt=RESUMES)


def run(args: argparse.Namespace) -> int:
    from poslab.lab.report import build_report

    if args.report_only:
        print(f"wrote {build_report(args.out, lang=args.lang)}")
        return 0
    seeds = seeds_option(args.seeds)  # a bad number: one line before any step
    shard = runner.parse_shard(args.shard) if args.shard is not None else None
    executor = runner.executor_for(args.cluster, args.ray_address)
    with runner.for_child_steps(executor):  # each step (a `poslab experiment` process) uses the same cluster
        manifest = lab.run_lab(args.out, args.mode, args.fresh, args.only, size=args.size, shard=shard, seeds=seeds)
    if args.lang != "en" and shard is None:
        print(f"wrote {build_report(args.out, lang=args.lang)}")
    return 0 if lab.succeeded(manifest, args.only) else 1
