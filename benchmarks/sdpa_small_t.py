"""SDPA at small T on CPU: the flash kernel vs the math path, forward + backward, causal.

Shapes of the CPU recipes' attention: nanoGPT's shakespeare_char (B=12, h=4, T=64, d_k=32) and
``train_throughput.py``'s 4/4/128 (B=32, T=128) and 6/6/384 (B=16, h=6, T=256, d_k=64). fp32 and bf16,
alternating the two kernels round by round, median ms over rounds, one thread by default.

    .venv/bin/python benchmarks/sdpa_small_t.py --json benchmarks/results/sdpa_small_t.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"B12 h4 T64 d32": (12, 4, 64, 32), "B32 h4 T128 d32": (32, 4, 128, 32), "B16 h6 T256 d64": (16, 6, 256, 64)}
KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for label, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(*shape, dtype=dtype)

            def run(kernel: SDPBackend, q=q, k=k, v=v, grad=grad) -> None:
                with sdpa_kernel(kernel):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(grad)
                q.grad = k.grad = v.grad = None

            times: dict[str, list[float]] = {name: [] for name in KERNELS}
            for kernel in KERNELS.values():
                run(kernel)
            for _ in range(args.rounds):
                for name, kernel in KERNELS.items():
                    start = time.perf_counter()
                    for _ in range(args.reps):
                        run(kernel)
                    times[name].append(1e3 * (time.perf_counter() - start) / args.reps)
            row = {
                "shape": label,
                "dtype": str(dtype).replace("torch.", ""),
                **{f"{name}_ms": statistics.median(t) for name, t in times.items()},
            }
            row["math_over_flash"] = row["math_ms"] / row["flash_ms"]
            rows.append(row)
            print(
                f"  {label:18s} {row['dtype']:8s} flash {row['flash_ms']:.3f} ms  math {row['math_ms']:.3f} ms  "
                f"math/flash {row['math_over_flash']:.2f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"threads": args.threads, "rows": rows, "load_average": list(__import__("os").getloadavg())}, indent=2
            )
        )


if __name__ == "__main__":
    main()
