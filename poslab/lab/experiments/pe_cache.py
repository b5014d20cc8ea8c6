"""Is a precomputed sinusoidal encoding "40x faster" than computing it on the fly? (seed 002 §5.2)

Seed 002 shows a ``PositionalEncoding`` that precomputes ``pe[max_len, d_model]`` once and claims
"实测效果：预计算版本比实时计算快40倍" (the precomputed version is 40x faster). This experiment times,
on this machine:

* the encoding alone: a lookup in poslab's cached ``sinusoidal`` table (``cache[pos]``) against
  computing ``sin``/``cos`` for the same positions (:func:`~poslab.nn.positions.absolute.sinusoid_table`);
* the embedding step ``x + PE`` for a batch, cached against on the fly;
* a whole forward pass of a small GPT whose sinusoidal scheme is cached against one that recomputes
  the table every call, to show what the speed-up is worth inside a model.

The two variants are timed alternately (:func:`time_pair`). It also checks two smaller claims of the same
section: the values stay in [-1, 1], and the wavelengths run from 2*pi to (almost) 10000*2*pi.
Vaswani et al. 2017 (https://arxiv.org/abs/1706.03762) define the encoding.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from poslab.display import print_table
from poslab.lab.experiments.common import FOUNDATION, Experiment, one_thread
from poslab.lab.verdicts import at_least, deterministic
from poslab.nn import positions
from poslab.nn.model import GPT, GPTConfig
from poslab.nn.positions.absolute import sinusoid_table

CLAIM = "预计算版本比实时计算快40倍 (the precomputed positional encoding is 40x faster than computing it)"
CLAIMED_SPEEDUP = 40.0
# Verdict on what the lesson's module does in forward (x + PE), not on the table computation alone:
# held if that is at least within a factor of 2 of the claimed 40x.
HELD_IF_AT_LEAST = 20.0


def time_pair(
    first: Callable[[], object], second: Callable[[], object], samples: int, calls: int
) -> tuple[float, float]:
    """Median seconds per call of two functions, timed alternately (``samples`` x ``calls`` each)."""
    first(), second()  # warm up
    times_a, times_b = [], []
    for _ in range(samples):
        for fn, bucket in ((first, times_a), (second, times_b)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            bucket.append((time.perf_counter() - start) / calls)
    return statistics.median(times_a), statistics.median(times_b)


def run(out: Path, quick: bool = False) -> dict:
    """Time the three comparisons on one thread; print a table; return the figures (``out`` unused).

    One thread: these are small element-wise ops, and on a shared machine a second OpenMP thread
    turns microseconds into milliseconds of spin-waiting, which would measure the neighbours.
    """
    with one_thread():
        return _run(quick)


def _run(quick: bool) -> dict:
    torch.manual_seed(0)
    d_model, batch = 512, 8
    lengths = (128, 512) if quick else (128, 512, 1024)
    samples, calls = (5, 5) if quick else (9, 10)
    scheme = positions.build("sinusoidal", n_embd=d_model, max_len=max(lengths))
    rows = []
    with torch.no_grad():
        for T in lengths:
            pos = torch.arange(T)
            x = torch.randn(batch, T, d_model)
            lookup, compute = time_pair(lambda: scheme.cache[pos], lambda: sinusoid_table(pos, d_model), samples, calls)  # noqa: B023
            embed_cached, embed_fly = time_pair(
                lambda: scheme.embed(x, pos),  # noqa: B023
                lambda: x + sinusoid_table(pos, d_model),  # noqa: B023
                samples,
                calls,
            )
            rows.append(
                {
                    "seq_len": T,
                    "d_model": d_model,
                    "batch": batch,
                    "pe_lookup_us": lookup * 1e6,
                    "pe_compute_us": compute * 1e6,
                    "pe_speedup": compute / lookup,
                    "embed_cached_us": embed_cached * 1e6,
                    "embed_on_the_fly_us": embed_fly * 1e6,
                    "embed_speedup": embed_fly / embed_cached,
                }
            )
        model_row = _model_forward(samples=3 if quick else 5, calls=2)

    table = torch.cat([scheme.cache, sinusoid_table(torch.arange(5000), d_model)])
    wavelengths = [2 * math.pi * 10000 ** (2 * i / d_model) for i in range(d_model // 2)]
    headline = next(r for r in rows if r["seq_len"] == 512)
    results = {
        "claim": CLAIM,
        "claimed_speedup": CLAIMED_SPEEDUP,
        "held_if_at_least": HELD_IF_AT_LEAST,
        "threads": torch.get_num_threads(),
        "timing": f"median of {samples} alternating samples, each the mean of {calls} calls; machine possibly shared",
        "rows": rows,
        "model_forward": model_row,
        "headline": {
            "seq_len": 512,
            "pe_speedup": headline["pe_speedup"],
            "embed_speedup": headline["embed_speedup"],
            "model_speedup": model_row["speedup"],
        },
        "value_range": {"min": float(table.min()), "max": float(table.max())},
        "wavelength_range": {
            "min_over_2pi": wavelengths[0] / (2 * math.pi),
            "max_over_2pi": wavelengths[-1] / (2 * math.pi),
        },
        "claims": [
            at_least(
                CLAIM,
                "seed 002 §5.2",
                f"x + PE with the cached table at least {HELD_IF_AT_LEAST:g}x faster than computing it (T=512, d=512; "
                f"median of {samples} alternating timing samples, one thread; no seeds)",
                (
                    f"encoding alone {headline['pe_speedup']:.1f}x, x + PE {headline['embed_speedup']:.1f}x, "
                    f"whole GPT forward {model_row['speedup']:.2f}x (T=512, d=512)"
                ),
                value=float(headline["embed_speedup"]),
                floor=float(HELD_IF_AT_LEAST),
            ).to_dict(),
            deterministic(
                "数值范围稳定在[-1,1]之间 (sinusoidal values stay in [-1, 1])",
                "seed 002 §2.1",
                "max |PE| over 5000 positions x 512 dims ≤ 1 (exact: sin and cos are bounded; tolerance 0)",
                f"min {float(table.min()):.4f}, max {float(table.max()):.4f} over 5000 positions x 512 dims",
                error=max(0.0, float(table.abs().max()) - 1.0),
                tolerance=0.0,
            ).to_dict(),
            deterministic(
                "不同维度对应不同波长（从2π到10000·2π） (wavelengths from 2*pi to 10000*2*pi)",
                "seed 002 §2.1",
                "shortest wavelength 2π (relative tolerance 1e-12) and longest in [0.9, 1) x 10000·2π",
                f"2pi x {wavelengths[0] / (2 * math.pi):.0f} to 2pi x {wavelengths[-1] / (2 * math.pi):,.0f} (d=512)",
                error=abs(wavelengths[0] / (2 * math.pi) - 1.0)
                + (0.0 if 0.9 * 10000 <= wavelengths[-1] / (2 * math.pi) < 10000 else 1.0),
                tolerance=1e-12,
            ).to_dict(),
        ],
    }
    print_table(
        ["T", "PE lookup", "PE compute", "speed-up", "x+PE cached", "x+PE on the fly", "speed-up"],
        [
            [
                r["seq_len"],
                f"{r['pe_lookup_us']:.1f} us",
                f"{r['pe_compute_us']:.1f} us",
                f"{r['pe_speedup']:.1f}x",
                f"{r['embed_cached_us']:.1f} us",
                f"{r['embed_on_the_fly_us']:.1f} us",
                f"{r['embed_speedup']:.1f}x",
            ]
            for r in rows
        ],
        title=f"seed 002 §5.2: precomputed vs on-the-fly sinusoidal encoding (d={d_model}, batch {batch}, "
        f"{torch.get_num_threads()} threads; medians)",
    )
    print(
        f"  whole GPT forward ({model_row['config']}): cached {model_row['cached_ms']:.2f} ms, "
        f"recomputed {model_row['on_the_fly_ms']:.2f} ms -> {model_row['speedup']:.2f}x"
    )
    verdict = results["claims"][0]["verdict"]
    print(
        f"  claim '40x faster': {verdict} for the module's forward x + PE ({headline['embed_speedup']:.1f}x at T=512; "
        f"the table computation alone: {headline['pe_speedup']:.1f}x); inside a whole model the difference is "
        f"{100 * (model_row['speedup'] - 1):+.1f}%"
    )
    return results


def _model_forward(samples: int, calls: int) -> dict:
    """A small sinusoidal GPT's forward with the scheme's cache vs a table recomputed every call."""
    cfg = GPTConfig(vocab_size=256, n_layer=4, n_head=4, n_embd=128, block_size=256, position="sinusoidal")
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (8, cfg.block_size))
    scheme = model.position
    cached_embed = scheme.embed

    def fly_embed(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x + sinusoid_table(pos, cfg.n_embd).to(x.dtype)  # [B, T, d] + [T, d]

    def with_cache() -> object:
        scheme.embed = cached_embed
        return model(idx)

    def on_the_fly() -> object:
        scheme.embed = fly_embed
        return model(idx)

    try:
        cached, fly = time_pair(with_cache, on_the_fly, samples, calls)
    finally:
        scheme.__dict__.pop("embed", None)  # back to the class's cached embed
    return {
        "config": "4 layers, 4 heads, n_embd 128, T 256, batch 8",
        "cached_ms": cached * 1e3,
        "on_the_fly_ms": fly * 1e3,
        "speedup": fly / cached,
    }


EXPERIMENT = Experiment(
    name="pe-cache",
    description="precomputed vs on-the-fly sinusoidal encoding: seed 002's '40x faster' (timed here)",
    tier=FOUNDATION,
    run=run,
)
