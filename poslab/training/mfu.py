"""Model FLOPs utilisation (layer 2): FLOPs per training token, the measured matmul peak, and MFU.

MFU is nanoGPT's figure: tokens/s x FLOPs per token over the machine's peak. The peak is measured
here (the best of repeated square matmuls), not looked up, and a figure above 1 is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from poslab.nn.model import GPT


def matmul_flops_per_token(model: GPT, block_size: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM's estimate as used by nanoGPT.

    ``6 * N + 12 * n_layer * n_embd * T`` with ``N`` = the weights of the transformer's linear
    layers and the LM head (the matmul parameters; embedding lookups cost no FLOPs).
    """
    n_matmul = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and (name.startswith("blocks.") or name == "lm_head")
    )
    cfg = model.config
    return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_embd * block_size


def measure_matmul_peak(
    dtype: str = "fp32", n: int = 1024, seconds: float = 0.3, min_reps: int = 8, device: torch.device | str = "cpu"
) -> float:
    """Best measured FLOP/s of an ``n x n @ n x n`` matmul on ``device`` (the CPU: with the current threads).

    The best of at least ``min_reps`` timed matmuls (and at least ``seconds``): on a machine shared
    with other jobs the best one is the least disturbed. Uses no global RNG (a run's random stream is
    untouched). On CUDA each matmul is timed between two synchronisations, at ``n = 4096`` at least.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    n = max(n, 4096) if cuda else n
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=generator).to(device=device, dtype=torch_dtype)
    b = torch.rand(n, n, generator=generator).to(device=device, dtype=torch_dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2):
        torch.matmul(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    reps = 0
    while True:
        sync()
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        elapsed = time.perf_counter() - start
        best = max(best, 2.0 * n**3 / elapsed)
        reps += 1
        if reps >= min_reps and time.perf_counter() > deadline:
            return best


def training_peak(dtype: str, device: torch.device, cached: Callable[[str, Callable[[], float]], float]) -> float:
    """The matmul peak a run's MFU is a fraction of: the faster of the measured peaks of the dtypes it uses.

    Under bf16 autocast the matmuls run in bf16 and the rest in fp32: the peak is the faster of the
    two, so the figure is a fraction of what this machine can do in any dtype the run uses.

    Args:
        dtype: the run's concrete dtype (``"fp32"`` or ``"bf16"``).
        device: where it trains.
        cached: ``cached(key, measure)``: the cached figure of ``key`` (``dtype/threads`` on the CPU,
            ``cuda/dtype`` on a GPU), measured with ``measure`` on first use (the run folder's ``peak.json``).
    """
    used = ("fp32", "bf16") if dtype == "bf16" else ("fp32",)
    if device.type == "cuda":
        return max(cached(f"cuda/{d}", lambda d=d: measured_peak(d, device)) for d in used)
    return max(cached(f"{d}/{torch.get_num_threads()}", lambda d=d: measured_peak(d)) for d in used)


def mfu_of(tokens_per_s: float | None, flops_per_token: float, peak: float) -> float | str | None:
    """Model FLOPs utilisation, ``None`` without a throughput, or the reason it is refused.

    A fraction above 1 cannot be: the peak would be wrong (measured at a disturbed moment, or in a
    dtype the run does not use), so the figure is not recorded and the reason is returned instead.
    """
    if not tokens_per_s:
        return None
    mfu = tokens_per_s * flops_per_token / peak
    if not 0.0 <= mfu <= 1.0:
        return (
            f"MFU {mfu:.2f} exceeds 1 ({tokens_per_s:,.0f} tok/s x {flops_per_token:,.0f} FLOP/token over a "
            f"measured peak of {peak / 1e9:.2f} GFLOP/s): the peak is wrong, the figure is not recorded"
        )
    return mfu


PEAK_CACHE: dict[str, float] = {}


def measured_peak(dtype: str, device: torch.device | None = None) -> float:
    """:func:`measure_matmul_peak`, measured once per process for each dtype/threads (CPU) or dtype/GPU."""
    device = device or torch.device("cpu")
    key = f"{device}/{dtype}" if device.type == "cuda" else f"{dtype}/{torch.get_num_threads()}"
    if key not in PEAK_CACHE:
        PEAK_CACHE[key] = measure_matmul_peak(dtype, device=device)
    return PEAK_CACHE[key]


__all__ = ["matmul_flops_per_token", "measure_matmul_peak", "measured_peak", "mfu_of", "training_peak"]
