"""Training throughput (tokens/s) of poslab's GPT: against transformers' GPT2LMHeadModel, per position
scheme against ``none``, and at nanoGPT's two CPU configurations.

Every measurement is a full training step — forward with the loss, backward, gradient clipping and a
fused AdamW step (poslab's ``make_optimizer``; transformers' Trainer also defaults to fused AdamW on
torch >= 2.8) — on random token batches, in one process with the same thread count. Contenders
are timed in alternation (A B A B ...), ``--reps`` rounds of ``--steps`` steps each after a warmup,
and the table reports the median tokens/s over rounds, so a burst of load from other processes
hits both sides alike. The machine may be shared: look at the spread column, and rerun when it is
large.

    .venv/bin/python benchmarks/train_throughput.py              # everything (~25 min on 2 cores)
    .venv/bin/python benchmarks/train_throughput.py --quick      # fewer rounds
    .venv/bin/python benchmarks/train_throughput.py --only hf    # one section: hf, schemes, nanogpt, compile
    .venv/bin/python benchmarks/train_throughput.py --profile    # where poslab's fp32 step spends its time
    .venv/bin/python benchmarks/train_throughput.py --only compile --threads 1 --reps 5 \
        --json benchmarks/results/train_compile.json             # torch.compile, both sides (~15 min)

The compile section times on the process CPU clock (``time.process_time``, meant for one thread on
a shared machine) as well as the wall clock, compiles from scratch (no inductor cache) and reports
each compiled contender's first step (the compilation) apart; ``--compile-configs`` adds the fast
preset's size, ``--compile-mode`` passes torch.compile's mode (e.g. ``max-autotune``).

nanoGPT's own figures on this machine come from ``../shared/references.md`` (measured there, not
here): fp32, 2 threads, quiet machine — 4/4/128, block 128, batch 32: ~20,000 tokens/s (19-24k);
6/6/384, block 256, batch 16: ~2,500 tokens/s (2.5-2.8k). GPT2LMHeadModel at 4/4/128 is on par with
nanoGPT there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from poslab import GPT, GPTConfig, positions
from poslab.nn.gpt_config import MLPConfig
from poslab.training.config import TrainConfig
from poslab.training.mfu import matmul_flops_per_token, measure_matmul_peak
from poslab.training.optim import make_optimizer

VOCAB = 65  # tinyshakespeare's character vocabulary, as in nanoGPT's shakespeare_char
NANOGPT_REFERENCE = {  # references.md, measured with nanoGPT on this machine (fp32, 2 threads)
    "4/4/128 T=128 B=32": 20_000,
    "6/6/384 T=256 B=16": 2_500,
}


def poslab_step_fn(  # noqa: PLR0913  (five dims positional, as every tree's attention_ab harness calls it, + options)
    n_layer: int,
    n_head: int,
    n_embd: int,
    block: int,
    batch: int,
    position: str = "learned",
    dtype: str = "fp32",
    bias: bool = True,
    activation: str | None = None,
    loop_adamw: bool = False,
    compile: bool = False,
    compile_mode: str | None = None,
) -> tuple[Callable[[], None], GPT]:
    """One training step of a poslab GPT of these dims, and the model."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=VOCAB,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            block_size=block,
            dropout=0.0,
            bias=bias,
            position=position,
            mlp=MLPConfig(activation=activation),
        )
    )
    model.train()
    # as the loop does for cfg.compile (compile_mode: torch.compile's mode, e.g. "max-autotune"; the loop uses the
    # default)
    train_model = torch.compile(model, dynamic=False, mode=compile_mode) if compile else model
    optimizer = make_optimizer(model, TrainConfig(name="bench"))
    if loop_adamw:  # what nanoGPT runs on CPU: the default (per-tensor loop) AdamW, same groups
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), foreach=False)
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(1)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else None

    def step() -> None:
        x = torch.randint(VOCAB, (batch, block), generator=generator)
        y = torch.randint(VOCAB, (batch, block), generator=generator)
        if autocast is not None:
            with autocast:
                _, loss = train_model(x, y)
        else:
            _, loss = train_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def hf_step_fn(n_layer: int, n_head: int, n_embd: int, block: int, batch: int) -> Callable[[], None]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=block,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)  # attn_implementation defaults to sdpa
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-3,
        betas=(0.9, 0.95),
        fused=True,
    )
    generator = torch.Generator().manual_seed(1)

    def step() -> None:
        x = torch.randint(VOCAB, (batch, block), generator=generator)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def race(
    contenders: dict[str, Callable[[], None]], tokens_per_step: int, steps: int, reps: int, warmup: int = 3
) -> dict[str, dict[str, float]]:
    """Alternating timing; returns name -> {median, min, max} tokens/s over the rounds."""
    for step in contenders.values():
        for _ in range(warmup):
            step()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, step in contenders.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            rates[name].append(tokens_per_step * steps / (time.perf_counter() - start))
    return {
        name: {"median": statistics.median(r), "min": min(r), "max": max(r), "rounds": r} for name, r in rates.items()
    }


def spread(stats: dict[str, float]) -> str:
    """Range of the rounds relative to the median: large means other jobs were competing for the CPU."""
    return f"{(stats['max'] - stats['min']) / stats['median']:.0%}"


def show(name: str, stats: dict[str, float], extra: str = "") -> None:
    print(
        f"  {name:18s} median {stats['median']:>9,.0f}  best {stats['max']:>9,.0f} tokens/s  "
        f"(spread {spread(stats)}){extra}",
        flush=True,
    )


def section_hf(args: argparse.Namespace) -> dict:
    dims = (4, 4, 128, 128, 32)
    print(
        f"\n== poslab GPT vs transformers GPT2LMHeadModel, {dims[0]}/{dims[1]}/{dims[2]}, T={dims[3]}, B={dims[4]}, "
        f"fp32, {torch.get_num_threads()} threads, learned positions"
    )
    contenders = {
        "poslab GPT": poslab_step_fn(*dims)[0],  # GPTConfig defaults: GPT-2's tanh GELU, as GPT2LMHeadModel
        "GPT2LMHeadModel": hf_step_fn(*dims),
        "poslab exact GELU": poslab_step_fn(*dims, activation="gelu")[0],  # the presets' (and nanoGPT's) choice
        "poslab loop AdamW": poslab_step_fn(*dims, loop_adamw=True)[0],  # nanoGPT's CPU optimizer: the fused lever
    }
    stats = race(contenders, dims[3] * dims[4], args.steps, args.reps)
    for name, s in stats.items():
        show(name, s)
    ratio = stats["poslab GPT"]["median"] / stats["GPT2LMHeadModel"]["median"]
    best_ratio = stats["poslab GPT"]["max"] / stats["GPT2LMHeadModel"]["max"]
    print(
        f"  poslab / GPT2LMHeadModel = {ratio:.2f}x on medians, {best_ratio:.2f}x on best rounds  (goal >= 1.2x)",
        flush=True,
    )
    exact = stats["poslab exact GELU"]["median"] / stats["GPT2LMHeadModel"]["median"]
    print(f"  poslab exact GELU / GPT2LMHeadModel = {exact:.2f}x on medians", flush=True)
    fused_gain = stats["poslab GPT"]["median"] / stats["poslab loop AdamW"]["median"]
    print(f"  fused AdamW / per-tensor-loop AdamW (poslab GPT) = {fused_gain:.2f}x on medians", flush=True)
    return {
        "dims": dims,
        "stats": stats,
        "ratio": ratio,
        "ratio_best": best_ratio,
        "ratio_exact_gelu": exact,
        "fused_adamw_gain": fused_gain,
    }


def section_schemes(args: argparse.Namespace) -> dict:
    dims = (4, 4, 128, 128, 32)
    names = args.schemes or positions.names()
    print(f"\n== per-scheme training cost vs 'none', {dims[0]}/{dims[1]}/{dims[2]}, T={dims[3]}, B={dims[4]}, fp32")
    contenders = {name: poslab_step_fn(*dims, position=name)[0] for name in names}
    stats = race(contenders, dims[3] * dims[4], args.steps, args.reps)
    base = stats["none"]["median"] if "none" in stats else None
    goals = {"rope": 0.10, "alibi": 0.30, "t5": 0.30}
    best_base = stats["none"]["max"] if "none" in stats else None
    for name, s in stats.items():
        overhead = base / s["median"] - 1 if base else float("nan")
        best_overhead = best_base / s["max"] - 1 if best_base else float("nan")
        goal = f"  (goal <= +{goals[name]:.0%})" if name in goals else ""
        show(name, s, f"  step time vs none {overhead:+6.1%} (medians), {best_overhead:+6.1%} (best){goal}")
        s["overhead_vs_none"] = overhead
        s["overhead_vs_none_best"] = best_overhead
    return {"dims": dims, "stats": stats}


def nanogpt_step_fn(
    n_layer: int,
    n_head: int,
    n_embd: int,
    block: int,
    batch: int,
    dtype: str = "fp32",
    compile: bool = False,
    compile_mode: str | None = None,
) -> Callable[[], None]:
    """nanoGPT's CPU training step, from ``nanogpt_control.py``'s re-implementation of its model: no
    bias, exact GELU, SDPA ``is_causal``, tied embeddings, and the per-tensor-loop AdamW that
    nanoGPT gets on CPU (it asks for ``fused`` on CUDA only). ``dtype="bf16"``: the forward under
    the same bf16 autocast as poslab's (nanoGPT's ``ctx``); ``compile``: nanoGPT's ``compile=True``
    (``torch.compile(model)``), here with ``dynamic=False`` as poslab's."""
    from nanogpt_control import TinyGPT, nanogpt_optimizer  # benchmarks/ is on sys.path

    torch.manual_seed(0)
    model = TinyGPT(VOCAB, block, n_layer, n_head, n_embd)
    model.train()
    optimizer = nanogpt_optimizer(model)
    forward = torch.compile(model, dynamic=False, mode=compile_mode) if compile else model
    generator = torch.Generator().manual_seed(1)

    def step() -> None:
        x = torch.randint(VOCAB, (batch, block), generator=generator)
        y = torch.randint(VOCAB, (batch, block), generator=generator)
        for group in optimizer.param_groups:  # nanogpt_control.nanogpt_update, with the autocast context
            group["lr"] = 1e-3
        with torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext():
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return step


def section_nanogpt(args: argparse.Namespace) -> dict:
    print(
        "\n== nanoGPT's CPU configurations: poslab vs a nanoGPT-style step raced in this run "
        "(benchmarks/nanogpt_control.py's model, per-tensor AdamW as nanoGPT runs on CPU)"
    )
    out = {}
    peaks = {dtype: measure_matmul_peak(dtype) for dtype in ("fp32", "bf16")}
    print(
        f"  measured matmul peak: fp32 {peaks['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f} GFLOP/s "
        "(references.md, quiet machine: 342 and 1,849)",
        flush=True,
    )
    for label, dims in (("4/4/128 T=128 B=32", (4, 4, 128, 128, 32)), ("6/6/384 T=256 B=16", (6, 6, 384, 256, 16))):
        fp32_step, model = poslab_step_fn(*dims, bias=False, activation="gelu")  # nanoGPT: no bias, exact GELU
        bf16_step, _ = poslab_step_fn(*dims, bias=False, activation="gelu", dtype="bf16")
        contenders = {"nanoGPT-style fp32": nanogpt_step_fn(*dims), "fp32": fp32_step, "bf16": bf16_step}
        stats = race(contenders, dims[3] * dims[4], max(2, args.steps // (4 if dims[2] > 128 else 1)), args.reps)
        flops = matmul_flops_per_token(model, dims[3])
        ref = NANOGPT_REFERENCE[label]
        nano = stats["nanoGPT-style fp32"]["median"]
        for name, s in stats.items():
            dtype = "bf16" if name == "bf16" else "fp32"
            s["mfu_best"] = s["max"] * flops / peaks[dtype]
            s["vs_nanogpt_style"] = s["median"] / nano
            extra = f"  MFU of best {s['mfu_best']:5.1%}"
            if name != "nanoGPT-style fp32":
                extra += f"; {s['vs_nanogpt_style']:.2f}x nanoGPT-style on medians (goal >= 1.30x at equal precision)"
            show(f"{label} {name}", s, extra)
        print(f"  (references.md's nanoGPT figure for {label}: ~{ref:,} tokens/s, fp32, quiet machine)", flush=True)
        out[label] = {"stats": stats, "nanogpt_reference": ref, "flops_per_token": flops}
    return {"configs": out, "peaks": peaks}


def race_cpu(
    contenders: dict[str, Callable[[], None]], tokens_per_step: int, steps: int, reps: int, warmup: int = 2
) -> dict[str, dict]:
    """Alternating timing on two clocks: process CPU time (``time.process_time``: what this process
    got of the machine, which other jobs' load does not inflate at one thread) and wall time.

    The first call of each contender (a compiled one compiles there) is timed apart as
    ``first_step_*_s`` and excluded, with ``warmup - 1`` more untimed steps. Returns name ->
    {median (CPU clock tokens/s), wall_median, min, max, rounds, wall_rounds, first_step_cpu_s, first_step_wall_s}.
    """
    out: dict[str, dict] = {}
    for name, step in contenders.items():
        cpu, wall, children = time.process_time(), time.perf_counter(), _children_cpu()
        step()
        out[name] = {
            "first_step_cpu_s": time.process_time() - cpu,
            "first_step_wall_s": time.perf_counter() - wall,
            "first_step_children_cpu_s": _children_cpu() - children,
        }  # the C++ compiler's processes
        for _ in range(warmup - 1):
            step()
        print(
            f"  {name}: first step {out[name]['first_step_wall_s']:.1f} s wall, "
            f"{out[name]['first_step_cpu_s']:.1f} s CPU (+ {out[name]['first_step_children_cpu_s']:.1f} s in "
            "compiler processes)",
            flush=True,
        )
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    wall_rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, step in contenders.items():
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(steps):
                step()
            rates[name].append(tokens_per_step * steps / (time.process_time() - cpu))
            wall_rates[name].append(tokens_per_step * steps / (time.perf_counter() - wall))
    for name in contenders:
        r, w = rates[name], wall_rates[name]
        out[name].update(
            {
                "median": statistics.median(r),
                "min": min(r),
                "max": max(r),
                "rounds": r,
                "wall_median": statistics.median(w),
                "wall_rounds": w,
            }
        )
    return out


def cpu_matmul_peak(dtype: str, n: int = 1024, reps: int = 20) -> float:
    """Best FLOP/s of an ``n x n @ n x n`` matmul over ``reps``, timed on the process CPU clock (the
    same clock as :func:`race_cpu`; at one thread other jobs' load does not enter it)."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=generator).to(torch_dtype)
    b = torch.rand(n, n, generator=generator).to(torch_dtype)
    torch.matmul(a, b)
    best = 0.0
    for _ in range(reps):
        start = time.process_time()
        torch.matmul(a, b)
        best = max(best, 2.0 * n**3 / max(time.process_time() - start, 1e-9))
    return best


def _children_cpu() -> float:
    """CPU seconds of this process's finished child processes (inductor's C++ compiler runs)."""
    t = os.times()
    return t.children_user + t.children_system


#: the compile section's configurations: label -> (dims, dtypes, steps per round, poslab's position scheme);
#: "preset" is ``shakespeare-char-fast``'s step (RoPE, bf16) against nanoGPT's recipe step (learned)
COMPILE_CONFIGS = {
    "4/4/128 T=128 B=32": ((4, 4, 128, 128, 32), ("fp32",), 4, "learned"),
    "6/6/384 T=256 B=16": ((6, 6, 384, 256, 16), ("fp32", "bf16"), 2, "learned"),
    "preset 4/4/128 T=64 B=12": ((4, 4, 128, 64, 12), ("fp32", "bf16"), 8, "rope"),
}
DEFAULT_COMPILE_CONFIGS = ("4/4/128 T=128 B=32", "6/6/384 T=256 B=16")


def section_compile(args: argparse.Namespace) -> dict:
    """poslab eager / compiled vs nanoGPT eager / compiled, the same dtype side by side; MFU of each."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # compile in this process, so process_time counts the compilation too
    inductor_config.fx_graph_cache = False  # and compile from scratch: the warm-up is a first run's
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="poslab-inductor-")  # no earlier run's kernels
    print(
        "\n== torch.compile: poslab (eager, compiled) vs nanoGPT's step (eager, compiled), the same dtype "
        "(bf16: the same autocast on both sides); clock: process CPU time",
        flush=True,
    )
    peaks = {dtype: cpu_matmul_peak(dtype) for dtype in ("fp32", "bf16")}
    wall_peaks = {dtype: measure_matmul_peak(dtype) for dtype in ("fp32", "bf16")}  # the loop's (wall clock)
    print(
        f"  measured matmul peak ({torch.get_num_threads()} threads, CPU clock): fp32 {peaks['fp32'] / 1e9:,.0f} "
        f"GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f} GFLOP/s (wall clock: {wall_peaks['fp32'] / 1e9:,.0f}, "
        f"{wall_peaks['bf16'] / 1e9:,.0f})",
        flush=True,
    )
    out: dict = {
        "peaks": peaks,
        "wall_peaks": wall_peaks,
        "threads": torch.get_num_threads(),
        "configs": {},
        "compile_mode": args.compile_mode,
    }
    for label in args.compile_configs or DEFAULT_COMPILE_CONFIGS:
        dims, dtypes, steps, position = COMPILE_CONFIGS[label]
        for dtype in (d for d in dtypes if not args.dtypes or d in args.dtypes):
            contenders: dict[str, Callable[[], None]] = {}
            model = None
            for compiled in (False, True):
                tag = " compiled" if compiled else ""
                step, built = poslab_step_fn(
                    *dims,
                    position=position,
                    bias=False,
                    activation="gelu",
                    dtype=dtype,
                    compile=compiled,
                    compile_mode=args.compile_mode,
                )
                model = model or built
                contenders[f"poslab{tag}"] = step
                contenders[f"nanoGPT{tag}"] = nanogpt_step_fn(
                    *dims, dtype=dtype, compile=compiled, compile_mode=args.compile_mode
                )
            print(f"  {label} {dtype}:", flush=True)
            stats = race_cpu(contenders, dims[3] * dims[4], steps, args.reps)
            flops = matmul_flops_per_token(model, dims[3])  # the same matrices on both sides (no bias, tied head)
            for name, st in stats.items():
                nano = stats["nanoGPT compiled" if name.endswith("compiled") else "nanoGPT"]["median"]
                st["mfu"] = st["median"] * flops / peaks[dtype]
                st["vs_nanogpt_same_mode"] = st["median"] / nano
                st["vs_nanogpt_eager"] = st["median"] / stats["nanoGPT"]["median"]
                show(
                    f"{label} {dtype} {name}",
                    st,
                    f"  MFU {st['mfu']:5.1%}; {st['vs_nanogpt_eager']:.2f}x nanoGPT "
                    f"eager, {st['vs_nanogpt_same_mode']:.2f}x nanoGPT in the same mode; wall median "
                    f"{st['wall_median']:,.0f}",
                )
            out["configs"][f"{label} {dtype}"] = {
                "stats": stats,
                "flops_per_token": flops,
                "steps": steps,
                "reps": args.reps,
            }
            if args.json:
                args.json.write_text(json.dumps({"compile": out}, indent=2, default=float))
    out["load_average_end"] = list(os.getloadavg())
    return out


def profile_step(steps: int = 10, config: str = "4/4/128 T=128 B=32", dtype: str = "fp32") -> None:
    """Where a training step's time goes: ``torch.profiler`` over ``steps`` steps, ops grouped
    (``config``: a :data:`COMPILE_CONFIGS` label; learned positions, no bias, exact GELU)."""
    from torch.profiler import ProfilerActivity, profile

    dims = COMPILE_CONFIGS[config][0]
    step, _ = poslab_step_fn(*dims, bias=False, activation="gelu", dtype=dtype)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    groups = {
        "matmul (mm/addmm/bmm)": ("aten::mm", "aten::addmm", "aten::bmm"),
        "SDPA (forward + backward)": ("aten::_scaled_dot_product",),
        "GELU (forward + backward)": ("aten::gelu",),
        "LayerNorm (forward + backward)": ("aten::native_layer_norm",),
        "copies (autocast casts, contiguous)": ("aten::copy_",),
        "AdamW": ("aten::_fused_adamw", "Optimizer."),
        "cross-entropy": ("aten::_log_softmax", "aten::nll_loss"),
    }
    shares = {name: 0.0 for name in groups}
    for event in events:
        for name, prefixes in groups.items():
            if event.key.startswith(prefixes):
                shares[name] += event.self_cpu_time_total
                break
    print(
        f"poslab {dtype} step, {config}, {torch.get_num_threads()} threads: "
        f"{total / steps / 1e3:.0f} ms of CPU per step (self time, {steps} steps)"
    )
    for name, value in shares.items():
        print(f"  {name:32s} {value / total:6.1%}")
    print(f"  {'everything else':32s} {1 - sum(shares.values()) / total:6.1%}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per timed round")
    parser.add_argument("--reps", type=int, default=7, help="alternating rounds")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 4 steps")
    parser.add_argument("--only", choices=("hf", "schemes", "nanogpt", "compile"), action="append")
    parser.add_argument(
        "--compile-configs",
        nargs="*",
        choices=list(COMPILE_CONFIGS),
        help=f"configurations of the compile section (default: {', '.join(DEFAULT_COMPILE_CONFIGS)})",
    )
    parser.add_argument("--compile-mode", help="torch.compile's mode in the compile section (default: its default)")
    parser.add_argument("--dtypes", nargs="*", choices=("fp32", "bf16"), help="compile section: only these dtypes")
    parser.add_argument("--schemes", nargs="*", help="schemes for the per-scheme section (default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only profile poslab's step (default fp32 4/4/128, T=128, B=32) and print where the time goes",
    )
    parser.add_argument("--profile-config", default="4/4/128 T=128 B=32", choices=list(COMPILE_CONFIGS))
    parser.add_argument("--profile-dtype", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args()
    if args.quick:
        args.steps, args.reps = 4, 3
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.reps} alternating rounds x {args.steps} "
        "steps; median and best round in tokens/s (the machine may be shared: see the spread)",
        flush=True,
    )
    if args.profile:
        profile_step(config=args.profile_config, dtype=args.profile_dtype)
        return
    sections = {"hf": section_hf, "schemes": section_schemes, "nanogpt": section_nanogpt, "compile": section_compile}
    results = {}
    for name, fn in sections.items():
        if not args.only or name in args.only:
            results[name] = fn(args)
            if args.json:  # after every section, so a long run interrupted still leaves its figures
                args.json.write_text(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
