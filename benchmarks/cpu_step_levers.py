"""CPU step levers at the time-to-loss size (4/4/128 RoPE, block 64, exact GELU, no bias): tokens/s of
full training steps (``train_throughput.poslab_step_fn``: forward with loss, backward, clip, fused
AdamW) for batch 12 vs 48, fp32 vs bf16 autocast, and SDPA's flash kernel vs its math kernel, with
nanoGPT's own step at its recipe's size (``nanogpt_control.py``'s model and per-tensor AdamW) in the
same rotation.

``default`` is poslab as shipped (bf16 at T <= 128 takes the math kernel on CPU,
``CPU_LOWP_MATH_MAX_T``); ``flash`` forces the flash kernel, ``math`` the math kernel. Contenders alternate
round by round in one process (median over rounds), one thread by default.

    .venv/bin/python benchmarks/cpu_step_levers.py --json benchmarks/results/cpu_step_levers.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import nanogpt_step_fn, poslab_step_fn  # noqa: E402

from poslab.nn.attention import backends as attention  # noqa: E402

KERNELS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = [
        (12, "fp32", "default"),
        (12, "bf16", "default"),
        (12, "bf16", "flash"),
        (12, "bf16", "math"),
        (12, "fp32", "math"),
        (48, "fp32", "default"),
        (48, "bf16", "default"),
    ]
    steps = {(12, "fp32", "nanoGPT"): nanogpt_step_fn(4, 4, 128, 64, 12)}  # the recipe's step, per-tensor AdamW
    for batch, dtype, kernel in cases:
        fn = poslab_step_fn(4, 4, 128, 64, batch, position="rope", dtype=dtype, bias=False, activation="gelu")[0]

        def step(fn=fn, kernel=KERNELS[kernel]) -> None:
            # poslab's own choice sits inside the model (an inner sdpa_kernel wins): switch it off to force a kernel
            limit = attention.CPU_LOWP_MATH_MAX_T
            attention.CPU_LOWP_MATH_MAX_T = limit if kernel is None else -1
            try:
                with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
                    fn()
            finally:
                attention.CPU_LOWP_MATH_MAX_T = limit

        steps[(batch, dtype, kernel)] = step
        step()
    rates: dict[tuple, list[float]] = {key: [] for key in steps}
    for _ in range(args.rounds):
        for key, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            rates[key].append(args.steps * key[0] * 64 / (time.perf_counter() - start))
    rows = []
    for (batch, dtype, kernel), r in rates.items():
        rows.append(
            {
                "batch": batch,
                "dtype": dtype,
                "sdpa_kernel": kernel,
                "tokens_per_s_median": statistics.median(r),
                "rounds": r,
            }
        )
        print(
            f"  B={batch:2d} {dtype} sdpa {kernel:7s} {statistics.median(r):>8,.0f} tokens/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in r)})",
            flush=True,
        )
    if args.json:
        args.json.write_text(
            json.dumps({"threads": args.threads, "rows": rows, "load_average": list(os.getloadavg())}, indent=2)
        )


if __name__ == "__main__":
    main()
