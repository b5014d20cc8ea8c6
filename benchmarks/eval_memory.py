"""Peak resident memory of evaluating one window of T tokens, for every position scheme.

Each case runs in a fresh subprocess (so one case's peak cannot hide another's): it imports poslab,
builds the lab's quick-size GPT (2 layers, 4 heads, n_embd 64, vocab 65, random weights; the learned
table gets T rows, as a model trained at T would have), reads ``ru_maxrss`` (the baseline: imports +
model + tokens), runs :func:`poslab.analysis.eval.evaluate_length` on one window of ``T`` tokens (non-overlapping,
``torch.no_grad``), and reads ``ru_maxrss`` again. The *evaluation peak* is the difference.

Linear memory means the peak grows about 4x from T = 2048 to 8192; materialising ``[h, T, T]`` would
grow it 16x. The verdict per scheme is "linear" when the ratio is below 8 (the geometric midpoint).
``--unblocked`` adds reference cases for the bias schemes with the attention's blocked path disabled
(``query_chunk`` above T, so all queries form one block), which show what quadratic memory looks like.

    .venv/bin/python benchmarks/eval_memory.py                     # every scheme at T = 2048, 8192
    .venv/bin/python benchmarks/eval_memory.py --lengths 1024,4096 --schemes alibi,t5 --unblocked
    .venv/bin/python benchmarks/eval_memory.py --out eval_memory.json
    .venv/bin/python benchmarks/eval_memory.py --allocator default   # glibc's default heap: the library path
    .venv/bin/python benchmarks/eval_memory.py --allocator default --train --schemes alibi   # one training step

``--allocator mmap`` (default) sets glibc's mmap threshold to 1 MiB in the child, exactly as
``poslab eval`` does (:func:`poslab.analysis.eval.return_freed_memory_to_os`): every freed bias tile goes back to
the OS. ``--allocator default`` keeps glibc's dynamic threshold, as any library user or training script
has; the blocked path runs its largest blocks first so that the heap does not fragment there either.
``--train`` measures one training step (forward + backward of the loss on one sequence) instead of
the evaluation.

Memory, unlike time, hardly depends on other processes, but the machine may be shared: the wall
times printed alongside are indicative only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SCHEMES = ("learned", "sinusoidal", "rope", "xpos", "alibi", "t5", "kerple", "fire", "xl", "none")


def child(scheme: str, length: int, unblocked: bool, allocator: str, train: bool = False) -> dict:
    """One case, in this (fresh) process: returns baseline and peak RSS in MiB."""
    import torch

    from poslab import GPT, GPTConfig
    from poslab.analysis.eval import evaluate_length, return_freed_memory_to_os

    if allocator == "mmap":
        return_freed_memory_to_os()  # what `poslab eval` does

    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=65,
        n_layer=2,
        n_head=4,
        n_embd=64,
        block_size=length if scheme == "learned" else 64,
        bias=False,
        position=scheme,
    )
    model = GPT(config).eval()
    if unblocked:
        for block in model.blocks:
            block.attn.query_chunk = 10 * length  # one block of all queries: one [B, h, T, T] bias per layer
    tokens = torch.randint(0, 65, (length + 1,), generator=torch.Generator().manual_seed(0))
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    start = time.perf_counter()
    if train:
        model.train()
        _, loss_tensor = model(tokens[None, :-1], tokens[None, 1:])
        loss_tensor.backward()
        loss = float(loss_tensor)
    else:
        loss = evaluate_length(model, tokens, length, length)["nonoverlapping"]["loss"]
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "scheme": scheme,
        "length": length,
        "unblocked": unblocked,
        "allocator": allocator,
        "train": train,
        "baseline_mib": baseline,
        "peak_mib": peak,
        "eval_peak_mib": peak - baseline,
        "seconds": seconds,
        "loss": loss,
        "threads": torch.get_num_threads(),
    }


def run_case(scheme: str, length: int, unblocked: bool, allocator: str, train: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", scheme, str(length), "--allocator", allocator]
    cmd += (["--unblocked"] if unblocked else []) + (["--train"] if train else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {
            "scheme": scheme,
            "length": length,
            "unblocked": unblocked,
            "allocator": allocator,
            "error": f"exit {proc.returncode}: {tail}",
        }
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192", help="two or more window lengths T")
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument(
        "--unblocked", action="store_true", help="also the reference cases without the blocked path (bias schemes)"
    )
    parser.add_argument(
        "--allocator",
        choices=("mmap", "default"),
        default="mmap",
        help="mmap: large blocks returned to the OS when freed, as `poslab eval` sets it (default); "
        "default: glibc's dynamic threshold, whose heap fragmentation inflates the peak",
    )
    parser.add_argument(
        "--train", action="store_true", help="one training step (forward + backward) instead of the evaluation"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the cases and verdicts as JSON")
    parser.add_argument("--child", nargs=2, metavar=("SCHEME", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.unblocked, args.allocator, args.train)))
        return 0

    lengths = [int(x) for x in args.lengths.split(",")]
    if len(lengths) < 2 or any(t <= 0 for t in lengths):
        parser.error(f"--lengths needs two or more positive integers, got {args.lengths!r}")
    schemes = [s for s in args.schemes.split(",") if s]
    unknown = sorted(set(schemes) - set(SCHEMES))
    if unknown:
        parser.error(f"unknown schemes {unknown}; choose from {', '.join(SCHEMES)}")
    variants = [(s, False) for s in schemes]
    if args.unblocked:
        from poslab import positions

        variants += [(s, True) for s in schemes if positions.get(s).has_bias]
    cases = []
    for scheme, unblocked in variants:
        for length in lengths:
            case = run_case(scheme, length, unblocked, args.allocator, args.train)
            cases.append(case)
            label = scheme + (" (unblocked)" if unblocked else "")
            if "error" in case:
                print(f"{label:22s} T={length:6d}  {case['error']}", flush=True)
            else:
                print(
                    f"{label:22s} T={length:6d}  baseline {case['baseline_mib']:7.1f} MiB  "
                    f"eval peak +{case['eval_peak_mib']:8.1f} MiB"
                    f"  {case['seconds']:6.1f} s",
                    flush=True,
                )

    lo, hi = min(lengths), max(lengths)
    print(
        f"\npeak growth from T={lo} to T={hi} (x{hi / lo:g} tokens): "
        f"linear ~x{hi / lo:g}, quadratic ~x{(hi / lo) ** 2:g}"
    )
    verdicts = []
    threshold = (hi / lo) ** 1.5  # geometric midpoint of linear and quadratic growth
    for scheme, unblocked in variants:
        by_length = {c["length"]: c for c in cases if c["scheme"] == scheme and c["unblocked"] == unblocked}
        small, large = by_length.get(lo, {}), by_length.get(hi, {})
        label = scheme + (" (unblocked)" if unblocked else "")
        if "eval_peak_mib" not in small or "eval_peak_mib" not in large:
            verdicts.append({"scheme": scheme, "unblocked": unblocked, "verdict": "error"})
            print(f"  {label:22s} error")
            continue
        growth = large["eval_peak_mib"] / max(small["eval_peak_mib"], 1.0)
        verdict = "linear" if growth < threshold else "quadratic"
        verdicts.append(
            {
                "scheme": scheme,
                "unblocked": unblocked,
                "growth": growth,
                "verdict": verdict,
                f"eval_peak_mib_{lo}": small["eval_peak_mib"],
                f"eval_peak_mib_{hi}": large["eval_peak_mib"],
            }
        )
        print(
            f"  {label:22s} +{small['eval_peak_mib']:7.1f} -> +{large['eval_peak_mib']:8.1f} MiB  "
            f"x{growth:5.2f}  {verdict}"
        )
    if args.out:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "lengths": lengths,
                    "allocator": args.allocator,
                    "threshold": threshold,
                    "cases": cases,
                    "verdicts": verdicts,
                },
                indent=2,
            )
        )
        tmp.replace(args.out)
    blocked_ok = all(v["verdict"] == "linear" for v in verdicts if not v["unblocked"])
    return 0 if blocked_ok else 1


if __name__ == "__main__":
    sys.exit(main())
