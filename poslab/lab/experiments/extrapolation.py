"""Length extrapolation: train at ``L``, read at ``1x .. 16x L``, one small GPT per position scheme.

Claims tested (never forced; each verdict is computed from the measured perplexities):

* Press et al. 2022, "Train Short, Test Long" (ALiBi, https://arxiv.org/abs/2108.12409): ALiBi's
  perplexity stays flat past the training length, sinusoidal and rotary models degrade; at 8x L
  ALiBi < RoPE < sinusoidal (their WikiText-103 table: at 512 / 2512 tokens after training at 512,
  sinusoidal 20.05 / 132.41, rotary 20.07 / 31.58, ALiBi 19.73 / 18.41).
* Seed 000 §2.2 and Q4: learned absolute tables "collapse past the training length"; RoPE
  extrapolates "well", better than the relative-bias schemes (T5, ALiBi, rated "medium"); in practice
  RoPE's perplexity "jumps from 10 to 100+".
* Seed 002 §4.1: Transformer-XL's relative encoding "solves long-sequence generalization".

Every scheme trains with the same data (tinyshakespeare, char-level), steps, batch and seed
(:func:`poslab.session.train`), then :func:`poslab.analysis.eval.evaluate_length` scores the same validation
targets at every length, both in non-overlapping chunks (the ALiBi paper's protocol, which carries
the "early-token curse") and with a sliding window of stride ``length/2``.

The claims are decided in :mod:`poslab.lab.experiments.extrapolation_verdicts`, each by the test its
design calls for: a ratio ``ppl(fL) / ppl(L)`` per seed on the ln scale (one model read at two lengths),
two schemes paired by seed (seed i trains every scheme on the same batches), RoPE's "10 to 100+"
against the corpus's unigram perplexity (the level of a model that ignores its context).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import evaluate_length, loss_by_position
from poslab.display import new_figure, save_figure, series_style
from poslab.lab.experiments import extrapolation_tables
from poslab.lab.experiments.common import (
    LAB,
    Experiment,
    baseline_line,
    draw_perplexity_baselines,
    ngram_baselines,
    scheme_style_index,
    unigram_entropy,
)
from poslab.lab.experiments.extrapolation_verdicts import (  # noqa: F401  (re-exported: the claims of this experiment)
    JUMP_QUOTE,
    UNDERTRAINED,
    extrapolation_claims,
    jump_claim,
    seed_perplexities,
    undertrained,
    undertrained_seeded,
)
from poslab.lab.experiments.training import (
    CONTEXT_WINDOWS,
    SEED,
    SEEDS,
    ensure_many,
    ensure_trained,
)
from poslab.lab.premises import all_of, arms_of, attach, beats_nope, below_bigram, uses_context
from poslab.lab.sizes import EXTRAPOLATION_FACTORS, SIZES, Size, size_of  # noqa: F401  (SIZES, size_of: re-exported)
from poslab.lab.tables import print_tables
from poslab.lab.verdicts import ClaimRecord, Premise, mean_sd
from poslab.runs import RunFolder, load_run


def lab_schemes() -> tuple[str, ...]:
    """The schemes the extrapolation (and attention-entropy) lab trains: every registered scheme a GPT can be
    built with from its default config (``positions.names()`` order), so a newly registered scheme reaches
    these labs without an edit here. The filter is a property of the scheme, never its name: a scheme whose
    default config does not build for the lab's geometry (it needs a hand-chosen value) is left out.
    """
    from poslab.nn import positions

    context = {
        "n_embd": 64,
        "n_heads": 4,
        "head_dim": 16,
        "max_len": 64,
        "original_max_len": 64,
        "bidirectional": False,
    }
    out = []
    for name in positions.names():
        try:
            with torch.device("meta"):
                positions.build_for_model(name, {}, context)
        except (ValueError, TypeError):
            continue
        out.append(name)
    return tuple(out)


SCHEMES = lab_schemes()


def schemes_of(size: Size) -> tuple[str, ...]:
    """The schemes trained at ``size``: its own list (the quick size's claim arms), else :data:`SCHEMES`."""
    return tuple(size.schemes) if size.schemes is not None else SCHEMES


FACTORS = EXTRAPOLATION_FACTORS
CORPUS = "shakespeare"


# ------------------------------------------------------------------------------------ training
def _bounded(scheme: str, size: Any) -> bool:
    """Whether ``scheme`` (default config at this size) encodes only a bounded number of positions (a table)."""
    from poslab.nn import positions

    context = {
        "n_embd": size.n_embd,
        "n_heads": size.n_head,
        "head_dim": size.n_embd // size.n_head,
        "max_len": size.train_length,
        "bidirectional": False,
    }
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        built = positions.build_for_model(scheme, {}, context)
    return built.max_positions is not None


def train_config(
    scheme: str,
    size: Size,
    models_dir: Path,
    *,
    name: str | None = None,
    block_size: int | None = None,
    position_config: dict | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    warmup_steps: int | None = None,
    init_from: str | None = None,
    seed: int = SEED,
) -> Any:
    """The :class:`poslab.training.config.TrainConfig` of one lab model (same data, seed and recipe for every scheme).

    The recipe is nanoGPT's (AdamW, warmup + cosine, no dropout, no biases) with the token embeddings
    multiplied by ``sqrt(n_embd)`` (``embed_scale``, Vaswani et al. 2017 §3.4) for every scheme: with
    nanoGPT's 0.02-std token embeddings the unit-amplitude sinusoidal code swamps the content, and the
    scale gives the content its share back. A LayerNorm on the embeddings (``embed_norm``, Bloom) does
    that too but slows the learned table down (measured at 2 layers, width 64, 1000 steps, one seed:
    validation loss 2.30 with the norm, 2.07 without; ``benchmarks/lm_recipe_search.py``).

    The learned table has ``max(FACTORS) * L`` rows, of which training only ever reads the first ``L``
    (as a GPT-2 checkpoint's table past the lengths it was trained on): the rows past ``L`` keep their
    random initialisation, so the model can be read past ``L`` and the lesson's "collapse" measured.
    Every model records its ``seed`` (model initialisation and batches); :data:`SEEDS` are the lab's.
    """
    from poslab.training.config import TrainConfig

    steps = steps or size.steps
    lr = lr or size.lr
    position_config = dict(position_config or {})
    if block_size is None and "max_len" not in position_config and _bounded(scheme, size):
        position_config["max_len"] = max(FACTORS) * size.train_length  # a table with rows to read past L
    values: dict[str, Any] = {
        "name": name or scheme,
        "out_dir": str(models_dir),
        "corpus": CORPUS,
        "tokenizer": "char",
        "model": {
            "n_layer": size.n_layer,
            "n_head": size.n_head,
            "n_embd": size.n_embd,
            "block_size": block_size or size.train_length,
            "dropout": 0.0,
            "bias": False,
            "embed_scale": float(size.n_embd) ** 0.5,
            "position": scheme,
            "position_config": position_config,
        },
        "max_steps": steps,
        "batch_size": batch_size or size.batch_size,
        "lr": lr,
        "min_lr": lr / 10,
        "warmup_steps": size.warmup_steps if warmup_steps is None else warmup_steps,
        "beta2": 0.99,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "eval_interval": max(1, steps // 5),  # five points of the validation curve
        "eval_iters": 4,
        "log_interval": max(1, steps // 10),
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "seed": seed,
        "device": size.device,  # a GPU size trains on CUDA
        "dtype": "auto",  # bf16 only where it measured faster on this machine (poslab.training.precision)
    }
    if init_from is not None:
        values["init_from"] = init_from
    return TrainConfig.from_dict(values)


def models_dir(out: Path, size: Size) -> Path:
    """Where an experiment keeps its trained models: ``OUT/models/SIZE``."""
    return Path(out) / "models" / size.name


def run_name(scheme: str, seed: int = SEED) -> str:
    """A lab model's folder name: ``SCHEME`` for the first seed (:data:`SEED`), ``SCHEME-sN`` for the others."""
    return scheme if seed == SEED else f"{scheme}-s{seed}"


#: the experiment whose quick form trains the same models first (its runs are reused here)
POSITION_TRAINING = "position-training"


def _reuse_candidates(scheme: str, size: Size, out: Path, seed: int) -> tuple[Path, ...]:
    parent = Path(out).parent
    return (
        parent / EXPERIMENT.name / "models" / size.name / run_name(scheme, seed),
        parent / POSITION_TRAINING / "runs" / f"{scheme}-s{seed}",
    )


def shared_model(scheme: str, size: Size, out: Path, seed: int = SEED) -> Path:
    """The lab model of ``scheme`` for ``size`` and ``seed``: trained into ``OUT/models/SIZE/NAME``, or reused
    from a sibling folder (this experiment's, or the position-training experiment's runs) when one there is
    complete and identical."""
    cfg = train_config(scheme, size, models_dir(out, size), name=run_name(scheme, seed), seed=seed)
    return ensure_trained(cfg, reuse=_reuse_candidates(scheme, size, out, seed))


def shared_models(
    schemes: tuple[str, ...] | list[str],
    size: Size,
    out: Path,
    seeds: tuple[int, ...] = SEEDS,
    workers: int | None = None,
) -> dict[str, dict[int, Path]]:
    """:func:`shared_model` for every scheme and seed, training the missing ones ``workers`` at a time.

    Returns:
        scheme -> seed -> run folder.
    """
    keys = [(scheme, seed) for scheme in schemes for seed in seeds]
    jobs = [
        (
            train_config(scheme, size, models_dir(out, size), name=run_name(scheme, seed), seed=seed),
            _reuse_candidates(scheme, size, out, seed),
        )
        for scheme, seed in keys
    ]
    found = dict(zip(keys, ensure_many(jobs, workers, what="lab models")))
    return {s: {seed: found[(s, seed)] for seed in seeds} for s in schemes}


# ------------------------------------------------------------------------------------ claims
# ------------------------------------------------------------------------------------ run
def evaluate_scheme(run_dir: Path, size: Size) -> dict[str, Any]:
    """Every factor's cell (non-overlapping + sliding window with stride ``length/2``) of one trained model."""
    model, tokenizer, config = load_run(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    cells = {}
    for factor in FACTORS:
        length = factor * size.train_length
        cells[str(factor)] = evaluate_length(model, tokens, length, size.n_targets, stride=max(1, length // 2))
    return cells


def context_curve(run_dir: Path, size: Size) -> list[float]:
    """Mean validation loss at each position of a window of ``L`` (:func:`poslab.analysis.eval.loss_by_position`)."""
    model, tokenizer, _ = load_run(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    return [float(v) for v in loss_by_position(model, tokens, size.train_length, CONTEXT_WINDOWS)]


def premise_of(
    record: ClaimRecord, tables: dict[str, dict[str, dict]], curves: dict[str, dict[str, list[float]]], bigram: float
) -> Premise:
    """A claim about reading past ``L``: every scheme it names is a language model (every seed's in-length
    loss clearly below the bigram baseline) that uses its context within ``L``; a comparison of two or
    more position schemes also needs each of them to beat NoPE in length by more than the noise (their
    positions matter to the model). :mod:`poslab.lab.premises` has the rules."""
    arms = arms_of(record, list(tables))
    losses = {s: [math.log(v) for v in seed_perplexities(tables, s, 1, "nonoverlapping") or []] for s in arms}
    found = [below_bigram(losses, bigram), uses_context({s: list(curves[s].values()) for s in arms})]
    positional = [s for s in arms if s != "none"]
    if len(positional) >= 2 and "none" in tables:
        nope = [math.log(v) for v in seed_perplexities(tables, "none", 1, "nonoverlapping") or []]
        found += [beats_nope(s, losses[s], nope, metric="in-length loss") for s in positional]
    return all_of(*found)


def aggregate(tables: dict[str, dict[str, dict]]) -> dict[str, dict[str, Any]]:
    """scheme -> factor -> ``{"cannot": why}`` or ``{mode: {"ppl": mean, "ppl_sd": sd, "ppl_seeds": [...]}}``
    over seeds."""
    out: dict[str, dict[str, Any]] = {}
    for scheme, by_seed in tables.items():
        cells: dict[str, Any] = {}
        for factor in FACTORS:
            key = str(factor)
            seeds = [t[key] for t in by_seed.values()]
            blocked = next((c for c in seeds if "cannot" in c), None)
            if blocked is not None:
                cells[key] = {"length": blocked["length"], "cannot": blocked["cannot"]}
                continue
            cell: dict[str, Any] = {"length": seeds[0]["length"]}
            for mode in ("nonoverlapping", "sliding"):
                values = [c[mode]["ppl"] for c in seeds if c.get(mode)]
                if len(values) == len(seeds):
                    mean, sd = mean_sd(values)
                    cell[mode] = {"ppl": mean, "ppl_sd": sd, "ppl_seeds": values}
            cells[key] = cell
        out[scheme] = cells
    return out


def plot(table: dict[str, dict[str, Any]], size: Size, path: Path, baselines: dict[str, float] | None = None) -> Path:
    """Log-log perplexity vs evaluation length, one line per scheme (non-overlapping and sliding).

    ``table`` is :func:`aggregate`'s: the line is the mean over seeds, the error bars the min..max.
    ``baselines``: the corpus's n-gram baselines (nats), drawn as the perplexities ``exp(nats)``.
    """
    from matplotlib.ticker import ScalarFormatter

    styles = scheme_style_index(list(table))
    fig, axes = new_figure(1, 2, size=(13.0, 5.0))
    for ax, mode, title in (
        (axes[0], "nonoverlapping", "non-overlapping chunks"),
        (axes[1], "sliding", "sliding window (stride length/2)"),
    ):
        for scheme in table:
            points = [
                (f * size.train_length, table[scheme][str(f)][mode])
                for f in FACTORS
                if mode in table[scheme].get(str(f), {})
            ]
            if not points:
                continue
            xs = [x for x, _ in points]
            ys = [c["ppl"] for _, c in points]
            seeds = [c.get("ppl_seeds") or [c["ppl"]] for _, c in points]
            yerr = [[y - min(v) for y, v in zip(ys, seeds)], [max(v) - y for y, v in zip(ys, seeds)]]
            n = len(seeds[0])
            style = series_style(styles[scheme])
            ax.errorbar(
                xs,
                ys,
                yerr=yerr,
                capsize=3,
                **style,
                label=f"{scheme} (n={n})" if len(xs) > 1 else f"{scheme} (only L, n={n})",
            )
        draw_perplexity_baselines(ax, baselines)
        ax.axvline(size.train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity (mean over seeds; bars: min..max)")
        ax.set_title(f"{title}; trained at L={size.train_length}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    return save_figure(fig, path)


def run(
    out: Path,
    quick: bool = False,
    size: str | None = None,
    schemes: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] = SEEDS,
    workers: int | None = None,
) -> dict:
    """Train (or reuse) one model per scheme and seed, evaluate at 1x..16x L, print the tables, plot, judge.

    Args:
        out: output folder (models in ``out/models/SIZE/NAME``, :func:`run_name`).
        quick: the demo's size; ``size`` names one of :data:`SIZES` instead.
        schemes: position schemes to train (``None``: :func:`schemes_of` the size).
        seeds: training seeds (at least 3 for conclusive verdicts).
        workers: trainings at a time (default: :func:`poslab.lab.runner.default_workers`).
    """
    lab = size_of(quick, size)
    schemes = schemes_of(lab) if schemes is None else tuple(schemes)
    out = Path(out)
    start = time.perf_counter()
    t0 = time.perf_counter()
    run_dirs = shared_models(tuple(schemes), lab, out, tuple(seeds), workers)
    train_s = time.perf_counter() - t0
    tables: dict[str, dict[str, dict]] = {}
    training: dict[str, Any] = {}
    for scheme in schemes:
        tables[scheme] = {}
        finals = []
        t1 = time.perf_counter()
        for seed, run_dir in run_dirs[scheme].items():
            results = RunFolder(run_dir).results() or {}
            finals.append(results.get("final_val_loss"))
            tables[scheme][str(seed)] = evaluate_scheme(run_dir, lab)
        training[scheme] = {
            "runs": {str(seed): str(d) for seed, d in run_dirs[scheme].items()},
            "final_val_loss": finals,
            "eval_seconds": time.perf_counter() - t1,
        }
    table = aggregate(tables)
    curves = {scheme: {str(seed): context_curve(d, lab) for seed, d in run_dirs[scheme].items()} for scheme in schemes}
    baseline = unigram_entropy(CORPUS)
    ngrams = ngram_baselines(CORPUS)
    shown = {
        "corpus": CORPUS,
        "unigram_entropy_nats": baseline,
        "seeds": list(seeds),
        "train_length": lab.train_length,
        "factors": list(FACTORS),
        "perplexity": table,
    }
    print_tables(EXPERIMENT.name, extrapolation_tables.TABLES, shown)
    print(
        f"  in-length loss = ln(ppl at 1x); {baseline_line(CORPUS).strip()} "
        f"(unigram perplexity {math.exp(baseline):.2f})"
    )
    claims = extrapolation_claims(tables, "nonoverlapping", baseline)
    sliding_claims = extrapolation_claims(tables, "sliding", baseline)
    for c, s in zip(claims, sliding_claims):
        c["details"]["sliding_window"] = {k: s.get(k) for k in ("measured", "margin", "noise", "verdict")}
    claims = attach(claims, lambda record: premise_of(record, tables, curves, ngrams["bigram"]))
    figure = plot(table, lab, out / "extrapolation.png", ngrams)
    return {
        "experiment": EXPERIMENT.name,
        "size": dataclasses.asdict(lab),
        **shown,
        "ngram_baselines": ngrams,
        "loss_by_position": curves,
        "seed": SEED,
        "lengths": [f * lab.train_length for f in FACTORS],
        "n_targets": lab.n_targets,
        "perplexity_by_seed": tables,
        "run_dirs": {
            scheme: {str(seed): str(d) for seed, d in by_seed.items()} for scheme, by_seed in run_dirs.items()
        },
        "training": training,
        "train_seconds": train_s,
        "claims": claims,
        "figure": str(figure),
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
    }


EXPERIMENT = Experiment(
    name="extrapolation",
    description="train one GPT per position scheme at L, perplexity at 1x..16x L (ALiBi paper; seeds 000, 002)",
    tier=LAB,
    run=run,
    reuses=("position-training",),
    estimate=(40, 3600),
    tables=extrapolation_tables.TABLES,
)
