"""Transformer-XL: what segment-level recurrence with the relative encoding buys past the segment length.

Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context"
(https://arxiv.org/abs/1901.02860), §3.2-3.3: a model reading a text in segments of ``L`` tokens
gives the first tokens of every segment almost no context ("context fragmentation"); caching the
previous segment's hidden states (stop-gradient) and attending them with the relative encoding lets
every token see up to ``n_layer x M`` tokens back, and a longer memory at evaluation than in training
helps further (their Table 6 / §4.2 ablations). Seed 002 §4.1 says relative encoding generalises to
longer contexts; this is the paper's form of that claim: the encoding plus the recurrence.

Here one small GPT with the Transformer-XL scheme (one ``W_R`` per layer, shared ``u, v``) per seed and arm, on
tinyshakespeare, trains on consecutive segments of ``L`` of contiguous streams: ``(a)`` each segment alone
(``TrainConfig.stream_batches``: the paper's fixed-context baseline), ``(b)`` the same segments in the same order
with the previous segment's states as memory (``TrainConfig.memory = L``). Same seed, initialisation and batches:
the memory is the only difference, so every claim is paired by seed (random windows would also change the data:
at the quick size that alone cost about 0.09 nats, measured).

Both read the validation split as consecutive segments of :data:`EVAL_STREAMS` contiguous streams, (a) without
memory and with a memory of ``L`` it never trained with, (b) with ``M = L``, ``2L``, ``4L`` and without; the loss is
in nats by place inside the segment and over it. The claims (:func:`xl_claims`): (b) beats (a) at ``L``; the gain is
larger on the segment's first quarter than its last; a ``4L`` memory beats ``L``; (a) uses a memory it never
trained with. The cost: forward + backward step time with and without memory, side by side (process CPU time,
one thread, alternating).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.display import new_figure, save_figure
from poslab.lab.experiments.common import FULL_ONLY, Baselines, baselines_field, corpus_baselines, one_thread
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, RunSummary, declare, seeded_arms
from poslab.lab.experiments.training import SEEDS, lm_premise
from poslab.lab.experiments.transformer_xl_measure import (
    EVAL_MEMORY_FACTORS,
    SeedReading,
    StepTime,
    conditions,
    read_seed,
    step_times,
)
from poslab.lab.premises import attach
from poslab.lab.tables import KeyTable, MeanSd, Table
from poslab.lab.verdicts import Arm, Metric, paired
from poslab.runs import load_run
from poslab.training import presets

SCHEME = "xl"
#: the quick and full model and training (L = block_size is the segment length)
MODELS = {
    "quick": {"n_layer": 2, "n_head": 4, "n_embd": 48, "block_size": 32},
    "full": {"n_layer": 3, "n_head": 4, "n_embd": 96, "block_size": 64},
}
STEPS = {
    "quick": {
        "max_steps": 150,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 15,
        "eval_interval": 75,
        "eval_iters": 4,
    },
    "full": {
        "max_steps": 600,
        "batch_size": 16,
        "lr": 2e-3,
        "warmup_steps": 50,
        "eval_interval": 150,
        "eval_iters": 8,
    },
}
#: validation streams read in parallel, and how many consecutive segments of each (None: all of them)
EVAL_STREAMS = {"quick": 8, "full": 16}
EVAL_SEGMENTS: dict[str, int | None] = {"quick": 48, "full": None}
#: forward + backward steps timed per variant (after one warm-up)
TIMED_STEPS = {"quick": 5, "full": 20}
ARMS = ("a", "b")
ARM_LABELS = {"a": "(a) trained without memory", "b": "(b) trained with memory M = L"}
SOURCE = "Dai et al. 2019 (arXiv 1901.02860) §3.2, §4.2; seed 002 §4.1"
PLOT_FILE = "transformer_xl_by_position.png"


def train_config(
    out: Path,
    quick: bool,
    arm: str,
    seed: int,
    model: dict[str, Any] | None = None,
    steps: dict[str, Any] | None = None,
    corpus: str | None = None,
) -> dict[str, Any]:
    """The training config mapping of one arm and seed (runs in ``out/runs/ARM-sSEED``; ``corpus``: tests)."""
    form = "quick" if quick else "full"
    geometry = dict(model or MODELS[form])
    config = {**presets.preset_config("shakespeare-char"), "ckpt_interval": 0, "keep_checkpoints": 1}
    config.update(steps or STEPS[form])
    if corpus is not None:
        config["corpus"] = corpus
    config["model"] = {**config["model"], **geometry, "position": SCHEME, "position_config": {}}
    config.update(
        lr_decay_steps=config["max_steps"],
        name=f"{arm}-s{seed}",
        out_dir=str(out / "runs"),
        seed=seed,
        threads=1,
        **arm_overrides(arm, geometry["block_size"]),
    )
    return config


def arm_overrides(arm: str, L: int) -> dict[str, Any]:
    """Both arms read the same consecutive segments of the same streams; only (b) keeps a memory of ``L``."""
    return {"memory": L} if arm == "b" else {"memory": 0, "stream_batches": True}


@dataclass(frozen=True)
class Setting:
    """The form (quick or full), the base config both arms share, and the seeds."""

    form: str
    base: dict[str, Any]
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class XLResult:
    """Every seed's two models read under every condition, their runs, and the step time with and without memory."""

    quick: bool
    scheme: str
    baselines: Baselines = baselines_field()
    segment_length: int
    train_memory: int
    eval_memories: list[int]
    model: dict[str, Any]
    steps: int
    seeds: list[int]
    arms: dict[str, str]
    eval_streams: int
    per_seed: list[SeedReading]
    runs: dict[str, list[RunSummary]]
    step_time: StepTime


def plan(
    out: Path,
    quick: bool,
    seeds: tuple[int, ...] = SEEDS,
    model: dict[str, Any] | None = None,
    steps: dict[str, Any] | None = None,
    corpus: str | None = None,
) -> Plan[Setting]:
    """Both arms at every seed, runs ``out/runs/ARM-sSEED``; ``model``, ``steps`` and ``corpus`` replace the form's
    (tests use tiny ones)."""
    first = train_config(out, quick, "a", seeds[0], model, steps, corpus)
    base = {k: v for k, v in first.items() if k not in ("name", "seed", "memory", "stream_batches")}
    variants = {arm: arm_overrides(arm, base["model"]["block_size"]) for arm in ARMS}
    arms = seeded_arms(out, base, variants, {arm: tuple(seeds) for arm in ARMS})
    return Plan(Setting("quick" if quick else "full", base, tuple(seeds)), arms)


def measure(runs: Runs[Setting]) -> XLResult:
    """Every seed's two models read segment after segment under every condition; the step times of (b)."""
    s, base = runs.setting, runs.setting.base
    L = base["model"]["block_size"]
    with one_thread():  # segment after segment through a tiny GPT: a second thread only adds waiting
        per_seed = [
            read_seed(
                seed, {arm: runs.by_arm[arm][seed].path for arm in ARMS}, EVAL_STREAMS[s.form], EVAL_SEGMENTS[s.form]
            )
            for seed in s.seeds
        ]
    timing_model, _, _ = load_run(runs.by_arm["b"][s.seeds[0]].path)
    corpus, fraction = base.get("corpus", "shakespeare"), base.get("val_fraction", 0.1)
    return XLResult(
        quick=s.form == "quick",
        scheme=SCHEME,
        baselines=corpus_baselines(corpus, fraction),
        segment_length=L,
        train_memory=L,
        eval_memories=[f * L for f in EVAL_MEMORY_FACTORS],
        model=base["model"],
        steps=base["max_steps"],
        seeds=list(s.seeds),
        arms=ARM_LABELS,
        eval_streams=EVAL_STREAMS[s.form],
        per_seed=per_seed,
        runs={arm: runs.summaries(arm) for arm in ARMS},
        step_time=step_times(timing_model, base["batch_size"], L, TIMED_STEPS[s.form]),
    )


def xl_claims(per_seed: list[SeedReading]) -> list[dict[str, Any]]:
    """The four claims of the module docstring, from the per-seed readings."""
    L = per_seed[0].block_size
    longest = max(EVAL_MEMORY_FACTORS) * L

    def values(label: str, key: str = "loss") -> list[float]:
        return [getattr(r.conditions[label], key) for r in per_seed]

    metric = Metric(f"val loss over segments of L = {L}", digits=4)
    seeds = [r.seed for r in per_seed]

    def arm(text: str, label: str) -> Arm:
        return Arm(text, values(label), seeds)

    # the arms of one seed share the seed's initialisation and batches (module docstring): paired by seed
    lowers = paired(
        "segment recurrence + relative encoding lowers the loss at segment length L",
        SOURCE,
        arm(f"(b) with memory {L}", f"b, memory {L}"),
        arm("(a) without memory", "a, no memory"),
        metric,
    )

    def gain(key: str) -> list[float]:  # per seed: the loss memory L takes off on part ``key`` of the segment
        return [a - b for a, b in zip(values("a, no memory", key), values(f"b, memory {L}", key))]

    where = paired(
        "what memory buys is at the start of a segment, where a fixed context is shortest: the gain on the first "
        "quarter of the segment exceeds the gain on the last quarter",
        SOURCE,
        Arm("gain on the first quarter", gain("first_quarter"), seeds),
        Arm("gain on the last quarter", gain("last_quarter"), seeds),
        Metric("loss of (a) without memory minus (b) with memory L", lower_is_better=False, digits=4),
    )
    longer = paired(
        f"a longer memory at evaluation helps further: (b) read with memory {longest} (4L) beats memory {L}",
        SOURCE,
        arm(f"(b) memory {longest}", f"b, memory {longest}"),
        arm(f"(b) memory {L}", f"b, memory {L}"),
        metric,
    )
    untrained = paired(
        "relative encoding alone lets a model use a memory it never trained with: (a) read with memory L beats (a) "
        "without",
        SOURCE,
        arm(f"(a) memory {L}", f"a, memory {L}"),
        arm("(a) no memory", "a, no memory"),
        metric,
    )
    return [r.to_dict() for r in (lowers, where, longer, untrained)]


def claims(r: XLResult) -> list[dict[str, Any]]:
    """:func:`xl_claims` with their premise: every claim is about context past L, so both arms' models, every seed
    (a per-model capability), must be language models that use their context within L."""
    premise = lm_premise(r.runs, list(ARMS), r.baselines.bigram, context=True)
    return attach(xl_claims(r.per_seed), lambda record: premise)


def loss_table(r: XLResult) -> Table:
    """Every evaluation condition's loss over the segment, on its first and last quarter and at its first place,
    mean ± sd over seeds; the step time with and without memory under it."""
    L, t = r.segment_length, r.step_time
    rows = []
    for label in conditions(L):
        read = [s.conditions[label] for s in r.per_seed]
        rows.append(
            (
                label,
                MeanSd.of([c.loss for c in read], 4),
                MeanSd.of([c.first_quarter for c in read]),
                MeanSd.of([c.last_quarter for c in read]),
                MeanSd.of([c.by_position[0] for c in read]),
            )
        )
    return Table(
        f"Transformer-XL on {r.baselines.corpus!r}: {r.model['n_layer']} layers, n_embd {r.model['n_embd']}, L = {L}, "
        f"{r.steps} steps; {r.eval_streams} validation streams read segment after segment; seeds {r.seeds}",
        ("evaluation", f"val loss (segments of {L})", "first quarter", "last quarter", "place 0"),
        tuple(rows),
        note=f"step time (forward + backward, batch {t.batch}, {t.clock}): memory {t.mem_len} "
        f"{1e3 * t.memory_s:.1f} ms vs none {1e3 * t.none_s:.1f} ms ({t.ratio:.2f}x)",
    )


def figures(r: XLResult, out: Path) -> dict[str, Path]:
    """Loss by place in the segment, one line per condition: mean over seeds, band min..max."""
    per_seed, baseline, baselines = r.per_seed, r.baselines.unigram_entropy_nats, r.baselines.ngram_baselines
    fig, ax = new_figure(size=(8.5, 5.0))
    L = r.segment_length
    places = list(range(L))
    for label in conditions(L):
        curves = [s.conditions[label].by_position for s in per_seed]
        mean = [sum(c) / len(c) for c in zip(*curves)]
        low = [min(c) for c in zip(*curves)]
        high = [max(c) for c in zip(*curves)]
        style = "--" if label.startswith("a") else "-"
        line = ax.plot(places, mean, style, marker="o", markersize=2.5, label=f"{label}: {sum(mean) / L:.3f}")[0]
        ax.fill_between(places, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle=":", linewidth=1, label=f"unigram baseline {baseline:.3f}")
    for name, style in (("bigram", "-."), ("trigram", (0, (1, 3)))):
        if baselines and name in baselines:
            ax.axhline(
                baselines[name],
                color="dimgray",
                linestyle=style,
                linewidth=1,
                label=f"{name} count model {baselines[name]:.3f}",
            )
    ax.set_xlabel(f"place inside the segment (segment length L = {L})")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(
        f"Transformer-XL: loss by place in the segment, (a) trained without / (b) with memory\n"
        f"line: mean over {len(per_seed)} seeds; band: min..max; legend: mean over the segment"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, out / PLOT_FILE)
    return {"plot": Path(PLOT_FILE)}  # results.json names the figure inside the experiment's folder


EXPERIMENT = declare(
    name="transformer-xl",
    description="Transformer-XL segment recurrence + relative encoding: what memory buys past the segment length L "
    "(Dai et al. 2019)",
    tier=FULL_ONLY,
    declaration=Declaration(
        XLResult, plan, measure, claims, (KeyTable("loss by evaluation condition", loss_table),), figures
    ),
    estimate=(90, 900),
)
run = EXPERIMENT.run
