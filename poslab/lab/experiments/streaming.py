"""StreamingLLM: attention sinks keep a windowed cache's perplexity stable (Xiao et al. 2023).

Xiao, Tian, Chen, Han, Lewis, "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024,
https://arxiv.org/abs/2309.17453), Figure 3 / Table 1: on a stream far longer than the cache,
window attention (keep the last ``L`` tokens) blows up once the first tokens are evicted, while
keeping 4 initial tokens ("attention sinks") plus the window stays near the sliding-window-with-
recomputation perplexity.

Here small RoPE GPTs trained on tinyshakespeare (block ``L``), one per seed, read a validation stream of ``8 L``
characters token by token: ``streaming`` (4 sinks + an ``L - 4`` window), ``window`` (0 sinks, an ``L`` window: the
same memory) and ``full`` (one pass, every key). The claim is tested on the perplexity after the first eviction
(``t >= L``), paired by seed (both caches read the same model), on ln-perplexity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from poslab.analysis.eval import loss_by_position
from poslab.analysis.heads import attention_weights, sink_scores
from poslab.display import new_figure, save_figure
from poslab.lab.experiments.common import (
    FULL_ONLY,
    Baselines,
    baselines_field,
    corpus_baselines,
    even_windows,
    one_thread,
)
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.training import CONTEXT_WINDOWS, SEEDS, preset_arms
from poslab.lab.premises import all_of, attach, below_bigram, uses_context
from poslab.lab.scale import STREAM_SCALES, Scale
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import Arm, Metric, Premise, paired
from poslab.nn.caches import StreamingSpec
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run

SINKS, STREAM_FACTOR = 4, 8
METHODS = ("streaming", "window", "full")
PLOT_FILE = "streaming_ppl.png"


@dataclass(frozen=True)
class MethodReading:
    """One way of reading the stream: perplexity after the first eviction (tokens ``>= L``), on the first block,
    and per block of ``L`` tokens."""

    ppl_after_eviction: float
    ppl_first_block: float
    ppl_by_block: list[float]


@dataclass(frozen=True)
class SinkRate:
    """The head analysis' sink rate (attention on the first token) on the streams' first ``L`` tokens."""

    max: float
    mean: float
    per_head: list[list[float]]
    uniform: float


@dataclass(frozen=True)
class SeedReading:
    """One seed's model read the three ways (:data:`METHODS`), with its sink rate and per-position loss."""

    seed: int
    block_size: int
    stream_length: int
    n_streams: int
    corpus: str
    loss_by_position: list[float]
    sink_rate: SinkRate
    streaming: MethodReading
    window: MethodReading
    full: MethodReading

    def method(self, name: str) -> MethodReading:
        return {"streaming": self.streaming, "window": self.window, "full": self.full}[name]


@dataclass(frozen=True)
class StreamingResult:
    """Every seed's readings."""

    sinks: int
    block_size: int
    stream_factor: int
    seeds: list[int]
    per_seed: list[SeedReading]
    quick: bool
    baselines: Baselines = baselines_field()


@torch.no_grad()
def stream_nll(
    model: GPT, stream: torch.Tensor, method: str, sinks: int = SINKS, size: int | None = None
) -> torch.Tensor:
    """Per-token negative log-likelihood ``[B, N-1]`` of predicting ``stream[:, 1:]`` (``stream [B, N]``) by
    ``method``: ``streaming`` (``sinks`` + ``size - sinks`` window), ``window`` (``size`` window, no sinks) or
    ``full`` (one pass); ``size`` defaults to the model's ``block_size``."""
    model.eval()
    size = size or model.config.block_size
    if method == "full":
        logits = model(stream[:, :-1])  # [B, N-1, V]
    elif method in ("streaming", "window"):
        k = sinks if method == "streaming" else 0
        if not 0 <= k < size:
            raise ValueError(f"sinks must lie in [0, {size}) for a cache of {size} entries, got {k}")
        cache = model.make_cache(stream.shape[0], StreamingSpec(window=size - k, sinks=k))
        logits = torch.cat(
            [model(stream[:, t : t + 1], cache=cache) for t in range(stream.shape[1] - 1)], dim=1
        )  # [B, N-1, V]
    else:
        raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    return F.cross_entropy(logits.float().transpose(1, 2), stream[:, 1:], reduction="none")  # [B, N-1]


def read_seed(seed: int, run_dir: Path, n_streams: int) -> SeedReading:
    """Perplexities of the three methods on one trained run's validation stream."""
    model, tokenizer, _ = load_run(run_dir)
    L = model.config.block_size
    val = RunFolder(run_dir).split_tokens("val", tokenizer)
    stream = even_windows(val, n_streams, STREAM_FACTOR * L)
    # do the models have sinks at all? the head analysis' sink rate on the streams' first L tokens
    rates = sink_scores(attention_weights(model, stream[:, :L]))  # [n_layer, n_head]
    uniform = float((1.0 / torch.arange(2, L + 1, dtype=torch.float64)).mean())
    methods = {}
    for method in METHODS:
        nll = stream_nll(model, stream, method).double()  # [B, N-1]; target t+1 predicted at query t
        after = nll[:, L - 1 :]  # queries t >= L: the first token has left a plain window of L
        segments = nll.mean(0).split(L)
        methods[method] = MethodReading(
            math.exp(float(after.mean())),
            math.exp(float(nll[:, : L - 1].mean())),
            [math.exp(float(s.mean())) for s in segments],
        )
    return SeedReading(
        seed=seed,
        block_size=L,
        stream_length=STREAM_FACTOR * L,
        n_streams=n_streams,
        corpus=RunFolder(run_dir).config()["train"]["corpus"],
        loss_by_position=[float(v) for v in loss_by_position(model.eval(), val, L, CONTEXT_WINDOWS)],
        sink_rate=SinkRate(float(rates.max()), float(rates.mean()), rates.tolist(), uniform),
        **methods,
    )


@dataclass(frozen=True)
class Setting:
    scale: Scale
    quick: bool


def plan(out: Path, quick: bool, seeds: tuple[int, ...] = SEEDS, scale: Scale | None = None) -> Plan[Setting]:
    """One model per seed. ``scale``: the models and the number of streams read (``eval_windows``; default
    :data:`~poslab.lab.scale.STREAM_SCALES` ``quick`` or ``full``; tests use a tiny one)."""
    scale = scale or STREAM_SCALES["quick" if quick else "full"]
    return Plan(Setting(scale, quick), preset_arms(out, scale, seeds), summarise=False)


def measure(runs: Runs[Setting]) -> StreamingResult:
    """Every seed's model read the three ways."""
    windows = runs.setting.scale.eval_windows
    with one_thread():  # token-by-token decoding of a tiny GPT: more threads only add overhead
        per_seed = [read_seed(seed, run.path, windows) for seed, run in runs.by_arm["rope"].items()]
    return StreamingResult(
        SINKS,
        per_seed[0].block_size,
        STREAM_FACTOR,
        [r.seed for r in per_seed],
        per_seed,
        runs.setting.quick,
        corpus_baselines(per_seed[0].corpus),
    )


def seed_claims(per_seed: list[SeedReading]) -> list[dict[str, Any]]:
    """The paper's claim on the after-eviction perplexity: the two caches read the same seed's model, so
    the design is paired by seed, on ln-perplexity (the ratio of the two caches' perplexities per seed)."""
    seeds = [r.seed for r in per_seed]
    record = paired(
        "keeping 4 attention sinks keeps perplexity stable where the plain window of the same size blows up",
        "Xiao et al. 2023 (StreamingLLM), Fig. 3 / Table 1",
        Arm(f"{SINKS} sinks + window", [r.streaming.ppl_after_eviction for r in per_seed], seeds),
        Arm("plain window", [r.window.ppl_after_eviction for r in per_seed], seeds),
        Metric(f"perplexity after the first eviction on an {STREAM_FACTOR}x stream", log=True),
    )
    return [record.to_dict()]


def premise_of(per_seed: list[SeedReading], bigram: float) -> Premise:
    """Attention sinks matter to a model that attends over its window: every seed's model (a per-model
    capability: no seed may miss it), read with full attention within L, clearly below the bigram baseline and
    using its context (:mod:`poslab.lab.premises`)."""
    losses = {"full attention within L": [math.log(r.full.ppl_first_block) for r in per_seed]}
    return all_of(
        below_bigram(losses, bigram),
        uses_context({"full attention within L": [r.loss_by_position for r in per_seed]}),
    )


def claims(r: StreamingResult) -> list[dict[str, Any]]:
    """:func:`seed_claims` with its premise (:func:`premise_of`)."""
    premise = premise_of(r.per_seed, r.baselines.bigram)
    return attach(seed_claims(r.per_seed), lambda record: premise)


def ppl_table(r: StreamingResult) -> Table:
    """Each method's perplexity before and after the first eviction, mean and per seed; the sink rates under it."""
    L, rows = r.block_size, []
    for method in METHODS:
        read = [s.method(method) for s in r.per_seed]
        after = [m.ppl_after_eviction for m in read]
        rows.append((method, sum(m.ppl_first_block for m in read) / len(read), sum(after) / len(after), after))
    return Table(
        f"StreamingLLM: stream {STREAM_FACTOR * L} tokens, cache {L} ({SINKS} sinks + {L - SINKS}), "
        f"{len(r.seeds)} seeds",
        ("method", "ppl tokens < L", "ppl tokens >= L", "per seed (>= L)"),
        tuple(rows),
        note=f"strongest head sink rate per seed (attention on the first token; uniform "
        f"{r.per_seed[0].sink_rate.uniform:.3f}): " + " ".join(f"{s.sink_rate.max:.3f}" for s in r.per_seed),
    )


def figures(r: StreamingResult, out: Path) -> dict[str, Path]:
    """Perplexity per block of ``L`` stream tokens, mean over seeds, one line per method."""
    fig, ax = new_figure(size=(8.0, 4.5))
    L = r.block_size
    for method, style in zip(METHODS, ("o-", "s--", "^:")):
        curves = [s.method(method).ppl_by_block for s in r.per_seed]
        mean = [sum(c) / len(c) for c in zip(*curves)]
        ax.plot([(i + 1) * L for i in range(len(mean))], mean, style, label=method)
    ax.axvline(L, color="0.5", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel(f"stream position (block of {L} tokens ending here); the cache holds {L}")
    ax.set_ylabel("perplexity (mean over seeds)")
    ax.set_title(f"StreamingLLM ({SINKS} sinks + {L - SINKS} window) vs window {L} vs full, stream {STREAM_FACTOR}x{L}")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    save_figure(fig, out / PLOT_FILE)
    return {"plot": Path(PLOT_FILE)}  # results.json names the figure inside the experiment's folder


EXPERIMENT = declare(
    name="streaming",
    description="StreamingLLM: 4 attention sinks + window vs a plain window vs full attention on an 8x-long stream "
    "(Xiao et al. 2023)",
    tier=FULL_ONLY,
    declaration=Declaration(
        StreamingResult, plan, measure, claims, (KeyTable("perplexity per method", ppl_table),), figures
    ),
    estimate=(30, 300),
)
run = EXPERIMENT.run
