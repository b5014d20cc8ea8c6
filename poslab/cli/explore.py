"""``poslab explore [RUN ...] [--port P]``: the local web page of attention heads and position schemes."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.explore.server import serve


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "explore",
        help="local web page: attention heads and position schemes, live",
        description="Serve a local page (127.0.0.1) to explore attention heads of runs and schemes.",
    )
    parser.add_argument(
        "runs", nargs="*", type=Path, help="run folders to offer (untrained models of every scheme are always offered)"
    )
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0 = any free port)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return serve(args.runs, args.port)
