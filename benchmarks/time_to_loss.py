"""Time to quality: wall time and tokens until the whole-validation-split loss reaches a target.

Side by side in one process, same threads, alternating: poslab's ``train()`` with a preset
(default ``shakespeare-char-fast``) stopping at ``--target`` (``stop_val_loss``, validation on the
whole split every ``--eval-every`` steps) and nanoGPT's CPU recipe (the model and loop of
``benchmarks/nanogpt_control.py``: 4/4/128, block 64, batch 12, 2000 iterations, lr 1e-3 -> 1e-4)
with the same whole-split validation every ``--nano-eval-every`` iterations. Both clocks count the
training steps only (batch, forward, backward, clip, update), never the evaluations, so how often
each side is evaluated does not move its time. nanoGPT's figure is the time of its 2000-step recipe
(which reaches 1.899 on the whole split over three seeds here) and, where its curve crossed the
target at an evaluation, the time to that crossing.

    .venv/bin/python benchmarks/time_to_loss.py --seeds 1337 1 2                 # the comparison
    .venv/bin/python benchmarks/time_to_loss.py --target 2.2 --no-nanogpt \\
        --variant rope --variant learned:model.position=learned                  # a lever trial

``--recipe gpu`` compares nanoGPT's GPU recipe (``config/train_shakespeare_char.py``: 6/6/384, block 256,
batch 64, dropout 0.2, 5000 iterations; neither side compiled) with the preset ``shakespeare-char-gpu``
to val 1.47; ``benchmarks/gpu_check.sh`` runs it with ``--device cuda --nano-dtype bf16`` (nanoGPT's
own precision there), and ``--dry-run`` checks the plumbing in a few steps on any device.

``--variant LABEL[:key=value,key=value]`` runs the preset with those overrides (dotted keys reach
``model``); several variants alternate with each other and with nanoGPT, seed by seed, with the
order rotated every seed. Results: ``--out`` (JSON, every run) and a table on stdout.

``--whole-process`` also runs each contender as its own process, timed from launch to exit (wall and
the process's CPU time): ``python -m poslab train --preset PRESET --seed S --threads N --OVERRIDE ...``
in a fresh run folder under ``RUNS/process`` (the preset as a user runs it: its evaluations and
checkpoints, the crossing read from the run folder's ``results.json``) and ``nanogpt_control.py
--no-full-split`` (nanoGPT's recipe loop with its estimates every 250 iterations, as its ``train.py``
runs it), with ``OMP_NUM_THREADS`` set to the same threads; the processes alternate with the
in-process runs, seed by seed. ``--process-only`` skips the in-process runs (a quicker rerun).

    .venv/bin/python benchmarks/time_to_loss.py --seeds 1337 1 2 --whole-process \\
        --variant poslab-fast --variant poslab-fast-fp32:dtype=fp32       # the comparison, both ways
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nanogpt_control import TinyGPT, nanogpt_lr, nanogpt_optimizer, nanogpt_update  # noqa: E402

from poslab.data import build_tokenizer, encode_corpus, load_text, split_text  # noqa: E402
from poslab.session import train  # noqa: E402
from poslab.training import precision, presets  # noqa: E402
from poslab.training.config import TrainConfig  # noqa: E402


@dataclass(frozen=True)
class NanoRecipe:
    """One of nanoGPT's recipes: its model (layers, heads, width, block, dropout), batch, iterations
    (the cosine schedule's length) and the whole-split validation loss it reaches (the default target)."""

    layers: int
    heads: int
    d: int
    block: int
    batch: int
    iters: int
    dropout: float
    target: float


#: nanoGPT's shakespeare_char recipes: its README's CPU one (``nanogpt_control.py``'s defaults) and
#: ``config/train_shakespeare_char.py`` for a GPU (val about 1.47 after 5000 iterations on an A100)
NANOGPT_RECIPES = {
    "cpu": NanoRecipe(layers=4, heads=4, d=128, block=64, batch=12, iters=2000, dropout=0.0, target=1.90),
    "gpu": NanoRecipe(layers=6, heads=6, d=384, block=256, batch=64, iters=5000, dropout=0.2, target=1.47),
}
#: the poslab preset each recipe is compared with by default
DEFAULT_PRESETS = {"cpu": "shakespeare-char-fast", "gpu": "shakespeare-char-gpu"}
#: ``--dry-run``: steps of each side, batch, and validation windows (a plumbing check on any device)
DRY_STEPS, DRY_BATCH, DRY_WINDOWS = 2, 2, 4
#: the repository root: a contender's process imports poslab from the same tree as this script
ROOT = Path(__file__).resolve().parent.parent


def dry_overrides(preset: str) -> dict[str, Any]:
    """``--dry-run``'s poslab settings: a few steps of a few windows, a few validation batches (the
    preset's warmup-stable-decay, where it has one, with a one-step cooldown)."""
    steps = DRY_STEPS
    return {
        "max_steps": steps,
        "lr_decay_steps": steps,
        "warmup_steps": 1,
        "cooldown_steps": 1 if presets.preset_config(preset).get("cooldown_steps") else 0,
        "batch_size": DRY_BATCH,
        "eval_interval": steps,
        "eval_iters": DRY_WINDOWS,
    }


def full_split_loss(model: TinyGPT, ids: torch.Tensor, block: int, batch: int = 64, limit: int | None = None) -> float:
    """Mean loss over the whole split in consecutive non-overlapping windows (nanogpt_control's figure);
    ``limit`` windows only where given (a dry run)."""
    model.eval()
    with torch.no_grad():
        n = (len(ids) - 1) // block
        n = n if limit is None else min(n, limit)
        total = 0.0
        for first in range(0, n, batch):
            starts = torch.arange(first, min(first + batch, n)) * block  # [b]
            window = starts[:, None] + torch.arange(block + 1)  # [b, T+1]
            chunk = ids[window]  # [b, T+1]
            total += model(chunk[:, :-1], chunk[:, 1:]).item() * chunk.shape[0]
    model.train()
    return total / n


def nanogpt_run(
    seed: int, args: argparse.Namespace, train_ids: torch.Tensor, val_ids: torch.Tensor, vocab: int
) -> dict[str, Any]:
    """nanoGPT's recipe (``--recipe``, on ``--device``, bf16 autocast with ``--nano-dtype bf16``); training
    time to the first evaluation at or under the target, and in all."""
    recipe = NANOGPT_RECIPES[getattr(args, "recipe", "cpu")]
    device = torch.device(getattr(args, "device", "cpu"))
    dry = getattr(args, "dry_run", False)
    bf16 = getattr(args, "nano_dtype", "fp32") == "bf16"
    torch.manual_seed(seed)
    block, iters = recipe.block, args.nano_iters
    batch = DRY_BATCH if dry else recipe.batch
    model = TinyGPT(vocab, block, recipe.layers, recipe.heads, recipe.d, dropout=recipe.dropout).to(device)
    opt = nanogpt_optimizer(model)
    train_ids, val_ids = train_ids.to(device), val_ids.to(device)

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    train_time, crossed, curve = 0.0, None, []
    for it in range(iters):
        start = clock()
        ix = torch.randint(len(train_ids) - block, (batch,))
        x = torch.stack([train_ids[i : i + block] for i in ix])  # [B, T]
        y = torch.stack([train_ids[i + 1 : i + 1 + block] for i in ix])  # [B, T]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            nanogpt_update(model, opt, x, y, nanogpt_lr(it, decay_iters=recipe.iters))
        train_time += clock() - start
        step = it + 1
        if step % args.nano_eval_every == 0 or step == iters:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                val = full_split_loss(model, val_ids, block, limit=DRY_WINDOWS if dry else None)
            curve.append({"step": step, "val_loss": val, "train_time_s": train_time})
            if crossed is None and val <= args.target:
                crossed = {"step": step, "tokens": step * batch * block, "train_time_s": train_time, "val_loss": val}
    return {
        "contender": "nanoGPT",
        "seed": seed,
        "steps": iters,
        "tokens": iters * batch * block,
        "train_time_s": train_time,
        "final_val_loss": curve[-1]["val_loss"],
        "reached": crossed is not None,
        "crossing": crossed,
        "curve": curve,
    }


def _scalar(text: str) -> Any:
    """``"2e-3"`` -> 0.002, ``"24"`` -> 24, ``"null"`` -> None, else YAML's reading (strings stay strings)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``LABEL[:key=value,...]`` -> (label, overrides); values parsed as YAML scalars."""
    label, _, rest = text.partition(":")
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        overrides[key.strip()] = _scalar(value)
    return label, overrides


def poslab_config(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> TrainConfig:
    values = presets.preset_config(args.preset)
    for key, value in overrides.items():
        if key.startswith("model."):
            values.setdefault("model", {})[key[len("model.") :]] = value
        else:
            values[key] = value
    values.update(
        name=f"{label}-s{seed}",
        out_dir=str(args.runs),
        seed=seed,
        threads=args.threads,
        stop_val_loss=args.target,
        eval_iters=0,
        ckpt_interval=0,
        keep_checkpoints=1,
    )
    if args.eval_every is not None:
        values["eval_interval"] = args.eval_every
    if getattr(args, "device", "cpu") != "cpu":
        values["device"] = args.device
    if getattr(args, "dry_run", False):
        values.update(dry_overrides(args.preset))
    return TrainConfig.from_dict(values)


def poslab_run(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    cfg = poslab_config(args, label, overrides, seed)
    results = train(cfg, overwrite=True, progress=False)
    target = results["target"]
    return {
        "contender": label,
        "seed": seed,
        "overrides": overrides,
        "run_dir": str(cfg.run_dir),
        "steps": results["steps"],
        "tokens": results["tokens_seen"],
        "train_time_s": results["train_time_s"],
        "final_val_loss": results["final_val_loss"],
        "reached": target["reached"],
        "crossing": {k: target[k] for k in ("step", "tokens", "train_time_s", "val_loss")}
        if target["reached"]
        else None,
        "tokens_per_s": results["tokens_per_s"],
        "mfu": results["mfu"],
        "dtype": results["dtype"],
        "precision": results["precision"],
    }


def timed_process(command: list[str], threads: int, log: Path) -> dict[str, float]:
    """Run ``command`` from launch to exit with ``OMP_NUM_THREADS=threads`` and poslab from :data:`ROOT`,
    its output in ``log``: its wall time and CPU time (user + system, from the OS), in seconds.

    Raises:
        SystemExit: the process failed (its exit code and log named).
    """
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}
    log.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        # subprocess.run kills the child on any exception: SIGTERM, raised as KeyboardInterrupt in main(), included
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}; its output: {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"process_wall_s": wall, "process_cpu_s": cpu}


def _cli_value(value: Any) -> str:
    """An override's value as ``poslab train --KEY VALUE`` reads it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def poslab_command(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> list[str]:
    """``python -m poslab train`` with the preset as a user runs it: only the seed, threads, target, run
    folder, the variant's overrides (and ``--eval-every`` or ``--dry-run``'s, where given) on top."""
    values: dict[str, Any] = {"seed": seed, "threads": args.threads, "stop_val_loss": args.target, **overrides}
    if args.eval_every is not None:
        values["eval_interval"] = args.eval_every
    if getattr(args, "dry_run", False):
        values.update(dry_overrides(args.preset))
    command = [sys.executable, "-m", "poslab", "train", "--preset", args.preset, "--name", f"{label}-s{seed}"]
    command += ["--out_dir", str(args.runs / "process"), "--no-progress", "--overwrite"]
    return command + [f"--{key}={_cli_value(value)}" for key, value in values.items()]


def poslab_process(args: argparse.Namespace, label: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """The preset as its own process, launch to exit; the crossing read from its run folder."""
    run_dir = args.runs / "process" / f"{label}-s{seed}"
    timing = timed_process(poslab_command(args, label, overrides, seed), args.threads, run_dir.with_suffix(".log"))
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    target = results.get("target", {})
    return {
        "contender": label,
        "seed": seed,
        **timing,
        "train_time_s": results["train_time_s"],
        "run_wall_s": results["wall_time_s"],
        "steps": results["steps"],
        "final_val_loss": results["final_val_loss"],
        "reached": bool(target.get("reached")),
        "crossing": {k: target[k] for k in ("step", "tokens", "train_time_s", "val_loss")}
        if target.get("reached")
        else None,
        "dtype": results["dtype"],
        "run_dir": str(run_dir),
    }


def nanogpt_process(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """nanoGPT's CPU recipe as its own process (``nanogpt_control.py --no-full-split``), launch to exit."""
    recipe = NANOGPT_RECIPES["cpu"]
    out = args.runs / "process" / f"nanoGPT-s{seed}.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "nanogpt_control.py"), "--seeds", str(seed)]
    command += ["--threads", str(args.threads), "--iters", str(args.nano_iters), "--out", str(out), "--no-full-split"]
    for flag, value in (("--layers", recipe.layers), ("--heads", recipe.heads), ("--d", recipe.d)):
        command += [flag, str(value)]
    batch = DRY_BATCH if getattr(args, "dry_run", False) else recipe.batch
    command += ["--block", str(recipe.block), "--batch", str(batch)]
    if getattr(args, "dry_run", False):
        command += ["--eval-iters", "1"]
    timing = timed_process(command, args.threads, out.with_suffix(".log"))
    (row,) = json.loads(out.read_text(encoding="utf-8"))
    return {
        "contender": "nanoGPT",
        "seed": seed,
        **timing,
        "train_time_s": row["train_time_s"],
        "run_wall_s": row["wall_s"],
        "steps": args.nano_iters,
        "val_loss_20_batches": row["val_loss_20_batches"],
    }


def summarise_processes(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per contender: mean process wall, CPU and training time; against nanoGPT's process of the same seed,
    the speed-up (nanoGPT's time over the contender's) of each seed that reached the target, and its mean and sd
    (a process that missed the target has no time to quality)."""
    out: dict[str, Any] = {}
    nano = {r["seed"]: r for r in rows if r["contender"] == "nanoGPT"}
    for name in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == name]
        entry: dict[str, Any] = {"runs": len(mine)}
        for key in ("process_wall_s", "process_cpu_s", "train_time_s"):
            entry[f"{key}_mean"] = statistics.fmean(r[key] for r in mine)
        entry["process_over_train"] = entry["process_wall_s_mean"] / entry["train_time_s_mean"]
        if name != "nanoGPT" and nano:
            entry["reached"] = sum(r["reached"] for r in mine)
            for key in ("process_wall_s", "process_cpu_s", "train_time_s"):
                ratios = [nano[r["seed"]][key] / r[key] for r in mine if r["seed"] in nano and r["reached"]]
                if ratios:
                    entry[f"speedup_{key}"] = ratios
                    entry[f"speedup_{key}_mean"] = statistics.fmean(ratios)
                    entry[f"speedup_{key}_sd"] = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        out[name] = entry
    return out


def summarise(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["contender"] for r in rows):
        mine = [r for r in rows if r["contender"] == name]
        reached = [r for r in mine if r["reached"]]
        entry = {
            "runs": len(mine),
            "reached": len(reached),
            "train_time_s_mean": statistics.fmean(r["train_time_s"] for r in mine),
            "final_val_loss_mean": statistics.fmean(r["final_val_loss"] for r in mine),
        }
        if reached:
            entry["time_to_target_s_mean"] = statistics.fmean(r["crossing"]["train_time_s"] for r in reached)
            entry["tokens_to_target_mean"] = statistics.fmean(r["crossing"]["tokens"] for r in reached)
        out[name] = entry
    if "nanoGPT" in out:
        base = out["nanoGPT"]["train_time_s_mean"]
        for name, entry in out.items():
            if name != "nanoGPT" and "time_to_target_s_mean" in entry and entry["reached"] == entry["runs"]:
                entry["time_vs_nanogpt_recipe"] = entry["time_to_target_s_mean"] / base
    return out


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target", type=float, default=None, help="whole-split validation loss to reach (default: the recipe's)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337])
    parser.add_argument("--recipe", choices=sorted(NANOGPT_RECIPES), default="cpu", help="nanoGPT's recipe")
    parser.add_argument("--preset", default=None, help="poslab's preset (default: the recipe's, DEFAULT_PRESETS)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides train")
    parser.add_argument("--nano-dtype", choices=["fp32", "bf16"], default="fp32", help="nanoGPT's precision")
    parser.add_argument("--dry-run", action="store_true", help=f"{DRY_STEPS} steps each, tiny batches: the plumbing")
    parser.add_argument("--variant", action="append", default=None, help="LABEL[:key=value,...] (repeatable)")
    parser.add_argument("--no-nanogpt", action="store_true", help="poslab variants only (lever trials)")
    parser.add_argument("--nano-iters", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--nano-eval-every", type=int, default=250)
    parser.add_argument(
        "--eval-every", type=int, default=None, help="poslab evaluation interval (default: the preset's)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--whole-process", action="store_true", help="also each contender as its own process, launch to exit"
    )
    parser.add_argument("--process-only", action="store_true", help="with --whole-process: no in-process runs")
    parser.add_argument("--runs", type=Path, default=Path("runs/time-to-loss"))
    parser.add_argument("--out", type=Path, default=Path("runs/time-to-loss/results.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)  # a stopped benchmark leaves no contender process behind
    args.preset = args.preset or DEFAULT_PRESETS[args.recipe]
    if args.target is None:
        args.target = NANOGPT_RECIPES[args.recipe].target
    if args.nano_iters is None:
        args.nano_iters = DRY_STEPS if args.dry_run else NANOGPT_RECIPES[args.recipe].iters
    if args.dry_run:
        args.nano_eval_every = min(args.nano_eval_every, args.nano_iters)
    if args.process_only and not args.whole_process:
        parser.error("--process-only goes with --whole-process")
    if args.whole_process and (args.recipe != "cpu" or args.device != "cpu" or args.nano_dtype != "fp32"):
        parser.error("--whole-process: nanoGPT's CPU recipe on the CPU in fp32 only (nanogpt_control.py's)")
    torch.set_num_threads(args.threads)
    # this machine's bf16/fp32 figures, beside the result: the preset's dtype auto follows them
    figures = precision.measure()
    machine = {"key": precision.machine_key(), **figures.__dict__, "bf16_over_fp32_step": figures.step_ratio}
    print(
        f"this machine: a bf16 training step takes {figures.step_ratio:.2f}x the fp32 step "
        f"(matmul bf16 {figures.bf16_matmul_flops / 1e9:.0f} vs fp32 {figures.fp32_matmul_flops / 1e9:.0f} GFLOP/s)",
        flush=True,
    )
    variants = [parse_variant(v) for v in (args.variant or [args.preset.replace("shakespeare-char-", "poslab-")])]
    text = load_text("shakespeare")
    tokenizer = build_tokenizer("char", text)
    train_text, val_text = split_text(text, 0.1)
    train_ids, val_ids = encode_corpus(tokenizer, train_text), encode_corpus(tokenizer, val_text)

    contenders: list[str] = ([] if args.no_nanogpt else ["nanoGPT"]) + [label for label, _ in variants]
    overrides = dict(variants)
    rows: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    cache_before = precision.cache_path().exists()
    started = time.perf_counter()
    for i, seed in enumerate(args.seeds):
        order = contenders[i % len(contenders) :] + contenders[: i % len(contenders)]  # rotate: alternating starts
        for name in [] if args.process_only else order:
            row = (
                nanogpt_run(seed, args, train_ids, val_ids, tokenizer.vocab_size)
                if name == "nanoGPT"
                else poslab_run(args, name, overrides[name], seed)
            )
            rows.append(row)
            cross = row["crossing"]
            print(
                f"  {name:24s} seed {seed:5d}: "
                + (
                    f"val {args.target} at step {cross['step']} after "
                    f"{cross['train_time_s']:.1f} s, {cross['tokens']:,} tokens"
                    if cross
                    else f"did not reach {args.target}"
                )
                + f"; final val {row['final_val_loss']:.4f} after {row['steps']} steps, {row['train_time_s']:.1f} s",
                flush=True,
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"target": args.target, "threads": args.threads, "rows": rows}, indent=2))
        for name in order if args.whole_process else []:
            proc = (
                nanogpt_process(args, seed) if name == "nanoGPT" else poslab_process(args, name, overrides[name], seed)
            )
            processes.append(proc)
            reach = (
                ""
                if "reached" not in proc
                else f", val {proc['crossing']['val_loss']:.4f} at step {proc['crossing']['step']}"
                if proc["reached"]
                else f", did not reach {args.target}"
            )
            print(
                f"  {name:24s} seed {seed:5d} as a process: {proc['process_wall_s']:.1f} s wall, "
                f"{proc['process_cpu_s']:.1f} s CPU, {proc['train_time_s']:.1f} s of training steps{reach}",
                flush=True,
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            partial = {"target": args.target, "threads": args.threads, "rows": rows, "processes": processes}
            args.out.write_text(json.dumps(partial, indent=2))
    summary = summarise(rows, args.target)
    report = {
        "target": args.target,
        "threads": args.threads,
        "seeds": args.seeds,
        "preset": args.preset,
        "recipe": args.recipe,
        "nanogpt_recipe": asdict(NANOGPT_RECIPES[args.recipe]),
        "device": args.device,
        "nano_dtype": args.nano_dtype,
        "dry_run": args.dry_run,
        "machine_precision": machine,
        "preset_config": presets.preset_config(args.preset),
        "rows": rows,
        "summary": summary,
        "processes": processes,
        "process_summary": summarise_processes(processes),
        "precision_cache_existed": cache_before,
        "wall_s": time.perf_counter() - started,
        "load_average": list(__import__("os").getloadavg()),
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(
        f"\ntime to whole-split val loss {args.target} ({len(args.seeds)} seed(s), {args.threads} thread(s); "
        "training-step time, evaluations excluded)"
    )
    for name, s in summary.items():
        to = (
            f"{s['time_to_target_s_mean']:.1f} s, {s['tokens_to_target_mean']:,.0f} tokens"
            if "time_to_target_s_mean" in s
            else "-"
        )
        ratio = f"  = {s['time_vs_nanogpt_recipe']:.2f}x nanoGPT's recipe time" if "time_vs_nanogpt_recipe" in s else ""
        dtypes = sorted({r["dtype"] for r in rows if r["contender"] == name and "dtype" in r}) or [args.nano_dtype]
        print(
            f"  {name:24s} ({'/'.join(dtypes)}) reached {s['reached']}/{s['runs']}: to target {to}; whole run "
            f"{s['train_time_s_mean']:.1f} s, final val {s['final_val_loss_mean']:.4f}{ratio}"
        )
    print(f"  (this machine's bf16 step: {figures.step_ratio:.2f}x the fp32 step)")
    if processes:
        print(
            "\nwhole process, launch to exit (mean; speed-up = nanoGPT's process time over the contender's, per seed)"
        )
        for name, s in report["process_summary"].items():
            speed = (
                f"; speed-up wall {s['speedup_process_wall_s_mean']:.2f} ± {s['speedup_process_wall_s_sd']:.2f}x, "
                f"CPU {s['speedup_process_cpu_s_mean']:.2f} ± {s['speedup_process_cpu_s_sd']:.2f}x, "
                f"training steps {s['speedup_train_time_s_mean']:.2f}x; reached {s['reached']}/{s['runs']}"
                if "speedup_process_wall_s_mean" in s
                else ""
            )
            print(
                f"  {name:24s} {s['process_wall_s_mean']:.1f} s wall, {s['process_cpu_s_mean']:.1f} s CPU, "
                f"{s['train_time_s_mean']:.1f} s training ({s['process_over_train']:.2f}x){speed}"
            )


if __name__ == "__main__":
    main()
