"""``poslab average RUN --last K --out NEW_RUN [--weights W ...]``: a new run holding the mean of a run's last K
checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.cli import paths
from poslab.runs import resolve_run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average",
        help="average the last K checkpoints of a run into a new run folder",
        description="Average the weights of a run's newest K checkpoints (float32 accumulation) into a new run folder "
        "that eval, sample and load_run read like any run. The source run is only read; the new folder "
        "must not exist (or be empty): nothing is overwritten. The run must have kept K checkpoints "
        "(train with --keep_checkpoints K and a --ckpt_interval that saves them).",
    )
    p.add_argument("run", help="run folder (or a name under runs/)")
    p.add_argument("--last", type=int, required=True, metavar="K", help="how many of the newest checkpoints to average")
    p.add_argument("--out", type=Path, required=True, metavar="NEW_RUN", help="the run folder to create")
    p.add_argument(
        "--weights",
        type=float,
        nargs="+",
        default=None,
        metavar="W",
        help="one weight per averaged checkpoint, oldest first (default: equal); normalised to sum 1",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths.output_folder(args.out, "--out")
    source = resolve_run(args.run)
    out = source.write_average(args.out, args.last, args.weights)
    steps = source.checkpoints()[-args.last :]
    print(f"averaged checkpoints {steps} of {source.path} -> {out}")
    print(f"try: poslab eval {out}   or   poslab sample {out} --temperature 0")
    return 0
