"""Attention entropy past the training length: does it "explode"?

Seed 000 §3.5 and Q4 explain RoPE's degradation past the training length by 「注意力熵爆炸」: the
attention distribution becomes unstable and its entropy rises sharply, the model "looks everywhere".
YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071, §3.4) adds a temperature (logits scaled by
``(0.1 ln s + 1)^2``) and Chiang & Cholak 2022 ("Overcoming a Theoretical Limitation of
Self-Attention", https://arxiv.org/abs/2202.12172) scale logits by ``log n / log L`` so that entropy
does not grow with the length. This experiment measures, for each lab model (one per scheme, trained at ``L``), the
Shannon entropy ``H_i = -sum_j a_ij ln a_ij`` (nats) of every query's attention row, per layer and head, by query
position and evaluation length (``1x .. 16x L``); the RoPE-family models also with YaRN (factor 4) with and without
its temperature, and with log-n scaling.

A uniform row over ``n`` keys has entropy ``ln n``, so some growth with the position is expected of any
model that spreads attention; the normalised entropy ``H_i / ln(i + 1)`` separates that from a real
loss of focus. Both are reported; the claim about RoPE tests the normalised one, and the variants (the
same trained models read differently) are compared paired by seed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from poslab.display import new_figure, save_figure
from poslab.lab.experiments.attention_entropy_measure import (
    QUERY_BLOCK,
    EntropyCell,
    Variant,
    measure_variant,
    uniform_rise,
    variants_of,
)
from poslab.lab.experiments.common import LAB, Baselines, baselines_field, corpus_baselines, spearman
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.lab_models import lab_model_arms
from poslab.lab.premises import attach, below_bigram
from poslab.lab.report.i18n import t
from poslab.lab.scale import CORPUS, SEEDS, Scale, schemes_of, size_of
from poslab.lab.scale import EXTRAPOLATION_FACTORS as FACTORS
from poslab.lab.tables import KeyTable, MeanSd, Table
from poslab.lab.verdicts import INCONCLUSIVE, Arm, ClaimRecord, Metric, Premise, bound, paired, pm

#: a rise must be smaller by more than this (nats) to count as "reduced": a hundredth of a nat, 1.4% of the
#: ln 2 a row gains by spreading evenly over twice as many keys; any reduction the papers describe is larger
MARGIN = 0.01
#: the normalised entropy H / ln(number of keys) must rise by more than this for RoPE to "lose focus" past L:
#: 1% of the way from attention on one key (0) to uniform attention (1), the same hundredth as :data:`MARGIN`
NORMALISED_MARGIN = 0.01


@dataclass(frozen=True)
class EntropyResult:
    """Every variant of every lab model, with the scale and the corpus's baselines."""

    size: Scale
    train_length: int
    factors: list[int]
    bin_width: int
    query_block: int
    seeds: list[int]
    baselines: Baselines = baselines_field()
    models: dict[str, Variant]
    seconds: float


@dataclass(frozen=True)
class Setting:
    """The scale, its schemes and seeds, the position bins' width, and when the experiment started."""

    lab: Scale
    schemes: tuple[str, ...]
    seeds: tuple[int, ...]
    bin_width: int
    started: float


def plan(
    out: Path,
    quick: bool,
    size: str | Scale | None = None,
    schemes: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] = SEEDS,
) -> Plan[Setting]:
    """The lab models of every scheme (default: the size's, :func:`poslab.lab.scale.schemes_of`) and seed
    (:func:`~poslab.lab.experiments.lab_models.lab_model_arms`: in the store, reused where finished)."""
    lab = size_of(quick, size)
    schemes = schemes_of(lab) if schemes is None else tuple(schemes)
    setting = Setting(lab, schemes, tuple(seeds), max(1, lab.train_length // 2), time.perf_counter())
    return Plan(setting, lab_model_arms(schemes, lab, tuple(seeds)), summarise=False, what="lab models")


def measure(runs: Runs[Setting]) -> EntropyResult:
    """Entropies (and perplexity at L and 4x L) of every lab model, seed and variant."""
    s = runs.setting
    models = {}
    for scheme in s.schemes:
        seeds = runs.by_arm[scheme]
        for label, scaling, logn in variants_of(scheme):
            by_seed = {str(k): measure_variant(r.path, s.lab, scaling, logn, s.bin_width) for k, r in seeds.items()}
            models[label] = Variant(scheme, scaling, logn, by_seed, {str(k): str(r.path) for k, r in seeds.items()})
    return EntropyResult(
        size=s.lab,
        train_length=s.lab.train_length,
        factors=list(FACTORS),
        bin_width=s.bin_width,
        query_block=QUERY_BLOCK,
        seeds=list(s.seeds),
        baselines=corpus_baselines(CORPUS),
        models=models,
        seconds=time.perf_counter() - s.started,
    )


# ------------------------------------------------------------------------------------ claims
def entropy_claims(models: dict[str, Variant], factor: int = 4) -> list[dict[str, Any]]:
    """The claims this experiment tests, as :class:`poslab.lab.verdicts.ClaimRecord` dicts (at ``factor`` x L).

    ``models``: variant label -> its readings. RoPE's loss of focus is the rise of its *normalised* entropy, per seed
    against :data:`NORMALISED_MARGIN` (one-sample t): a raw rise near ``ln 4`` is expected of any model that spreads
    its attention over 4x more keys (:func:`uniform_rise`: 1.15 nats for uniform rows), so the raw rise is shown,
    not claimed. The variants are the same models read differently: their rises are compared paired by seed.
    """
    key = str(factor)
    seeds = sorted({s for v in models.values() for s in v.by_seed}, key=int)

    def cell(variant: str, seed: str) -> EntropyCell | None:
        entries = models[variant].by_seed if variant in models else {}
        return entries[seed].entropy.get(key) if seed in entries else None

    def per_seed(variant: str, field: str = "rise") -> list[float] | None:
        values = [None if c is None else getattr(c, field) for c in (cell(variant, s) for s in seeds)]
        if not values or any(v is None for v in values):
            return None
        return [float(v) for v in values]

    def unmeasured(text: str, source: str, criterion: str) -> dict[str, Any]:
        return ClaimRecord(
            text, source, criterion, "not measured (a variant is missing)", None, None, 0, INCONCLUSIVE
        ).to_dict()

    def reduces(text: str, source: str, better: str, worse: str) -> dict[str, Any]:
        """``better``'s rise is lower than ``worse``'s by more than :data:`MARGIN`, paired by seed."""
        a, b = per_seed(better), per_seed(worse)
        criterion = f"rise({worse}) - rise({better}) > {MARGIN} nats"
        if a is None or b is None:
            return unmeasured(text, source, criterion)
        return paired(
            text,
            source,
            Arm(better, a, seeds),
            Arm(worse, b, seeds),
            Metric(f"entropy rise at {factor}x L (nats)"),
            offset=MARGIN,
            criterion=criterion + " (the same models read both ways)",
        ).to_dict()

    out = []
    text = f"plain RoPE's attention entropy past L rises more than the growing key count explains (at {factor}x L)"
    source = "seed 000 §3.5, Q4 (注意力熵爆炸; 注意力分布变得均匀或混乱)"
    criterion = (
        f"normalised entropy H / ln(number of keys) of the queries past L minus of those in [L/2, L) > "
        f"{NORMALISED_MARGIN}, per seed (the raw rise, about ln {factor} for uniform rows, is shown, not tested)"
    )
    normalised_rises, raw = per_seed("rope", "rise_normalised"), per_seed("rope")
    if normalised_rises is None:
        out.append(unmeasured(text, source, criterion))
    else:
        record = bound(
            text,
            source,
            Arm("rope", normalised_rises, seeds),
            NORMALISED_MARGIN,
            Metric(f"normalised entropy rise at {factor}x L"),
            below=False,
            criterion=criterion,
            details={"raw_rise": raw},
        ).to_dict()
        if raw is not None:
            length = next(iter(models["rope"].by_seed.values())).entropy[key].length
            uniform = uniform_rise(length // factor, factor)
            record["details"]["uniform_rise"] = uniform
            record["measured"] += f"; raw rise {pm(raw, 3)} nats (uniform rows: {uniform:.3f})"
        out.append(record)
    yarn, no_temperature = "rope + YaRN x4", "rope + YaRN x4 no temperature"
    out.append(
        reduces(
            "YaRN's temperature reduces the entropy rise (vs the same YaRN frequencies without it)",
            "Peng et al. 2023 (YaRN §3.4)",
            yarn,
            no_temperature,
        )
    )
    out.append(
        reduces("YaRN (with its temperature) rises less than plain RoPE", "Peng et al. 2023 (YaRN)", yarn, "rope")
    )
    out.append(reduces("log-n scaling reduces the entropy rise", "Chiang & Cholak 2022", "rope + log-n", "rope"))
    rhos, rhos_normalised, counts, rho_seeds = [], [], [], []
    for seed in seeds:
        readings = [v.by_seed[seed] for v in models.values() if seed in v.by_seed]
        cells = [(e.entropy[key], e.ppl_ratio) for e in readings if key in e.entropy and e.ppl_ratio is not None]
        pairs = [(c.rise, ratio) for c, ratio in cells if c.rise is not None]
        npairs = [(c.rise_normalised, ratio) for c, ratio in cells if c.rise_normalised is not None]
        if len(pairs) >= 3:
            rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
            if not math.isnan(rho):
                rhos.append(rho)
                counts.append(len(pairs))
                rho_seeds.append(seed)
        if len(npairs) >= 3:
            rho = spearman([p[0] for p in npairs], [p[1] for p in npairs])
            if not math.isnan(rho):
                rhos_normalised.append(rho)
    text = "the entropy rise is what degrades perplexity: across models, larger rises go with larger perplexity ratios"
    source = "seed 000 §3.5 (degradation 'because' of the entropy explosion)"
    criterion = (
        f"Spearman rank correlation of rise({factor}L) and ppl({factor}L)/ppl(L) across all variants > 0.5 "
        "(one correlation per seed)"
    )
    if not rhos:
        entry = unmeasured(text, source, criterion)
    else:
        entry = bound(
            text,
            source,
            Arm("all variants", rhos),
            0.5,
            Metric("Spearman correlation"),
            below=False,
            criterion=criterion,
        ).to_dict()
    entry.setdefault("details", {}).update(
        spearman_normalised_rise=rhos_normalised, n_variants=counts, seeds=[int(s) for s in rho_seeds]
    )
    out.append(entry)
    return out


def premise_of(record: ClaimRecord, models: dict[str, Variant], bigram: float) -> Premise:
    """How a model spreads its attention past ``L`` says something only about a language model: every seed
    of each scheme the claim reads (as trained, without scaling) clearly below the bigram baseline at L."""
    plain = {v.scheme: v for v in models.values() if v.rope_scaling is None and not v.logn_scaling}
    named = [scheme for scheme in plain if scheme in str(record.details.get("label", ""))] or list(plain)
    return below_bigram(
        {scheme: [math.log(r.ppl["1"]) for r in plain[scheme].by_seed.values()] for scheme in named}, bigram
    )


def claims(result: EntropyResult) -> list[dict[str, Any]]:
    """:func:`entropy_claims`, each with its premise (:func:`premise_of`)."""
    bigram = result.baselines.bigram
    return attach(entropy_claims(result.models), lambda record: premise_of(record, result.models, bigram))


# ------------------------------------------------------------------------------------ table and figure
def _means(v: Variant) -> dict[str, float]:
    """Factor -> the mean entropy over the seeds read at that length."""
    readings = list(v.by_seed.values())
    out = {}
    for f in readings[0].entropy:
        values = [r.entropy[f].mean for r in readings if f in r.entropy]
        out[f] = sum(values) / len(values)
    return out


def entropy_table(r: EntropyResult) -> Table:
    """Mean attention entropy per model and evaluation length, with the raw and the normalised rise at 4×L and the
    perplexity ratio as mean ± sd over seeds (the raw rise is a measured number: :func:`entropy_claims` tests the
    normalised one)."""
    rows = []
    for label, v in r.models.items():
        four = [e.entropy.get("4") for e in v.by_seed.values()]
        means = _means(v)
        rows.append(
            (label, *(means.get(str(f), "cannot") for f in r.factors))
            + (
                MeanSd.of([c.rise for c in four if c is not None]),
                MeanSd.of([c.rise_normalised for c in four if c is not None]),
                MeanSd.of([e.ppl_ratio for e in v.by_seed.values()]),
            )
        )
    return Table(
        t("key.entropy.caption", seeds=r.seeds),
        (t("key.model"), *(f"{f}×L" for f in r.factors), t("key.entropy.rise"), "H / ln n rise at 4×L", "ppl 4×L / L"),
        tuple(rows),
    )


def figures(r: EntropyResult, out: Path) -> dict[str, Path]:
    """Entropy vs query position at 16x L (left) and mean entropy vs evaluation length (right)."""
    from matplotlib import colormaps

    colors = colormaps["tab20"]
    L = r.train_length
    fig, axes = new_figure(1, 2, size=(14.0, 5.2))
    longest = str(max(r.factors))
    for i, (label, v) in enumerate(r.models.items()):
        style, color = ("--" if " + " in label else "-"), colors(i % 20)
        cells = [e.entropy[longest] for e in v.by_seed.values() if longest in e.entropy]
        if cells:
            starts = cells[0].bin_starts
            xs = [b + (starts[1] if len(starts) > 1 else 1) / 2 for b in starts]  # bin centres
            ys = [sum(c) / len(c) for c in zip(*(cell.by_position for cell in cells))]
            axes[0].plot(xs, ys, style, color=color, label=label, linewidth=1.2)
        means = _means(v)
        seeds = [[e.entropy[f].mean for e in v.by_seed.values() if f in e.entropy] for f in means]
        yerr = [
            [m - min(s) for m, s in zip(means.values(), seeds)],
            [max(s) - m for m, s in zip(means.values(), seeds)],
        ]
        axes[1].errorbar(
            [int(f) * L for f in means],
            list(means.values()),
            yerr=yerr,
            fmt=style,
            color=color,
            marker="o",
            label=label,
            linewidth=1.2,
            capsize=2,
        )
    n = torch.arange(1, max(r.factors) * L + 1, dtype=torch.float32)
    axes[0].plot(n.tolist(), torch.log(n).tolist(), color="black", linestyle=":", linewidth=1, label="uniform (ln n)")
    axes[0].set_xlabel("query position")
    axes[0].set_ylabel("attention entropy (nats), mean over layers and heads")
    axes[0].set_title(f"at {longest}x L = {len(n)} tokens; trained at L = {L} (dotted line)")
    axes[1].set_xlabel("evaluation length")
    axes[1].set_ylabel("mean attention entropy (nats)")
    axes[1].set_title("mean over every query, layer and head (bars: min..max over seeds)")
    axes[1].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.axvline(L, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    return {"figure": save_figure(fig, out / "attention_entropy.png")}


EXPERIMENT = declare(
    name="attention-entropy",
    description="attention entropy vs query position and length, per scheme, with/without YaRN temperature and log-n "
    "(seed 000 §3.5)",
    tier=LAB,
    declaration=Declaration(
        EntropyResult, plan, measure, claims, (KeyTable("attention entropy by length", entropy_table),), figures
    ),
    after=("extrapolation", "position-training"),
    estimate=(15, 900),
)
run = EXPERIMENT.run
