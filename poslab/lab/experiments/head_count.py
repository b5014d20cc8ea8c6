"""How many heads? Seed 001 exercise 2, and seed 002's "optimal heads ≈ sqrt(d_model/16)".

Seed 001 (exercise 2) asks to train its GPT with 1 and 8 heads instead of 4 (n_embd kept at 128) for 1000 steps
and compare the validation loss; poslab adds 2 and 16 heads. Only the head split differs (same seed, data,
batches, schedule and parameter count, seed 000 §1.2). Seed 002 (§3.2) states, from "ImageNet classification
experiments", that the optimal number of heads is about ``sqrt(d_model / 16)``; the claim is decided pairwise on
the per-seed differences (:func:`poslab.lab.verdicts.best_of`, ``paired_seeds``). Michel et al. 2019 ("Are
Sixteen Heads Really Better than One?", https://arxiv.org/abs/1905.10650) is the background: head count matters
less than one might think.

The quick form trains on tinyshakespeare (:data:`HEADS_QUICK`: at n_embd 64 the rule predicts 2 heads): on the
Tang poems' 7,721-character vocabulary a few hundred steps stay near the character-frequency baseline and the
head counts cannot be told apart. The full form is the lesson's own setting (Tang poems, n_embd 128).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.lab.experiments.common import (
    LAB,
    Baselines,
    baselines_field,
    corpus_baselines,
    plot_seeded_curves,
)
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, RunSummary, declare, seeded_arms
from poslab.lab.experiments.training import planned_seeds
from poslab.lab.premises import attach, below_bigram
from poslab.lab.report.i18n import t
from poslab.lab.scale import SIZES, Scale, lab_config, lesson_config
from poslab.lab.tables import KeyTable, MeanSd, Table
from poslab.lab.verdicts import VAL_LOSS, Arm, best_of, paired

HEADS = (1, 2, 4, 8, 16)
#: the count-model baseline every seed of every head count must be clearly below (:func:`claims`). Both claims
#: are about the loss a head split reaches, not about what the heads learn (seed 000 §1.4 "减小 d_k 往往提升效果",
#: seed 002 §3.2 "最优头数 ≈ √(d_model/16)", and seed 001's exercise 2 "各訓練 1000 步，比較驗證損失" set no bar on
#: the models): they need language models that use their context through attention, below the bigram. The
#: trigram bar belongs to claims about what heads learn
#: (:func:`poslab.lab.experiments.tang_heads.analysed_model_premise`).
PREMISE_BASELINE = "bigram"

#: the quick form's models: the lab's quick geometry at 2 layers and 600 cosine steps at lr 3e-3, enough for
#: language models below the bigram baseline (the claims' premise)
HEADS_QUICK = dataclasses.replace(
    SIZES["quick-cosine"], name="quick-heads", n_layer=2, steps=600, warmup_steps=60, schemes=None
)


def base_config(quick: bool, position: str = "learned", size: Scale | None = None) -> dict[str, Any]:
    """Full: the lessons' ``tang-small`` training (:func:`poslab.lab.scale.lesson_config`); quick: a lab model of
    ``size`` (default ``quick``) with ``position`` (:func:`poslab.lab.scale.lab_config`)."""
    return lab_config(position, size or SIZES["quick"]) if quick else lesson_config()


def nearest_counts(heads: list[int] | tuple[int, ...], d_model: int) -> list[int]:
    """The tested head counts nearest ``sqrt(d_model / 16)`` on a log scale (within half an octave of the nearest)."""
    predicted = math.sqrt(d_model / 16)
    distance = {h: abs(math.log2(h) - math.log2(predicted)) for h in heads}
    return sorted(h for h in heads if distance[h] - min(distance.values()) < 0.5)


def head_claims(
    losses: dict[int, list[float]], d_model: int, seeds: tuple[int, ...] | None = None
) -> list[dict[str, Any]]:
    """Seed 002's √(d/16) rule and seed 000's "smaller d_k does better", as claim records over seeds
    (``losses``: head count -> per-seed validation losses, every count from the same ``seeds``: paired)."""
    predicted = math.sqrt(d_model / 16)
    nearest = nearest_counts(list(losses), d_model)
    arms = {f"{h} heads": v for h, v in losses.items()}
    out = [
        best_of(
            f"最优头数 ≈ √(d_model/16): the best head count is the one nearest √({d_model}/16) = {predicted:.2f}",
            "seed 002 §3.2",
            arms,
            [f"{h} heads" for h in nearest],
            VAL_LOSS,
            paired_seeds=True,
        ).to_dict()
    ]
    one, most = min(losses), max(losses)
    if most != one:
        out.append(
            paired(
                "减小 d_k 往往提升效果 — smaller heads (more of them) do better than one big head",
                "seed 000 §1.4",
                Arm(f"{most} heads (d_k {d_model // most})", losses[most], seeds),
                Arm(f"{one} head (d_k {d_model // one})", losses[one], seeds),
                VAL_LOSS,
            ).to_dict()
        )
    return out


@dataclass(frozen=True)
class Setting:
    """What the measurement reads besides the runs: the head counts, the base config's corpus, width and steps."""

    heads: tuple[int, ...]
    corpus: str
    val_fraction: float
    d_model: int
    steps: int
    quick: bool
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class HeadsResult:
    """Every head count's seeds: their run summaries (arm ``heads-N``) and whole-split validation losses."""

    steps: int
    quick: bool
    baselines: Baselines = baselines_field()
    d_model: int
    seeds: list[int]
    runs: dict[str, list[RunSummary]]
    val_loss_seeds: dict[str, list[float]]
    nearest_sqrt_d_over_16: list[int]


def plan(
    out: Path,
    quick: bool,
    heads: tuple[int, ...] = HEADS,
    base: dict[str, Any] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> Plan[Setting]:
    """Every head count (each must divide the width) with every seed, runs ``out/runs/heads-N-sSEED``; ``base``
    replaces the base config (tests use a tiny one), ``seeds`` default to the plan's
    (:func:`~poslab.lab.experiments.training.planned_seeds`)."""
    if seeds is None:
        seeds = planned_seeds(EXPERIMENT.name, ("*",), quick)["*"]
    base = base if base is not None else base_config(quick, size=HEADS_QUICK)
    variants = {f"heads-{h}": {"model": {"n_head": h}} for h in heads}
    setting = Setting(
        tuple(heads),
        base.get("corpus", "tang5"),
        base.get("val_fraction", 0.1),
        base["model"]["n_embd"],
        base["max_steps"],
        quick,
        tuple(seeds),
    )
    return Plan(setting, seeded_arms(out, base, variants, {arm: tuple(seeds) for arm in variants}))


def measure(runs: Runs[Setting]) -> HeadsResult:
    """The head counts' whole-split losses per seed, with the corpus's baselines."""
    s = runs.setting
    summaries = {f"heads-{h}": runs.summaries(f"heads-{h}") for h in s.heads}
    return HeadsResult(
        steps=s.steps,
        quick=s.quick,
        baselines=corpus_baselines(s.corpus, s.val_fraction),
        d_model=s.d_model,
        seeds=list(s.seeds),
        runs=summaries,
        val_loss_seeds={str(h): [r.val_loss_all for r in summaries[f"heads-{h}"]] for h in s.heads},
        nearest_sqrt_d_over_16=nearest_counts(list(s.heads), s.d_model),
    )


def claims(result: HeadsResult) -> list[dict[str, Any]]:
    """:func:`head_claims`, each with its premise: every claim ranks or compares head counts, so every seed of
    every count must be a language model (clearly below the :data:`PREMISE_BASELINE`)."""
    losses = {int(h): v for h, v in result.val_loss_seeds.items()}
    premise = below_bigram(
        {f"heads-{h}": v for h, v in result.val_loss_seeds.items()}, result.baselines.ngram_baselines[PREMISE_BASELINE]
    )
    return attach(head_claims(losses, result.d_model, tuple(result.seeds)), lambda record: premise)


def heads_table(r: HeadsResult) -> Table:
    """Every head count: d_k, parameters, whole-split and sampled validation loss and speed over seeds."""
    rows = []
    for h, losses in r.val_loss_seeds.items():
        summaries = r.runs[f"heads-{h}"]
        rows.append(
            (
                int(h),
                r.d_model // int(h),
                summaries[0].n_params,
                MeanSd.of(losses, 4),
                MeanSd.of([x.final_val_loss for x in summaries], 4),
                MeanSd.of([x.tokens_per_s for x in summaries], 0),
            )
        )
    return Table(
        f"seed 001 exercise 2: heads at n_embd {r.d_model}, {r.steps} steps on {r.baselines.corpus!r}; seeds {r.seeds}",
        ("heads", "d_k", t("key.train.params"), t("key.train.val"), "final val loss (sampled)", "tokens/s"),
        tuple(rows),
        note="count-model baselines (interpolated Kneser-Ney), nats/token: "
        + ", ".join(f"{k} {v:.3f}" for k, v in r.baselines.ngram_baselines.items()),
    )


def figures(r: HeadsResult, out: Path) -> dict[str, Path]:
    """The validation curves of every head count (mean and band over seeds)."""
    curves = {f"{h} heads": [x.val_curve for x in r.runs[f"heads-{h}"]] for h in r.val_loss_seeds}
    title = f"heads at n_embd {r.d_model} ({r.steps} steps, {r.baselines.corpus})"
    path = plot_seeded_curves(curves, out / "heads_curves.png", title, r.baselines)
    return {"plot": path}


EXPERIMENT = declare(
    name="heads",
    description=(
        "train 1/2/4/8/16 heads (full: n_embd 128 on Tang poems; --quick: n_embd 64 on tinyshakespeare); "
        "test 'optimal heads ≈ sqrt(d/16)' (seeds 001, 002)"
    ),
    tier=LAB,
    declaration=Declaration(
        HeadsResult, plan, measure, claims, (KeyTable("validation loss per head count", heads_table),), figures
    ),
    estimate=(180, 3750),
)
run = EXPERIMENT.run
