"""Transformer-XL: what segment-level recurrence with the relative encoding buys past the segment length.

Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context"
(https://arxiv.org/abs/1901.02860), §3.2-3.3: a model reading a text in segments of ``L`` tokens
gives the first tokens of every segment almost no context ("context fragmentation"); caching the
previous segment's hidden states (stop-gradient) and attending them with the relative encoding lets
every token see up to ``n_layer x M`` tokens back, and a longer memory at evaluation than in training
helps further (their Table 6 / §4.2 ablations). Seed 002 §4.1 says relative encoding generalises to
longer contexts; this is the paper's form of that claim: the encoding plus the recurrence.

Here, on the lab's corpus (tinyshakespeare, characters), one small GPT with the Transformer-XL
scheme (one ``W_R`` per layer, shared ``u, v``) per seed and arm, the same steps and seeds:

* ``(a) no memory``: trained on consecutive segments of ``L`` of contiguous streams, each segment
  alone (``TrainConfig.stream_batches``: the paper's fixed-context baseline);
* ``(b) memory M = L``: the same segments in the same order, with the previous segment's states as
  memory (``TrainConfig.memory = L``).

Same seed, same initialisation, same batches: the memory is the only difference between the arms
(random windows would also change the data: at the quick size, 8 streams read contiguously cover
less of the text than 8 random windows per step, which alone cost about 0.09 nats, measured).

Both read the validation split as consecutive segments of ``L`` of :data:`EVAL_STREAMS` contiguous
streams: (a) without memory (every segment alone, the fixed-context baseline) and with a memory of
``L`` it never trained with; (b) with ``M = L``, ``2L`` and ``4L`` and without memory. The loss is
reported by place inside the segment (plot: mean and min..max over seeds) and as the mean over the
segment. Claims (the lab's one rule, ``poslab.lab.verdicts``):

* recurrence + relative encoding lowers the loss at segment length ``L``: (b) with memory below (a)
  without (paired by seed: the arms of a seed share their initialisation and batches, so the seed's
  pair differs by the memory alone, :func:`~poslab.lab.verdicts.paired`);
* the gain is where the fixed context is shortest: (b)-with-memory's advantage over (a) on the first
  quarter of the segment is larger than on the last quarter (paired by seed);
* a longer memory at evaluation helps further: (b) with ``4L`` below (b) with ``L`` (paired by seed:
  the same model read twice);
* relative encoding alone lets a model use memory it never trained with: (a) with memory ``L`` below
  (a) without (paired by seed).

Every claim records its seeds; the losses are in nats (ln-perplexity), so differences of losses are
ln-perplexity ratios.

The cost: forward + backward step time with and without the memory, measured side by side (process
CPU time, one thread, alternating) on the (b) model's geometry.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from poslab.display import new_figure, print_table, save_figure
from poslab.lab.experiments.common import FULL_ONLY, Experiment, baseline_line, ngram_baselines, unigram_entropy
from poslab.lab.experiments.training import SEEDS, lm_premise, train_seeded
from poslab.lab.premises import attach
from poslab.lab.verdicts import paired, pm
from poslab.nn.memory import SegmentMemory
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run
from poslab.training import presets
from poslab.training.data import batchify
from poslab.training.loop import segment_nll

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
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
    },
    "full": {
        "max_steps": 600,
        "batch_size": 16,
        "lr": 2e-3,
        "warmup_steps": 50,
        "eval_interval": 150,
        "eval_iters": 8,
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
    },
}
#: validation streams read in parallel, and how many consecutive segments of each (None: all of them)
EVAL_STREAMS = {"quick": 8, "full": 16}
EVAL_SEGMENTS: dict[str, int | None] = {"quick": 48, "full": None}
#: evaluation memories of model (b), in units of L
EVAL_MEMORY_FACTORS = (1, 2, 4)
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
    config = presets.preset_config("shakespeare-char")
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


def conditions(L: int) -> dict[str, tuple[str, int]]:
    """Evaluation label -> (arm, memory length)."""
    out = {"a, no memory": ("a", 0), f"a, memory {L}": ("a", L), "b, no memory": ("b", 0)}
    out.update({f"b, memory {f * L}": ("b", f * L) for f in EVAL_MEMORY_FACTORS})
    return out


def measure(run_dirs: dict[str, Path], n_streams: int, segments: int | None) -> dict[str, Any]:
    """Loss by place in the segment for every evaluation condition of one seed's two models."""
    loaded = {arm: load_run(path) for arm, path in run_dirs.items()}
    model_b, tokenizer, _ = loaded["b"]
    L = model_b.config.block_size
    val = RunFolder(run_dirs["b"]).split_tokens("val", tokenizer)
    streams = batchify(val, n_streams, L)  # [n, S]
    out: dict[str, Any] = {"block_size": L, "n_streams": n_streams}
    for label, (arm, mem_len) in conditions(L).items():
        nll = segment_nll(loaded[arm][0], streams, L, mem_len, segments).double()  # [segments, n, L]
        by_place = nll.mean(dim=(0, 1))  # [L]
        quarter = max(1, L // 4)
        out[label] = {
            "loss": float(nll.mean()),
            "by_position": by_place.tolist(),
            "first_quarter": float(by_place[:quarter].mean()),
            "last_quarter": float(by_place[-quarter:].mean()),
            "segments": int(nll.shape[0]),
        }
    return out


def step_times(model: GPT, batch: int, mem_len: int, steps: int) -> dict[str, float]:
    """Median forward + backward CPU seconds per step with and without a memory of ``mem_len`` (alternating, one
    thread)."""
    L = model.config.block_size
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (batch, L), generator=generator)
    model.train()
    memory = SegmentMemory(mem_len)
    model(x, x, memory=memory)  # fill the memory with one segment
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {"memory": [], "none": []}
    try:
        for i in range(steps + 1):
            for variant in ("memory", "none"):
                start = time.process_time()
                if variant == "memory":
                    _, loss = model(x, x, memory=memory)
                else:
                    _, loss = model(x, x)
                loss.backward()
                elapsed = time.process_time() - start
                model.zero_grad(set_to_none=True)
                if i:  # the first round warms up
                    times[variant].append(elapsed)
    finally:
        torch.set_num_threads(threads)
    medians = {f"{k}_s": statistics.median(v) for k, v in times.items()}
    return {
        **medians,
        "ratio": medians["memory_s"] / medians["none_s"],
        "steps": steps,
        "batch": batch,
        "mem_len": mem_len,
        "clock": "process CPU time, 1 thread, alternating",
    }


def plot(
    per_seed: list[dict[str, Any]], path: Path, baseline: float | None, baselines: dict[str, float] | None = None
) -> Path:
    """Loss by place in the segment, one line per condition: mean over seeds, band min..max."""
    fig, ax = new_figure(size=(8.5, 5.0))
    L = per_seed[0]["block_size"]
    places = list(range(L))
    for label in conditions(L):
        curves = [r[label]["by_position"] for r in per_seed]
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
    return save_figure(fig, path)


def claims(per_seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The four claims of the module docstring, from the per-seed measurements."""
    L = per_seed[0]["block_size"]
    longest = max(EVAL_MEMORY_FACTORS) * L

    def values(label: str, key: str = "loss") -> list[float]:
        return [r[label][key] for r in per_seed]

    metric = f"val loss over segments of L = {L}"
    seeds = [r["seed"] for r in per_seed]
    # the arms of one seed share the seed's initialisation and batches (module docstring): paired by seed
    lowers = paired(
        "segment recurrence + relative encoding lowers the loss at segment length L",
        SOURCE,
        values(f"b, memory {L}"),
        values("a, no memory"),
        better_label=f"(b) with memory {L}",
        worse_label="(a) without memory",
        metric=metric,
        digits=4,
        seeds=seeds,
    )
    gain_first = [
        a - b for a, b in zip(values("a, no memory", "first_quarter"), values(f"b, memory {L}", "first_quarter"))
    ]
    gain_last = [
        a - b for a, b in zip(values("a, no memory", "last_quarter"), values(f"b, memory {L}", "last_quarter"))
    ]
    where = paired(
        "what memory buys is at the start of a segment, where a fixed context is shortest: the gain on the first "
        "quarter of the segment exceeds the gain on the last quarter",
        SOURCE,
        gain_first,
        gain_last,
        better_label="gain on the first quarter",
        worse_label="gain on the last quarter",
        metric="loss of (a) without memory minus (b) with memory L",
        lower_is_better=False,
        digits=4,
        seeds=seeds,
    )
    longer = paired(
        f"a longer memory at evaluation helps further: (b) read with memory {longest} (4L) beats memory {L}",
        SOURCE,
        values(f"b, memory {longest}"),
        values(f"b, memory {L}"),
        better_label=f"(b) memory {longest}",
        worse_label=f"(b) memory {L}",
        metric=metric,
        digits=4,
        seeds=seeds,
    )
    untrained = paired(
        "relative encoding alone lets a model use a memory it never trained with: (a) read with memory L beats (a) "
        "without",
        SOURCE,
        values(f"a, memory {L}"),
        values("a, no memory"),
        better_label=f"(a) memory {L}",
        worse_label="(a) no memory",
        metric=metric,
        digits=4,
        seeds=seeds,
    )
    return [r.to_dict() for r in (lowers, where, longer, untrained)]


def run(
    out: Path,
    quick: bool = False,
    seeds: tuple[int, ...] = SEEDS,
    model: dict[str, Any] | None = None,
    steps: dict[str, Any] | None = None,
    workers: int | None = None,
    corpus: str | None = None,
) -> dict[str, Any]:
    """Train both arms at every seed, read the validation stream by segments, plot, judge the claims.

    Args:
        out: output folder (runs in ``out/runs/ARM-sSEED``, plot ``out/transformer_xl_by_position.png``).
        quick: the short form (:data:`MODELS`, :data:`STEPS`).
        seeds: training seeds (at least 3 for a conclusive verdict).
        model, steps: geometry and training overrides (tests use tiny ones).
        corpus: replaces the lab's corpus (tests use a short text).
        workers: trainings at a time (:func:`poslab.lab.experiments.training.train_seeded`).
    """
    out = Path(out)
    form = "quick" if quick else "full"
    first = train_config(out, quick, "a", seeds[0], model, steps, corpus)
    base = {k: v for k, v in first.items() if k not in ("name", "seed", "memory", "stream_batches")}
    L = base["model"]["block_size"]
    variants = {arm: arm_overrides(arm, L) for arm in ARMS}
    runs = train_seeded(out, base, variants, tuple(seeds), workers)
    per_seed = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # segment after segment through a tiny GPT: a second thread only adds waiting
    try:
        for i, seed in enumerate(seeds):
            dirs = {arm: Path(runs[arm][i]["run_dir"]) for arm in ARMS}
            per_seed.append({"seed": seed, **measure(dirs, EVAL_STREAMS[form], EVAL_SEGMENTS[form])})
    finally:
        torch.set_num_threads(threads)
    corpus = base.get("corpus", "shakespeare")
    baseline = unigram_entropy(corpus, base.get("val_fraction", 0.1))

    rows = []
    for label in conditions(L):
        rows.append(
            [
                label,
                pm([r[label]["loss"] for r in per_seed], 4),
                pm([r[label]["first_quarter"] for r in per_seed], 3),
                pm([r[label]["last_quarter"] for r in per_seed], 3),
                pm([r[label]["by_position"][0] for r in per_seed], 3),
            ]
        )
    geometry = base["model"]
    print_table(
        ["evaluation", f"val loss (segments of {L})", "first quarter", "last quarter", "place 0"],
        rows,
        title=(
            f"Transformer-XL on {corpus!r}: {geometry['n_layer']} layers, n_embd {geometry['n_embd']}, L = {L}, "
            f"{base['max_steps']} steps; {EVAL_STREAMS[form]} validation streams read segment after segment; "
            f"mean ± sd over seeds {list(seeds)}"
        ),
    )
    print(baseline_line(corpus, base.get("val_fraction", 0.1)))

    timing_model, _, _ = load_run(Path(runs["b"][0]["run_dir"]))
    timing = step_times(timing_model, base["batch_size"], L, TIMED_STEPS[form])
    print(
        f"  step time (forward + backward, batch {base['batch_size']}, {timing['clock']}): memory {L} "
        f"{1e3 * timing['memory_s']:.1f} ms vs none {1e3 * timing['none_s']:.1f} ms ({timing['ratio']:.2f}x)"
    )

    ngrams = ngram_baselines(corpus, base.get("val_fraction", 0.1))
    # every claim is about context past L: both arms' models, every seed (a per-model capability), must be language
    # models that use their context within L
    records = attach(claims(per_seed), lambda record: lm_premise(runs, list(ARMS), ngrams["bigram"], context=True))
    plot(per_seed, out / PLOT_FILE, baseline, ngrams)
    return {
        "quick": quick,
        "scheme": SCHEME,
        "corpus": corpus,
        "unigram_entropy_nats": baseline,
        "ngram_baselines": ngrams,
        "segment_length": L,
        "train_memory": L,
        "eval_memories": [f * L for f in EVAL_MEMORY_FACTORS],
        "model": geometry,
        "steps": base["max_steps"],
        "seeds": list(seeds),
        "arms": ARM_LABELS,
        "eval_streams": EVAL_STREAMS[form],
        "val_loss": {label: pm([r[label]["loss"] for r in per_seed], 4) for label in conditions(L)},
        "per_seed": per_seed,
        "runs": runs,
        "step_time": timing,
        "claims": records,
        "plot": PLOT_FILE,
    }


EXPERIMENT = Experiment(
    name="transformer-xl",
    description="Transformer-XL segment recurrence + relative encoding: what memory buys past the segment length L "
    "(Dai et al. 2019)",
    tier=FULL_ONLY,
    run=run,
    estimate=(90, 900),
)
