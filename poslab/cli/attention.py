"""``poslab attention RUN [--prompt TEXT] [--out PNG] [--json FILE]``: a grid of attention heatmaps."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.analysis.attention_map import DEFAULT_PROMPT, run_attention
from poslab.cli import paths


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("attention", help="grid of attention heatmaps (layer x head) of a trained run for a prompt")
    parser.add_argument("run", type=Path, help="run folder, or a name under runs/")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to read (default {DEFAULT_PROMPT})")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default RUN/attention.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write the tokens and per-head numbers as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths.output_file(args.out, "--out")
    paths.output_file(args.json, "--json")
    run_attention(args.run, args.prompt, args.out, args.json)
    return 0
