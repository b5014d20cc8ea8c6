"""Training throughput of 1 process vs 2 data-parallel processes (torchrun, DDP over gloo) on the CPU.

Every measurement is a real ``poslab train`` run in fresh processes (the same code path a user
runs), on tinyshakespeare, fp32, with the same per-process batch in every case (weak scaling: 2
processes train twice the tokens per step). Three cases:

* ``1 proc x 2 threads``: one process using both cores (``--threads 2``);
* ``1 proc x 1 thread``: the single-thread baseline (what one DDP process has);
* ``2 procs x 1 thread``: ``torchrun --standalone --nproc_per_node 2 -m poslab train --threads 1``
  (``--fsdp`` adds ``2 procs x 1 thread, FSDP2``).

tokens/s is read from each run's ``metrics.jsonl``: the median over its logging intervals, the first
one (warm-up) dropped; evaluation, checkpoints and start-up are not in it. Totals count every
process's tokens; "per process" is the total over the number of processes. The cases run in
alternation, the order rotating each round, ``--rounds`` rounds; the table shows the median over
rounds and the spread (min-max). The load average before and after is printed: on a machine shared
with other work the figures move, so read the spread and rerun when it is wide.

On a 2-core machine 2 processes x 1 thread can at best match 1 process x 2 threads (the same two
cores do the same arithmetic), minus the gradient all-reduce and the duplicated Python overhead;
what DDP buys there is nothing but the check that it works. The speedup that matters is on a machine
with more cores or GPUs.

    .venv/bin/python benchmarks/ddp_throughput.py                     # 3 rounds, 60 steps, 4/4/128, T=128, B=16
    .venv/bin/python benchmarks/ddp_throughput.py --quick             # 2 rounds, 30 steps
    .venv/bin/python benchmarks/ddp_throughput.py --fsdp --out runs/bench/ddp_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "dropout": 0.0, "position": "learned"}


def case_command(
    case: dict, out: Path, name: str, steps: int, batch: int, log_interval: int, model: dict
) -> tuple[list[str], dict]:
    """The command line and environment of one run of ``case``."""
    train = [
        "train",
        "--preset",
        "tiny",
        "--corpus",
        "shakespeare",
        "--name",
        name,
        "--out_dir",
        str(out),
        "--max_steps",
        str(steps),
        "--lr_decay_steps",
        str(steps),
        "--warmup_steps",
        "10",
        "--batch_size",
        str(batch),
        "--eval_interval",
        str(steps),
        "--eval_iters",
        "1",
        "--log_interval",
        str(log_interval),
        "--ckpt_interval",
        "0",
        "--keep_checkpoints",
        "1",
        "--threads",
        str(case["threads"]),
        "--no-progress",
    ]
    for key, value in model.items():
        train += [f"--model.{key}", str(value)]
    if case.get("fsdp"):
        train.append("--fsdp")
    env = {**os.environ, "OMP_NUM_THREADS": str(case["threads"])}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if case["procs"] == 1:
        return [sys.executable, "-m", "poslab", *train], env
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(case["procs"])]
    return [*launcher, "-m", "poslab", *train], env


def measure(run_dir: Path) -> float:
    """Median tokens/s over the run's logging intervals, the first (warm-up) dropped."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    if len(rates) < 2:
        raise RuntimeError(f"{run_dir}: too few logged intervals ({len(rates)}); raise --steps")
    return statistics.median(rates[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 60; --quick 30)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per process per step (default 16)")
    parser.add_argument("--layers", type=int, default=MODEL["n_layer"])
    parser.add_argument("--heads", type=int, default=MODEL["n_head"])
    parser.add_argument("--embd", type=int, default=MODEL["n_embd"])
    parser.add_argument("--block", type=int, default=MODEL["block_size"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fsdp", action="store_true", help="also time 2 processes with FSDP2 (--fsdp)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    steps = args.steps or (30 if args.quick else 60)
    log_interval = max(steps // 6, 1)
    model = {**MODEL, "n_layer": args.layers, "n_head": args.heads, "n_embd": args.embd, "block_size": args.block}
    cases = [
        {"label": "1 proc x 2 threads", "procs": 1, "threads": 2},
        {"label": "1 proc x 1 thread", "procs": 1, "threads": 1},
        {"label": "2 procs x 1 thread (DDP)", "procs": 2, "threads": 1},
    ]
    if args.fsdp:
        cases.append({"label": "2 procs x 1 thread (FSDP2)", "procs": 2, "threads": 1, "fsdp": True})
    totals: dict[str, list[float]] = {c["label"]: [] for c in cases}
    load_before = os.getloadavg()
    print(
        f"cpus: {os.cpu_count()}, load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}"
    )
    print(
        f"model {model['n_layer']}/{model['n_head']}/{model['n_embd']}, T={model['block_size']}, batch {args.batch} "
        f"per process, {steps} steps, {rounds} rounds, fp32"
    )
    work = Path(tempfile.mkdtemp(prefix="ddp_throughput_"))
    try:
        for round_index in range(rounds):
            order = cases[round_index % len(cases) :] + cases[: round_index % len(cases)]
            for case in order:
                name = (
                    f"r{round_index}-{case['label'].split()[0]}-{case['label'].split()[2]}-"
                    f"{'fsdp' if case.get('fsdp') else 'x'}"
                )
                cmd, env = case_command(case, work, name, steps, args.batch, log_interval, model)
                start = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{case['label']} failed (exit {done.returncode})")
                rate = measure(work / name)
                totals[case["label"]].append(rate)
                print(
                    f"round {round_index + 1}: {case['label']:<28} {rate:>9.0f} tokens/s total "
                    f"({time.perf_counter() - start:.0f} s wall with start-up)",
                    flush=True,
                )
                shutil.rmtree(work / name, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    base2 = statistics.median(totals[cases[0]["label"]])
    base1 = statistics.median(totals[cases[1]["label"]])
    rows = []
    print()
    print("| case | tokens/s total (median) | per process | spread (min-max) | vs 1x2 threads | vs 1x1 thread |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        values = totals[case["label"]]
        median = statistics.median(values)
        row = {
            "case": case["label"],
            "processes": case["procs"],
            "threads_per_process": case["threads"],
            "fsdp": bool(case.get("fsdp")),
            "tokens_per_s_total": median,
            "tokens_per_s_per_process": median / case["procs"],
            "rounds": values,
            "vs_1proc_2threads": median / base2,
            "vs_1proc_1thread": median / base1,
        }
        rows.append(row)
        print(
            f"| {case['label']} | {median:,.0f} | {median / case['procs']:,.0f} "
            f"| {min(values):,.0f}-{max(values):,.0f} "
            f"| {median / base2:.2f}x | {median / base1:.2f}x |"
        )
    print(
        f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} "
        f"(a load above {os.cpu_count()} means other processes shared these cores)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "model": model,
                    "batch_per_process": args.batch,
                    "steps": steps,
                    "rounds": rounds,
                    "cpus": os.cpu_count(),
                    "load_average_before": load_before,
                    "load_average_after": load_after,
                    "cases": rows,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
