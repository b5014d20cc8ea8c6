"""Side-by-side timing of two poslab trees: the attention call and the training step, alternating.

Two worker processes import poslab from two trees (``--before``, default ``/work/baseline``, and
``--after``, default this checkout), one thread each. For every round and every item the two are
asked in turn (the order flips each round) to run ``--reps`` timed repetitions, measured in process
CPU time (``time.process_time``: what other jobs on a shared machine take is not counted). The
items are ``poslab bench``'s attention cases (forward + backward, B=8, h=4, d_k=32, causal, fp32)
at ``--sizes`` and ``benchmarks/train_throughput.py``'s training step (4/4/128, T=128, B=32, fp32,
AdamW) for ``--train`` schemes. Prints a markdown table of medians and after/before ratios.

    .venv/bin/python benchmarks/attention_ab.py --rounds 5 --reps 3 --json /tmp/ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(tree: str) -> None:
    """Answer one JSON request per stdin line with the per-repetition CPU seconds."""
    import torch

    torch.set_num_threads(1)
    from poslab.bench import build_case, find_cases

    spec = importlib.util.spec_from_file_location("train_throughput", Path(tree) / "benchmarks" / "train_throughput.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    built: dict[str, object] = {}
    for line in sys.stdin:
        req = json.loads(line)
        key = json.dumps(req["item"])
        if key not in built:
            kind, name, T = req["item"]
            if kind == "attn":
                built[key] = build_case(find_cases([name])[0], T)
            else:
                built[key] = train.poslab_step_fn(4, 4, 128, 128, 32, position=name)[0]
            built[key]()  # warm-up
        step = built[key]
        times = []
        for _ in range(req["reps"]):
            t0 = time.process_time()
            step()
            times.append(time.process_time() - t0)
        print(json.dumps(times), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="/work/baseline")
    parser.add_argument("--after", default=str(HERE.parent))
    parser.add_argument("--sizes", default="256,1024")
    parser.add_argument(
        "--cases",
        default="poslab:none,poslab:rope,poslab:alibi,poslab:t5,poslab:none-window256,"
        "poslab:rope+sinks,poslab:rope+softcap,poslab:rope+chunk",
    )
    parser.add_argument("--train", default="rope,alibi")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    items = [["attn", c, int(T)] for T in args.sizes.split(",") for c in args.cases.split(",") if c]
    items += [["train", p, 128] for p in args.train.split(",") if p]
    procs = {}
    for side, tree in (("before", args.before), ("after", args.after)):
        env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
        procs[side] = subprocess.Popen(
            [sys.executable, __file__, "--worker", tree],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tree,
        )
    times: dict[str, dict[str, list[float]]] = {json.dumps(i): {"before": [], "after": []} for i in items}
    for r in range(args.rounds):
        for n, item in enumerate(items):
            order = ("before", "after") if (r + n) % 2 == 0 else ("after", "before")
            for side in order:
                p = procs[side]
                p.stdin.write(json.dumps({"item": item, "reps": args.reps}) + "\n")
                p.stdin.flush()
                times[json.dumps(item)][side] += json.loads(p.stdout.readline())
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        table = report(items, times)
        if args.json:  # after every round, so a cut-short run keeps what it measured
            Path(args.json).write_text(json.dumps({"rounds": r + 1, "table": table, "times": times}, indent=1))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    print(table)
    return 0


def report(items: list, times: dict) -> str:
    """The markdown table of medians (ms) and after/before ratios."""
    lines = ["| item | before ms | after ms | after / before |", "|:---|---:|---:|---:|"]
    for item in items:
        t = times[json.dumps(item)]
        b, a = statistics.median(t["before"]) * 1e3, statistics.median(t["after"]) * 1e3
        label = f"attention fwd+bwd {item[1]} T={item[2]}" if item[0] == "attn" else f"training step {item[1]} 4/4/128"
        lines.append(f"| {label} | {b:.1f} | {a:.1f} | {a / b:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
