"""Stacked training (``poslab.training.batched``) against one model per process, side by side in one run.

Two workloads at the quick lab's sizes, each trained both ways on the same two cores:

* ``lm``: the quick language model of the extrapolation / position-training experiments (2 layers,
  4 heads, n_embd 64, block 64, batch 16, RoPE, tinyshakespeare), ``--seeds`` seeds.
  *per-process*: today's way, two spawned processes at a time, one thread and one model each
  (``poslab.session.train``). *stacked*: two spawned processes, one thread each, each training half
  of the seeds as one stacked model (``poslab.session.train_stacked``).
* ``probe``: the quick probes' model (2 layers, 4 heads, n_embd 64) on reverse at L = 8, batch 64:
  ``train_probe`` per process vs ``train_probes_stacked`` over half the seeds per process.

Reported: training tokens (LM: ``steps x batch x block`` per model; probe: sequences x padded
length is not counted, so the figure is models x steps per second) per second of wall time,
including process start and the final evaluation, for all models together; the ratio
stacked / per-process. The order alternates (per-process, stacked, per-process, stacked) over
``--repeats`` rounds and the best round of each is kept, which on a shared machine is the least
disturbed. ::

    PYTHONPATH=. .venv/bin/python benchmarks/batched_training.py --steps 60 --seeds 6 --repeats 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _lm_config(out: str, seed: int, steps: int) -> dict[str, Any]:
    return {
        "name": f"s{seed}",
        "out_dir": out,
        "corpus": "shakespeare",
        "tokenizer": "char",
        "model": {
            "n_layer": 2,
            "n_head": 4,
            "n_embd": 64,
            "block_size": 64,
            "dropout": 0.0,
            "bias": False,
            "position": "rope",
        },
        "max_steps": steps,
        "batch_size": 16,
        "lr": 3e-3,
        "warmup_steps": 10,
        "eval_interval": steps,
        "eval_iters": 2,
        "log_interval": steps,
        "ckpt_interval": 0,
        "seed": seed,
        "threads": 1,
    }


def _lm_single(out: str, seed: int, steps: int) -> float:
    from poslab.session import train
    from poslab.training.config import TrainConfig

    return train(TrainConfig.from_dict(_lm_config(out, seed, steps)), overwrite=True, progress=False)["final_val_loss"]


def _lm_stacked(out: str, seeds: list[int], steps: int) -> list[float]:
    from poslab.session import train_stacked
    from poslab.training.config import TrainConfig

    configs = [TrainConfig.from_dict({**_lm_config(out, s, steps), "threads": None}) for s in seeds]
    return [r["final_val_loss"] for r in train_stacked(configs, overwrite=True, progress=None, threads=1)]


def _probe_recipe(steps: int) -> Any:
    from poslab.analysis.probes import ProbeRecipe

    return ProbeRecipe(
        n_layer=2, n_head=4, n_embd=64, steps=steps, batch_size=64, lr=3e-3, warmup_steps=10, eval_batch=128
    )


def _probe_single(seed: int, steps: int) -> float:
    from poslab.analysis.probes import train_probe

    return train_probe("reverse", 8, "rope", seed, _probe_recipe(steps), (1,), threads=1)["final_loss"]


def _probe_stacked(seeds: list[int], steps: int) -> list[float]:
    from poslab.analysis.probes import train_probes_stacked

    return [
        r["final_loss"]
        for r in train_probes_stacked("reverse", 8, "rope", tuple(seeds), _probe_recipe(steps), (1,), threads=1)
    ]


def _pool(calls: list[tuple[Any, tuple]]) -> float:
    """Wall seconds to run ``calls`` in a pool of two spawned processes."""
    context = multiprocessing.get_context("spawn")
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        for future in [pool.submit(fn, *args) for fn, args in calls]:
            future.result()
    return time.perf_counter() - start


def measure(workload: str, seeds: int, steps: int, repeats: int) -> dict[str, Any]:
    ids = list(range(seeds))
    halves = [ids[: seeds // 2], ids[seeds // 2 :]]
    best = {"per-process": float("inf"), "stacked": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            if workload == "lm":
                single = [(_lm_single, (f"{tmp}/a", s, steps)) for s in ids]
                stacked = [(_lm_stacked, (f"{tmp}/b", h, steps)) for h in halves]
            else:
                single = [(_probe_single, (s, steps)) for s in ids]
                stacked = [(_probe_stacked, (h, steps)) for h in halves]
            best["per-process"] = min(best["per-process"], _pool(single))
            best["stacked"] = min(best["stacked"], _pool(stacked))
    per_model = steps * (16 * 64 if workload == "lm" else 1)
    unit = "tokens/s" if workload == "lm" else "model-steps/s"
    rates = {k: seeds * per_model / v for k, v in best.items()}
    return {
        "workload": workload,
        "seeds": seeds,
        "steps": steps,
        "unit": unit,
        "wall_s": best,
        "rate": rates,
        "ratio": rates["stacked"] / rates["per-process"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", default="lm,probe")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        print(f"--seeds must be >= 2 (two processes), got {args.seeds}", file=sys.stderr)
        return 2
    rows = []
    for workload in args.workloads.split(","):
        r = measure(workload, args.seeds, args.steps, args.repeats)
        rows.append(r)
        print(
            f"{r['workload']:6s} {r['seeds']} models x {r['steps']} steps, 2 processes x 1 thread: "
            f"per-process {r['rate']['per-process']:,.0f} {r['unit']} ({r['wall_s']['per-process']:.1f} s), "
            f"stacked {r['rate']['stacked']:,.0f} {r['unit']} ({r['wall_s']['stacked']:.1f} s): "
            f"x{r['ratio']:.2f}",
            flush=True,
        )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
