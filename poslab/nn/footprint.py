"""Memory a model will need, estimated from its config before anything is built.

Used by the pre-flight of ``poslab train`` (``--dry-run`` included) and ``poslab sweep`` so that a
config that cannot fit this machine (``--model.n_layer 100000000``) is refused in one line, with the
estimate, instead of allocating layer after layer until the kernel kills the process; and by the
eager attention backend, which refuses to allocate ``[B, h, Tq, Tk]`` score tensors larger than a
fraction of the memory available.

Estimates (fp32 unless said otherwise):

* parameters: per layer ``q, k, v, o`` projections ``d (d + 2 h_kv d_k) + d^2`` and the MLP
  (``2 d f`` for GELU, ``3 d f`` for SwiGLU), plus the token embedding ``V d`` (twice if untied) and a
  learned position table ``T d``. Biases and norms are ignored (``O(L d)``).
* training state: weights, gradients and AdamW's two moments, 16 bytes per parameter.
* activations kept for the backward: ``34 s b d`` bytes per layer in 16-bit, plus ``5 a s^2 b`` for
  the attention scores when they are materialised (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", https://arxiv.org/abs/2205.05198, §4.1), doubled for
  fp32; the score term counts only for the eager backend (SDPA and flex keep no ``T x T`` tensor);
  plus the logits and their gradient, ``3 b s V`` fp32 values.

The numbers are estimates for refusing the impossible, not for packing a machine tightly.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: eager attention refuses score tensors above this fraction of the memory available
EAGER_RAM_FRACTION = 0.5
#: below this many bytes of scores the eager check does not even read /proc/meminfo
EAGER_CHECK_FROM_BYTES = 256 * 2**20
#: validation batches per evaluation above which a training config is refused (each is a forward pass)
MAX_EVAL_ITERS = 100_000
GIB = 2**30


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes of one training (or inference) configuration."""

    parameters: int
    weights: int
    gradients_and_optimizer: int
    activations: int
    attention_scores: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients_and_optimizer + self.activations + self.attention_scores + self.logits

    def describe(self) -> str:
        parts = [f"{self.parameters:,} parameters: weights {_gib(self.weights)}"]
        if self.gradients_and_optimizer:
            parts.append(f"gradients + AdamW state {_gib(self.gradients_and_optimizer)}")
        parts.append(f"activations {_gib(self.activations)}")
        if self.attention_scores:
            parts.append(f"attention scores {_gib(self.attention_scores)}")
        parts.append(f"logits {_gib(self.logits)}")
        return f"about {_gib(self.total)} ({', '.join(parts)})"


def _gib(n: float) -> str:
    if n < GIB:
        return f"{n / 2**20:,.0f} MiB"
    return f"{n / GIB:,.1f} GiB" if n < 1e6 * GIB else f"{n / GIB:.2e} GiB"


def parameter_count(model: dict[str, Any]) -> int:
    """Parameters of a GPT config given as a mapping of :class:`poslab.nn.model.GPTConfig` fields."""
    d, L = int(model.get("n_embd", 128)), int(model.get("n_layer", 4))
    heads = max(int(model.get("n_head", 4)), 1)
    kv = int(model.get("n_kv_head") or heads)
    head_dim = d // heads if d >= heads else 1
    V, T = int(model.get("vocab_size", 65)), int(model.get("block_size", 128))
    mlp_group = model.get("mlp") if isinstance(model.get("mlp"), dict) else {}
    gated = mlp_group.get("kind", "gelu") == "swiglu"
    hidden = int(mlp_group.get("hidden") or (int(math.ceil(8 * d / 3 / 8) * 8) if gated else 4 * d))
    attention = d * (d + 2 * kv * head_dim) + d * d
    mlp = (3 if gated else 2) * d * hidden
    embeddings = V * d * (1 if model.get("tie_embeddings", True) else 2)
    embeddings += position_parameters(model, d, heads, head_dim, T)
    return L * (attention + mlp) + embeddings


def position_parameters(model: dict[str, Any], d: int, heads: int, head_dim: int, T: int) -> int:
    """Parameters of the model's position scheme (a learned table's ``T x d``), asked of the scheme itself.

    The scheme is built on the meta device (no memory, no RNG draw); a config it refuses counts 0 here
    (building the model reports the error).
    """
    import torch

    from poslab.nn import positions

    name = model.get("position", "learned")
    context = {
        "n_embd": d,
        "n_heads": heads,
        "head_dim": head_dim,
        "max_len": T,
        "bidirectional": not model.get("causal", True),
    }
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            scheme = positions.build_for_model(name, model.get("position_config") or {}, context)
    except (ValueError, TypeError, RuntimeError):
        return 0
    return sum(p.numel() for p in scheme.parameters())


def estimate(model: dict[str, Any], batch_size: int, *, training: bool = True, seq_len: int | None = None) -> Footprint:
    """The :class:`Footprint` of ``model`` (GPTConfig fields) at ``batch_size`` x ``seq_len`` (default block_size)."""
    n = parameter_count(model)
    d, L = int(model.get("n_embd", 128)), int(model.get("n_layer", 4))
    heads = max(int(model.get("n_head", 4)), 1)
    V = int(model.get("vocab_size", 65))
    s = int(seq_len or model.get("block_size", 128))
    b = int(batch_size)
    per_layer = 34 * s * b * d * 2  # fp32: twice the paper's 16-bit bytes
    activations = L * per_layer if training else per_layer  # inference: one layer's at a time
    scores = 5 * heads * s * s * b * 2 if model.get("backend") == "eager" else 0
    return Footprint(
        parameters=n,
        weights=4 * n,
        gradients_and_optimizer=12 * n if training else 0,
        activations=activations,
        attention_scores=(L if training else 1) * scores,
        logits=(3 if training else 1) * b * s * V * 4,
    )


def available_bytes() -> int:
    """Memory this machine can give now: ``MemAvailable`` (Linux), else the physical memory."""
    try:
        match = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        if match:
            return int(match.group(1)) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_training(
    model: Any, batch_size: int, eval_iters: int | None = None, *, force: bool = False, available: int | None = None
) -> Footprint:
    """Refuse a training config that cannot fit this machine (or evaluates absurdly long) unless ``force``.

    Args:
        model: a GPTConfig or its fields as a mapping (``vocab_size`` may be missing: the corpus is not
            read yet; 256 is assumed).
        batch_size: sequences per step.
        eval_iters: validation batches per evaluation.
        force: only warn (the user knows better, e.g. swap or a machine that frees memory).
        available: bytes available (default :func:`available_bytes`).

    Raises:
        ValueError: the estimate exceeds the memory available, or ``eval_iters`` > :data:`MAX_EVAL_ITERS`;
            the message carries the estimate and says ``--force`` overrides.
    """
    if dataclasses.is_dataclass(model):
        model = dataclasses.asdict(model)
    model = {"vocab_size": 256, **model}
    footprint = estimate(model, batch_size)
    available = available_bytes() if available is None else available
    problems = []
    if footprint.total > available:
        problems.append(
            f"this training needs {footprint.describe()}, more than the {_gib(available)} this machine has "
            f"available; use a smaller model (n_layer, n_embd), batch_size or block_size"
        )
    if eval_iters is not None and eval_iters > MAX_EVAL_ITERS:
        problems.append(
            f"eval_iters {eval_iters:,} is more than {MAX_EVAL_ITERS:,} validation batches per evaluation "
            f"(each one a forward pass: it would not finish); use fewer"
        )
    if problems and not force:
        raise ValueError("; ".join(problems) + " (or pass --force to try anyway)")
    if problems:
        import warnings

        warnings.warn("--force: " + "; ".join(problems), stacklevel=2)
    return footprint


def check_eager_scores(
    batch: int, heads: int, q_len: int, k_len: int, copies: int = 4, available: int | None = None
) -> None:
    """Refuse an eager attention whose ``[B, h, Tq, Tk]`` fp32 tensors would take too much of the memory.

    ``copies`` counts the scores, the bias or mask added to them, the softmax and its output weights.

    Raises:
        ValueError: the tensors exceed :data:`EAGER_RAM_FRACTION` of the memory available (message
            with the estimate and the way out: the sdpa backend or a shorter input).
    """
    needed = copies * 4 * batch * heads * q_len * k_len
    if needed < EAGER_CHECK_FROM_BYTES:
        return
    available = available_bytes() if available is None else available
    if needed > EAGER_RAM_FRACTION * available:
        raise ValueError(
            f"eager attention at B={batch}, h={heads}, {q_len}x{k_len} would allocate about {_gib(needed)} "
            f"({copies} fp32 [B, h, Tq, Tk] tensors), more than {EAGER_RAM_FRACTION:.0%} of the {_gib(available)} "
            f"available; use the sdpa backend (which keeps no T x T tensor) or a shorter input"
        )


__all__ = [
    "EAGER_RAM_FRACTION",
    "MAX_EVAL_ITERS",
    "Footprint",
    "available_bytes",
    "check_eager_scores",
    "check_training",
    "estimate",
    "parameter_count",
]
