"""``poslab bench [--quick] [--sizes T,..] [--contexts C,..] [--cases NAME,..] ...``: attention and decoding speed.

The command line is read here once into typed values (sizes, :class:`~poslab.bench.Case` specs);
:func:`poslab.bench.run_bench` measures.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from poslab import bench
from poslab.checks import positive_int
from poslab.cli import paths


def parse_sizes(text: str, label: str = "--sizes") -> list[int]:
    """``"256,1024"`` -> ``[256, 1024]`` (positive integers), else ``ValueError`` naming the bad item."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) <= 0:
            raise ValueError(f"{label} must be comma-separated positive integers, got {item!r} in {text!r}")
        values.append(int(item))
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark attention (time, memory) and KV-cache decoding against reference implementations",
        description="Attention forward+backward time and peak memory for every scheme and the references, and "
        "KV-cache decoding vs full recompute. Alternating runs, medians; writes results.json, report.md, bench.png.",
    )
    p.add_argument(
        "--quick", action="store_true", help=f"sizes {bench.QUICK_SIZES}, contexts {bench.QUICK_CONTEXTS}, 3 repeats"
    )
    p.add_argument(
        "--sizes",
        default=None,
        help=f"attention lengths, comma-separated (default {','.join(map(str, bench.FULL_SIZES))})",
    )
    p.add_argument(
        "--contexts", default=None, help=f"decode contexts (default {','.join(map(str, bench.FULL_CONTEXTS))})"
    )
    p.add_argument("--cases", default=None, help="only these attention cases, comma-separated (default: all)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds per size (default 5; 3 with --quick)")
    p.add_argument("--only", choices=("attention", "decode"), default=None, help="run one half")
    p.add_argument("--no-memory", action="store_true", help="skip the per-case peak-memory subprocesses")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's choice). On a shared, oversubscribed machine 1 thread "
        "gives stable timings: OpenMP threads that wait for a descheduled peer can be 10x slower",
    )
    p.add_argument(
        "--clock",
        choices=tuple(bench.CLOCKS),
        default="wall",
        help="wall time (default) or process CPU time (steadier when other jobs share the cores; use with --threads 1)",
    )
    p.add_argument("--out", type=Path, default=Path("runs") / "bench", help="output folder (default runs/bench)")
    p.add_argument(
        "--from-results",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: re-render report.md, the targets and bench.png from a results.json",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    paths.output_folder(args.out, "--out")
    if args.from_results is not None:
        return bench.rerender(args.from_results, args.out)
    sizes = parse_sizes(args.sizes) if args.sizes else list(bench.QUICK_SIZES if args.quick else bench.FULL_SIZES)
    contexts = (
        parse_sizes(args.contexts, "--contexts")
        if args.contexts
        else list(bench.QUICK_CONTEXTS if args.quick else bench.FULL_CONTEXTS)
    )
    repeats = positive_int("--repeats", args.repeats if args.repeats is not None else (3 if args.quick else 5))
    cases = bench.find_cases([c.strip() for c in args.cases.split(",")]) if args.cases else None
    if args.threads is not None:
        positive_int("--threads", args.threads)
        torch.set_num_threads(args.threads)
        os.environ[bench.THREADS_ENV] = str(args.threads)  # the memory workers follow
    bench.set_clock(args.clock)
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])  # exactly what was run
    bench.run_bench(args.out, sizes, contexts, repeats, cases, args.only, memory=not args.no_memory, command=command)
    return 0
