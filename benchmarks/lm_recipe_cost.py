"""A cheaper recipe for the quick lab's language models: one training per call, one thread, process CPU clock.

Starts from the quick lab's own training config (:func:`poslab.lab.experiments.extrapolation.train_config`
on ``SIZES["quick"]``: embeddings times ``sqrt(n_embd)``, no embedding norm, warmup + cosine to lr/10,
``dtype="auto"``) and changes only the fields given, then measures what the position-training premises
read (``poslab/lab/premises.py``): the loss on the whole validation split in consecutive windows of
``L`` and the context gain (mean loss at window positions 1-4 minus the mean at the last quarter of
the window) over every window of the split. Each call appends one JSON line (the command, the
config's changed fields, CPU seconds of training and of the evaluation, loss, gain, the per-position
curve) to ``benchmarks/results/lm_recipe_cost.jsonl``.

``--schedule wsd`` replaces the cosine with warmup-stable-decay (constant ``lr`` after the warmup,
linear decay to ``min_lr`` over the last ``--decay-frac`` of the steps) by patching the loop's
``lr_at`` in this process only::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/lm_recipe_cost.py none --seed 1337 \\
        --length 32 [--batch 8] [--steps 1500 --lr 6e-3 --warmup 100] [--layers 3] [--width 48] \\
        [--schedule wsd --decay-frac 0.2]
    PYTHONPATH=. .venv/bin/python benchmarks/lm_recipe_cost.py --summary   # the table of every line so far

``dtype="auto"`` resolves to bf16 autocast on this machine's CPU (the line records it), as in the lab.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "lm_recipe_cost.jsonl"


def wsd_lr(decay_frac: float):
    """Warmup-stable-decay: linear warmup, ``lr`` held, linear decay to ``min_lr`` over the last ``decay_frac``."""

    def lr_at(step: int, cfg) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
        start = int(cfg.max_steps * (1 - decay_frac))
        if step < start:
            return cfg.lr
        ratio = min(1.0, (step - start) / max(1, cfg.max_steps - start))
        return cfg.lr + ratio * (cfg.min_lr - cfg.lr)

    return lr_at


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scheme")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--layers", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int)
    p.add_argument("--length", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--schedule", choices=("cosine", "wsd"), default="cosine")
    p.add_argument("--decay-frac", type=float, default=0.2)
    p.add_argument("--label", default="", help="the candidate's name in the results")
    p.add_argument("--out", type=Path, default=Path("/tmp/lm_recipe_cost"), help="where the run folders go")
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSONL file a line is appended to")
    return p.parse_args(argv)


def summary(path: Path) -> None:
    """One line per candidate and scheme: loss / gain per seed and the mean training CPU seconds."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault((row["label"], row["scheme"]), []).append(row)
    for (label, scheme), runs in rows.items():
        seeds = ", ".join(f"{r['seed']}: {r['val_all']:.3f} / {r['gain']:.3f}" for r in runs)
        cpu = sum(r["train_cpu_s"] for r in runs) / len(runs)
        print(f"{label:24s} {scheme:10s} {cpu:6.1f} CPU-s   {seeds}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summary"]:
        summary(Path(argv[1]) if len(argv) > 1 else RESULTS)
        return 0
    from poslab.analysis.eval import loss_by_position
    from poslab.lab.experiments.extrapolation import SIZES, train_config
    from poslab.lab.premises import context_gain
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training import loop
    from poslab.training.config import TrainConfig
    from poslab.training.data import prepare_data
    from poslab.training.evaluation import evaluate_loss

    args = parse(argv)
    torch.set_num_threads(1)
    fields = {
        "n_layer": args.layers,
        "n_embd": args.width,
        "steps": args.steps,
        "lr": args.lr,
        "batch_size": args.batch,
        "train_length": args.length,
        "warmup_steps": args.warmup,
    }
    changed = {k: v for k, v in fields.items() if v is not None}
    size = dataclasses.replace(SIZES["quick"], **changed)
    if args.schedule == "wsd":
        loop.lr_at = wsd_lr(args.decay_frac)
        changed.update(schedule="wsd", decay_frac=args.decay_frac)
    name = f"{args.scheme}-{args.label or 'x'}-s{args.seed}"
    values = train_config(args.scheme, size, args.out, name=name, seed=args.seed).to_dict()
    values.update(threads=1)
    cfg = TrainConfig.from_dict(values)
    cpu = time.process_time()
    results = train(cfg, overwrite=True, progress=False)
    train_cpu = time.process_time() - cpu
    cpu = time.process_time()
    model, tokenizer, _ = load_run(cfg.run_dir)
    data = prepare_data(cfg, tokenizer)
    length = size.train_length
    val = float(evaluate_loss(model, data.val, length, max(1, 8192 // length), None))
    curve = [float(v) for v in loss_by_position(model.eval(), data.val, length, None)]
    eval_cpu = time.process_time() - cpu
    row = {
        "label": args.label,
        "scheme": args.scheme,
        "seed": args.seed,
        "changed": changed,
        "command": "OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/lm_recipe_cost.py " + shlex.join(argv),
        "dtype": results.get("dtype", cfg.dtype),
        "val_all": val,
        "gain": context_gain(curve),
        "train_cpu_s": train_cpu,
        "eval_cpu_s": eval_cpu,
        "curve": curve,
    }
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if k != "curve"}))
    with args.results.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
