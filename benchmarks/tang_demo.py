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
On a loaded machine, seeds run faster as one-thread processes side by side; ``--merge A.json B.json
... --out ALL.json`` joins their reports and recomputes the summary.
A run meets the goal when at least :data:`SCAN_GOAL` of its segments have five characters and its
whole-split validation loss is at least :data:`BIGRAM_MARGIN` nats below the bigram.
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

#: "clearly below the bigram": the whole-split validation loss at least this many nats under it
BIGRAM_MARGIN = 0.1
#: the share of five-character line segments a run's samples must reach
SCAN_GOAL = 0.9


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


def one_run(
    args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int, bigram: float
) -> dict[str, Any]:
    cfg = run_config(args, label, overrides, seed)
    cpu = time.process_time()
    results = train(cfg, overwrite=True, progress=False)
    cpu = time.process_time() - cpu
    model, tokenizer, _ = load_run(cfg.run_dir)
    whole = evaluate_loss(model, prepare_data(cfg).val, cfg.model.block_size, 64, None)  # the whole split
    texts = sample_text(model, tokenizer, args.prompt, args.tokens, num_samples=args.samples, seed=seed)
    scanning, total = scan_fraction(texts)
    fraction = scanning / total if total else 0.0
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
        "scan_fraction": fraction,
        "below_bigram": bigram - whole,
        "meets_goal": fraction >= SCAN_GOAL and bigram - whole >= BIGRAM_MARGIN,
        "dtype": results["dtype"],
        "first_sample": texts[0],
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each contender's runs: means, sample standard deviations, the worst seed, whether every run meets the goal."""
    summary = {}
    for label in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == label]
        summary[label] = {
            "runs": len(mine),
            "seeds": [r["seed"] for r in mine],
            "train_time_s_mean": statistics.fmean(r["train_time_s"] for r in mine),
            "train_time_s_max": max(r["train_time_s"] for r in mine),
            "process_cpu_s_mean": statistics.fmean(r["process_cpu_s"] for r in mine),
            "val_loss_mean": statistics.fmean(r["val_loss_whole_split"] for r in mine),
            "val_loss_sd": statistics.stdev(r["val_loss_whole_split"] for r in mine) if len(mine) > 1 else 0.0,
            "below_bigram_min": min(r["below_bigram"] for r in mine),
            "scan_fraction_mean": statistics.fmean(r["scan_fraction"] for r in mine),
            "scan_fraction_sd": statistics.stdev(r["scan_fraction"] for r in mine) if len(mine) > 1 else 0.0,
            "scan_fraction_min": min(r["scan_fraction"] for r in mine),
            "every_run_meets_goal": all(r["meets_goal"] for r in mine),
        }
    return summary


def print_summary(report: dict[str, Any]) -> None:
    print(
        f"\n{report['corpus']} bigram (interpolated Kneser-Ney) {report['bigram_kneser_ney']:.3f} nats/token; "
        f"{report['threads']} thread(s)"
    )
    for label, s in report["summary"].items():
        print(
            f"  {label:20s} train {s['train_time_s_mean']:.1f} s (max {s['train_time_s_max']:.1f}; process CPU "
            f"{s['process_cpu_s_mean']:.0f} s), whole-split val "
            f"{s['val_loss_mean']:.3f} ± {s['val_loss_sd']:.3f} (worst {s['below_bigram_min']:.3f} below the bigram), "
            f"five-character segments {s['scan_fraction_mean']:.1%} ± {s['scan_fraction_sd']:.1%} "
            f"(worst seed {s['scan_fraction_min']:.0%}) over {s['runs']} seed(s); "
            f"{'every run meets' if s['every_run_meets_goal'] else 'not every run meets'} the goal"
        )


def merge(paths: list[Path], out: Path) -> None:
    """One report from several (seeds run in parallel processes, one thread each): the rows together,
    the summary recomputed, each part's command and load average kept."""
    parts = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    for key in ("preset_config", "corpus", "samples", "tokens", "prompt", "threads"):
        if any(part[key] != parts[0][key] for part in parts):
            raise SystemExit(f"cannot merge {', '.join(map(str, paths))}: their {key!r} differ")
    rows = [row for part in parts for row in part["rows"]]
    report = {key: value for key, value in parts[0].items() if key not in ("command", "wall_s", "load_average")}
    report.update(
        rows=rows,
        summary=summarize(rows),
        parts=[{"command": p.get("command"), "wall_s": p["wall_s"], "load_average": p["load_average"]} for p in parts],
        command=" ".join(sys.argv),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    print_summary(report)


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
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="merge these reports into --out")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    torch.set_num_threads(args.threads)
    corpus = presets.preset_config(args.preset)["corpus"]
    bigram = ngram_baselines(corpus)["bigram"]
    variants = [parse_variant(v) for v in (args.variant or [args.preset])]
    labels, overrides = [label for label, _ in variants], dict(variants)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i, seed in enumerate(args.seeds):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            row = one_run(args, label, overrides[label], seed, bigram)
            rows.append(row)
            print(
                f"  {label:20s} seed {seed}: {row['steps']} steps, {row['train_time_s']:.1f} s, val "
                f"{row['val_loss_whole_split']:.3f}, CPU {row['process_cpu_s']:.0f} s, five-character segments "
                f"{row['scanning']}/{row['segments']} "
                f"({row['scan_fraction']:.0%}), {row['below_bigram']:.3f} below the bigram"
                f"{'' if row['meets_goal'] else ' (misses the goal)'}; {row['first_sample'][:40]!r}",
                flush=True,
            )
    summary = summarize(rows)
    report = {
        "preset": args.preset,
        "quick": args.quick,
        "preset_config": presets.preset_config(args.preset, quick=args.quick),
        "corpus": corpus,
        "bigram_kneser_ney": bigram,
        "bigram_margin": BIGRAM_MARGIN,
        "scan_goal": SCAN_GOAL,
        "command": " ".join(sys.argv),
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
    print_summary(report)


if __name__ == "__main__":
    main()
