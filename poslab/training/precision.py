"""The training precision chosen by measuring it: ``dtype="auto"``.

bf16 autocast is a speed-up only where the hardware computes bf16 natively (CUDA GPUs that support it;
CPUs with AVX512-BF16 or AMX). On a CPU without it PyTorch emulates bf16 and a training step runs many
times slower than in fp32. So ``auto`` does not guess from the CPU's flags: it times a small matmul and
a small training step (forward + backward of a 2-layer GPT) in fp32 and under bf16 autocast, and uses
bf16 only where its step is clearly faster (at most :data:`BF16_AT_MOST` of the fp32 step's time). The
figures are measured once per machine and cached in ``$XDG_CACHE_HOME/poslab/precision.json``
(``~/.cache/poslab/precision.json``), keyed by CPU model, torch version and thread count;
``POSLAB_CACHE_DIR`` names another folder. On CUDA the rule is ``torch.cuda.is_bf16_supported()``, with
nothing to measure.

An explicit ``bf16`` on a CPU where it measured slower still runs, with a one-line warning that names
the measured ratio.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from poslab.checks import is_number
from poslab.fileio import atomic_write_json
from poslab.safe_load import load_json

#: the dtypes a run computes in; ``"auto"`` resolves to one of them
CONCRETE_DTYPES = ("fp32", "bf16")

#: ``auto`` takes bf16 only when its step takes at most this fraction of the fp32 step: a tie (inside
#: the few-percent noise of a short timing) keeps fp32, the more precise dtype
BF16_AT_MOST = 0.9


@dataclass(frozen=True)
class PrecisionFigures:
    """What one machine measured: best times of a small training step and matmul rates, per dtype.

    Attributes:
        fp32_step_s / bf16_step_s: best wall time of one forward + backward of the probe model.
        fp32_matmul_flops / bf16_matmul_flops: best FLOP/s of a 512 x 512 matmul.
    """

    fp32_step_s: float
    bf16_step_s: float
    fp32_matmul_flops: float
    bf16_matmul_flops: float

    @property
    def step_ratio(self) -> float:
        """bf16 step time / fp32 step time (below 1: bf16 is faster)."""
        return self.bf16_step_s / self.fp32_step_s


@dataclass(frozen=True)
class PrecisionChoice:
    """The dtype a run uses and why.

    Attributes:
        requested: what the config asked for (``auto``, ``fp32`` or ``bf16``).
        dtype: what the run computes in (``fp32`` or ``bf16``).
        reason: one line for the progress header.
        figures: the measurement behind it (``None`` where nothing was measured).
        warning: a one-line warning to print (explicit bf16 measured slower), or ``None``.
    """

    requested: str
    dtype: str
    reason: str
    figures: PrecisionFigures | None = None
    warning: str | None = None

    def to_dict(self) -> dict:
        """The record ``results.json`` keeps under ``"precision"``."""
        doc = asdict(self)
        if self.figures is not None:
            doc["figures"]["bf16_over_fp32_step"] = self.figures.step_ratio
        return doc


Measure = Callable[[], PrecisionFigures]


def autocast(dtype: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast for ``dtype="bf16"``, nothing for fp32."""
    if dtype == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cache_path() -> Path:
    """Where the per-machine figures are kept (``POSLAB_CACHE_DIR``, else the XDG cache folder)."""
    base = os.environ.get("POSLAB_CACHE_DIR")
    if base:
        return Path(base) / "precision.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "poslab" / "precision.json"


def machine_key() -> str:
    """CPU model, torch version and threads: what the figures depend on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def _best_time(fn: Callable[[], object], reps: int, budget_s: float) -> float:
    """Best wall time of ``fn`` over ``reps`` calls (fewer once ``budget_s`` is spent, at least 2)."""
    fn()  # warm-up
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    for i in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        if i >= 1 and time.perf_counter() > deadline:
            break
    return best


def measure(reps: int = 5, budget_s: float = 1.5, rounds: int = 3) -> PrecisionFigures:
    """Time the probe step and matmul in fp32 and bf16 on this CPU (a few seconds; no global RNG used).

    The probe is a 2-layer, 4-head, width-128 GPT on 8 windows of 64 tokens: the lab's scale.
    """
    from poslab.nn.model import GPT, GPTConfig  # layer 1 from layer 2: allowed

    generator = torch.Generator().manual_seed(0)
    state = torch.get_rng_state()
    try:
        model = GPT(GPTConfig(vocab_size=96, n_layer=2, n_head=4, n_embd=128, block_size=64, position="rope"))
    finally:
        torch.set_rng_state(state)  # building the probe leaves the run's random stream untouched
    idx = torch.randint(0, 96, (8, 64), generator=generator)  # [B, T]
    targets = torch.randint(0, 96, (8, 64), generator=generator)  # [B, T]

    def step(dtype: str) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(idx)  # [B, T, V]
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()

    a = torch.rand(512, 512, generator=generator)
    b = torch.rand(512, 512, generator=generator)
    a16, b16 = a.bfloat16(), b.bfloat16()
    flops = 2.0 * 512**3
    # alternate the two dtypes, round after round, and keep each one's best: a load that comes and
    # goes on a shared machine slows some calls of both, not the best call of either
    fp32_step = bf16_step = fp32_mm = bf16_mm = float("inf")
    share = budget_s / rounds
    for _ in range(rounds):
        fp32_step = min(fp32_step, _best_time(lambda: step("fp32"), reps, share / 3))
        bf16_step = min(bf16_step, _best_time(lambda: step("bf16"), reps, share / 3))
        fp32_mm = min(fp32_mm, _best_time(lambda: a @ b, reps, share / 6))
        bf16_mm = min(bf16_mm, _best_time(lambda: a16 @ b16, reps, share / 6))
    return PrecisionFigures(fp32_step, bf16_step, flops / fp32_mm, flops / bf16_mm)


#: the plausible range of each cached figure: a step of the probe model takes about a millisecond to a
#: second on any machine torch runs on, a 512 x 512 matmul runs at 1 MFLOP/s to 1 EFLOP/s; a cached
#: value outside it (0, 1e-400 read as 0, a negative or absurd time, NaN, a bool) is a damaged or
#: forged file, measured again
FIGURE_RANGES = {
    "fp32_step_s": (1e-7, 1e4),
    "bf16_step_s": (1e-7, 1e4),
    "fp32_matmul_flops": (1e6, 1e18),
    "bf16_matmul_flops": (1e6, 1e18),
}


def valid_figures(entry: object) -> PrecisionFigures | None:
    """``entry`` (one cached record) as figures when every field is a finite number in :data:`FIGURE_RANGES`
    (a bool or a string is not a number), else ``None``."""
    if not isinstance(entry, dict):
        return None
    values = {}
    for name, (low, high) in FIGURE_RANGES.items():
        value = entry.get(name)
        if not is_number(value) or not low <= value <= high:
            return None  # NaN fails the range comparison too
        values[name] = float(value)
    return PrecisionFigures(**values)


def cached_figures(measure_fn: Measure = measure, path: Path | None = None) -> PrecisionFigures:
    """This machine's figures: from the cache, else measured now and cached.

    A cache file that cannot be read or parsed, or whose record for this machine is not valid
    (:func:`valid_figures`: a zero, negative, non-finite or absurd figure, a bool), is measured again
    and rewritten; one that cannot be written is left as it is (the figures are still returned). A
    cache file that is a symbolic link is read through it (a cache folder kept elsewhere) and,
    rewritten, replaced by a file: the link's target is never written.
    """
    path = cache_path() if path is None else path
    key = machine_key()
    entries: dict = {}
    try:
        entries = load_json(path.read_text(encoding="utf-8"), repr(str(path)))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8, not JSON, nested too deeply
        pass
    if not isinstance(entries, dict):
        entries = {}
    cached = valid_figures(entries.get(key))
    if cached is not None:
        return cached
    figures = measure_fn()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**entries, key: asdict(figures)})
    except OSError:
        pass
    return figures


def choose_dtype(
    requested: str, device: torch.device, measure_fn: Measure = measure, path: Path | None = None
) -> PrecisionChoice:
    """Resolve ``requested`` (``auto``/``fp32``/``bf16``) for ``device``.

    Args:
        requested: the config's ``dtype``.
        device: where the run computes.
        measure_fn: the measurement (tests pass a stub).
        path: the cache file (default :func:`cache_path`).

    Returns:
        The choice, with the figures it rests on and any warning.

    Raises:
        ValueError: ``requested`` is not ``auto``, ``fp32`` or ``bf16``.
    """
    if requested not in ("auto", *CONCRETE_DTYPES):
        raise ValueError(f"dtype={requested!r} is not allowed; choose one of ['auto', 'fp32', 'bf16']")
    if requested == "fp32":
        return PrecisionChoice(requested, "fp32", "fp32 as configured")
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        if requested == "bf16":
            return PrecisionChoice(requested, "bf16", "bf16 as configured")
        return PrecisionChoice(
            requested,
            "bf16" if supported else "fp32",
            f"auto: this GPU {'supports' if supported else 'does not support'} bf16",
        )
    if device.type != "cpu":
        return PrecisionChoice(
            requested, "fp32" if requested == "auto" else requested, f"{requested} on {device.type}: nothing measured"
        )
    figures = cached_figures(measure_fn, path)
    ratio = figures.step_ratio
    measured = (
        f"bf16 step {1e3 * figures.bf16_step_s:.1f} ms vs fp32 {1e3 * figures.fp32_step_s:.1f} ms "
        f"({ratio:.2f}x the time)"
    )
    if requested == "bf16":
        warning = None
        if ratio >= 1.0:
            warning = (
                f"poslab: warning: dtype bf16 measured slower than fp32 on this CPU ({measured}); "
                f"--dtype auto or fp32 trains faster"
            )
        return PrecisionChoice(requested, "bf16", f"bf16 as configured ({measured})", figures, warning)
    dtype = "bf16" if ratio <= BF16_AT_MOST else "fp32"
    return PrecisionChoice(requested, dtype, f"auto: {dtype}, {measured}", figures)


__all__ = [
    "autocast",
    "CONCRETE_DTYPES",
    "PrecisionChoice",
    "PrecisionFigures",
    "cache_path",
    "cached_figures",
    "choose_dtype",
    "machine_key",
    "measure",
    "valid_figures",
]
