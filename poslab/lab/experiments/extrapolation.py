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

Every scheme trains with the same data (tinyshakespeare), steps, batch and seed (the lab models,
:mod:`poslab.lab.experiments.lab_models`); :func:`poslab.analysis.eval.evaluate_length` scores the same validation
targets at every length, in non-overlapping chunks (the ALiBi paper's protocol, with its "early-token curse") and
with a sliding window of stride ``length/2``. The claims (:mod:`poslab.lab.experiments.extrapolation_verdicts`)
test a ratio ``ppl(fL) / ppl(L)`` per seed on the ln scale, two schemes paired by seed, and RoPE's "10 to 100+"
against the corpus's unigram perplexity.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import evaluate_length, loss_by_position
from poslab.display import new_figure, save_figure, series_style
from poslab.lab.experiments.cells import MODES, NONOVERLAPPING, SLIDING, Evaluation, MeanEvaluation
from poslab.lab.experiments.common import (
    LAB,
    Baselines,
    baselines_field,
    corpus_baselines,
    draw_perplexity_baselines,
    scheme_style_index,
)
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.extrapolation_verdicts import (  # noqa: F401  (re-exported: the claims of this experiment)
    JUMP_QUOTE,
    UNDERTRAINED,
    Tables,
    extrapolation_claims,
    jump_claim,
    seed_perplexities,
    undertrained_seeded,
)
from poslab.lab.experiments.lab_models import lab_model_arms
from poslab.lab.experiments.training import CONTEXT_WINDOWS, baseline_note, planned_seeds
from poslab.lab.premises import all_of, arms_of, attach, beats_nope, below_bigram, uses_context
from poslab.lab.report.i18n import t
from poslab.lab.scale import CORPUS, SEED, SEEDS, Scale, schemes_of, size_of  # noqa: F401  (SEED, SEEDS: the lab's seeds)
from poslab.lab.scale import EXTRAPOLATION_FACTORS as FACTORS
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import ClaimRecord, Premise
from poslab.runs import RunFileError, RunFolder, load_run

#: factor -> one seed's evaluation cell there (:func:`evaluate_scheme`); over seeds by :func:`aggregate`
Cells = dict[str, Evaluation]


@dataclass(frozen=True)
class Setting:
    """The scale, its schemes and each scheme's seeds, and when the experiment started."""

    lab: Scale
    schemes: tuple[str, ...]
    seeds_by_scheme: dict[str, tuple[int, ...]]
    started: float


@dataclass(frozen=True)
class ExtrapolationResult:
    """Every scheme read at every length factor, per seed (``perplexity_by_seed``: scheme -> seed -> factor) and
    over seeds (``perplexity``: :func:`aggregate`'s), with the corpus's baselines."""

    size: Scale
    baselines: Baselines = baselines_field()
    seeds: list[int]
    seeds_by_scheme: dict[str, list[int]]
    train_length: int
    factors: list[int]
    lengths: list[int]
    n_targets: int
    perplexity: dict[str, dict[str, MeanEvaluation]]
    perplexity_by_seed: Tables
    loss_by_position: dict[str, dict[str, list[float]]]
    run_dirs: dict[str, dict[str, str]]
    final_val_loss: dict[str, list[float | None]]
    seconds: float
    threads: int


def evaluate_scheme(run_dir: Path, size: Scale) -> Cells:
    """Every factor's cell (non-overlapping + sliding window with stride ``length/2``) of one trained model."""
    model, tokenizer, config = load_run(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    cells = {}
    for factor in FACTORS:
        length = factor * size.train_length
        cells[str(factor)] = Evaluation.of(
            evaluate_length(model, tokens, length, size.n_targets, stride=max(1, length // 2))
        )
    return cells


def context_curve(run_dir: Path, size: Scale) -> list[float]:
    """Mean validation loss at each position of a window of ``L`` (:func:`poslab.analysis.eval.loss_by_position`)."""
    model, tokenizer, _ = load_run(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    return [float(v) for v in loss_by_position(model, tokens, size.train_length, CONTEXT_WINDOWS)]


def premise_of(
    record: ClaimRecord, tables: Tables, curves: dict[str, dict[str, list[float]]], bigram: float
) -> Premise:
    """A claim about reading past ``L``: every scheme it names is a language model (every seed's in-length
    loss clearly below the bigram baseline) that uses its context within ``L``; a comparison of two or
    more position schemes also needs each of them to beat NoPE in length by more than the noise (their
    positions matter to the model). :mod:`poslab.lab.premises` has the rules."""
    arms = arms_of(record, list(tables))
    losses = {s: [math.log(v) for v in seed_perplexities(tables, s, 1, NONOVERLAPPING) or []] for s in arms}
    found = [below_bigram(losses, bigram), uses_context({s: list(curves[s].values()) for s in arms})]
    positional = [s for s in arms if s != "none"]
    if len(positional) >= 2 and "none" in tables:
        nope = [math.log(v) for v in seed_perplexities(tables, "none", 1, NONOVERLAPPING) or []]
        found += [beats_nope(s, losses[s], nope, metric="in-length loss") for s in positional]
    return all_of(*found)


def aggregate(tables: Tables) -> dict[str, dict[str, MeanEvaluation]]:
    """scheme -> factor -> the seeds' cells as one (:meth:`~poslab.lab.experiments.cells.MeanEvaluation.of`)."""
    return {
        scheme: {str(f): MeanEvaluation.of([t[str(f)] for t in by_seed.values()]) for f in FACTORS}
        for scheme, by_seed in tables.items()
    }


def plot(
    table: dict[str, dict[str, MeanEvaluation]], size: Scale, path: Path, baselines: dict[str, float] | None = None
) -> Path:
    """Log-log perplexity vs evaluation length, one line per scheme (non-overlapping and sliding): the mean over
    seeds, bars min..max; ``baselines`` (the corpus's n-gram baselines, nats) drawn as perplexities."""
    from matplotlib.ticker import ScalarFormatter

    styles = scheme_style_index(list(table))
    fig, axes = new_figure(1, 2, size=(13.0, 5.0))
    for ax, mode, title in (
        (axes[0], "nonoverlapping", "non-overlapping chunks"),
        (axes[1], "sliding", "sliding window (stride length/2)"),
    ):
        for scheme in table:
            cells = [(f * size.train_length, table[scheme][str(f)]) for f in FACTORS]
            points = [(x, score) for x, c in cells if c is not None and (score := c.score(mode)) is not None]
            if not points:
                continue
            xs = [x for x, _ in points]
            ys = [c.ppl for _, c in points]
            seeds = [c.ppl_seeds for _, c in points]
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


def plan(
    out: Path,
    quick: bool,
    size: str | Scale | None = None,
    schemes: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> Plan[Setting]:
    """The lab model of every scheme and seed (:func:`~poslab.lab.experiments.lab_models.lab_model_arms`: in the
    store, ``MODELS/SIZE/NAME``). ``size`` (a :class:`~poslab.lab.scale.Scale` or a name) overrides ``quick``;
    ``schemes`` default to the size's (:func:`~poslab.lab.scale.schemes_of`), ``seeds`` to the plan's
    (:func:`~poslab.lab.experiments.training.planned_seeds`)."""
    lab = size_of(quick, size)
    schemes = schemes_of(lab) if schemes is None else tuple(schemes)
    by_scheme = planned_seeds(EXPERIMENT.name, schemes, lab.name == "quick", seeds)
    schemes = tuple(s for s in schemes if s in by_scheme)
    setting = Setting(lab, schemes, {s: tuple(by_scheme[s]) for s in schemes}, time.perf_counter())
    return Plan(setting, lab_model_arms(schemes, lab, by_scheme), summarise=False, what="lab models")


def _final_val_loss(run_dir: Path) -> float:
    """A finished run's final validation loss (``RunFileError`` naming the folder when it has no results)."""
    results = RunFolder(run_dir).results()
    if results is None:
        raise RunFileError(f"{str(run_dir)!r} has no results.json: the run did not finish")
    return results["final_val_loss"]


def measure(runs: Runs[Setting]) -> ExtrapolationResult:
    """Every model read at every factor (non-overlapping and sliding) and position, aggregated over seeds."""
    s, lab = runs.setting, runs.setting.lab
    by_seed = {
        scheme: {str(seed): evaluate_scheme(r.path, lab) for seed, r in runs.by_arm[scheme].items()}
        for scheme in s.schemes
    }
    return ExtrapolationResult(
        size=lab,
        baselines=corpus_baselines(CORPUS),
        seeds=sorted({seed for chosen in s.seeds_by_scheme.values() for seed in chosen}),
        seeds_by_scheme={scheme: list(chosen) for scheme, chosen in s.seeds_by_scheme.items()},
        train_length=lab.train_length,
        factors=list(FACTORS),
        lengths=[f * lab.train_length for f in FACTORS],
        n_targets=lab.n_targets,
        perplexity=aggregate(by_seed),
        perplexity_by_seed=by_seed,
        loss_by_position={
            scheme: {str(seed): context_curve(r.path, lab) for seed, r in runs.by_arm[scheme].items()}
            for scheme in s.schemes
        },
        run_dirs={scheme: {str(seed): str(r.path) for seed, r in runs.by_arm[scheme].items()} for scheme in s.schemes},
        final_val_loss={
            scheme: [_final_val_loss(r.path) for r in runs.by_arm[scheme].values()] for scheme in s.schemes
        },
        seconds=time.perf_counter() - s.started,
        threads=torch.get_num_threads(),
    )


def claims(r: ExtrapolationResult) -> list[dict[str, Any]]:
    """:func:`~poslab.lab.experiments.extrapolation_verdicts.extrapolation_claims` on the non-overlapping reading,
    each with the sliding window's verdict in its details and its premise (:func:`premise_of`)."""
    tables, baseline = r.perplexity_by_seed, r.baselines.unigram_entropy_nats
    records = extrapolation_claims(tables, NONOVERLAPPING, baseline)
    for c, s in zip(records, extrapolation_claims(tables, SLIDING, baseline)):
        c["details"]["sliding_window"] = {k: s.get(k) for k in ("measured", "margin", "noise", "verdict")}
    bigram = r.baselines.bigram
    return attach(records, lambda record: premise_of(record, tables, r.loss_by_position, bigram))


def perplexity_table(r: ExtrapolationResult, mode: str) -> Table:
    """Scheme × evaluation length, mean ± sd of the perplexity over seeds (``cannot`` where a scheme cannot run)."""
    counts = {len(v) for v in r.seeds_by_scheme.values()}

    def label(scheme: str) -> str:  # the seed count where the schemes trained different numbers of seeds
        return f"{scheme} (n={len(r.seeds_by_scheme[scheme])})" if len(counts) > 1 else scheme

    baseline = baseline_note(r.baselines.corpus, r.baselines.unigram_entropy_nats)
    length = r.train_length
    return Table(
        t("key.extrapolation", label=t(f"key.{mode}"), length=length, seeds=r.seeds, baseline=baseline),
        (t("key.scheme"), *(f"{f}×L = {f * length}" for f in r.factors)),
        tuple(
            (label(scheme), *(c.spread(mode) if (c := cells.get(str(f))) else None for f in r.factors))
            for scheme, cells in r.perplexity.items()
        ),
    )


def figures(r: ExtrapolationResult, out: Path) -> dict[str, Path]:
    """Perplexity against evaluation length (:func:`plot`)."""
    return {"figure": plot(r.perplexity, r.size, out / "extrapolation.png", r.baselines.ngram_baselines)}


TABLES = tuple(KeyTable(f"perplexity ({mode})", lambda r, mode=mode: perplexity_table(r, mode)) for mode in MODES)

EXPERIMENT = declare(
    name="extrapolation",
    description="train one GPT per position scheme at L, perplexity at 1x..16x L (ALiBi paper; seeds 000, 002)",
    tier=LAB,
    declaration=Declaration(ExtrapolationResult, plan, measure, claims, TABLES, figures),
    after=("position-training",),
    estimate=(40, 3600),
)
run = EXPERIMENT.run
