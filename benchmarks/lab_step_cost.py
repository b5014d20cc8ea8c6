"""What one training step of the quick lab's models costs, fp32 or bf16.

The quick lab's time is its trainings (docs/lab.md): position-training's language models (4 layers,
4 heads, width 64, 16 windows of 64 tokens, ``poslab.lab.scale.SIZES["quick"]``) and the probes' tiny
models (``poslab.lab.experiments.probes.FORMS["quick"]``: reverse at L = 5, batch 128). This script
times full training steps of both, contenders alternating round by round in one process on one
thread, on the process CPU clock (``time.process_time``: other work on the machine does not inflate
it), median over rounds, reported as milliseconds per *model*-step:

* ``single fp32`` / ``single bf16``: one model, forward with loss, backward, clipping, fused AdamW
  (bf16: under CPU autocast, what ``dtype: auto`` runs where it picks bf16).

    PYTHONPATH=. .venv/bin/python benchmarks/lab_step_cost.py --json benchmarks/results/lab_step_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from poslab.analysis.probes import build_model, training_batch
from poslab.lab.experiments.probes import FORMS
from poslab.lab.scale import SIZES
from poslab.nn.model import GPT, GPTConfig


def _lm_models(scheme: str, seeds: range) -> list[GPT]:
    size = SIZES["quick"]
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        config = GPTConfig(
            vocab_size=65,  # tinyshakespeare's characters
            n_layer=size.n_layer,
            n_head=size.n_head,
            n_embd=size.n_embd,
            block_size=size.train_length,
            dropout=0.0,
            bias=False,
            embed_scale=float(size.n_embd) ** 0.5,
            position=scheme,
        )
        models.append(GPT(config))
    return models


def _single_step(model: GPT, batch: Callable[[], tuple], bf16: bool) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step() -> None:
        idx, targets = batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(idx)  # [B, T, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def contenders() -> dict[str, tuple[Callable[[], None], int]]:
    """name -> (one step, models it trains)."""
    size = SIZES["quick"]
    g = torch.Generator().manual_seed(0)

    def lm_batch() -> tuple:
        tokens = torch.randint(0, 65, (size.batch_size, size.train_length + 1), generator=g)  # [B, T + 1]
        return tokens[:, :-1], tokens[:, 1:]

    form = FORMS["quick"]
    task, recipe = form.recipe.task("reverse", form.train_size), form.recipe

    def probe_batch() -> tuple:
        # a batch of the recipe's last step: every training size, padded to the longest
        return training_batch(task, recipe, recipe.steps - 1, g)

    out: dict[str, tuple[Callable[[], None], int]] = {}
    for scheme in ("rope", "none"):
        out[f"lm {scheme} single fp32"] = (_single_step(_lm_models(scheme, range(1))[0], lm_batch, False), 1)
        out[f"lm {scheme} single bf16"] = (_single_step(_lm_models(scheme, range(1))[0], lm_batch, True), 1)
    out["probe rope single fp32"] = (_single_step(build_model(task, "rope", recipe, 0), probe_batch, False), 1)
    return out


def profile(step: Callable[[], None], steps: int = 20) -> None:
    """Print the share of self CPU time of the operators of ``steps`` calls of ``step`` (``torch.profiler``)."""
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        step()
    with torch_profile() as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    shares: dict[str, float] = {}
    for e in events:
        name = e.key
        group = (
            "matmul (aten::mm, aten::bmm)"
            if name in ("aten::mm", "aten::bmm")
            else "SDPA kernels (forward and backward)"
            if "scaled_dot_product" in name
            else "GELU (forward and backward)"
            if name in ("aten::gelu", "aten::gelu_backward")
            else "everything else"
        )
        shares[group] = shares.get(group, 0.0) + e.self_cpu_time_total / total
    for group, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"{group:40s} {share:6.1%} of the self CPU time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per contender per round")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="only: where the single fp32 RoPE LM step's time goes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = contenders()
    if args.profile:
        profile(steps["lm rope single fp32"][0])
        return
    for fn, _ in steps.values():  # warm-up: allocator, oneDNN primitives
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (fn, models) in steps.items():
            start = time.process_time()
            for _ in range(args.steps):
                fn()
            times[name].append((time.process_time() - start) / args.steps / models * 1000)
    median = {name: statistics.median(v) for name, v in times.items()}
    for name, ms in median.items():
        base = name.split(" single")[0] + " single fp32"
        print(f"{name:28s} {ms:7.2f} ms per model-step (CPU)   x{median[base] / ms:.2f} vs {base}")
    if args.json:
        record = {
            "command": "benchmarks/lab_step_cost.py "
            + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json"),
            "torch": torch.__version__,
            "threads": 1,
            "clock": "process CPU time",
            "load_average": round(os.getloadavg()[0], 2),
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "ms_per_model_step": {k: round(v, 3) for k, v in median.items()},
            "rounds": {k: [round(x, 3) for x in v] for k, v in times.items()},
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
