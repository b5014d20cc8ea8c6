"""Timing and peak memory of the bench's cases, and KV-cache decoding (the honesty rules: :mod:`poslab.bench`)."""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from poslab.bench.cases import (
    BATCH,
    D_MODEL,
    HEAD_DIM,
    HEADS,
    THREADS_ENV,
    WINDOW,
    Case,
    attention_cases,
    build_case,
)
from poslab.nn.attention import AttentionConfig
from poslab.nn.caches import DecodeSpec

#: the clock of every timing: wall time (``perf_counter``) or this process's CPU time (``process_time``)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def set_clock(name: str) -> None:
    """Time with ``"wall"`` (default) or ``"cpu"`` (process CPU time: steadier on a busy machine at 1 thread)."""
    global _clock
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {name!r}")
    _clock = CLOCKS[name]


def clock_name() -> str:
    return next(name for name, fn in CLOCKS.items() if fn is _clock)


def useful_flops(T: int, window: int | None) -> float:
    """FLOPs of causal attention (with projections), forward + backward (= 3x forward)."""
    keys = (T + 1) / 2 if window is None or window >= T else (window * T - window * (window - 1) / 2) / T
    forward = 8 * BATCH * T * D_MODEL**2 + 4 * BATCH * T * keys * D_MODEL
    return 3 * forward


def matmul_gflops(n: int = 1024, repeats: int = 7) -> float:
    """The machine's fp32 ``torch.matmul`` rate (median of ``repeats``), in GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        start = _clock()
        a @ b
        times.append(_clock() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def time_cases(steps: dict[str, Callable[[], None]], repeats: int, warmup: bool = True) -> dict[str, list[float]]:
    """Warm up each step once (optional), then ``repeats`` rounds in rotating order; seconds per run."""
    names = list(steps)
    for name in names if warmup else ():
        steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # alternate who goes first
        for name in order:
            gc.collect()
            start = _clock()
            steps[name]()
            times[name].append(_clock() - start)
    return times


# ---------------------------------------------------------------------------------- memory
def _status_kb(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def _worker(case: Case, T: int) -> None:
    """Subprocess entry: peak resident memory of one forward + backward, printed as JSON (MiB)."""
    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    step = build_case(case, T)
    gc.collect()
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    step()
    peak = _status_kb("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def available_mib() -> float:
    match = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return int(match.group(1)) / 1024 if match else float("inf")


def measure_memory(case: Case, T: int, timeout: float = 1800) -> float | None:
    """Peak MiB of ``case`` at ``T`` in a fresh subprocess (``None`` if skipped or failed)."""
    if case.quadratic_bytes * T * T / 2**20 > 0.5 * available_mib():
        return None
    cmd = [sys.executable, "-m", "poslab.bench.measure", "--worker", case.to_json(), str(T)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    if done.returncode != 0:
        print(
            f"  memory worker for {case.name} at T={T} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr
        )
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"])


# ------------------------------------------------------------------------------------- run
def run_attention(
    sizes: Sequence[int],
    repeats: int,
    memory: bool = True,
    cases: Sequence[Case] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time (and measure) every case (default :func:`attention_cases`) at every size; the rows and the roofline."""
    peak = matmul_gflops()
    log(f"fp32 matmul roofline: {peak:.0f} GFLOP/s ({torch.get_num_threads()} threads)")
    cases = list(cases) if cases is not None else attention_cases()
    rows = []
    for T in sizes:
        runnable = [c for c in cases if c.quadratic_bytes * T * T / 2**20 <= 0.5 * available_mib()]
        skipped = [c.name for c in cases if c not in runnable]
        # long sizes: no warm-up round, at least 3 timed rounds (the median drops a cold first run)
        n_repeats, warmup = (repeats, True) if T <= 2048 else (max(3, repeats // 2), False)
        log(
            f"T={T}: timing {len(runnable)} cases x {n_repeats} alternating rounds"
            + (f" (skipped, too much memory: {', '.join(skipped)})" if skipped else "")
        )
        steps = {c.name: build_case(c, T) for c in runnable}
        times = time_cases(steps, n_repeats, warmup)
        del steps
        gc.collect()
        for case in cases:
            row: dict[str, Any] = {"case": case.name, "T": T, "ms": None, "runs_ms": [], "peak_mib": None}
            if case.name in times:
                median = statistics.median(times[case.name])
                flops = useful_flops(T, case.window)
                row.update(
                    ms=median * 1e3,
                    runs_ms=[t * 1e3 for t in times[case.name]],
                    gflops=flops / median / 1e9,
                    roofline=flops / median / 1e9 / peak,
                )
                if memory:
                    row["peak_mib"] = measure_memory(case, T)
            else:
                row["skipped"] = "estimated memory above half of MemAvailable"
            rows.append(row)
            if row["ms"] is not None:
                mem = f"{row['peak_mib']:.0f} MiB" if row["peak_mib"] is not None else "-"
                log(f"  {case.name:24s} {row['ms']:10.1f} ms  {mem}")
    return {
        "roofline_gflops": peak,
        "threads": torch.get_num_threads(),
        "clock": clock_name(),
        "rows": rows,
        "geometry": {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "window": WINDOW},
    }


# ======================================================================================== decode
def _decode_model(position: str, window: int | None, block: int) -> nn.Module:
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(
        GPTConfig(
            vocab_size=256,
            n_layer=4,
            n_head=4,
            n_embd=128,
            block_size=block,
            position=position,
            attention=AttentionConfig(window=window),
        )
    ).eval()


def run_decode(
    contexts: Sequence[int], repeats: int, steps: int = 16, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Per-token latency at each context: KV cache (RoPE, ALiBi, rolling window) vs full recompute (RoPE)."""
    block = max(contexts) + steps + 1
    models = {
        "kv-cache:rope": _decode_model("rope", None, block),
        "kv-cache:alibi": _decode_model("alibi", None, block),
        f"kv-cache:rope-window{WINDOW}": _decode_model("rope", WINDOW, block),
    }
    recompute = models["kv-cache:rope"]
    rows = []
    with torch.no_grad():
        for context in contexts:
            idx = torch.randint(0, 256, (1, context + steps))
            latencies: dict[str, list[float]] = {name: [] for name in [*models, "recompute:rope"]}
            for r in range(repeats):
                names = list(latencies)
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    gc.collect()
                    if name == "recompute:rope":  # one new token = one forward over everything so far
                        start = _clock()
                        recompute(idx[:, : context + 1])
                        latencies[name].append(_clock() - start)
                        continue
                    model = models[name]
                    cache = model.make_cache(1, DecodeSpec(capacity=context + steps))
                    model(idx[:, :context], cache=cache)  # prefill (not timed)
                    for t in range(context, context + steps):
                        start = _clock()
                        model(idx[:, t : t + 1], cache=cache)
                        latencies[name].append(_clock() - start)
            for name, values in latencies.items():
                median = statistics.median(values)
                rows.append(
                    {"case": name, "context": context, "ms_per_token": median * 1e3, "tokens_per_s": 1 / median}
                )
                log(f"  context {context:5d}  {name:24s} {median * 1e3:8.2f} ms/token  {1 / median:8.1f} tokens/s")
    return {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "batch": 1},
        "steps": steps,
        "rows": rows,
        "threads": torch.get_num_threads(),
        "clock": clock_name(),
    }


# ======================================================================================= report


if __name__ == "__main__":  # memory worker: python -m poslab.bench.measure --worker CASE T
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(Case.from_json(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: python -m poslab.bench.measure --worker CASE_JSON T (use `poslab bench` for the benchmark)")
