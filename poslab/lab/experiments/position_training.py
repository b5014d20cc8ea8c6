"""The same GPT trained with every position scheme: seed 001 exercise 3, generalised.

Seed 001 keeps GPT-2's learned position table and, as a challenge (exercise 3), asks to add RoPE
(Su et al. 2021, https://arxiv.org/abs/2104.09864), drop ``pos_emb`` and compare training. poslab
trains its GPT once per registered scheme and seed — ``none`` (NoPE, Haviv et al. 2022), ``learned``,
``sinusoidal``, ``rope``, ``xpos``, ``alibi``, ``t5``, ``kerple``, ``fire``, ``xl`` and any scheme
registered later — with the same data, batches and schedule, and reports the validation loss (mean
± sd over 3 seeds, on the whole validation split), the curves (mean and band over seeds) and the
training speed. Every scheme is trained with the same 3 seeds (seed i: the same batches for every
scheme), so two schemes are compared on their per-seed differences (:func:`poslab.lab.verdicts.paired`),
with the seeds recorded. The speed claim times the two arms alternating in one process
(:func:`poslab.lab.experiments.training.alternating_cpu_speed`): round ``r`` of each arm runs back to back,
so the rounds pair the arms, and "nearly the speed" is an equivalence (TOST) of ln tokens/s per round, in a
family of its own (a timing, out of the lesson's family of training claims).
Seed 001 predicts that NoPE still learns (the causal mask leaks position) but somewhat worse than
explicit positions; the claims are decided by :mod:`poslab.lab.verdicts`.

The full form trains ``tang-small`` (seed 001's GPT on the Tang poems, n_embd 128, 1000 steps) with
every registered scheme. The quick form trains on tinyshakespeare, not on the Tang poems: exactly the
lab's quick extrapolation models (4 layers, n_embd 64, window 64, 3000 steps;
:func:`poslab.lab.scale.train_config`) for the five arms of the lessons' main
claims (NoPE, the learned and sinusoidal tables, RoPE, ALiBi: the quick size's ``schemes``), so the
extrapolation, context-extension and attention-entropy experiments of the same lab reuse these runs
instead of training them again. Fewer arms, each trained long enough to use its context, test the
claims; every scheme at bigram level would not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from poslab.display import plot_loss_by_position, print_table
from poslab.lab.experiments.common import (
    LAB,
    NGRAM_ORDERS,
    Experiment,
    baseline_line,
    ngram_baselines,
    plot_seeded_curves,
    scheme_style_index,
    unigram_entropy,
)
from poslab.lab.experiments.training import (
    SCHEME_TABLES,
    SEEDS,
    TIMING_STEPS,
    alternating_cpu_speed,
    lm_premise,
    seed_values,
    train_seeded,
)
from poslab.lab.plan import own_family
from poslab.lab.premises import arms_of, attach, context_gain, language_models, premises_table
from poslab.lab.scale import SIZES, lab_config, lesson_config, schemes_of
from poslab.lab.tables import KeyTable
from poslab.lab.verdicts import ClaimRecord, Premise, deterministic, equivalent, paired, pm
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
METRIC = "val loss (whole validation split)"
SPEED_METRIC = "training tokens per CPU second (arms alternating in one process)"


def _gain_text(seed_runs: list[dict]) -> str:
    """The seeds' context gains (:func:`poslab.lab.premises.context_gain`) as ``mean ± sd``, or ``-`` where none
    is measured (a masked LM, or a window too short for it)."""
    curves = [r["loss_by_position"] for r in seed_runs if r.get("loss_by_position")]
    try:
        return pm([context_gain(c) for c in curves], 3) if curves else "-"
    except ValueError:
        return "-"


def quick_variants(schemes: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Base and per-scheme overrides that reproduce the extrapolation experiment's quick models exactly."""
    base = lab_config("none", SIZES["quick"])
    variants = {name: {"model": lab_config(name, SIZES["quick"])["model"]} for name in schemes}
    return base, variants


def training_claims(
    losses: dict[str, list[float]],
    runs: dict[str, list[dict]],
    speed: dict[str, list[float]] | None = None,
    seeds: tuple[int, ...] | list[int] = SEEDS,
) -> list[dict[str, Any]]:
    """The lessons' claims about training with each scheme, as claim records (schemes absent: skipped).

    ``losses``: arm -> one value per seed, in the order of ``seeds``: every arm is trained from the same
    seeds on the same batches (:func:`poslab.lab.experiments.training.train_seeded`), so two arms are
    compared paired by seed. ``speed``: arm -> training tokens per CPU second of each round of the arms
    alternating in one process (:func:`poslab.lab.experiments.training.alternating_cpu_speed`), paired by
    round; without it the speed claim is not made (wall-clock speeds of trainings run at different moments
    on a shared machine say nothing about compute).
    """
    out = []
    seeds = [int(s) for s in seeds]

    def have(*names: str) -> bool:
        return all(n in losses for n in names)

    if have("learned", "none"):
        out.append(
            paired(
                "a causal model learns better with positions: the learned table beats none in-length",
                "seed 001 (NoPE learns, 'only a little worse')",
                losses["learned"],
                losses["none"],
                better_label="learned",
                worse_label="none",
                metric=METRIC,
                seeds=seeds,
            ).to_dict()
        )
        gap = NOPE_MAX_GAP * sum(losses["learned"]) / len(losses["learned"])
        out.append(
            paired(
                "不加位置编码的因果语言模型也能学到位置信息，效果只比加了位置编码的差一点 — no position encoding is "
                f"at most a little worse (within {NOPE_MAX_GAP:.0%} of the learned table's loss)",
                "seed 001",
                losses["none"],
                losses["learned"],
                better_label="none",
                worse_label="learned",
                metric=METRIC,
                offset=-gap,
                seeds=seeds,
            ).to_dict()
        )
    if have("rope", "alibi"):
        out.append(
            paired(
                "ALiBi 性能略低于 RoPE — ALiBi trains to a slightly worse loss than RoPE",
                "seed 000 §4",
                losses["rope"],
                losses["alibi"],
                better_label="rope",
                worse_label="alibi",
                metric=METRIC,
                seeds=seeds,
            ).to_dict()
        )
    if have("rope", "learned", "sinusoidal"):
        from poslab.lab.verdicts import best_of

        ranked = best_of(
            "RoPE 比「加位置向量」更好 — RoPE beats adding a learned or sinusoidal position vector",
            "seed 000 Q2",
            {k: losses[k] for k in ("rope", "learned", "sinusoidal")},
            ["rope"],
            metric=METRIC,
            paired_seeds=True,
        ).to_dict()
        ranked["details"]["seeds"] = seeds
        out.append(ranked)
    for scheme, source, text in (
        ("alibi", "seed 000 §4", "ALiBi 极简：不需要任何参数 — ALiBi adds no parameters"),
        ("rope", "seed 002 §4.2", "无需显式存储位置编码 — RoPE adds no parameters"),
    ):
        if have(scheme, "none"):
            mine, none = runs[scheme][0]["n_params"], runs["none"][0]["n_params"]
            out.append(
                deterministic(
                    text,
                    source,
                    "parameter count equals the no-position model's exactly (tolerance 0)",
                    f"model parameters: {scheme} {mine:,}, no position encoding {none:,}",
                    error=float(abs(mine - none)),
                    tolerance=0.0,
                )
            )
            out[-1] = out[-1].to_dict()
    if have("alibi", "none") and speed is not None:
        record = equivalent(
            "ALiBi 不增加计算 — ALiBi trains at (nearly) the speed of no position encoding "
            f"(tokens/s within {ALIBI_SPEED_WITHIN:.0%} of it, either way)",
            "seed 000 §4",
            speed["alibi"],
            speed["none"],
            labels=("alibi", "none"),
            metric=SPEED_METRIC,
            within=math.log(1 + ALIBI_SPEED_WITHIN),
            digits=0,
            log=True,
        )
        record.details["paired_by"] = "timing round (the arms alternate, round by round, in one process)"
        out.append(own_family(record, TIMING_FAMILY).to_dict())
    return out


def _config(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with a variant's overrides (``model`` merged key by key), as :func:`train_variants` builds it."""
    values = {**base, **{k: v for k, v in override.items() if k != "model"}}
    values["model"] = {**base.get("model", {}), **override.get("model", {})}
    return values


def run(
    out: Path,
    quick: bool = False,
    schemes: list[str] | None = None,
    base: dict[str, Any] | None = None,
    workers: int | None = None,
    seeds: tuple[int, ...] = SEEDS,
) -> dict:
    """Train one GPT per scheme and seed, print the table, plot the curves, judge the claims.

    Args:
        out: output folder (runs in ``out/runs/SCHEME-sSEED``, plot ``out/position_training_curves.png``).
        quick: the short form (the lab's quick models; see the module docstring).
        schemes: scheme names (default: every registered one; quick: the quick size's arms,
            :func:`poslab.lab.scale.schemes_of`).
        base: a config mapping replacing the base (tests use a tiny one; every scheme then trains on it
            with ``position`` set).
        workers: trainings at a time (see :func:`poslab.lab.experiments.training.train_variants`).
        seeds: training seeds (at least 3 for a conclusive verdict).
    """
    out = Path(out)
    if schemes is None:
        schemes = list(schemes_of(SIZES["quick"])) if quick and base is None else positions.names()
    schemes = list(schemes)
    if base is None and quick:
        base, variants = quick_variants(schemes)
    else:
        base = base if base is not None else lesson_config()
        variants = {name: {"model": {"position": name, "position_config": {}}} for name in schemes}
    runs = train_seeded(out, base, variants, tuple(seeds), workers)
    losses = {name: seed_values(runs[name]) for name in schemes}
    ranked = sorted(schemes, key=lambda s: sum(losses[s]) / len(losses[s]))
    reference = sum(losses["learned"]) / len(losses["learned"]) if "learned" in losses else None
    corpus = base.get("corpus", "tang5")
    baseline = unigram_entropy(corpus, base.get("val_fraction", 0.1))
    rows = []
    for name in ranked:
        mean = sum(losses[name]) / len(losses[name])
        delta = f"{mean - reference:+.4f}" if reference is not None else "-"
        rows.append(
            [
                name,
                pm(losses[name], 4),
                delta,
                pm(seed_values(runs[name], "best_val_loss"), 4),
                _gain_text(runs[name]),
                f"{sum(seed_values(runs[name], 'tokens_per_s')) / len(seeds):,.0f}",
            ]
        )
    print_table(
        ["scheme", "val loss (whole split)", "vs learned", "best val loss (sampled)", "context gain", "tokens/s"],
        rows,
        title=f"seed 001 exercise 3: one GPT, every position scheme, {base['max_steps']} steps on {corpus!r}; "
        f"mean ± sd over seeds {list(seeds)}",
    )
    print(baseline_line(corpus, base.get("val_fraction", 0.1)))
    ngrams = ngram_baselines(corpus, base.get("val_fraction", 0.1))
    speed = None
    if "alibi" in schemes and "none" in schemes:
        vocab = RunFolder(runs["none"][0]["run_dir"]).config()["model"]["vocab_size"]
        speed = alternating_cpu_speed({k: _config(base, variants[k]) for k in ("alibi", "none")}, vocab)
        print(
            f"  training tokens per CPU second, alibi vs none alternating in this process: "
            f"{pm(speed['alibi'], 0)} vs {pm(speed['none'], 0)}"
        )

    def premise(record: ClaimRecord) -> Premise:
        if record.details.get("metric") == SPEED_METRIC:
            return Premise(
                "timing: process CPU time of the arms alternating in one process",
                f"{len(speed['alibi'])} rounds of {TIMING_STEPS} steps of each arm",
                True,
            )
        return lm_premise(runs, arms_of(record, schemes), ngrams["bigram"])

    claims = attach(training_claims(losses, runs, speed, seeds), premise)
    styles = scheme_style_index(schemes)
    plot = plot_seeded_curves(
        runs,
        out / "position_training_curves.png",
        f"position schemes, same GPT ({base['max_steps']} steps, {corpus})",
        baseline,
        ngrams,
        style_index=styles,
    )
    curves = {name: [r["loss_by_position"] for r in runs[name] if r.get("loss_by_position")] for name in schemes}
    by_position = None
    if all(curves.values()):
        window = len(next(iter(curves.values()))[0])
        by_position = plot_loss_by_position(
            curves,
            out / "loss_by_position.png",
            style_index=styles,
            baselines={f"{k} count model": v for k, v in ngrams.items() if k in NGRAM_ORDERS},
            title=f"loss at each position of the {window}-token window, validation split ({corpus}); "
            "a model that uses its context falls below the bigram line",
        )
    return {
        "steps": base["max_steps"],
        "quick": quick,
        "corpus": corpus,
        "unigram_entropy_nats": baseline,
        "ngram_baselines": ngrams,
        "cpu_speed": speed,
        "seeds": list(seeds),
        "runs": runs,
        "val_loss": {name: pm(losses[name], 4) for name in schemes},
        "val_loss_seeds": losses,
        "ranking": ranked,
        "claims": claims,
        "plot": str(plot),
        "plot_by_position": None if by_position is None else str(by_position),
    }


EXPERIMENT = Experiment(
    name="position-training",
    description=(
        "train the same GPT with every registered position scheme, 3 seeds (full: Tang poems, n_embd 128; "
        "--quick: tinyshakespeare, n_embd 64); curves and val loss (seed 001 ex. 3)"
    ),
    tier=LAB,
    run=run,
    estimate=(1250, 7200),
    tables=(*SCHEME_TABLES, KeyTable("premises", lambda r: premises_table(language_models(r)))),
)
