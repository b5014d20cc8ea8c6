"""The sparse experiment's task, model, cost readings and training of one model (seed 002 §3.1, §7.1): the delayed
copy task, the five attentions behind one interface, the peak memory of a step and the keys adaptive span attends.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.nn.attention import AttentionConfig, MultiHeadAttention
from poslab.nn.sparse import AdaptiveSpanAttention, AxialAttention, LSHAttention
from poslab.training.step import StepSettings, train_step

KINDS = ("full", "window", "axial", "lsh", "adaptive")
VOCAB, D_MODEL, N_HEADS, N_LAYERS = 16, 64, 4, 2
WINDOW, LSH_BUCKETS, LSH_CHUNK, SPAN_RAMP = 16, 4, 32, 16  # 2 layers of W=16 reach 30 < 31 = T/2 - 1 at T=64
SPAN_LOSS_COEF = 2e-3
SPAN_LR_MULT = 3.0  # the span ratios learn 3x faster than the weights, so spans settle within a short run


@dataclass(frozen=True)
class Recipe:
    """The experiment's form: the lengths and seeds, and every model's training and reading.

    Attributes:
        lengths: the sequence lengths ``T`` (each a multiple of its axial width).
        seeds: the training seeds (every kind and length trains from each).
        steps: training steps; batch: sequences per step; lr: AdamW's learning rate.
        eval_batches: evaluation batches (the same for every model); timed_steps: the last steps timed.
    """

    lengths: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int
    batch: int
    lr: float
    eval_batches: int
    timed_steps: int


QUICK = Recipe(lengths=(64, 128), seeds=(0,), steps=100, batch=16, lr=3e-3, eval_batches=2, timed_steps=10)
FULL = Recipe(
    lengths=(64, 128, 256, 512), seeds=(0, 1, 2), steps=600, batch=16, lr=3e-3, eval_batches=8, timed_steps=50
)


@dataclass(frozen=True)
class SparseRun:
    """One trained model: its kind, length and seed, its delayed-copy loss and accuracy, the median ms of a
    timed step, the peak MiB of a step, its learned spans (per layer, per head; adaptive span only) and the keys
    its widest span attends relative to full causal attention (adaptive span only)."""

    kind: str
    T: int
    seed: int
    eval_loss: float
    accuracy: float
    step_ms: float
    peak_mib: float
    spans: list[list[float]]
    attended_fraction: float | None = None


# ------------------------------------------------------------------------------------ task
def delayed_copy(batch: int, T: int, generator: torch.Generator) -> Tensor:
    """``[batch, T]`` int64: ``T/2`` random tokens, then the same ``T/2`` again."""
    half = torch.randint(0, VOCAB, (batch, T // 2), generator=generator)
    return torch.cat([half, half], dim=1)  # [B, T/2] x2 -> [B, T]


def copy_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Cross-entropy of the predictable targets (positions ``T/2 .. T-1``, predicted from ``T/2-1 .. T-2``)."""
    T = tokens.shape[1]
    pred = logits[:, T // 2 - 1 : T - 1]  # [B, T/2, V]
    return F.cross_entropy(pred.reshape(-1, VOCAB), tokens[:, T // 2 :].reshape(-1))


# ------------------------------------------------------------------------------------ model
def axial_width(T: int) -> int:
    """Row width of the axial grid: the power of two nearest above ``sqrt(T)`` (dividing ``T``)."""
    return 2 ** math.ceil(math.log2(math.sqrt(T)))


class Attention(nn.Module):
    """One of :data:`KINDS` behind one interface: ``[B, T, d] -> [B, T, d]``."""

    def __init__(self, kind: str, T: int) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}; choose one of {list(KINDS)}")
        self.kind = kind
        if kind == "full":
            self.inner = MultiHeadAttention(D_MODEL, N_HEADS)
        elif kind == "window":
            self.inner = MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(window=WINDOW))
        elif kind == "axial":
            self.width = axial_width(T)
            self.inner = AxialAttention(D_MODEL, N_HEADS, causal=True)
        elif kind == "lsh":
            self.inner = LSHAttention(
                D_MODEL, N_HEADS, n_buckets=LSH_BUCKETS, chunk_size=min(LSH_CHUNK, T), causal=True
            )
        else:
            self.inner = AdaptiveSpanAttention(
                D_MODEL, N_HEADS, max_span=T, ramp=SPAN_RAMP, init_ratio=1.0, span_loss_coef=SPAN_LOSS_COEF
            )

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "axial":
            B, T, d = x.shape
            grid = x.view(B, T // self.width, self.width, d)  # [B, T, d] -> [B, rows, w, d] (row-major)
            return self.inner(grid).reshape(B, T, d)  # [B, rows, w, d] -> [B, T, d]
        return self.inner(x)


class Block(nn.Module):
    def __init__(self, kind: str, T: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = Attention(kind, T)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CopyModel(nn.Module):
    """Token + learned position embeddings, :data:`N_LAYERS` blocks of one attention kind, an LM head."""

    def __init__(self, kind: str, T: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(T, D_MODEL)
        self.blocks = nn.ModuleList(Block(kind, T) for _ in range(N_LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        T = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(T, device=tokens.device))[None]  # [B, T, d]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # [B, T, V]

    def span_layers(self) -> list[AdaptiveSpanAttention]:
        return [b.attn.inner for b in self.blocks if isinstance(b.attn.inner, AdaptiveSpanAttention)]


# ------------------------------------------------------------------------------------ cost
def peak_step_mib(model: CopyModel, tokens: Tensor) -> float:
    """Peak live-tensor memory of one forward + backward (torch profiler allocation records), MiB."""
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = copy_loss(model(tokens), tokens)
        loss.backward()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage)
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    model.zero_grad(set_to_none=True)
    return peak / 2**20


def attended_fraction(spans: list[float], T: int, ramp: int = SPAN_RAMP) -> float:
    """Keys attended with the widest learned span, over full causal attention: ``sum_i min(i+1, z+R) / sum_i (i+1)``."""
    reach = max(spans) + ramp
    return sum(min(i + 1, reach) for i in range(T)) / sum(i + 1 for i in range(T))


# ------------------------------------------------------------------------------------ training
def train_one(kind: str, T: int, seed: int, cfg: Recipe) -> SparseRun:
    """Train one model; return its eval loss, step times, peak memory and (adaptive) spans."""
    torch.manual_seed(seed)
    model = CopyModel(kind, T)
    span_params = [layer.span_ratio for layer in model.span_layers()]
    others = [p for p in model.parameters() if all(p is not q for q in span_params)]
    groups = [{"params": others}] + ([{"params": span_params, "lr": cfg.lr * SPAN_LR_MULT}] if span_params else [])
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0)
    data = torch.Generator().manual_seed(1000 + seed)
    times = []
    for step in range(cfg.steps):
        tokens = delayed_copy(cfg.batch, T, data)
        start = time.perf_counter()

        def loss_of(_micro: int, tokens: torch.Tensor = tokens) -> torch.Tensor:
            loss = copy_loss(model(tokens), tokens)
            for layer in model.span_layers():
                loss = loss + layer.span_loss()
            return loss

        train_step(optimizer, [*others, *span_params], loss_of, StepSettings(grad_clip=None))  # no clipping
        for layer in model.span_layers():
            layer.clamp_()
        if step >= cfg.steps - cfg.timed_steps:
            times.append(time.perf_counter() - start)
    model.eval()
    evalgen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        losses, correct = [], []
        for _ in range(cfg.eval_batches):
            tokens = delayed_copy(cfg.batch, T, evalgen)
            logits = model(tokens)
            losses.append(float(copy_loss(logits, tokens)))
            pred = logits[:, T // 2 - 1 : T - 1].argmax(-1)
            correct.append(float((pred == tokens[:, T // 2 :]).float().mean()))
    model.train()
    peak = peak_step_mib(model, delayed_copy(cfg.batch, T, torch.Generator().manual_seed(7)))
    spans = [[float(z) for z in layer.spans().detach()] for layer in model.span_layers()]
    fraction = attended_fraction([z for layer in spans for z in layer], T) if spans else None
    return SparseRun(
        kind,
        T,
        seed,
        eval_loss=statistics.fmean(losses),
        accuracy=statistics.fmean(correct),
        step_ms=1000 * statistics.median(times),
        peak_mib=peak,
        spans=spans,
        attended_fraction=fraction,
    )
