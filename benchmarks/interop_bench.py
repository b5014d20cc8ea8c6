"""Forward throughput of a converted Llama-style model: poslab vs transformers (``attn_implementation="sdpa"``).

One random-weight ``LlamaForCausalLM`` (default 4 layers, d 256, 8 heads, SwiGLU 688, vocab 32000,
RoPE) is converted with ``poslab.from_hf``; the two models are first checked to give the same
logits (1e-4), then timed on the same token batches: inference-mode forward passes over
``[batch, T]`` tokens returning the full logits. Contenders alternate (A B A B ...), ``--reps``
rounds of ``--iters`` forwards each after a warmup, and the table reports the median tokens/s over
the rounds and their spread (min-max), so a burst of load from other processes hits both sides
alike. The machine may be shared: look at the spread, and rerun when it is large.

    .venv/bin/python benchmarks/interop_bench.py                   # T 1024, batch 1, 2 threads
    .venv/bin/python benchmarks/interop_bench.py --quick           # fewer rounds
    .venv/bin/python benchmarks/interop_bench.py --seq 512 --batch 4 --vocab 256 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import poslab


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, poslab.GPT]:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=max(args.seq, 2048),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="sdpa",
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norms too, so the equality check below is meaningful
        for p in hf.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)
    ours = poslab.from_hf(hf)
    return hf, ours


def timed(fn: Callable[[], object], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA key/value heads (default: heads)")
    parser.add_argument("--ffn", type=int, default=688)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5, help="forwards per round")
    parser.add_argument("--reps", type=int, default=9, help="alternating rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 forwards")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.reps = 2, 3
    if args.threads:
        torch.set_num_threads(args.threads)

    hf, ours = build(args)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected, got = hf(idx).logits, ours(idx)
        max_diff = float((expected - got).abs().max())
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

        contenders: dict[str, Callable[[], object]] = {
            "poslab GPT (from_hf, sdpa)": lambda: ours(idx),
            "transformers LlamaForCausalLM (sdpa)": lambda: hf(idx).logits,
        }
        for fn in contenders.values():  # warmup
            timed(fn, 2)
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        tokens = args.batch * args.seq * args.iters
        for _ in range(args.reps):
            for name, fn in contenders.items():
                rates[name].append(tokens / timed(fn, args.iters))

    rows = []
    print(
        f"\nforward tokens/s, {args.layers} layers, d {args.d}, {args.heads} heads (kv {args.kv_heads or args.heads}), "
        f"ffn {args.ffn}, vocab {args.vocab}, T {args.seq}, batch {args.batch}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, transformers {transformers.__version__}; logits max |diff| {max_diff:.2e}"
    )
    print(f"{'model':40s} {'median tok/s':>13s} {'min':>9s} {'max':>9s}")
    for name, values in rates.items():
        median = statistics.median(values)
        rows.append(
            {"model": name, "median_tokens_per_s": median, "min": min(values), "max": max(values), "rounds": values}
        )
        print(f"{name:40s} {median:13,.0f} {min(values):9,.0f} {max(values):9,.0f}")
    ratio = rows[0]["median_tokens_per_s"] / rows[1]["median_tokens_per_s"]
    print(f"poslab / transformers: {ratio:.2f}x (median of {args.reps} alternating rounds of {args.iters} forwards)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"out": str(args.out)},
                    "max_abs_logit_diff": max_diff,
                    "ratio": ratio,
                    "results": rows,
                },
                indent=2,
            )
        )
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
