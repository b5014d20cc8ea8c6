"""The head-pattern map seed 002 §6.1 describes but does not show.

Seed 002 §6.1: "通过t-SNE降维展示8个头在文本分类任务中的关注模式：…可见：头1/2主要捕捉局部语法关系；头3/4关注语义
关键词；头5/6处理长距离依赖；头7/8充当'备用通道'" (a t-SNE of 8 heads' attention patterns shows: heads 1/2
capture local grammar, 3/4 attend to semantic keywords, 5/6 handle long-range dependencies, 7/8 are
"spare channels"). No figure follows.

Here one small GPT per seed (the ``shakespeare-char`` preset with 8 heads per layer and RoPE) is probed on fixed
validation windows: each head is one point, its attention weights on the windows (every ``[T, T]`` map's lower
triangle), projected to 2-D with PCA and t-SNE (scikit-learn) and coloured by layer and by the type
:mod:`poslab.analysis.heads` detects; the map shows the first seed's model.

Each claim is a one-sample t-test of the per-seed values against its bound (:func:`poslab.lab.verdicts.bound`);
its premise: every seed's model below the corpus's *trigram* baseline (roles such as long-range heads mean little
in a model that uses two characters of context).

* "local" vs "long-range" heads exist and separate: of two k-means clusters of the heads (on the PCA coordinates),
  the ratio of their median mean attention distances is at least 2 (on its ln against ln 2).
* the roles follow the head *index* (1/2 local, 5/6 long range): the Spearman correlation of index and distance
  over all heads is at least 0.5 (heads are interchangeable under permutation, so an index carries no role unless
  something breaks the symmetry).
* some heads are "spare": at least a quarter (2 of 8) raise the loss by less than 1% when zeroed.
* "semantic keywords" is not tested: it needs word-level semantic labels the corpus does not carry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.display import new_figure, save_figure
from poslab.lab.experiments.common import FULL_ONLY, Baselines, baselines_field, corpus_baselines, one_thread
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.head_map_probe import SPARE_LOSS, HeadRow, MapStatistics, Probe, SeedProbe, probe_model
from poslab.lab.experiments.training import SEEDS, preset_arms
from poslab.lab.premises import attach, below_baseline
from poslab.lab.scale import Scale, ScaleTable
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import Arm, ClaimRecord, Metric, Premise, bound

N_HEAD = 8
PRESET = "shakespeare-char"  # 65 characters: heads take shape within a few hundred steps
#: the probed models: the preset's geometry with :data:`N_HEAD` heads a layer, trained with RoPE (attention takes
#: shape sooner than with learned positions) by :func:`~poslab.lab.scale.preset_config`
_QUICK = Scale(
    name="quick",
    train_length=64,
    n_layer=4,
    n_head=N_HEAD,
    n_embd=128,
    steps=400,
    batch_size=16,
    lr=3e-3,
    warmup_steps=30,
    eval_interval=100,
    eval_iters=4,
)
SCALES: ScaleTable[Scale] = ScaleTable(
    _QUICK,
    dataclasses.replace(
        _QUICK, name="full", steps=2000, batch_size=32, lr=2e-3, warmup_steps=100, eval_interval=250, eval_iters=20
    ),
)
DISTANCE_FACTOR, INDEX_RHO, SPARE_SHARE = 2.0, 0.5, 0.25


@dataclass(frozen=True)
class MapResult:
    """Every seed's probe, and the first seed's heads (the map drawn)."""

    quick: bool
    seeds: list[int]
    run: str
    probe: Probe
    base_loss: float
    pca_explained: list[float]
    heads: list[HeadRow]
    counts: dict[str, Any]
    per_seed: list[SeedProbe]
    baselines: Baselines = baselines_field()
    not_tested: str


def map_claims(per_seed: list[MapStatistics], seeds: list[int]) -> list[ClaimRecord]:
    """Seed 002 §6.1's testable descriptions as one-sample claims over the seeds' :func:`map_statistics`."""
    source = "seed 002 §6.1"
    label = f"{PRESET} GPT, {N_HEAD} heads a layer"

    def arm(values: list[float]) -> Arm:
        return Arm(label, values)

    records = [
        bound(
            "the heads split into local heads and long-range heads (头1/2主要捕捉局部语法关系 … 头5/6处理长距离依赖)",
            source,
            arm([r.ratio for r in per_seed]),
            DISTANCE_FACTOR,
            Metric(
                "ratio of the two k-means clusters' median mean attention distances (long-range over local)", log=True
            ),
            below=False,
            details={"cluster_medians": [r.cluster_medians for r in per_seed]},
        ),
        bound(
            "a head's role follows its index (heads 1/2 local, 3/4 keywords, 5/6 long range, 7/8 spare)",
            source,
            arm([r.rho for r in per_seed]),
            INDEX_RHO,
            Metric("Spearman correlation of head index and mean attention distance over all heads"),
            below=False,
        ),
        bound(
            "some heads are spare channels (头7/8充当'备用通道')",
            source,
            arm([r.spare_share for r in per_seed]),
            SPARE_SHARE,
            Metric(f"share of the heads whose zeroing raises the loss by less than {SPARE_LOSS:.0%} of the base loss"),
            below=False,
            details={"spare_heads": [r.spare_heads for r in per_seed]},
        ),
    ]
    for record in records:
        record.details["seeds"] = [int(seed) for seed in seeds]
    return records


def map_premise(val_losses: list[float], trigram: float) -> Premise:
    """Every seed's model clearly below the corpus's trigram baseline (whole-split validation loss)."""
    return below_baseline({f"{PRESET} GPT": val_losses}, trigram, "trigram")


def plot_map(table: list[HeadRow], path: Path) -> Path:
    """PCA and t-SNE maps, coloured by layer (top) and by head type (bottom); marker size ~ mean distance."""
    fig, axes = new_figure(2, 2, size=(12.0, 10.0))
    layers = sorted({h.layer for h in table})
    types = sorted({h.type for h in table})
    sizes = [15 + 8 * h.mean_distance for h in table]
    for col, key in enumerate(("pca", "tsne")):
        xy = [getattr(h, key) for h in table]
        for row, (field, classes) in enumerate((("layer", layers), ("type", types))):
            ax = axes[row][col]
            for k, cls in enumerate(classes):
                idx = [i for i, h in enumerate(table) if getattr(h, field) == cls]
                ax.scatter(
                    [xy[i][0] for i in idx],
                    [xy[i][1] for i in idx],
                    s=[sizes[i] for i in idx],
                    color=f"C{k}",
                    label=f"layer {cls}" if field == "layer" else cls,
                    alpha=0.8,
                )
            for i, h in enumerate(table):
                ax.annotate(f"{h.layer}.{h.head}", xy[i], fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.set_title(f"{key.upper()}, coloured by {field} (size ~ mean attention distance)")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    return save_figure(fig, path)


@dataclass(frozen=True)
class Setting:
    quick: bool
    seeds: tuple[int, ...]


def plan(out: Path, quick: bool, seeds: tuple[int, ...] = SEEDS, scale: Scale | None = None) -> Plan[Setting]:
    """One probed GPT per seed (:func:`~poslab.lab.experiments.training.preset_arms`: runs ``out/runs/seed-SEED``,
    one thread each); ``scale``: the models (default :data:`SCALES` ``quick`` or ``full``; tests use a short one)."""
    scale = scale or SCALES["quick" if quick else "full"]
    return Plan(Setting(quick, tuple(seeds)), preset_arms(out, scale, seeds), summarise=False)


def measure(runs: Runs[Setting]) -> MapResult:
    """Every seed's model probed (on one thread, restored afterwards); the first seed's heads kept for the map."""
    s = runs.setting
    with one_thread():
        probed = [probe_model(seed, runs.by_arm["rope"][seed].path, s.quick) for seed in s.seeds]
    per_seed = [p for p, _ in probed]
    first, heads = probed[0]
    return MapResult(
        quick=s.quick,
        seeds=list(s.seeds),
        run=first.run,
        probe=first.probe,
        base_loss=first.base_loss,
        pca_explained=first.pca_explained,
        heads=heads,
        counts=first.counts,
        per_seed=per_seed,
        baselines=corpus_baselines(first.corpus),
        not_tested="heads 3/4 'semantic keywords': the corpus has no word-level semantic labels",
    )


def claims(r: MapResult) -> list[dict[str, Any]]:
    """:func:`map_claims` with their premise (:func:`map_premise`)."""
    premise = map_premise([p.val_loss for p in r.per_seed], r.baselines.ngram_baselines["trigram"])
    return attach(map_claims([p.statistics for p in r.per_seed], r.seeds), lambda record: premise)


def heads_table(r: MapResult) -> Table:
    """The first seed's heads: type, labels, mean attention distance, zeroing cost, cluster."""
    return Table(
        f"heads of a {r.per_seed[0].n_layer}x{N_HEAD}-head GPT ({PRESET}, seed {r.seeds[0]}; base loss "
        f"{r.base_loss:.3f})",
        ("layer", "head", "type", "labels", "mean distance", "mask Δloss", "cluster"),
        tuple(
            (h.layer, h.head, h.type, ", ".join(h.labels) or "-", h.mean_distance, h.mask_loss_delta, h.cluster)
            for h in r.heads
        ),
    )


def statistics_table(r: MapResult) -> Table:
    """Each seed's values of the testable descriptions against their bounds."""
    return Table(
        f"seed 002 §6.1's descriptions per seed (bounds: ratio >= {DISTANCE_FACTOR:g}, rho >= {INDEX_RHO:g}, "
        f"share >= {SPARE_SHARE:g})",
        ("seed", "val loss", "cluster distance ratio", "rho(index, distance)", "spare share"),
        tuple((p.seed, p.val_loss, p.statistics.ratio, p.statistics.rho, p.statistics.spare_share) for p in r.per_seed),
    )


def figures(r: MapResult, out: Path) -> dict[str, Path]:
    """The first seed's heads on the PCA and t-SNE maps."""
    return {"plot": plot_map(r.heads, out / "head_map.png")}


EXPERIMENT = declare(
    name="head-map",
    description="each head of a trained GPT as a point: PCA / t-SNE map by layer and head type; tests seed 002 §6.1",
    tier=FULL_ONLY,
    declaration=Declaration(
        MapResult,
        plan,
        measure,
        claims,
        (KeyTable("heads of the mapped model", heads_table), KeyTable("descriptions per seed", statistics_table)),
        figures,
    ),
    estimate=(390, 3900),
)
run = EXPERIMENT.run
