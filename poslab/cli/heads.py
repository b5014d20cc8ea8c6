"""``poslab heads RUN [--out DIR] [--text CORPUS] [--quick]``: what each attention head does."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.analysis.heads import run_heads
from poslab.cli import paths


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("heads", help="what each attention head does: types and importance of a trained run")
    parser.add_argument("run", type=Path, help="run folder (runs/NAME)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN/heads)")
    parser.add_argument("--text", default=None, help="evaluation corpus name or file (default: the run's corpus)")
    parser.add_argument("--quick", action="store_true", help="fewer evaluation batches")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths.output_folder(args.out, "--out")
    run_heads(args.run, args.out or args.run / "heads", args.quick, args.text)
    return 0
