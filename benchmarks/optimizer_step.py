"""Optimizer step time at nanoGPT's CPU size (4/4/128, vocabulary 65): fused vs foreach vs per-tensor AdamW, and Muon.

Only ``optimizer.step()`` is timed (gradients are fixed random tensors), alternating the
contenders round by round, median over rounds; the share of a whole training step comes from
``train_throughput.py``. One thread by default (the machine is shared).

    .venv/bin/python benchmarks/optimizer_step.py --json benchmarks/results/optimizer_step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from poslab import GPT, GPTConfig
from poslab.nn.gpt_config import MLPConfig
from poslab.training.config import TrainConfig
from poslab.training.optim import make_optimizer


def build(kind: str) -> tuple[torch.optim.Optimizer, GPT]:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=65,
            n_layer=4,
            n_head=4,
            n_embd=128,
            block_size=64,
            bias=False,
            position="rope",
            mlp=MLPConfig(activation="gelu"),
        )
    )
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    if kind == "muon":
        return make_optimizer(model, TrainConfig(name="b", optimizer="muon")), model
    opt = make_optimizer(model, TrainConfig(name="b"))  # fused
    if kind != "fused":
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), foreach=kind == "foreach")
    return opt, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kinds = ["fused", "foreach", "loop", "muon"]
    opts = {k: build(k)[0] for k in kinds}
    for opt in opts.values():
        opt.step()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for k, opt in opts.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                opt.step()
            times[k].append((time.perf_counter() - start) / args.steps)
    rows = {k: {"ms_median": 1e3 * statistics.median(v), "ms_min": 1e3 * min(v)} for k, v in times.items()}
    for k, r in rows.items():
        print(
            f"  {k:8s} step {r['ms_median']:.3f} ms median ({r['ms_min']:.3f} best); "
            f"{rows['loop']['ms_median'] / r['ms_median']:.2f}x the per-tensor loop"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"threads": args.threads, "rows": rows, "load_average": list(__import__("os").getloadavg())}, indent=2
            )
        )


if __name__ == "__main__":
    main()
