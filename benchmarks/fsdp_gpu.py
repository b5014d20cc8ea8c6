"""DDP vs FSDP2 on GPUs (nccl): equivalence, tokens/s and peak memory per GPU, MFU.

The script launches ``poslab.session.train`` under ``torchrun --standalone`` itself (one process per
GPU; ``poslab.training.distributed`` picks ``nccl`` and ``cuda:LOCAL_RANK``), in three parts:

1. **Equivalence** (fp32, TF32 off, the tiny model, 20 steps): 1 GPU x batch N*b vs N GPUs x batch b
   (DDP) vs N GPUs x batch b with ``--fsdp``: the loss after 20 steps and the final val loss must
   agree to ``--tol`` (default 1e-4: GPU reductions are not bitwise reproducible across layouts).
   With a single GPU the three are 1 x N*b, DDP(1) and FSDP(1).
2. **Throughput** (bf16 autocast, default GPT-2-small shape 12/12/768, T=1024, batch 16 per GPU,
   char-level tinyshakespeare, 60 steps): DDP and FSDP, alternating, ``--rounds`` rounds; tokens/s
   is the median over each run's logging intervals (the first dropped), total and per GPU.
3. **Memory and MFU**: every rank reports ``torch.cuda.max_memory_allocated`` after its run; MFU per
   GPU = tokens/s per GPU x the run's FLOPs per token (PaLM's ``6N + 12 L d T``) / the bf16 matmul
   peak measured on that GPU (8192^3 matmuls). ``poslab train``'s own ``mfu`` field is against a CPU
   matmul peak and is not used here.

    .venv/bin/python benchmarks/fsdp_gpu.py                         # every visible GPU
    .venv/bin/python benchmarks/fsdp_gpu.py --nproc 2 --quick --out runs/bench/fsdp_gpu.json
    .venv/bin/python benchmarks/fsdp_gpu.py --cpu-smoke             # the same flow on CPU/gloo, tiny sizes

``--cpu-smoke`` hides the GPUs (``CUDA_VISIBLE_DEVICES=``) and runs the identical flow with 2 CPU
processes on gloo and a tiny model: a check of the script, not a measurement. Without CUDA (and
without ``--cpu-smoke``) the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "dropout": 0.0}


def worker(spec_path: str) -> int:
    """Under torchrun: one training run, then this rank's peak memory (and rank 0: the GPU matmul peak)."""
    import torch

    from poslab.session import train
    from poslab.training.config import TrainConfig

    spec = json.loads(Path(spec_path).read_text())
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the equivalence part
        torch.backends.cudnn.allow_tf32 = False
    cfg = TrainConfig.from_dict(spec["config"])
    results = train(cfg, progress=False, fsdp=spec["fsdp"])
    rank = int(os.environ.get("RANK", "0"))
    report = {"rank": rank, "results": results if rank == 0 else None, "max_memory_allocated": None, "peak_flops": None}
    if torch.cuda.is_available():
        report["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        if rank == 0 and spec.get("measure_peak"):
            report["peak_flops"] = gpu_matmul_peak()
    Path(spec["report_dir"], f"rank{rank}.json").write_text(json.dumps(report))
    return 0


def gpu_matmul_peak(n: int = 8192, seconds: float = 1.0) -> float:
    """Best bf16 FLOP/s of an ``n x n @ n x n`` matmul on the current GPU."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ b
        end.record()
        torch.cuda.synchronize()
        best = max(best, 10 * 2.0 * n**3 / (start.elapsed_time(end) / 1e3))
    return best


def launch(nproc: int, config: dict, fsdp: bool, work: Path, tag: str, env: dict, measure_peak: bool = False) -> dict:
    """Run one configuration under torchrun; returns rank 0's results and every rank's peak memory."""
    report_dir = work / f"report-{tag}"
    report_dir.mkdir(parents=True)
    spec = {
        "config": {**config, "name": tag, "out_dir": str(work / "runs")},
        "fsdp": fsdp,
        "report_dir": str(report_dir),
        "measure_peak": measure_peak,
    }
    spec_path = work / f"{tag}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        str(Path(__file__).resolve()),
        "--worker",
        str(spec_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], file=sys.stderr)
        raise SystemExit(f"{tag} failed (exit {done.returncode})")
    reports = [json.loads((report_dir / f"rank{r}.json").read_text()) for r in range(nproc)]
    run_dir = work / "runs" / tag
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    return {
        "results": reports[0]["results"],
        "metrics": records,
        "tokens_per_s": statistics.median(rates[1:] if len(rates) > 1 else rates),
        "max_memory_allocated": [r["max_memory_allocated"] for r in reports],
        "peak_flops": reports[0]["peak_flops"],
    }


def loss_at(run: dict, step: int) -> float:
    return next(r["loss"] for r in run["metrics"] if r["step"] == step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=None, help="GPUs to use (default: all visible)")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same flow on CPU/gloo with tiny sizes")
    parser.add_argument("--quick", action="store_true", help="1 throughput round of 30 steps")
    parser.add_argument("--rounds", type=int, default=None, help="throughput rounds (default 2; --quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="throughput steps (default 60; --quick 30)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16, help="sequences per GPU per step (throughput part)")
    parser.add_argument("--position", default="rope", help="position scheme of the throughput model (default rope)")
    parser.add_argument("--tol", type=float, default=None, help="equivalence tolerance (default 1e-4; 1e-5 on CPU)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)

    import torch

    env = {**os.environ}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if args.cpu_smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = "1"
        nproc, device = args.nproc or 2, "cpu (gloo) smoke test"
        big = {**TINY, "position": args.position}
        batch, dtype, tol = 4, "fp32", args.tol or 1e-5
        steps, rounds = args.steps or 10, args.rounds or 1
    else:
        if not torch.cuda.is_available():
            print(
                "fsdp_gpu: no CUDA device here; this script measures DDP/FSDP on GPUs with nccl. "
                "Run `benchmarks/fsdp_gpu.py --cpu-smoke` to check the flow on CPU, and "
                "`benchmarks/ddp_throughput.py` for CPU throughput.",
                file=sys.stderr,
            )
            return 2
        count = torch.cuda.device_count()
        nproc = args.nproc or count
        if not 1 <= nproc <= count:
            print(f"fsdp_gpu: --nproc {nproc} but {count} GPU(s) are visible", file=sys.stderr)
            return 2
        device = f"{nproc} x {torch.cuda.get_device_name(0)}"
        big = {
            "n_layer": args.layers,
            "n_head": args.heads,
            "n_embd": args.embd,
            "block_size": args.block,
            "dropout": 0.0,
            "bias": False,
            "position": args.position,
        }
        batch, dtype, tol = args.batch, "bf16", args.tol or 1e-4
        steps, rounds = args.steps or (30 if args.quick else 60), args.rounds or (1 if args.quick else 2)
    print(f"device: {device}; torch {torch.__version__}")
    common = {
        "corpus": "shakespeare",
        "tokenizer": "char",
        "lr": 1e-3,
        "min_lr": 1e-4,
        "warmup_steps": 5,
        "eval_iters": 2,
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "seed": 3,
    }
    summary: dict = {"device": device, "nproc": nproc, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="fsdp_gpu_") as tmp:
        work = Path(tmp)
        # 1. equivalence ------------------------------------------------------------------------------
        b = 4
        eq = {
            **common,
            "model": TINY,
            "max_steps": 20,
            "lr_decay_steps": 20,
            "eval_interval": 20,
            "log_interval": 5,
            "dtype": "fp32",
        }
        ref = launch(1, {**eq, "batch_size": nproc * b}, False, work, "eq-ref", env)
        ddp = launch(nproc, {**eq, "batch_size": b}, False, work, "eq-ddp", env)
        fsdp = launch(nproc, {**eq, "batch_size": b}, True, work, "eq-fsdp", env)
        rows = []
        for label, run in (("DDP", ddp), ("FSDP2", fsdp)):
            d_loss = abs(loss_at(run, 20) - loss_at(ref, 20))
            d_val = abs(run["results"]["final_val_loss"] - ref["results"]["final_val_loss"])
            rows.append(
                {"case": label, "loss_20_diff": d_loss, "final_val_diff": d_val, "ok": max(d_loss, d_val) < tol}
            )
        print(
            f"\nequivalence: 1 process x batch {nproc * b} vs {nproc} processes x batch {b} "
            f"(fp32, 20 steps, tol {tol:g})"
        )
        print("| case | loss@20 diff | final val diff | within tol |\n|---|---|---|---|")
        for row in rows:
            print(f"| {row['case']} | {row['loss_20_diff']:.2e} | {row['final_val_diff']:.2e} | {row['ok']} |")
        summary["equivalence"] = {"tol": tol, "reference_loss_20": loss_at(ref, 20), "cases": rows}

        # 2. throughput and memory -------------------------------------------------------------------
        tp = {
            **common,
            "model": big,
            "max_steps": steps,
            "lr_decay_steps": steps,
            "eval_interval": steps,
            "log_interval": max(steps // 6, 1),
            "batch_size": batch,
            "dtype": dtype,
        }
        runs: dict[str, list[dict]] = {"DDP": [], "FSDP2": []}
        for round_index in range(rounds):
            order = ["DDP", "FSDP2"] if round_index % 2 == 0 else ["FSDP2", "DDP"]
            for label in order:
                run = launch(
                    nproc, tp, label == "FSDP2", work, f"tp-{label}-{round_index}", env, measure_peak=not args.cpu_smoke
                )
                runs[label].append(run)
                print(f"round {round_index + 1}: {label:<6} {run['tokens_per_s']:,.0f} tokens/s total", flush=True)
        print(f"\nthroughput: {big}, batch {batch} per process, {dtype}, {steps} steps, {rounds} round(s)")
        print("| case | tokens/s total | per GPU | peak memory per GPU (GiB) | MFU per GPU |\n|---|---|---|---|---|")
        summary["throughput"] = {"model": big, "batch_per_process": batch, "dtype": dtype, "steps": steps, "cases": []}
        for label, label_runs in runs.items():
            total = statistics.median(r["tokens_per_s"] for r in label_runs)
            memory = [m for r in label_runs for m in r["max_memory_allocated"] if m is not None]
            peaks = [r["peak_flops"] for r in label_runs if r["peak_flops"]]
            flops_per_token = label_runs[0]["results"]["flops_per_token"]
            mfu = (total / nproc * flops_per_token / statistics.median(peaks)) if peaks else None
            gib = max(memory) / 2**30 if memory else None
            print(
                f"| {label} | {total:,.0f} | {total / nproc:,.0f} | {'-' if gib is None else f'{gib:.2f}'} | "
                f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} |"
            )
            summary["throughput"]["cases"].append(
                {
                    "case": label,
                    "tokens_per_s_total": total,
                    "tokens_per_s_per_gpu": total / nproc,
                    "rounds": [r["tokens_per_s"] for r in label_runs],
                    "max_memory_allocated_bytes": max(memory) if memory else None,
                    "gpu_bf16_matmul_peak_flops": statistics.median(peaks) if peaks else None,
                    "mfu_per_gpu": mfu,
                    "flops_per_token": flops_per_token,
                }
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.out}")
    failed = [row["case"] for row in summary["equivalence"]["cases"] if not row["ok"]]
    if failed:
        print(f"fsdp_gpu: equivalence outside tolerance for {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
