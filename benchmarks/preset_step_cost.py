"""Per-step cost of a preset's variants, side by side in one process, on the process CPU clock.

A lever that changes the model or the batch (a bigram table, another width or depth, another batch)
changes what a step costs; ``time_to_loss.py --no-nanogpt`` gives the steps it needs to the target,
this script the cost of each step relative to the preset's, so the estimate of its time is steps x
step cost without trusting wall-clock figures on a loaded machine. Each step is the loop's: a batch
of random windows of the preset's training split, forward with the loss (under the run's dtype), backward, gradient
clipping, the run's optimizer. Contenders alternate round by round (median over rounds, one thread
by default); ``time.process_time`` counts this process's CPU only, so other jobs on the machine do
not inflate it.

    .venv/bin/python benchmarks/preset_step_cost.py --dtype fp32 --variant fast \\
        --variant bigram:model.bigram_logits=true --variant b8:batch_size=8 \\
        --json benchmarks/results/preset_step_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_loss import parse_variant  # noqa: E402

from poslab.nn.model import GPT  # noqa: E402
from poslab.training import presets  # noqa: E402
from poslab.training.config import TrainConfig, model_config  # noqa: E402
from poslab.training.data import prepare_data  # noqa: E402
from poslab.training.optim import make_optimizer  # noqa: E402
from poslab.training.precision import autocast  # noqa: E402


def variant_config(preset: str, overrides: dict[str, Any], dtype: str) -> TrainConfig:
    """The preset with ``overrides`` (dotted keys reach ``model``) under ``dtype`` unless they name one."""
    values = presets.preset_config(preset)
    values["dtype"] = dtype  # a variant's own dtype= wins
    for key, value in overrides.items():
        if key.startswith("model."):
            values.setdefault("model", {})[key[len("model.") :]] = value
        else:
            values[key] = value
    values.update(name="step-cost")
    return TrainConfig.from_dict(values)


def step_fn(cfg: TrainConfig, vocab: int, data: torch.Tensor) -> Callable[[], None]:
    """One training step of ``cfg``'s model and optimizer on random windows of ``data``."""
    torch.manual_seed(cfg.seed)
    model = GPT(model_config(cfg, vocab))
    model.train()
    optimizer = make_optimizer(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    block, batch = cfg.model.block_size, cfg.batch_size
    generator = torch.Generator().manual_seed(1)

    def step() -> None:
        ix = torch.randint(len(data) - block - 1, (batch,), generator=generator)
        window = ix[:, None] + torch.arange(block + 1)  # [B, T+1]
        chunk = data[window]
        with autocast(cfg.dtype, "cpu"):
            _, loss = model(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="shakespeare-char-fast")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--variant", action="append", required=True, help="LABEL[:key=value,...]; the first is 1.00x")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per contender per round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [parse_variant(v) for v in args.variant]
    steps = {}
    for label, overrides in variants:
        cfg = variant_config(args.preset, overrides, args.dtype)
        run_data = prepare_data(cfg)  # the preset's corpus, tokenized: its vocabulary and training windows
        steps[label] = step_fn(cfg, run_data.tokenizer.vocab_size, run_data.train)
        for _ in range(3):  # warm-up: allocator, kernels
            steps[label]()
    ms: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(args.rounds):
        for label, step in steps.items():
            start = time.process_time()
            for _ in range(args.steps):
                step()
            ms[label].append((time.process_time() - start) / args.steps * 1000)
    base = statistics.median(ms[variants[0][0]])
    rows = []
    for label, overrides in variants:
        median = statistics.median(ms[label])
        rows.append({"variant": label, "overrides": overrides, "ms_per_step": median, "vs_first": median / base})
        rounds = ", ".join(f"{x:.1f}" for x in ms[label])
        print(f"  {label:16s} {median:7.2f} ms/step  {median / base:.3f}x  (rounds {rounds})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"preset": args.preset, "dtype": args.dtype, "threads": args.threads, "rounds": args.rounds}
        report.update(steps=args.steps, rows=rows, load_average=list(os.getloadavg()))
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
