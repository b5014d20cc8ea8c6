"""Sparse attention in the lab: quality and cost of full, window, axial, LSH and adaptive span (seed 002 §3.1, §7.1).

Seed 002 §3.1 lists local (sliding-window), axial and LSH attention as the fixes for attention's
``O(n²)`` cost, and §7.1 says Adaptive Attention Span "在PG-19任务上减少23%计算量" (cuts computation
by 23% on PG-19; the paper is Sukhbaatar et al. 2019, Facebook AI Research,
https://arxiv.org/abs/1905.07799, and reports text8 / enwik8). This experiment trains the same small model with
each attention at growing ``T`` on a *delayed copy* (``T/2`` random tokens, then the same again: every target of the
second half is ``T/2`` back; chance ``ln V``) and measures side by side the loss on the predictable half, the wall
time of a training step (median) and the peak memory of one step (the torch profiler's allocations in operator
order: live tensors, not the process), and adaptive span's learned spans and the keys they attend relative to full
causal attention (``sum_i min(i + 1, z_max + R) / sum_i (i + 1)``).

The model: learned absolute positions, 2 pre-norm blocks, width 64, 4 heads; the attentions are poslab's
(``poslab/nn/sparse.py``, ``MultiHeadAttention``): ``full`` (causal), ``window`` (``W = 16``, Mistral semantics: two
layers reach 30 keys back, short of ``T/2``), ``axial`` (causal rows then columns of a ``T/w x w`` grid,
``w = 2^ceil(log2(sqrt T))``), ``lsh`` (Reformer: shared QK, 4 buckets, chunk 32, one round) and ``adaptive``
(``max_span = T``, ramp 16, spans start at ``T``, shrunk by the L1 penalty, ratios at 3x the weights' lr).

Claims, paired by seed (every kind trains on the same batches and is read on the same evaluation batches): full
attention beats each sparse pattern at the largest ``T`` (in nats), and adaptive span takes less time per step
than full attention (on the ln of the times; a family of its own, :data:`TIMING_FAMILY`). The quick form runs one
seed (inconclusive by rule), the full form three.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.display import new_figure, save_figure
from poslab.jobs.runner import Task, train_many
from poslab.lab.experiments.common import FULL_ONLY, one_thread
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.sparse_model import FULL, KINDS, QUICK, VOCAB, Recipe, SparseRun, train_one
from poslab.lab.plan import own_family
from poslab.lab.premises import attach, fits_length
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import Arm, ClaimRecord, Metric, Premise, paired


@dataclass(frozen=True)
class Setting:
    """The form the plan chose: quick or full, and its recipe."""

    quick: bool
    recipe: Recipe


@dataclass(frozen=True)
class KindSummary:
    """One kind at one length, the mean over seeds (``attended_fraction``: adaptive span only)."""

    eval_loss: float
    accuracy: float
    step_ms: float
    peak_mib: float
    attended_fraction: float | None = None


@dataclass(frozen=True)
class AdaptiveSpan:
    """What adaptive span saves at the largest length ``T``: the key pairs and the time per step, relative to full
    attention, and the spans the first seed's model learned at every length (per layer, per head)."""

    T: int
    key_pairs_saved: float
    step_time_saved: float
    spans: dict[int, list[list[float]]]


@dataclass(frozen=True)
class SparseResult:
    """Every model trained (:class:`SparseRun`), the mean over seeds per kind and length, and adaptive span's
    savings."""

    quick: bool
    config: Recipe
    runs: list[SparseRun]
    summary: dict[str, dict[int, KindSummary]]
    adaptive_span: AdaptiveSpan


# ------------------------------------------------------------------------------------ claims
#: the Holm family of the step-time claim: a timing, kept out of the experiment's family of quality claims
TIMING_FAMILY = "sparse: timing"


def sparse_claims(runs: list[SparseRun], T: int) -> list[ClaimRecord]:
    """Full beats each sparse kind on loss at ``T``; adaptive span is faster per step than full at ``T``; paired
    by seed (every kind's values in the order of the seeds)."""
    seeds = sorted({r.seed for r in runs if r.T == T})

    def arm(kind: str, key: str) -> Arm:
        by_seed = {r.seed: getattr(r, key) for r in runs if r.kind == kind and r.T == T}
        return Arm(kind, [by_seed[s] for s in seeds], seeds)

    claims = []
    for kind in KINDS[1:]:
        claims.append(
            paired(
                f"full attention beats {kind} attention on a dependency "
                f"T/2 back (T = {T}): what the sparse pattern gives up",
                "seed 002 §3.1 (sparse patterns offered as drop-in fixes for O(n²))",
                arm("full", "eval_loss"),
                arm(kind, "eval_loss"),
                Metric(f"delayed-copy loss at T={T}"),
            )
        )
    timing = paired(
        f"adaptive span takes less time per training step than full attention (T = {T})",
        "seed 002 §7.1 ('cuts computation by 23%', claimed on PG-19)",
        arm("adaptive", "step_ms"),
        arm("full", "step_ms"),
        Metric(f"ms per training step at T={T}", log=True, digits=2),
    )
    claims.append(own_family(timing, TIMING_FAMILY))
    return claims


def sparse_premise(record: ClaimRecord, runs: list[SparseRun], T: int) -> Premise:
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
    full = [r for r in runs if r.kind == "full" and r.T == T]
    return fits_length({f"full at T={T}, seed {r.seed}": [r.accuracy] for r in full})


def plan(out: Path, quick: bool, config: Mapping[str, Any] | None = None) -> Plan[Setting]:
    """Every kind at every length and seed (trained by :func:`measure`, one after another in its process);
    ``config``: fields of the form's :class:`~poslab.lab.experiments.sparse_model.Recipe` replaced (tests)."""
    recipe = dataclasses.replace(QUICK if quick else FULL, **dict(config or {}))
    recipe = dataclasses.replace(recipe, lengths=tuple(recipe.lengths), seeds=tuple(recipe.seeds))
    return Plan(Setting(quick, recipe), {}, summarise=False, what="sparse models")


def measure(runs: Runs[Setting]) -> SparseResult:
    """Train every kind at every length and seed on one thread, one after another in this process (the step times
    and peak memory compare like with like only so); the means over seeds and adaptive span's savings."""
    quick, cfg = runs.setting.quick, runs.setting.recipe
    tasks = [
        Task(f"{kind}-T{T}-s{seed}", train_one, (kind, T, seed, cfg))
        for T in cfg.lengths
        for kind in KINDS
        for seed in cfg.seeds
    ]
    with one_thread():
        trained: list[SparseRun] = train_many(tasks, 1, on_done=_done)
    summary: dict[str, dict[int, KindSummary]] = {}
    for kind in KINDS:
        summary[kind] = {}
        for T in cfg.lengths:
            group = [r for r in trained if r.kind == kind and r.T == T]
            mean = {k: statistics.fmean(getattr(r, k) for r in group) for k in ("eval_loss", "accuracy", "step_ms")}
            fraction = _mean_fraction(group) if kind == "adaptive" else None
            summary[kind][T] = KindSummary(
                **mean, peak_mib=statistics.fmean(r.peak_mib for r in group), attended_fraction=fraction
            )
    spans = {
        T: next(r.spans for r in trained if r.kind == "adaptive" and r.T == T and r.seed == cfg.seeds[0])
        for T in cfg.lengths
    }
    T_max = max(cfg.lengths)
    adaptive, full = summary["adaptive"][T_max], summary["full"][T_max]
    saved = 1 - _mean_fraction([r for r in trained if r.kind == "adaptive" and r.T == T_max])  # adaptive's own mean
    span = AdaptiveSpan(T_max, saved, 1 - adaptive.step_ms / full.step_ms, spans)
    return SparseResult(quick, cfg, trained, summary, span)


def _mean_fraction(group: list[SparseRun]) -> float:
    """The mean over seeds of adaptive-span models' attended fraction (every such model has one)."""
    values = [r.attended_fraction for r in group]
    if any(v is None for v in values):
        raise ValueError("an adaptive-span model without an attended fraction")
    return statistics.fmean(v for v in values if v is not None)


def _done(task: Task, r: SparseRun) -> None:
    print(
        f"  {r.kind:>8} T={r.T:<4} seed {r.seed}: loss {r.eval_loss:.3f} acc {r.accuracy:.2f} "
        f"{r.step_ms:.1f} ms/step {r.peak_mib:.1f} MiB",
        flush=True,
    )


def claims(result: SparseResult) -> list[ClaimRecord | dict[str, Any]]:
    """:func:`sparse_claims` at the largest length, each with its premise (:func:`sparse_premise`)."""
    T = result.adaptive_span.T
    return attach(sparse_claims(result.runs, T), lambda record: sparse_premise(record, result.runs, T))


def sparse_table(r: SparseResult) -> Table:
    """Every kind at every length: loss, accuracy, ms per step, peak MiB and the keys attended relative to full."""
    rows = tuple(
        (
            kind,
            T,
            f"{s.eval_loss:.3f}",
            f"{s.accuracy:.2f}",
            f"{s.step_ms:.1f}",
            f"{s.peak_mib:.1f}",
            "-" if s.attended_fraction is None else f"{s.attended_fraction:.2f}",
        )
        for T in r.config.lengths
        for kind, by_T in r.summary.items()
        for s in [by_T[T]]
    )
    span = r.adaptive_span
    time_saved = span.step_time_saved
    return Table(
        f"delayed copy (copy distance T/2), {r.config.steps} steps x {r.config.batch}, "
        f"mean of {len(r.config.seeds)} seed(s)",
        ("attention", "T", "loss", "accuracy", "ms/step", "peak MiB", "keys vs full"),
        rows,
        note=f"adaptive span at T={span.T}: the widest learned span attends {1 - span.key_pairs_saved:.0%} of full "
        f"causal attention's key pairs ({span.key_pairs_saved:.0%} fewer); {abs(time_saved):.0%} "
        f"{'less' if time_saved >= 0 else 'more'} time per step than full attention (seed 002 §7.1 claims 23% less "
        "computation on PG-19)",
    )


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


def figures(r: SparseResult, out: Path) -> dict[str, Path]:
    """Loss, time and memory against ``T`` per kind, and the learned spans (:func:`plot_results`)."""
    summary = {kind: {T: dataclasses.asdict(s) for T, s in by_T.items()} for kind, by_T in r.summary.items()}
    return {"plot": plot_results(summary, r.adaptive_span.spans, out / "sparse.png")}


EXPERIMENT = declare(
    name="sparse",
    description="full vs window / axial / LSH / adaptive-span attention: long-range quality, time and memory per step "
    "(seed 002 §3.1, §7.1)",
    tier=FULL_ONLY,
    declaration=Declaration(
        SparseResult, plan, measure, claims, (KeyTable("sparse attention side by side", sparse_table),), figures
    ),
    estimate=(180, 1800),
)
run = EXPERIMENT.run
