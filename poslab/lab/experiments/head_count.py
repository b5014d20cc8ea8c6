"""How many heads? Seed 001 exercise 2, and seed 002's "optimal heads ≈ sqrt(d_model/16)".

Seed 001 (exercise 2) asks to train its GPT with 1 and 8 heads instead of 4 (n_embd kept at 128) for
1000 steps each and compare the validation loss; poslab adds 2 and 16 heads. Every run has the same
seed, data, batches and schedule (``tang-small``: 4 layers, n_embd 128, block 128, five-character
Tang poems), so only the head split differs — the parameter count is identical (seed 000 §1.2).

Seed 002 (§3.2) states, from "ImageNet classification experiments", that the optimal number of heads
is about ``sqrt(d_model / 16)``: ``sqrt(8) ≈ 2.83`` for ``d_model = 128``. The claim is tested on the
measured final validation losses: it *holds* here if the best head count is one of the tested counts
nearest 2.83 (2 or 4). The full form also retrains the 4-head model with another seed, so the
verdict can say whether the margins exceed run-to-run noise. Michel et al. 2019 ("Are Sixteen Heads
Really Better than One?", https://arxiv.org/abs/1905.10650) is the background: head count matters
less than one might think.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
from pathlib import Path
from typing import Any

from poslab.display import new_figure, print_table, save_figure
from poslab.runs import read_metrics
from poslab.session import train
from poslab.training import presets
from poslab.training.config import TrainConfig

NAME = "heads"
DESCRIPTION = "train 1/2/4/8/16 heads at n_embd 128 on Tang poems; test 'optimal heads ≈ sqrt(d/16)' (seeds 001, 002)"
IN_ALL = False  # it trains: run it by name

HEADS = (1, 2, 4, 8, 16)
FULL = {"max_steps": 1000, "batch_size": 16, "warmup_steps": 100, "eval_interval": 100, "eval_iters": 20,
        "ckpt_interval": 0, "keep_checkpoints": 1}
QUICK = {"max_steps": 200, "batch_size": 8, "warmup_steps": 20, "eval_interval": 50, "eval_iters": 8,
         "ckpt_interval": 0, "keep_checkpoints": 1}
# the quick form halves the window (64 characters still hold a whole quatrain and most of a regulated
# verse): half the tokens per step, so the lab's 15 quick trainings fit the demo's 10 minutes
QUICK_MODEL = {"block_size": 64}
NOISE_THRESHOLD = 0.02  # a val-loss gap below this is treated as noise when no seed repeat was run


def base_config(quick: bool) -> dict[str, Any]:
    """``tang-small`` with the experiment's schedule (``lr_decay_steps`` = the run length)."""
    config = presets.preset_config("tang-small")
    config.update(QUICK if quick else FULL)
    if quick:
        config["model"] = {**config["model"], **QUICK_MODEL}
    config["lr_decay_steps"] = config["max_steps"]
    return config


def default_workers() -> int:
    """Trainings run side by side by default: one per core, at most two.

    The lab's small GPTs use a second thread poorly, so two one-thread trainings at a time finish a
    set of runs sooner than one two-thread training after another (``docs/lab.md`` has the lab's
    timings before and after).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def _train_variant(label: str, values: dict[str, Any], progress: bool) -> tuple[str, dict[str, Any]]:
    """Train one variant (in this process or a worker) and summarise its run."""
    cfg = TrainConfig.from_dict(values)
    results = train(cfg, overwrite=True, progress=progress)
    metrics = read_metrics(cfg.run_dir)
    return label, {
        "final_val_loss": results["final_val_loss"],
        "final_train_loss": results["final_train_loss"],
        "best_val_loss": results["best_val_loss"],
        "tokens_per_s": results["tokens_per_s"],
        "wall_time_s": results["wall_time_s"],
        "n_params": results["n_params"],
        "threads": results["threads"],
        "val_curve": [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r],
        "train_curve": [(r["step"], r["loss"]) for r in metrics],
        "run_dir": str(cfg.run_dir),
    }


def train_variants(out: Path, base: dict[str, Any], variants: dict[str, dict[str, Any]],
                   workers: int | None = None) -> dict[str, dict]:
    """Train one run per variant (``model`` overrides merged key by key) into ``out/runs/LABEL``.

    Args:
        out: the experiment's folder.
        base: the config every variant starts from.
        variants: label -> overrides.
        workers: trainings at a time (``None``: :func:`default_workers`). With more than one, each
            training runs in its own process on one thread (unless ``base`` sets ``threads``) without
            a live progress bar, and a line is printed as each finishes.

    Returns:
        label -> {final/best val loss, tokens/s, wall time, curve [(step, val_loss)], train curve},
        in the order of ``variants``.

    Raises:
        ValueError: ``workers`` < 1.
    """
    workers = default_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    jobs = {}
    for label, override in variants.items():
        values = {**base, **{k: v for k, v in override.items() if k != "model"}}
        values["model"] = {**base.get("model", {}), **override.get("model", {})}
        values.update(name=label, out_dir=str(out / "runs"))
        TrainConfig.from_dict(values)  # every config checked before the first training starts
        jobs[label] = values
    summary: dict[str, dict] = {}
    if workers == 1 or len(jobs) == 1:
        for label, values in jobs.items():
            print(f"\n--- {label}")
            summary[label] = _train_variant(label, values, progress=True)[1]
        return summary
    print(f"\n--- training {len(jobs)} runs, {min(workers, len(jobs))} at a time (one thread each): "
          f"{', '.join(jobs)}", flush=True)
    # spawn, not fork: a forked child of a process that already ran OpenMP threads can hang
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(_train_variant, label, {**values, "threads": values.get("threads") or 1}, False) for label, values in jobs.items()]
        for future in concurrent.futures.as_completed(futures):
            label, result = future.result()
            summary[label] = result
            print(f"--- {label}: final val loss {result['final_val_loss']:.4f}, {result['tokens_per_s']:,.0f} tokens/s, "
                  f"{result['wall_time_s']:.0f}s ({len(summary)}/{len(jobs)} done)", flush=True)
    return {label: summary[label] for label in jobs}


def plot_curves(summary: dict[str, dict], path: Path, title: str) -> Path:
    """Validation (solid, markers) and training (faint) loss curves of every run."""
    fig, ax = new_figure(size=(8.0, 5.0))
    for label, run in summary.items():
        steps, losses = zip(*run["train_curve"]) if run["train_curve"] else ((), ())
        line = ax.plot(steps, losses, alpha=0.25, linewidth=1)[0]
        vsteps, vlosses = zip(*run["val_curve"]) if run["val_curve"] else ((), ())
        ax.plot(vsteps, vlosses, marker="o", markersize=3, color=line.get_color(),
                label=f"{label}: val {run['final_val_loss']:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(title)
    finals = [r["final_val_loss"] for r in summary.values()]
    if finals:
        ax.set_ylim(min(finals) - 0.3, min(finals) + 2.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def judge_claim(finals: dict[int, float], d_model: int, noise: float | None) -> dict[str, Any]:
    """Seed 002's rule on measured losses: does the best head count sit nearest sqrt(d_model/16)?"""
    predicted = math.sqrt(d_model / 16)
    distance = {h: abs(math.log2(h) - math.log2(predicted)) for h in finals}
    nearest = sorted(h for h in finals if distance[h] - min(distance.values()) < 0.5)  # 2 and 4 for 2.83
    best = min(finals, key=finals.get)
    ranked = sorted(finals, key=finals.get)
    margin = finals[ranked[1]] - finals[best] if len(ranked) > 1 else 0.0
    threshold = noise if noise is not None else NOISE_THRESHOLD
    held = best in nearest
    if held:
        verdict = f"held: the best head count is {best}, one of the counts nearest {predicted:.2f} ({nearest})"
    else:
        verdict = f"did not hold: the best head count is {best}, not one of the counts nearest {predicted:.2f} ({nearest})"
    best_nearest = min(nearest, key=finals.get)
    gap = finals[best_nearest] - finals[best]
    if margin < threshold:
        verdict += (f"; but the best and second best ({ranked[1]}) differ by {margin:.4f}, within the "
                    f"{'measured seed-to-seed spread' if noise is not None else 'assumed noise'} {threshold:.4f}")
    return {
        "predicted": predicted,
        "nearest_tested": nearest,
        "best_heads": best,
        "ranking": ranked,
        "margin_to_second": margin,
        "gap_best_vs_best_predicted": gap,
        "noise": noise,
        "held": held,
        "verdict": verdict,
    }


def run(out: Path, quick: bool = False, heads: tuple[int, ...] = HEADS, base: dict[str, Any] | None = None,
        workers: int | None = None) -> dict:
    """Train every head count, print the table, plot the curves, judge seed 002's claim.

    Args:
        out: output folder (runs in ``out/runs/heads-N``, plot ``out/heads_curves.png``).
        quick: the short form (200 steps of 8 x 64 tokens) used by the demo and tests.
        heads: head counts to train (each must divide 128).
        base: a config mapping replacing the ``tang-small`` base (tests use a tiny one).
        workers: trainings at a time (see :func:`train_variants`).
    """
    out = Path(out)
    base = base if base is not None else base_config(quick)
    d_model = base["model"]["n_embd"]
    variants: dict[str, dict[str, Any]] = {f"heads-{h}": {"model": {"n_head": h}} for h in heads}
    repeat = not quick and 4 in heads  # one seed repeat measures run-to-run noise
    if repeat:
        variants["heads-4-seed2"] = {"seed": base.get("seed", 1337) + 1, "model": {"n_head": 4}}
    summary = train_variants(out, base, variants, workers)
    noise = None
    if repeat:
        noise = abs(summary["heads-4-seed2"]["final_val_loss"] - summary["heads-4"]["final_val_loss"])
    finals = {h: summary[f"heads-{h}"]["final_val_loss"] for h in heads}
    claim = judge_claim(finals, d_model, noise)
    rows = [[h, d_model // h, f"{summary[f'heads-{h}']['n_params']:,}", f"{finals[h]:.4f}",
             f"{summary[f'heads-{h}']['best_val_loss']:.4f}", f"{summary[f'heads-{h}']['tokens_per_s']:,.0f}"]
            for h in heads]
    print_table(["heads", "d_k", "params", "final val loss", "best val loss", "tokens/s"], rows,
                title=f"seed 001 exercise 2: heads at n_embd {d_model}, {base['max_steps']} steps, same seed and data")
    if noise is not None:
        print(f"  seed-to-seed spread of the 4-head run: {noise:.4f}")
    print(f"\n  seed 002: optimal heads ≈ sqrt(d_model/16) = {claim['predicted']:.2f} -> {claim['verdict']}")
    plot = plot_curves({k: v for k, v in summary.items() if not k.endswith("seed2")}, out / "heads_curves.png",
                       f"heads at n_embd {d_model} ({base['max_steps']} steps)")
    return {
        "steps": base["max_steps"],
        "quick": quick,
        "d_model": d_model,
        "runs": summary,
        "final_val_loss": {str(h): finals[h] for h in heads},
        "claim_sqrt_d_over_16": claim,
        "plot": str(plot),
    }
