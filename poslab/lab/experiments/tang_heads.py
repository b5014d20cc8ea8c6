"""The lessons' Tang-poem GPT, what its heads do, and its attention on 白日依山尽，黄河入海流。.

Seed 000 Q1: 「有些头专门做「前一个词」的关注，有些头做「句号」的关注」 (some heads attend to the previous token,
some to the full stop); seed 002 §6.1: 「头7/8充当"备用通道"」 (some heads are spare channels).

One model, as the lessons have it: seed 001's GPT (preset ``tang-small``) trained on the five-character Tang
poems (its quick form in the quick lab), the declaration's one arm. Then the product's analyses of it:
``poslab heads`` (:func:`poslab.analysis.heads.head_results`) and ``poslab attention``
(:func:`poslab.analysis.attention_map.draw_attention`, on the poem's first line pair).

The claims are properties of that one model, not a seeded comparison (:func:`head_claims`): a previous-token head
and a punctuation head exist, and pruning the least important 30% of the heads costs at most 2% of the loss. Each
needs the model clearly below its text's trigram count model (:func:`analysed_model_premise`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.analysis import heads as head_analysis
from poslab.analysis.attention_map import DEFAULT_PROMPT, draw_attention
from poslab.config import merge
from poslab.lab.experiments.common import LAB, unigram_entropy
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare, load, to_json
from poslab.lab.experiments.tang_heads_result import TangHeadsResult
from poslab.lab.report.i18n import t
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import (
    INCONCLUSIVE,
    ClaimRecord,
    Premise,
    at_least,
    deterministic,
    num,
    with_premise,
)
from poslab.training import presets

#: the lessons' model (seed 001's GPT on the Tang poems)
PRESET = "tang-small"
#: "spare" heads: pruning 30% of the heads costs at most 2% of the loss
SPARE_HEADS_MAX_INCREASE = 0.02


def tang_config(out: Path, quick: bool, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Tang GPT's training values: preset ``tang-small`` (its quick form when ``quick``) into
    ``OUT/runs/tang-small[-quick]``, as ``poslab train --preset tang-small [--quick]`` trains it (``overrides``:
    training values on top, merged as the command line's ``--KEY VALUE``; tests use tiny ones)."""
    values = merge(presets.preset_config(PRESET, quick=quick), overrides or {})
    values.update(name=PRESET + ("-quick" if quick else ""), out_dir=str(Path(out) / "runs"))
    return values


@dataclass(frozen=True)
class Setting:
    """Where the analysis writes its figures, the quick form (fewer evaluation batches), and the run to analyse
    when it is given (``None``: the plan's one arm)."""

    out: Path
    quick: bool
    trained: Path | None


def plan(out: Path, quick: bool, overrides: dict[str, Any] | None = None, trained: Path | None = None) -> Plan[Setting]:
    """Train (or reuse) the Tang GPT in ``out/runs`` (``overrides`` on top of the preset: :func:`tang_config`), or
    analyse the finished run folder ``trained`` instead (nothing is trained)."""
    setting = Setting(Path(out), quick, None if trained is None else Path(trained))
    if trained is not None:
        return Plan(setting, {}, summarise=False, what="Tang model")
    values = tang_config(out, quick, overrides)
    return Plan(setting, {PRESET: {int(values.get("seed", 0)): values}}, summarise=False, what="Tang model")


def measure(runs: Runs[Setting]) -> TangHeadsResult:
    """The head analysis of the run (:func:`poslab.analysis.heads.head_results`), its attention on
    :data:`DEFAULT_PROMPT` (drawn to ``out/attention.png``) and the run's training."""
    from poslab.runs import RunFolder

    s = runs.setting
    run_dir = s.trained if s.trained is not None else next(iter(runs.by_arm[PRESET].values())).path
    results = head_analysis.head_results(run_dir, s.quick)
    s.out.mkdir(parents=True, exist_ok=True)
    attention = draw_attention(Path(run_dir), DEFAULT_PROMPT, s.out / "attention.png")
    run = RunFolder(run_dir)
    train, final = run.config()["train"], run.results() or {}
    training = {
        "run": Path(run_dir).name,
        "corpus": train["corpus"],
        "steps": final.get("steps") or train.get("max_steps"),
        "final_val_loss": final.get("final_val_loss"),
        "unigram_entropy": unigram_entropy(train["corpus"], train.get("val_fraction", 0.1)),
    }
    return load(TangHeadsResult, {**results, "quick": s.quick, "training": training, "attention": attention})


def figures(r: TangHeadsResult, out: Path) -> dict[str, Path]:
    """The heads' scores and pruning curves (:func:`poslab.analysis.heads.plot`), beside the attention map that
    :func:`measure` drew."""
    head_analysis.plot(to_json(r), out / "heads.png")
    return {"heads_plot": out / "heads.png", "attention_plot": out / r.attention.png}


# ------------------------------------------------------------------------------------------- claims
def _one_model(text: str) -> str:
    return f"{text} (measured on the lab's one trained Tang model: a property of that model, not a seeded comparison)"


def _strongest(text: str, source: str, score: str, measured: str, value: float, threshold: float) -> ClaimRecord:
    """The strongest head's ``score`` (``value``) reaches ``threshold`` (:func:`at_least`, on the one model)."""
    criterion = _one_model(f"the strongest head's {score} ≥ {num(threshold)}")
    return at_least(text, source, criterion, measured, value=float(value), floor=float(threshold))


def _previous_token(r: TangHeadsResult, text: str, source: str) -> ClaimRecord:
    counts = r.counts
    best = max(r.heads, key=lambda h: h.previous_token)
    threshold = r.thresholds.previous_token
    measured = (
        f"{counts['previous-token']} previous-token, {counts['induction']} induction, "
        f"{counts['positional']} positional "
        f"of {len(r.heads)} heads; strongest previous-token head L{best.layer}H{best.head} "
        f"({num(best.previous_token, 3)} of its attention on the previous token)"
    )
    return _strongest(text, source, "previous-token score", measured, best.previous_token, threshold)


def _punctuation(r: TangHeadsResult, text: str, source: str) -> ClaimRecord:
    best = max(r.heads, key=lambda h: h.punctuation)
    threshold = r.thresholds.punctuation
    measured = (
        f"{r.counts['punctuation']} of {len(r.heads)} heads put ≥ {num(threshold)} of their "
        f"attention on punctuation; strongest L{best.layer}H{best.head} ({num(best.punctuation, 3)}); "
        f"punctuation is {r.punctuation_share_of_keys:.0%} of the text"
    )
    if not r.punctuation_ids:
        return ClaimRecord(text, source, "needs punctuation in the vocabulary", measured, None, None, 0, INCONCLUSIVE)
    return _strongest(text, source, "share of attention on punctuation", measured, best.punctuation, threshold)


def _spare(r: TangHeadsResult, text: str, source: str) -> ClaimRecord:
    base, pruned = r.base_loss, r.pruned_30
    relative = pruned.loss_increase / base
    measured = (
        f"masking the {pruned.heads_masked} least important heads (30%) moves the loss "
        f"{num(base)} → {num(pruned.loss)} ({relative:+.1%}); 60%: {num(r.pruned_60.loss)}"
    )
    return deterministic(
        text,
        source,
        _one_model(f"relative loss increase after pruning 30% of heads ≤ {SPARE_HEADS_MAX_INCREASE:.0%}"),
        measured,
        error=float(max(relative, 0.0)),
        tolerance=SPARE_HEADS_MAX_INCREASE,
    )


#: the lessons' claims about the heads: (source, claim, check reading the head analysis's results)
CLAIMS = (
    (
        "seed 000 Q1",
        "有些头专门做「前一个词」的关注 — some heads specialise in the previous token",
        _previous_token,
    ),
    ("seed 000 Q1", "有些头做「句号」的关注 — some heads attend to punctuation (the full stop)", _punctuation),
    (
        "seed 002 §6.1",
        '头7/8充当"备用通道" — some heads are spare: pruning the least important 30% costs < 2% of the loss',
        _spare,
    ),
)


def analysed_model_premise(r: TangHeadsResult) -> Premise:
    """The premise of a claim read off the analysed model: a language model of its text whose loss is at least
    :data:`poslab.lab.premises.BIGRAM_MARGIN` below the text's *trigram* count model
    (:func:`poslab.lab.experiments.common.ngram_baselines`, interpolated Kneser–Ney).

    The claims are about what a trained language model's heads learn (a previous-token head, a head on the
    full stop, heads to spare). A model above the trigram baseline predicts worse than a count of the last two
    characters, so whatever its heads attend to is not yet what the lesson's heads do; the claim is then not
    testable at this scale. The analysed model is one training (the lab's Tang GPT), not seeds: the premise
    and the claims are a property of that one model. Results that do not say which character-level text the
    loss was measured on cannot show the premise, and leave the claim not testable too.
    """
    from poslab.lab.experiments.common import ngram_baselines
    from poslab.lab.premises import BIGRAM_MARGIN, below_baseline

    text = r.text
    needed = f"the analysed model's loss at least {BIGRAM_MARGIN:g} nats/token below its text's trigram baseline"
    if not text.corpus or text.tokenizer != "char":
        return Premise(needed, "not measurable: the results do not name the character-level text of the loss", False)
    trigram = ngram_baselines(text.corpus, text.val_fraction)["trigram"]
    return below_baseline({"analysed model (one training, no seeds)": [r.base_loss]}, trigram, "trigram")


def head_claims(results: TangHeadsResult) -> list[ClaimRecord]:
    """The records of :data:`CLAIMS` from the head analysis's results, each under :func:`analysed_model_premise`."""
    premise = analysed_model_premise(results)
    return [with_premise(check(results, text, source), premise) for source, text, check in CLAIMS]


# ------------------------------------------------------------------------------------------- tables
def heads_table(r: TangHeadsResult) -> Table:
    """Every head: its scores, its Δloss when masked, its labels."""
    return Table(
        t("key.heads.caption", loss=num(r.base_loss)),
        (
            *(t("key.heads." + k) for k in ("head", "prev", "induction", "offset", "confidence", "punct", "masked")),
            "|∂L/∂ξ|",
            t("key.heads.type"),
        ),
        tuple(
            (
                f"L{h.layer}H{h.head}",
                h.previous_token,
                h.induction,
                f"{h.positional_offset:+d}",
                h.positional_confidence,
                h.punctuation,
                h.mask_loss_delta,
                h.grad_importance,
                ", ".join(h.labels) or "—",
            )
            for h in r.heads
        ),
    )


def pruning_table(r: TangHeadsResult) -> Table:
    """The loss with the least important 30% and 60% of the heads masked."""
    return Table(
        t("key.heads.prune"),
        tuple(t("key.heads." + k) for k in ("pruned", "nmasked", "loss", "increase")),
        tuple(
            (f"{share}%", p.heads_masked, p.loss, p.loss_increase)
            for share, p in ((30, r.pruned_30), (60, r.pruned_60))
        ),
    )


def training_table(r: TangHeadsResult) -> Table:
    """The analysed model: its final validation loss beside its corpus's unigram entropy."""
    run = r.training
    return Table(
        t("key.runs.caption"),
        (t("key.run"), t("key.runs.corpus"), t("key.runs.steps"), t("key.runs.final"), t("key.runs.baseline")),
        ((run.run, run.corpus, run.steps, run.final_val_loss, run.unigram_entropy),),
    )


TABLES = (
    KeyTable("every head", heads_table),
    KeyTable("pruning", pruning_table),
    KeyTable("training run", training_table),
)

EXPERIMENT = declare(
    name="tang-heads",
    description="the lessons' Tang-poem GPT (tang-small) trained, its heads analysed and its attention drawn; tests "
    "seed 000 Q1 and seed 002 §6.1's spare heads",
    tier=LAB,
    declaration=Declaration(TangHeadsResult, plan, measure, head_claims, TABLES, figures),
    # wall seconds of training, head analysis and attention map on 2 quiet cores (docs/lab.md, "Timing")
    estimate=(120, 1040),
)
run = EXPERIMENT.run
