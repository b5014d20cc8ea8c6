"""``poslab convert --from-hf DIR --out RUN_DIR [--corpus NAME] [--dtype D]``: a Hugging Face folder -> a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.interop.convert import DTYPES, convert_hf_folder
from poslab.interop.hf import SUPPORTED
from poslab.runs import RunFolder


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face model folder into a poslab run folder (offline)")
    p.add_argument(
        "--from-hf",
        dest="from_hf",
        type=Path,
        required=True,
        metavar="DIR",
        help=f"local folder with config.json + model.safetensors ({', '.join(SUPPORTED)})",
    )
    p.add_argument("--out", type=Path, required=True, metavar="RUN_DIR", help="run folder to create, e.g. runs/NAME")
    p.add_argument(
        "--corpus", default="shakespeare", help="corpus `poslab eval` scores the run on (default shakespeare)"
    )
    p.add_argument(
        "--dtype", default="source", choices=list(DTYPES), help="stored weight dtype (default: the checkpoint's)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run = convert_hf_folder(args.from_hf, args.out, corpus=args.corpus, dtype=args.dtype)
    folder = RunFolder(run)
    cfg = folder.config()["model"]
    kind = folder.tokenizer().to_dict()["type"]
    print(
        f"converted {args.from_hf} -> {run}: {cfg['n_layer']} layers, {cfg['n_head']} heads, n_embd {cfg['n_embd']}, "
        f"position {cfg['position']}, vocab {cfg['vocab_size']}"
    )
    if kind == "ids":
        print(
            "the folder has no tokenizer: prompts are token ids, e.g. "
            f"poslab sample {run} --prompt '1 2 3' --temperature 0"
        )
    else:
        print(f"try: poslab sample {run} --prompt 'Hello' --temperature 0")
    return 0
