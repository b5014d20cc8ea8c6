"""``poslab eval RUN [--lengths L,..] [--stride S] [--rope-scaling NAME:F] [--logn-scaling] ...``: perplexity per
length."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.analysis import eval as evaluation
from poslab.cli import paths
from poslab.nn.positions.rope import SPEC_NAMES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="perplexity of a trained run per evaluation length (length extrapolation)")
    p.add_argument("run", type=Path, help="run folder (runs/NAME)")
    p.add_argument("--lengths", default="64,128,256,512,1024", help="comma-separated evaluation lengths")
    p.add_argument(
        "--stride", type=int, default=None, help="also a sliding-window evaluation with this stride (<= every length)"
    )
    p.add_argument(
        "--rope-scaling",
        default=None,
        metavar="NAME:FACTOR",
        help=f"RoPE scaling applied at inference: none, "
        f"{', '.join(s + ':4' for s in SPEC_NAMES[1:] if s != 'longrope')}, "
        "longrope:FACTOR:l1,l2,..[:s1,s2,..] or longrope:PATH.json",
    )
    p.add_argument(
        "--logn-scaling", action="store_true", help="scale queries by log(n)/log(L) past the training length"
    )
    p.add_argument(
        "--split",
        default="val",
        help="text to score: the run's 'val' (default) or 'train' split, or a corpus name / UTF-8 file path",
    )
    p.add_argument("--tokens", type=int, default=None, help="targets scored at every length (default: the whole split)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from poslab.display import print_table
    from poslab.fileio import atomic_write_json

    paths.output_file(args.out, "--out")
    lengths = evaluation.parse_lengths(args.lengths)
    evaluation.return_freed_memory_to_os()
    if args.stride is not None:
        evaluation.check_stride(args.stride, min(lengths))
    scaling = evaluation.parse_rope_scaling(args.rope_scaling) if args.rope_scaling is not None else None
    results = evaluation.eval_run(
        args.run,
        lengths,
        stride=args.stride,
        rope_scaling=scaling,
        logn_scaling=args.logn_scaling,
        split=args.split,
        n_targets=args.tokens,
        step=args.step,
    )
    title = f"{args.run} ({results['scheme']}, trained at {results['train_length']}), {results['split']} split"
    if args.rope_scaling or args.logn_scaling:
        title += f", rope scaling {args.rope_scaling or 'as trained'}{' + log-n' if args.logn_scaling else ''}"
    print_table(*evaluation.results_table(results["lengths"]), title=title)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, results, allow_nan=False)  # strict JSON: no NaN/Infinity
        print(f"results in {args.out}")
    return 0
