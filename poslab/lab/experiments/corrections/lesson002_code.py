"""Seed 002's code and recipes, run as written."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from poslab.lab.lesson_quotes import quoted
from poslab.lab.verdicts import deterministic
from poslab.nn.attention import position_mask


# ----------------------------------------------------------------------------- local mask
def lesson_local_keep(L: int, window_size: int) -> torch.Tensor:
    """Seed 002 §3.1 verbatim, as the keep-mask its ``masked_fill(mask == 0, -1e9)`` implies."""
    mask = torch.ones(L, L).tril(-window_size) + torch.ones(L, L).triu(window_size)
    return mask != 0


def local_mask_claim(T: int = 8, W: int = 3) -> dict[str, Any]:
    lesson = lesson_local_keep(T, W)
    right = position_mask(torch.arange(T), torch.arange(T), True, W)
    wrong = int((lesson != right).sum())
    record = deterministic(
        "the local-attention mask keeps each query's window",
        "seed 002 §3.1",
        f"the lesson's keep-mask equals poslab's sliding window (i - W < j <= i) at T = {T}, W = {W} "
        "(error = number of disagreeing pairs)",
        f"{wrong} of {T * T} pairs disagree: the lesson keeps the pairs at distance >= W (past and future) and masks "
        f"the window, the query itself included (diagonal kept: {bool(lesson.diagonal().any())})",
        error=float(wrong),
        tolerance=0.0,
        details={"lesson": lesson.int().tolist(), "poslab": right.int().tolist()},
    )
    return quoted(
        "local_mask",
        record,
        "tests/test_window.py::test_the_harness_catches_the_lessons_local_mask "
        "(the same mask against the brute-force definition)",
    )


# ----------------------------------------------------------------------------- fp16 clipping
def clipping_norms(seed: int = 0, max_norm: float = 0.1) -> dict[str, float]:
    """Gradient norms a clipper sees: fp32, fp16 autocast + GradScaler (scaled, then after ``unscale_``)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    x, y = torch.randn(128, 16), torch.randint(0, 4, (128,))
    F.cross_entropy(model(x), y).backward()
    reference = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    clipped_ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaled = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
    scaler.unscale_(optimizer)
    unscaled = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    clipped_gap = max(float((p.grad - r).abs().max() / r.abs().max()) for p, r in zip(model.parameters(), clipped_ref))
    return {
        "fp32": reference,
        "scaled": scaled,
        "unscaled": unscaled,
        "scale": scaler.get_scale(),
        "relative_gap": abs(unscaled - reference) / reference,
        "clipped_grad_gap": clipped_gap,
        "max_norm": max_norm,
    }


def fp16_claim() -> dict[str, Any]:
    n = clipping_norms()
    threshold = 0.02
    record = deterministic(
        "with FP16 training the gradient-clipping threshold must be changed to suit the FP16 range",
        "seed 002 §7.2",
        "the norm clip_grad_norm_ sees after GradScaler.unscale_ differs from the fp32 run's by more than "
        f"{threshold:.0%} (else the fp32 threshold clips the same way; error = threshold - relative difference)",
        f"fp32 norm {n['fp32']:.5f}; fp16 autocast + GradScaler (scale {n['scale']:.0f}): {n['scaled']:.1f} before "
        f"unscale_, {n['unscaled']:.5f} after ({n['relative_gap']:.1e} relative); clipped to max_norm {n['max_norm']} "
        f"the gradients match to {n['clipped_grad_gap']:.1e}. Keep the threshold; call unscale_ before clipping",
        error=threshold - n["relative_gap"],
        tolerance=0.0,
        details=n,
    )
    return quoted(
        "fp16_clip",
        record,
        "torch.amp.GradScaler + torch.nn.utils.clip_grad_norm_ after unscale_ on a "
        "two-layer MLP (Micikevicius et al. 2018: loss scaling leaves the unscaled gradients unchanged)",
    )


# ----------------------------------------------------------------------------- autocast scores
def autocast_scores_dtype(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """The dtype of seed 002 §7.2's scores under autocast, and with autocast disabled around the matmul.

    ``q`` and ``k`` are ``[batch, h, T, d_k] = [2, 4, 8, 16]``, as a low-precision projection under
    autocast yields them. Autocast casts a matmul's inputs to its low-precision dtype whatever their
    own dtype, so ``.float()`` before the call changes nothing; ``autocast(enabled=False)`` does.
    """
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g).to(device=device, dtype=dtype)  # [B, h, T, d_k]
    k = torch.randn(2, 4, 8, 16, generator=g).to(device=device, dtype=dtype)
    with torch.autocast(device, dtype=dtype):
        lesson = torch.matmul(q.float(), k.transpose(-2, -1).float())  # seed 002 §7.2 verbatim: [B, h, T, T]
        with torch.autocast(device, enabled=False):
            fixed = torch.matmul(q.float(), k.transpose(-2, -1).float())
    return {
        "device": device,
        "autocast_dtype": str(dtype).replace("torch.", ""),
        "lesson": str(lesson.dtype).replace("torch.", ""),
        "autocast_disabled": str(fixed.dtype).replace("torch.", ""),
    }


def autocast_claim() -> dict[str, Any]:
    m = autocast_scores_dtype()
    record = deterministic(
        "casting q and k with .float() inside autocast keeps the attention scores in FP32",
        "seed 002 §7.2",
        "the scores of the lesson's line under autocast are float32 (error = 1 if not)",
        f"under torch.autocast('{m['device']}', {m['autocast_dtype']}) the lesson's matmul(q.float(), k.float()) gives "
        f"{m['lesson']} scores: autocast casts the matmul's inputs back down. Inside autocast(enabled=False) the same "
        f"line gives {m['autocast_disabled']}",
        error=float(m["lesson"] != "float32"),
        tolerance=0.0,
        details=m,
    )
    return quoted(
        "autocast_fp32",
        record,
        "torch.autocast on this machine's CPU (bf16, CPU autocast's dtype; CUDA's "
        "fp16 autocast casts matmul the same way: torch's autocast op list)",
    )


# ----------------------------------------------------------------------------- seed 002 §5.2 code
#: seed 002 §5.2's cache class, verbatim
LESSON_PE_CACHE = """
class PositionalEncoding:
    def __init__(self, max_len=5000):
        self.pe = torch.zeros(max_len, d_model)  # 预计算
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        self.pe[:, 0::2] = torch.sin(position * div_term)
        self.pe[:, 1::2] = torch.cos(position * div_term)
        self.pe = self.pe.unsqueeze(0)  # 批处理维度
"""


def run_lesson_pe_cache() -> str:
    """The names seed 002 §5.2's class reads but nothing defines (``""`` if none), read with ``ast``.

    The snippet is parsed, never executed (the package runs no quoted code): every name the class
    loads must be an argument, an assignment, a builtin or one of the modules the lesson imports
    (``torch``, ``math``); a name that is none of these raises ``NameError`` when the class is built.
    """
    import ast
    import builtins

    tree = ast.parse(LESSON_PE_CACHE)
    bound = {"torch", "math", "self", *dir(builtins)}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            bound.add(node.name)
    free = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound)
    return f"NameError: name {free[0]!r} is not defined" if free else ""


def pe_cache_code_claim() -> dict[str, Any]:
    error = run_lesson_pe_cache()
    record = deterministic(
        "the PositionalEncoding class precomputes the sinusoidal table",
        "seed 002 §5.2",
        "the lesson's class, run as written, builds its table (error = 1 if constructing it raises)",
        f"PositionalEncoding() raises {error}: d_model is neither an argument nor defined; poslab's sinusoidal "
        "scheme takes d_model and caches the table (experiment pe-cache times it)"
        if error
        else "built",
        error=float(bool(error)),
        tolerance=0.0,
        details={"raised": error},
    )
    return quoted("pe_cache_code", record, "the lesson's class read with ast: the names it loads that nothing binds")


# ----------------------------------------------------------------------------- seed 002 §7.1 code
def lesson_adaptive_mask(seq_len: int, spans: list[int]) -> torch.Tensor:
    """Seed 002 §7.1's ``get_attention_mask`` with the span predictor replaced by given integer spans: ``[T, T]``."""
    mask = torch.ones(seq_len, seq_len)
    for span in spans:
        mask += torch.triu(torch.ones(seq_len, seq_len), diagonal=-span)
    return mask


def adaptive_mask_faults(seq_len: int = 8, spans: tuple[int, ...] = (1, 3)) -> dict[str, Any]:
    """The four checks a per-head span mask must pass, run on the lesson's code."""
    mask = lesson_adaptive_mask(seq_len, list(spans))
    masked = int((mask == 0).sum())  # what masked_fill(mask == 0, ...) would hide
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    future_kept = int((mask[future] != 0).sum())
    try:
        torch.triu(torch.ones(seq_len, seq_len), diagonal=-torch.tensor(2.0, requires_grad=True))
        learned_span = "accepted"
    except TypeError:
        learned_span = "TypeError"
    faults = {
        "nothing masked": masked == 0,
        "future keys kept": future_kept > 0,
        "one summed mask for all heads": mask.dim() == 2 and len(spans) > 1,
        "a learned (tensor) span refused": learned_span == "TypeError",
    }
    return {
        "masked_pairs": masked,
        "future_pairs_kept": future_kept,
        "of_future_pairs": int(future.sum()),
        "values": sorted(set(mask.unique().tolist())),
        "learned_span": learned_span,
        "faults": faults,
    }


def adaptive_span_code_claim() -> dict[str, Any]:
    f = adaptive_mask_faults()
    n_faults = sum(f["faults"].values())
    record = deterministic(
        "get_attention_mask gives each head its own learned attention span",
        "seed 002 §7.1",
        "the lesson's mask (spans 1 and 3, T = 8) hides keys outside a span, keeps no future key, is one mask per "
        "head and takes a learned span (error = number of the four checks that fail)",
        f"masked pairs {f['masked_pairs']}; future pairs kept {f['future_pairs_kept']} of {f['of_future_pairs']}; "
        f"one [T, T] mask with values {f['values']} summed over the heads; a tensor span in triu: {f['learned_span']}. "
        "poslab.nn.sparse.AdaptiveSpanAttention has the paper's soft, per-head, causal, learned span",
        error=float(n_faults),
        tolerance=0.0,
        details=f,
    )
    return quoted(
        "adaptive_span_code", record, "the lesson's mask code run with integer spans (tests/test_sparse.py runs it too)"
    )
