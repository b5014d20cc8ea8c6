"""The same GPT trained with every position scheme: seed 001 exercise 3, generalised.

Seed 001 keeps GPT-2's learned position table and, as a challenge (exercise 3), asks to add RoPE
(Su et al. 2021, https://arxiv.org/abs/2104.09864), drop ``pos_emb`` and compare training. poslab
trains its GPT once per registered scheme and seed (NoPE, Haviv et al. 2022, among them) with the same data,
batches and schedule: seed i trains on the same batches for every scheme, so two schemes are compared paired by
seed on the seeds both trained. Seed 001 predicts that NoPE still learns (the causal mask leaks position) but
somewhat worse than explicit positions. The speed claim times the two arms alternating in one process
(:func:`poslab.lab.experiments.training.alternating_cpu_speed`), paired by round: "nearly the speed" is a TOST of
ln tokens/s in a family of its own (a timing, not a training claim).

The full form trains ``tang-small`` (seed 001's GPT on the Tang poems, n_embd 128, 1000 steps). The quick form
trains the lab's quick models on tinyshakespeare (:func:`poslab.lab.scale.train_config`) for the five arms of the
lessons' main claims, in the lab model store, where the other length experiments read them: fewer arms, each
trained long enough to use its context, test the claims; every scheme at bigram level would not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.display import plot_loss_by_position
from poslab.lab.experiments.common import (
    LAB,
    NGRAM_ORDERS,
    Baselines,
    baselines_field,
    corpus_baselines,
    plot_seeded_curves,
    scheme_style_index,
)
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, RunSummary, declare, seeded_arms, to_json
from poslab.lab.experiments.lab_models import lab_model_arms
from poslab.lab.experiments.training import SEEDS, TIMING_STEPS, alternating_cpu_speed, planned_seeds, runs_table
from poslab.lab.plan import own_family
from poslab.lab.premises import arms_of, attach, below_bigram, language_models, premises_table
from poslab.lab.scale import SIZES, lab_config, lesson_config, schemes_of
from poslab.lab.tables import KeyTable
from poslab.lab.verdicts import (
    VAL_LOSS,
    Arm,
    ClaimRecord,
    Metric,
    Premise,
    deterministic,
    equivalent,
    on_common_seeds,
    paired,
)
from poslab.nn import positions
from poslab.runs import RunFolder

#: "only a little worse": NoPE's validation loss within this fraction of the learned table's
NOPE_MAX_GAP = 0.05
#: "不增加计算" (no extra compute), "nearly the speed": ALiBi's tokens/s within this fraction of no position
#: encoding's, either way. The ALiBi paper counts an 11% training-speed difference as a reason to choose a
#: method (Press et al. 2022, abstract: "training 11% faster"), so a difference under 10% is "nearly the speed"
ALIBI_SPEED_WITHIN = 0.10
#: the family of the timing claim: a timing is not tested with the lesson's claims about training (poslab.lab.plan)
TIMING_FAMILY = "position-training timing"
SPEED_METRIC = Metric("training tokens per CPU second (arms alternating in one process)", log=True, digits=0)


def quick_variants(schemes: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Base and per-scheme overrides that reproduce the extrapolation experiment's quick models exactly."""
    base = lab_config("none", SIZES["quick"])
    variants = {name: {"model": lab_config(name, SIZES["quick"])["model"]} for name in schemes}
    return base, variants


def training_claims(
    losses: dict[str, list[float]],
    params: Mapping[str, int],
    speed: dict[str, list[float]] | None = None,
    seeds: Sequence[int] | Mapping[str, Sequence[int]] = SEEDS,
) -> list[dict[str, Any]]:
    """The lessons' claims about training with each scheme, as claim records (schemes absent: skipped).

    ``losses``: arm -> one value per seed of ``seeds`` (every arm's, or arm -> its own), paired on the seeds both
    arms trained. ``speed``: arm -> tokens per CPU second of each round of the arms alternating in one process,
    paired by round; without it the speed claim is not made (wall-clock speeds of trainings run at different
    moments on a shared machine say nothing about compute).
    """
    out = []
    by_arm = {arm: [int(x) for x in (seeds[arm] if isinstance(seeds, Mapping) else seeds)] for arm in losses}

    def have(*names: str) -> bool:
        return all(n in losses for n in names)

    def common(*names: str) -> tuple[list[int], list[list[float]]]:
        return on_common_seeds({n: dict(zip(by_arm[n], losses[n])) for n in names})

    if have("learned", "none"):
        both, (learned, none) = common("learned", "none")
        out.append(
            paired(
                "a causal model learns better with positions: the learned table beats none in-length",
                "seed 001 (NoPE learns, 'only a little worse')",
                Arm("learned", learned, both),
                Arm("none", none, both),
                VAL_LOSS,
            ).to_dict()
        )
        gap = NOPE_MAX_GAP * sum(learned) / len(learned)
        out.append(
            paired(
                "不加位置编码的因果语言模型也能学到位置信息，效果只比加了位置编码的差一点 — no position encoding is "
                f"at most a little worse (within {NOPE_MAX_GAP:.0%} of the learned table's loss)",
                "seed 001",
                Arm("none", none, both),
                Arm("learned", learned, both),
                VAL_LOSS,
                offset=-gap,
            ).to_dict()
        )
    if have("rope", "alibi"):
        both, (rope, alibi) = common("rope", "alibi")
        out.append(
            paired(
                "ALiBi 性能略低于 RoPE — ALiBi trains to a slightly worse loss than RoPE",
                "seed 000 §4",
                Arm("rope", rope, both),
                Arm("alibi", alibi, both),
                VAL_LOSS,
            ).to_dict()
        )
    if have("rope", "learned", "sinusoidal"):
        from poslab.lab.verdicts import best_of

        names = ("rope", "learned", "sinusoidal")
        both, values = common(*names)
        ranked = best_of(
            "RoPE 比「加位置向量」更好 — RoPE beats adding a learned or sinusoidal position vector",
            "seed 000 Q2",
            dict(zip(names, values)),
            ["rope"],
            VAL_LOSS,
            paired_seeds=True,
        ).to_dict()
        ranked["details"]["seeds"] = both
        out.append(ranked)
    for scheme, source, text in (
        ("alibi", "seed 000 §4", "ALiBi 极简：不需要任何参数 — ALiBi adds no parameters"),
        ("rope", "seed 002 §4.2", "无需显式存储位置编码 — RoPE adds no parameters"),
    ):
        if have(scheme, "none"):
            mine, none = params[scheme], params["none"]
            record = deterministic(
                text,
                source,
                "parameter count equals the no-position model's exactly (tolerance 0)",
                f"model parameters: {scheme} {mine:,}, no position encoding {none:,}",
                error=float(abs(mine - none)),
                tolerance=0.0,
            )
            out.append(record.to_dict())
    if have("alibi", "none") and speed is not None:
        record = equivalent(
            "ALiBi 不增加计算 — ALiBi trains at (nearly) the speed of no position encoding "
            f"(tokens/s within {ALIBI_SPEED_WITHIN:.0%} of it, either way)",
            "seed 000 §4",
            Arm("alibi", speed["alibi"]),
            Arm("none", speed["none"]),
            SPEED_METRIC,
            within=math.log(1 + ALIBI_SPEED_WITHIN),
        )
        record.details["paired_by"] = "timing round (the arms alternate, round by round, in one process)"
        out.append(own_family(record, TIMING_FAMILY).to_dict())
    return out


#: the experiment's name (its folder, its Holm family and its row of :data:`poslab.lab.plan.QUICK_SEEDS`)
EXPERIMENT_NAME = "position-training"


@dataclass(frozen=True)
class Setting:
    """The schemes, the base config's corpus and steps, and the two arms' configs the timing alternates."""

    schemes: tuple[str, ...]
    corpus: str
    val_fraction: float
    steps: int
    quick: bool
    seeds: tuple[int, ...]
    timing: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class PositionResult:
    """Every scheme's seeds (arm = scheme): run summaries, whole-split losses, and the timing of alibi vs none."""

    steps: int
    quick: bool
    baselines: Baselines = baselines_field()
    cpu_speed: dict[str, list[float]] | None
    seeds: list[int]
    runs: dict[str, list[RunSummary]]
    val_loss_seeds: dict[str, list[float]]
    ranking: list[str]
    arm_seeds: dict[str, list[int]]


def plan(
    out: Path,
    quick: bool,
    schemes: list[str] | None = None,
    base: dict[str, Any] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> Plan[Setting]:
    """One GPT per scheme and seed: runs ``out/runs/SCHEME-sSEED``; in the quick form without ``base``, the lab
    models of the quick size (:func:`~poslab.lab.experiments.lab_models.lab_model_arms`: in the store).
    ``schemes`` default to every registered one (quick: the quick size's arms); ``base`` replaces the base config
    (tests use a tiny one); ``seeds`` default to the plan's (:func:`~poslab.lab.experiments.training.planned_seeds`).
    """
    if schemes is None:
        schemes = list(schemes_of(SIZES["quick"])) if quick and base is None else positions.names()
    schemes = list(schemes)
    base_given = base
    if base is None and quick:
        base, variants = quick_variants(schemes)
    else:
        base = base if base is not None else lesson_config()
        variants = {name: {"model": {"position": name, "position_config": {}}} for name in schemes}
    lab_models = quick and base_given is None
    by_scheme = planned_seeds(EXPERIMENT_NAME, schemes, lab_models, seeds)
    arms: Mapping[str, Mapping[int, Any]]
    if lab_models:
        arms = lab_model_arms(tuple(by_scheme), SIZES["quick"], {s: tuple(v) for s, v in by_scheme.items()})
    else:
        arms = seeded_arms(out, base, variants, by_scheme)
    timed = [k for k in ("alibi", "none") if k in variants]
    timing = {k: {**base, "model": {**base.get("model", {}), **variants[k]["model"]}} for k in timed}
    setting = Setting(
        tuple(schemes),
        base.get("corpus", "tang5"),
        base.get("val_fraction", 0.1),
        base["max_steps"],
        quick,
        tuple(sorted({x for chosen in by_scheme.values() for x in chosen})),
        timing,
    )
    return Plan(setting, arms)


def measure(runs: Runs[Setting]) -> PositionResult:
    """The schemes' whole-split losses per seed, ranked, and alibi's and none's training speed side by side."""
    s = runs.setting
    summaries = {name: runs.summaries(name) for name in s.schemes}
    losses = {name: [r.val_loss_all for r in summaries[name]] for name in s.schemes}
    speed = None
    if "alibi" in s.schemes and "none" in s.schemes:
        vocab = RunFolder(summaries["none"][0].run_dir).config()["model"]["vocab_size"]
        speed = alternating_cpu_speed({k: s.timing[k] for k in ("alibi", "none")}, vocab)
    return PositionResult(
        steps=s.steps,
        quick=s.quick,
        baselines=corpus_baselines(s.corpus, s.val_fraction),
        cpu_speed=speed,
        seeds=list(s.seeds),
        runs=summaries,
        val_loss_seeds=losses,
        ranking=sorted(s.schemes, key=lambda name: sum(losses[name]) / len(losses[name])),
        arm_seeds={name: [r.seed for r in summaries[name]] for name in s.schemes},
    )


def claims(r: PositionResult) -> list[dict[str, Any]]:
    """:func:`training_claims`, each with its premise: the timing's says how it was measured; the others need every
    seed of the arms they read below the bigram baseline."""
    speed, bigram = r.cpu_speed, r.baselines.bigram

    def premise(record: ClaimRecord) -> Premise:
        if record.details.get("metric") == SPEED_METRIC.name and speed is not None:
            return Premise(
                "timing: process CPU time of the arms alternating in one process",
                f"{len(speed['alibi'])} rounds of {TIMING_STEPS} steps of each arm",
                True,
            )
        return below_bigram({a: r.val_loss_seeds[a] for a in arms_of(record, list(r.runs))}, bigram)

    params = {name: summaries[0].n_params for name, summaries in r.runs.items()}
    return attach(training_claims(r.val_loss_seeds, params, speed, r.arm_seeds), premise)


def figures(r: PositionResult, out: Path) -> dict[str, Path]:
    """The validation curves per scheme (mean and band over seeds) and, for causal models, the loss at each
    position of the window against the n-gram baselines."""
    styles = scheme_style_index(list(r.runs))
    runs = {name: [x.val_curve for x in summaries] for name, summaries in r.runs.items()}
    title = f"position schemes, same GPT ({r.steps} steps, {r.baselines.corpus})"
    drawn = {
        "plot": plot_seeded_curves(
            runs,
            out / "position_training_curves.png",
            title,
            r.baselines,
            styles,
        )
    }
    curves = {name: [x.loss_by_position for x in seeds if x.loss_by_position] for name, seeds in r.runs.items()}
    if all(curves.values()):
        window = len(next(iter(curves.values()))[0])
        drawn["plot_by_position"] = plot_loss_by_position(
            curves,
            out / "loss_by_position.png",
            style_index=styles,
            baselines={f"{k} count model": v for k, v in r.baselines.ngram_baselines.items() if k in NGRAM_ORDERS},
            title=f"loss at each position of the {window}-token window, validation split ({r.baselines.corpus}); "
            "a model that uses its context falls below the bigram line",
        )
    return drawn


EXPERIMENT = declare(
    name=EXPERIMENT_NAME,
    description=(
        "train the same GPT with every registered position scheme, 3 seeds (full: Tang poems, n_embd 128; "
        "--quick: tinyshakespeare, n_embd 64); curves and val loss (seed 001 ex. 3)"
    ),
    tier=LAB,
    declaration=Declaration(
        PositionResult,
        plan,
        measure,
        claims,
        (
            KeyTable("validation loss per scheme", lambda r: runs_table(to_json(r), "key.scheme")),
            KeyTable("premises", lambda r: premises_table(language_models(to_json(r)))),
        ),
        figures,
    ),
    estimate=(1250, 7200),
)
run = EXPERIMENT.run
