"""Sparse attention in the lab: quality and cost of full, window, axial, LSH and adaptive span (seed 002 §3.1, §7.1).

Seed 002 §3.1 lists local (sliding-window), axial and LSH attention as the fixes for attention's
``O(n²)`` cost, and §7.1 says Adaptive Attention Span "在PG-19任务上减少23%计算量" (cuts computation
by 23% on PG-19; the paper is Sukhbaatar et al. 2019, Facebook AI Research,
https://arxiv.org/abs/1905.07799, and reports text8 / enwik8). This experiment trains the same small
model with each attention on a task whose answer lies far back, at growing ``T``, and measures side
by side:

* **quality**: cross-entropy on the predictable half of a *delayed copy* sequence: ``T/2`` random
  tokens followed by the same ``T/2`` tokens again, so every target in the second half is the token
  ``T/2`` positions earlier (an induction / long-range retrieval task; chance is ``ln V``);
* **cost**: wall time of a training step (median over the timed steps) and the peak memory of one
  step (forward + backward), read with the torch profiler's allocation records (``profile_memory``;
  allocations summed in operator order, so it is the peak of live tensors, not of the process);
* **adaptive span**: the learned span of every head (plotted), and what the spans save: the keys
  each query attends, summed over queries, relative to full causal attention
  (``sum_i min(i + 1, z_max + R) / sum_i (i + 1)``; the blocked path skips the rest).

The model: token + learned absolute position embeddings, 2 pre-norm blocks (attention + GELU MLP),
width 64, 4 heads. The attentions are poslab's real modules (``poslab/nn/sparse.py``,
``MultiHeadAttention``): ``full`` (causal), ``window`` (``W = 16``, Mistral semantics: two layers reach 30 keys
back, short of ``T/2``), ``axial`` (causal rows then columns of a ``T/w x w`` grid,
``w = 2^ceil(log2(sqrt T))``), ``lsh`` (Reformer,
shared QK, 4 buckets, chunk 32, one hash round) and ``adaptive`` (adaptive span, ``max_span = T``,
ramp 16, spans initialised at the full ``T`` and shrunk by the L1 penalty; the span ratios
learn at 3x the weights' rate so they settle within a short run).

Claims (the verdict rule of ``poslab/lab/verdicts.py``, seeds per arm in the record): full attention
beats each sparse pattern on the long-range task at the largest ``T`` (what the pattern gives up),
and adaptive span takes less time per step than full attention (seed 002 §7.1's saving, here). The
quick form runs one seed (its comparisons are inconclusive by rule); the full form runs three.
Every kind trains from each seed on the same batches (the data generator is seeded by the seed
alone) and is read on the same evaluation batches, so the claims are paired by seed; the losses
are in nats (ln-perplexity), the step times tested on their ln (a ratio of times). The timing claim
is not a lesson claim about quality and has a family of its own (:data:`TIMING_FAMILY`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.display import new_figure, print_table, save_figure
from poslab.jobs.runner import Task, train_many
from poslab.lab.experiments.common import FULL_ONLY, Experiment
from poslab.lab.plan import own_family
from poslab.lab.premises import attach, fits_length
from poslab.lab.verdicts import ClaimRecord, Premise, paired
from poslab.nn.attention import AttentionConfig, MultiHeadAttention
from poslab.nn.sparse import AdaptiveSpanAttention, AxialAttention, LSHAttention
from poslab.training.step import StepSettings, train_step

KINDS = ("full", "window", "axial", "lsh", "adaptive")
VOCAB, D_MODEL, N_HEADS, N_LAYERS = 16, 64, 4, 2
WINDOW, LSH_BUCKETS, LSH_CHUNK, SPAN_RAMP = 16, 4, 32, 16  # 2 layers of W=16 reach 30 < 31 = T/2 - 1 at T=64
SPAN_LOSS_COEF = 2e-3
SPAN_LR_MULT = 3.0  # the span ratios learn 3x faster than the weights, so spans settle within a short run
QUICK = {
    "lengths": (64, 128),
    "seeds": (0,),
    "steps": 100,
    "batch": 16,
    "lr": 3e-3,
    "eval_batches": 2,
    "timed_steps": 10,
}
FULL = {
    "lengths": (64, 128, 256, 512),
    "seeds": (0, 1, 2),
    "steps": 600,
    "batch": 16,
    "lr": 3e-3,
    "eval_batches": 8,
    "timed_steps": 50,
}


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
def train_one(kind: str, T: int, seed: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train one model; return its eval loss, step times, peak memory and (adaptive) spans."""
    torch.manual_seed(seed)
    model = CopyModel(kind, T)
    span_params = [layer.span_ratio for layer in model.span_layers()]
    others = [p for p in model.parameters() if all(p is not q for q in span_params)]
    groups = [{"params": others}] + ([{"params": span_params, "lr": cfg["lr"] * SPAN_LR_MULT}] if span_params else [])
    optimizer = torch.optim.AdamW(groups, lr=cfg["lr"], weight_decay=0.0)
    data = torch.Generator().manual_seed(1000 + seed)
    times = []
    for step in range(cfg["steps"]):
        tokens = delayed_copy(cfg["batch"], T, data)
        start = time.perf_counter()

        def loss_of(_micro: int, tokens: torch.Tensor = tokens) -> torch.Tensor:
            loss = copy_loss(model(tokens), tokens)
            for layer in model.span_layers():
                loss = loss + layer.span_loss()
            return loss

        train_step(optimizer, [*others, *span_params], loss_of, StepSettings(grad_clip=None))  # no clipping
        for layer in model.span_layers():
            layer.clamp_()
        if step >= cfg["steps"] - cfg["timed_steps"]:
            times.append(time.perf_counter() - start)
    model.eval()
    evalgen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        losses, correct = [], []
        for _ in range(cfg["eval_batches"]):
            tokens = delayed_copy(cfg["batch"], T, evalgen)
            logits = model(tokens)
            losses.append(float(copy_loss(logits, tokens)))
            pred = logits[:, T // 2 - 1 : T - 1].argmax(-1)
            correct.append(float((pred == tokens[:, T // 2 :]).float().mean()))
    model.train()
    peak = peak_step_mib(model, delayed_copy(cfg["batch"], T, torch.Generator().manual_seed(7)))
    spans = [[float(z) for z in layer.spans().detach()] for layer in model.span_layers()]
    out = {
        "kind": kind,
        "T": T,
        "seed": seed,
        "eval_loss": statistics.fmean(losses),
        "accuracy": statistics.fmean(correct),
        "step_ms": 1000 * statistics.median(times),
        "peak_mib": peak,
        "spans": spans,
    }
    if spans:
        out["attended_fraction"] = attended_fraction([z for layer in spans for z in layer], T)
    return out


# ------------------------------------------------------------------------------------ claims
#: the Holm family of the step-time claim: a timing, kept out of the experiment's family of quality claims
TIMING_FAMILY = "sparse: timing"


def sparse_claims(runs: list[dict[str, Any]], T: int) -> list[ClaimRecord]:
    """Full beats each sparse kind on loss at ``T``; adaptive span is faster per step than full at ``T``.

    Paired by seed (module docstring): each kind's values are taken in the order of the seeds, and a
    seed every kind of ``T`` has is a pair.
    """
    seeds = sorted({r["seed"] for r in runs if r["T"] == T})

    def values(kind: str, key: str) -> list[float]:
        by_seed = {r["seed"]: r[key] for r in runs if r["kind"] == kind and r["T"] == T}
        return [by_seed[s] for s in seeds]

    claims = []
    for kind in KINDS[1:]:
        claims.append(
            paired(
                f"full attention beats {kind} attention on a dependency "
                f"T/2 back (T = {T}): what the sparse pattern gives up",
                "seed 002 §3.1 (sparse patterns offered as drop-in fixes for O(n²))",
                values("full", "eval_loss"),
                values(kind, "eval_loss"),
                better_label="full",
                worse_label=kind,
                metric=f"delayed-copy loss at T={T}",
                lower_is_better=True,
                seeds=seeds,
            )
        )
    timing = paired(
        f"adaptive span takes less time per training step than full attention (T = {T})",
        "seed 002 §7.1 ('cuts computation by 23%', claimed on PG-19)",
        values("adaptive", "step_ms"),
        values("full", "step_ms"),
        better_label="adaptive",
        worse_label="full",
        metric=f"ms per training step at T={T}",
        lower_is_better=True,
        digits=2,
        seeds=seeds,
        log=True,
    )
    claims.append(own_family(timing, TIMING_FAMILY))
    return claims


def sparse_premise(record: ClaimRecord, runs: list[dict[str, Any]], T: int) -> Premise:
    """What a sparse pattern gives up can be read only where full attention solves the task: every seed's full
    attention model (a per-model capability) reaches the length threshold of delayed-copy accuracy at ``T``.
    The step-time claim's times are wall-clock times of whole runs one after another, not CPU time of the
    arms alternating in one process, so it is not tested."""
    if record.details["metric"].startswith("ms per training step"):
        return Premise(
            "timing: process CPU time of the arms alternating in one process",
            "wall-clock ms per step of separate runs, one after another",
            False,
        )
    full = [r for r in runs if r["kind"] == "full" and r["T"] == T]
    return fits_length({f"full at T={T}, seed {r['seed']}": [r["accuracy"]] for r in full})


# ------------------------------------------------------------------------------------ plots
def plot_results(
    summary: dict[str, dict[int, dict[str, float]]], spans: dict[int, list[list[float]]], path: Path
) -> Path:
    """Loss, ms/step and peak MiB against T per kind, and the learned spans per head at each T."""
    fig, axes = new_figure(1, 4, size=(20.0, 4.8))
    for ax, key, label in (
        (axes[0], "eval_loss", "delayed-copy loss (chance ln 16 = 2.77)"),
        (axes[1], "step_ms", "ms per training step"),
        (axes[2], "peak_mib", "peak MiB per step"),
    ):
        for kind, by_T in summary.items():
            Ts = sorted(by_T)
            ax.plot(Ts, [by_T[T][key] for T in Ts], marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("T")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].axhline(math.log(VOCAB), color="grey", linestyle=":")
    ax = axes[3]
    for T, layers in sorted(spans.items()):
        for li, layer in enumerate(layers):
            ax.scatter(
                [f"L{li}h{h}" for h in range(len(layer))],
                [z / T for z in layer],
                label=f"T={T}" if li == 0 else None,
                marker="o" if li == 0 else "s",
                color=f"C{sorted(spans).index(T)}",
            )
    ax.set_ylabel("learned span / T")
    ax.set_ylim(-0.05, 1.05)
    ax.axhline(0.5, color="grey", linestyle=":")
    ax.set_title("adaptive span per head (dotted: the copy distance T/2)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def run(out: Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict:
    """Train every kind at every length and seed; print the side-by-side table; plot; judge the claims."""
    out = Path(out)
    cfg = dict(QUICK if quick else FULL, **(config or {}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: tiny models gain nothing from more, and the timings compare like with like
    try:
        return _run(out, quick, cfg)
    finally:
        torch.set_num_threads(threads)


def _run(out: Path, quick: bool, cfg: dict[str, Any]) -> dict:
    def done(task: Task, r: dict[str, Any]) -> None:
        print(
            f"  {r['kind']:>8} T={r['T']:<4} seed {r['seed']}: loss {r['eval_loss']:.3f} acc {r['accuracy']:.2f} "
            f"{r['step_ms']:.1f} ms/step {r['peak_mib']:.1f} MiB",
            flush=True,
        )

    tasks = [
        Task(f"{kind}-T{T}-s{seed}", train_one, (kind, T, seed, cfg))
        for T in cfg["lengths"]
        for kind in KINDS
        for seed in cfg["seeds"]
    ]
    # one after another in this process: the step times and peak memory compare like with like only so
    runs = train_many(tasks, 1, on_done=done)
    summary: dict[str, dict[int, dict[str, float]]] = {}
    for kind in KINDS:
        summary[kind] = {}
        for T in cfg["lengths"]:
            group = [r for r in runs if r["kind"] == kind and r["T"] == T]
            summary[kind][T] = {
                key: statistics.fmean(r[key] for r in group) for key in ("eval_loss", "accuracy", "step_ms", "peak_mib")
            }
            if kind == "adaptive":
                summary[kind][T]["attended_fraction"] = statistics.fmean(r["attended_fraction"] for r in group)
    rows = [
        [
            kind,
            T,
            f"{s['eval_loss']:.3f}",
            f"{s['accuracy']:.2f}",
            f"{s['step_ms']:.1f}",
            f"{s['peak_mib']:.1f}",
            f"{s['attended_fraction']:.2f}" if "attended_fraction" in s else "-",
        ]
        for T in cfg["lengths"]
        for kind, by_T in summary.items()
        for s in [by_T[T]]
    ]
    print_table(
        ["attention", "T", "loss", "accuracy", "ms/step", "peak MiB", "keys vs full"],
        rows,
        title=f"delayed copy (copy distance T/2), {cfg['steps']} "
        f"steps x {cfg['batch']}, mean of {len(cfg['seeds'])} seed(s)",
    )
    spans = {
        T: next(r["spans"] for r in runs if r["kind"] == "adaptive" and r["T"] == T and r["seed"] == cfg["seeds"][0])
        for T in cfg["lengths"]
    }
    T_max = max(cfg["lengths"])
    saved = 1 - summary["adaptive"][T_max]["attended_fraction"]
    time_saved = 1 - summary["adaptive"][T_max]["step_ms"] / summary["full"][T_max]["step_ms"]
    print(
        f"\n  adaptive span at T={T_max}: the widest learned span attends {1 - saved:.0%} of full causal attention's "
        f"key pairs ({saved:.0%} fewer); {abs(time_saved):.0%} {'less' if time_saved >= 0 else 'more'} time per step "
        "than full attention (seed 002 §7.1 claims 23% less computation on PG-19)"
    )
    claims = attach(sparse_claims(runs, T_max), lambda record: sparse_premise(record, runs, T_max))
    plot = plot_results(summary, spans, out / "sparse.png")
    return {
        "quick": quick,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
        "runs": runs,
        "summary": {k: {str(T): v for T, v in by_T.items()} for k, by_T in summary.items()},
        "adaptive_span": {
            "T": T_max,
            "key_pairs_saved": saved,
            "step_time_saved": time_saved,
            "spans": {str(T): s for T, s in spans.items()},
        },
        "claims": claims,
        "plots": [str(plot)],
    }


EXPERIMENT = Experiment(
    name="sparse",
    description="full vs window / axial / LSH / adaptive-span attention: long-range quality, time and memory per step "
    "(seed 002 §3.1, §7.1)",
    tier=FULL_ONLY,
    run=run,
    estimate=(180, 1800),
)
