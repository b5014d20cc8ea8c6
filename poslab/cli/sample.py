"""``poslab sample RUN --prompt 白日依山尽 --tokens 64 [--temperature --top-k --top-p --seed --max-len]``."""

from __future__ import annotations

import argparse

from poslab.nn.generate import Sampling, sample_text
from poslab.runs import load_run, resolve_run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample", help="sample text from a trained run (KV-cached decoding)")
    p.add_argument("run", help="run folder, or a run name under runs/")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens to sample (default 64)")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature, 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep the smallest set with mass p")
    p.add_argument("--seed", type=int, default=None, help="random seed (same seed -> same text)")
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="stop when prompt + sample reach this many tokens (default: the model's block_size)",
    )
    p.add_argument("--num-samples", type=int, default=1, help="independent samples (default 1)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    model, tokenizer, _ = load_run(resolve_run(args.run), step=args.step)
    texts = sample_text(
        model,
        tokenizer,
        args.prompt,
        args.tokens,
        num_samples=args.num_samples,
        sampling=sampling,
        max_len=args.max_len,
        seed=args.seed,
    )
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        print(text)
    return 0
