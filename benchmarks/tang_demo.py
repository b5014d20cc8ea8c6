"""The Tang-poem demo model: which recipe samples poems that scan within a training-time budget.

Each variant is a preset (default ``tang-demo``) with overrides, trained with poslab's ``train()``;
the variants alternate seed by seed (order rotated every seed) in one process, same threads. For each
run: the training-step time (evaluations excluded), the validation loss on the whole split, and the
share of five-character line segments in ``--samples`` samples of ``--tokens`` characters continuing
``--prompt`` (:func:`poslab.analysis.poems.scan_fraction`), beside the corpus's interpolated
Kneser–Ney bigram (:func:`poslab.lab.experiments.common.ngram_baselines`).

    .venv/bin/python benchmarks/tang_demo.py --seeds 0 1 2                      # the preset as shipped
    .venv/bin/python benchmarks/tang_demo.py --preset tang-small --quick \\
        --variant lab --variant rope:model.position=rope                          # a lever trial

``--variant LABEL[:key=value,...]`` as in ``time_to_loss.py``. Results: ``--out`` (JSON) and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_loss import parse_variant  # noqa: E402

from poslab.analysis.poems import scan_fraction  # noqa: E402
from poslab.lab.experiments.common import ngram_baselines  # noqa: E402
from poslab.nn.generate import sample_text  # noqa: E402
from poslab.runs import load_run  # noqa: E402
from poslab.session import train  # noqa: E402
from poslab.training import presets  # noqa: E402
from poslab.training.config import TrainConfig  # noqa: E402
from poslab.training.data import prepare_data  # noqa: E402
from poslab.training.evaluation import evaluate_loss  # noqa: E402


def run_config(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> TrainConfig:
    values = presets.preset_config(args.preset, quick=args.quick)
    for key, value in overrides.items():
        if key.startswith("model."):
            values.setdefault("model", {})[key[len("model.") :]] = value
        else:
            values[key] = value
    values.update(name=f"{label}-s{seed}", out_dir=str(args.runs), seed=seed, threads=args.threads)
    values.update(ckpt_interval=0, keep_checkpoints=1)
    return TrainConfig.from_dict(values)


def one_run(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    cfg = run_config(args, label, overrides, seed)
    cpu = time.process_time()
    results = train(cfg, overwrite=True, progress=False)
    cpu = time.process_time() - cpu
    model, tokenizer, _ = load_run(cfg.run_dir)
    whole = evaluate_loss(model, prepare_data(cfg).val, cfg.model.block_size, 64, None)  # the whole split
    texts = sample_text(model, tokenizer, args.prompt, args.tokens, num_samples=args.samples, seed=seed)
    scanning, total = scan_fraction(texts)
    return {
        "contender": label,
        "seed": seed,
        "overrides": overrides,
        "steps": results["steps"],
        "train_time_s": results["train_time_s"],
        "process_cpu_s": cpu,
        "tokens": results["tokens_seen"],
        "final_val_loss": results["final_val_loss"],
        "val_loss_whole_split": whole,
        "scanning": scanning,
        "segments": total,
        "scan_fraction": scanning / total if total else 0.0,
        "dtype": results["dtype"],
        "first_sample": texts[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tang-demo")
    parser.add_argument("--quick", action="store_true", help="the preset's quick form")
    parser.add_argument("--variant", action="append", default=None, help="LABEL[:key=value,...] (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", default="白日依山尽")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=Path("runs/tang-demo"))
    parser.add_argument("--out", type=Path, default=Path("runs/tang-demo/results.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus = presets.preset_config(args.preset)["corpus"]
    bigram = ngram_baselines(corpus)["bigram"]
    variants = [parse_variant(v) for v in (args.variant or [args.preset])]
    labels, overrides = [label for label, _ in variants], dict(variants)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i, seed in enumerate(args.seeds):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            row = one_run(args, label, overrides[label], seed)
            rows.append(row)
            print(
                f"  {label:20s} seed {seed}: {row['steps']} steps, {row['train_time_s']:.1f} s, val "
                f"{row['val_loss_whole_split']:.3f}, CPU {row['process_cpu_s']:.0f} s, five-character segments "
                f"{row['scanning']}/{row['segments']} "
                f"({row['scan_fraction']:.0%}); {row['first_sample'][:40]!r}",
                flush=True,
            )
    summary = {}
    for label in labels:
        mine = [r for r in rows if r["contender"] == label]
        summary[label] = {
            "runs": len(mine),
            "train_time_s_mean": statistics.fmean(r["train_time_s"] for r in mine),
            "train_time_s_max": max(r["train_time_s"] for r in mine),
            "process_cpu_s_mean": statistics.fmean(r["process_cpu_s"] for r in mine),
            "val_loss_mean": statistics.fmean(r["val_loss_whole_split"] for r in mine),
            "scan_fraction_mean": statistics.fmean(r["scan_fraction"] for r in mine),
            "scan_fraction_min": min(r["scan_fraction"] for r in mine),
        }
    report = {
        "preset": args.preset,
        "quick": args.quick,
        "preset_config": presets.preset_config(args.preset, quick=args.quick),
        "corpus": corpus,
        "bigram_kneser_ney": bigram,
        "threads": args.threads,
        "samples": args.samples,
        "tokens": args.tokens,
        "prompt": args.prompt,
        "rows": rows,
        "summary": summary,
        "wall_s": time.perf_counter() - started,
        "load_average": list(os.getloadavg()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print(f"\n{corpus} bigram (interpolated Kneser-Ney) {bigram:.3f} nats/token; {args.threads} thread(s)")
    for label, s in summary.items():
        print(
            f"  {label:20s} train {s['train_time_s_mean']:.1f} s (max {s['train_time_s_max']:.1f}; process CPU "
            f"{s['process_cpu_s_mean']:.0f} s), whole-split val "
            f"{s['val_loss_mean']:.3f}, five-character segments {s['scan_fraction_mean']:.0%} "
            f"(worst seed {s['scan_fraction_min']:.0%}) over {s['runs']} seed(s)"
        )


if __name__ == "__main__":
    main()
