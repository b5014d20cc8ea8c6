"""The head-pattern map seed 002 §6.1 describes but does not show.

Seed 002 §6.1: "通过t-SNE降维展示8个头在文本分类任务中的关注模式：…可见：头1/2主要捕捉局部语法关系；头3/4关注语义
关键词；头5/6处理长距离依赖；头7/8充当'备用通道'" (a t-SNE of 8 heads' attention patterns shows: heads 1/2
capture local grammar, 3/4 attend to semantic keywords, 5/6 handle long-range dependencies, 7/8 are
"spare channels"). No figure follows.

Here a small GPT (the ``shakespeare-char`` preset: 4 layers, width 128, block 64, with 8 heads per layer
and RoPE, trained on tiny Shakespeare) is probed on a
fixed set of validation windows. Each head becomes one point: its attention weights on the probe
windows (the lower triangle of every ``[T, T]`` map, concatenated). The points are projected to 2-D
with PCA and t-SNE (scikit-learn) and coloured by layer and by the type ``poslab heads`` detects
(:mod:`poslab.analysis.heads`: previous-token, induction, positional, punctuation); the map is drawn
for the first seed's model.

What of §6.1 can be tested, and how: one model per seed (:data:`~poslab.lab.experiments.training.SEEDS`),
each giving one value of each statistic below; a claim is a one-sample t-test of the per-seed values
against its bound (:func:`poslab.lab.verdicts.bound`), so a verdict is about models of this recipe,
not one model. Each claim's premise: every seed's model (a per-model capability) is a language model
clearly below the corpus's *trigram* baseline (:func:`poslab.lab.premises.below_baseline`): roles such
as long-range heads mean little in a model that uses two characters of context.

* "local" vs "long-range" heads exist and separate: split the heads into two clusters (k-means on
  the PCA coordinates); the ratio of the clusters' median mean-attention-distances is at least 2
  (tested on its ln against ln 2: a ratio).
* the roles follow the head *index* (1/2 local, 5/6 long range): within each layer the head index
  would rank the mean attention distance; the Spearman correlation between index and distance, over
  all heads, is at least 0.5. (Heads are interchangeable under permutation, so an index carries no
  role unless something breaks the symmetry.)
* some heads are "spare": the share of the heads whose zeroing raises the loss by less than 1% of the
  base loss is at least a quarter (2 of 8).
* "semantic keywords" is not tested: it needs word-level semantic labels the corpus does not carry.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from poslab.analysis import heads as head_analysis
from poslab.display import new_figure, print_table, save_figure
from poslab.jobs.runner import Task, train_many
from poslab.lab.experiments.common import FULL_ONLY, Experiment, baseline_line, ngram_baselines, spearman
from poslab.lab.experiments.training import SEEDS, train_or_resume
from poslab.lab.premises import attach, below_baseline
from poslab.lab.verdicts import ClaimRecord, Premise, bound
from poslab.runs import RunFolder, load_run
from poslab.training import presets
from poslab.training.config import TrainConfig
from poslab.training.loop import evaluate_loss

N_HEAD = 8
PRESET = "shakespeare-char"  # 65 characters: heads take shape within a few hundred steps
QUICK = {
    "max_steps": 400,
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 30,
    "eval_interval": 100,
    "eval_iters": 4,
    "ckpt_interval": 0,
    "keep_checkpoints": 1,
}
FULL = {
    "max_steps": 2000,
    "batch_size": 32,
    "lr": 2e-3,
    "warmup_steps": 100,
    "eval_interval": 250,
    "eval_iters": 20,
    "ckpt_interval": 0,
    "keep_checkpoints": 1,
}
MODEL = {
    "n_head": N_HEAD,
    "block_size": 64,
    "position": "rope",
}  # RoPE: attention takes shape sooner than with learned positions
PROBE = {"quick": (4, 64), "full": (16, 64)}  # (windows, length)
DISTANCE_FACTOR, INDEX_RHO, SPARE_LOSS, SPARE_SHARE = 2.0, 0.5, 0.01, 0.25


def train_model(out: Path, quick: bool, seed: int, steps: dict[str, Any] | None = None) -> Path:
    """Train the probed GPT of ``seed`` into ``out/runs/head-map-sSEED`` and return the run folder (``steps``:
    training overrides, tests use short ones)."""
    config = presets.preset_config(PRESET)
    config.update(QUICK if quick else FULL)
    config.update(steps or {})
    config["model"] = {**config["model"], **MODEL}
    config.update(
        lr_decay_steps=config["max_steps"],
        name=f"head-map-s{seed}",
        out_dir=str(out / "runs"),
        seed=seed,
        threads=1,
    )  # one thread: a tiny GPT gains nothing from more
    cfg = TrainConfig.from_dict(config)
    train_or_resume(cfg)  # a stopped training continues from its checkpoint
    return cfg.run_dir


def probe_windows(tokens: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """``[n, length]`` evenly spaced windows of the validation tokens (the fixed probe set)."""
    starts = torch.linspace(0, len(tokens) - length - 1, n).long()
    return torch.stack([tokens[s : s + length] for s in starts.tolist()])


def head_features(weights: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head: the flattened lower-triangle attention on the probes, and the mean attention distance.

    Args:
        weights: per layer ``[B, h, T, T]``.

    Returns:
        features ``[L*h, B*T*(T+1)/2]`` and mean distance ``[L*h]`` (expected ``i - j`` under each
        query's weights, averaged over queries ``i >= 1``).
    """
    T = weights[0].shape[-1]
    rows, cols = torch.tril_indices(T, T)
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0).float()  # [T, T]
    feats, dists = [], []
    for w in weights:
        B, h = w.shape[:2]
        feats.append(w[:, :, rows, cols].permute(1, 0, 2).reshape(h, -1))  # [B, h, N] -> [h, B, N] -> [h, B*N]
        expected = (w * distance).sum(-1)[:, :, 1:]  # [B, h, T-1]: expected distance per query
        dists.append(expected.mean(dim=(0, 2)))  # [h]
    return torch.cat(feats), torch.cat(dists)


def project(features: torch.Tensor, seed: int = 0) -> dict[str, list[list[float]]]:
    """2-D PCA and t-SNE coordinates of the heads (scikit-learn)."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    x = features.double().numpy()
    pca = PCA(n_components=2, random_state=seed).fit(x)
    tsne = TSNE(n_components=2, perplexity=min(8.0, (len(x) - 1) / 3), init="pca", random_state=seed).fit_transform(x)
    return {
        "pca": pca.transform(x).tolist(),
        "tsne": tsne.tolist(),
        "pca_explained": pca.explained_variance_ratio_.tolist(),
    }


def two_clusters(points: list[list[float]], seed: int = 0) -> list[int]:
    """k-means with k = 2 on 2-D points (scikit-learn)."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=2, n_init=10, random_state=seed).fit_predict(points).tolist()


def map_statistics(table: list[dict[str, Any]], clusters: list[int], base_loss: float) -> dict[str, Any]:
    """One model's values of seed 002 §6.1's testable descriptions (criteria in the module docstring).

    Returns:
        ``ratio``: the long-range cluster's median mean attention distance over the local one's (1 when
        both are 0); ``cluster_medians``, ``cluster_sizes`` (local first); ``rho``: Spearman of head index
        and mean distance (0 when every head has one distance); ``spare_share`` and ``spare_heads``.
    """
    dist = [h["mean_distance"] for h in table]
    by_cluster = [[d for d, c in zip(dist, clusters) if c == k] for k in (0, 1)]
    groups = sorted((g for g in by_cluster if g), key=statistics.median)
    medians = [statistics.median(g) for g in groups]
    if len(medians) < 2 or medians[-1] == 0:
        ratio = 1.0  # one cluster, or every head at distance 0: no separation
    else:
        ratio = medians[-1] / max(medians[0], 1e-9)
    rho = spearman([float(h["head"]) for h in table], dist)
    cheap = [h for h in table if h["mask_loss_delta"] < SPARE_LOSS * base_loss]
    return {
        "ratio": ratio,
        "cluster_medians": medians,
        "cluster_sizes": [len(g) for g in groups],
        "rho": 0.0 if math.isnan(rho) else rho,  # every head at one distance: no correlation
        "spare_share": len(cheap) / len(table),
        "spare_heads": [[h["layer"], h["head"]] for h in cheap],
        "n_heads": len(table),
    }


def map_claims(per_seed: list[dict[str, Any]], seeds: list[int]) -> list[ClaimRecord]:
    """Seed 002 §6.1's testable descriptions as one-sample claims over the seeds' models (module docstring).

    Args:
        per_seed: :func:`map_statistics` of each seed's model.
        seeds: the seeds, in the same order (recorded).
    """
    source = "seed 002 §6.1"
    label = f"{PRESET} GPT, {N_HEAD} heads a layer"
    records = [
        bound(
            "the heads split into local heads and long-range heads (头1/2主要捕捉局部语法关系 … 头5/6处理长距离依赖)",
            source,
            [r["ratio"] for r in per_seed],
            DISTANCE_FACTOR,
            below=False,
            label=label,
            metric="ratio of the two k-means clusters' median mean attention distances (long-range over local)",
            details={"cluster_medians": [r["cluster_medians"] for r in per_seed]},
            log=True,
        ),
        bound(
            "a head's role follows its index (heads 1/2 local, 3/4 keywords, 5/6 long range, 7/8 spare)",
            source,
            [r["rho"] for r in per_seed],
            INDEX_RHO,
            below=False,
            label=label,
            metric="Spearman correlation of head index and mean attention distance over all heads",
        ),
        bound(
            "some heads are spare channels (头7/8充当'备用通道')",
            source,
            [r["spare_share"] for r in per_seed],
            SPARE_SHARE,
            below=False,
            label=label,
            metric=f"share of the heads whose zeroing raises the loss by less than {SPARE_LOSS:.0%} of the base loss",
            details={"spare_heads": [r["spare_heads"] for r in per_seed]},
        ),
    ]
    for record in records:
        record.details["seeds"] = [int(seed) for seed in seeds]
    return records


def map_premise(val_losses: list[float], trigram: float) -> Premise:
    """Every seed's model clearly below the corpus's trigram baseline (whole-split validation loss)."""
    return below_baseline({f"{PRESET} GPT": val_losses}, trigram, "trigram")


def head_type(labels: list[str]) -> str:
    """One colour class per head: the first label ``poslab heads`` gave it, or ``none``."""
    for prefix in ("induction", "previous-token", "positional", "punctuation"):
        for label in labels:
            if label.startswith(prefix):
                return prefix
    return "none"


def plot_map(table: list[dict[str, Any]], coords: dict[str, Any], path: Path) -> Path:
    """PCA and t-SNE maps, coloured by layer (top) and by head type (bottom); marker size ~ mean distance."""
    fig, axes = new_figure(2, 2, size=(12.0, 10.0))
    layers = sorted({h["layer"] for h in table})
    types = sorted({h["type"] for h in table})
    sizes = [15 + 8 * h["mean_distance"] for h in table]
    for col, key in enumerate(("pca", "tsne")):
        xy = coords[key]
        for row, (field, classes) in enumerate((("layer", layers), ("type", types))):
            ax = axes[row][col]
            for k, cls in enumerate(classes):
                idx = [i for i, h in enumerate(table) if h[field] == cls]
                ax.scatter(
                    [xy[i][0] for i in idx],
                    [xy[i][1] for i in idx],
                    s=[sizes[i] for i in idx],
                    color=f"C{k}",
                    label=f"layer {cls}" if field == "layer" else cls,
                    alpha=0.8,
                )
            for i, h in enumerate(table):
                ax.annotate(f"{h['layer']}.{h['head']}", xy[i], fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.set_title(f"{key.upper()}, coloured by {field} (size ~ mean attention distance)")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    return save_figure(fig, path)


def run(
    out: Path,
    quick: bool = False,
    seeds: tuple[int, ...] = SEEDS,
    steps: dict[str, Any] | None = None,
    workers: int | None = None,
) -> dict:
    """Train one model per seed (``workers`` at a time), probe each, project, plot the first, judge (on one
    thread, restored afterwards).

    Args:
        out: output folder (runs in ``out/runs/head-map-sSEED``, plot ``out/head_map.png``).
        quick: the short form.
        seeds: training seeds (at least 3 for a conclusive verdict).
        steps: training overrides (tests use short ones).
        workers: trainings at a time (:func:`poslab.jobs.runner.train_many`).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny GPT gains nothing from more threads, and the machine is shared
    try:
        return _run(Path(out), quick, tuple(seeds), steps, workers)
    finally:
        torch.set_num_threads(threads)


def probe_model(run_dir: Path, quick: bool) -> dict[str, Any]:
    """One trained model's head table, map coordinates, statistics and whole-split validation loss."""
    model, tokenizer, _ = load_run(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)  # checksummed validation split
    analysis = head_analysis.analyze(
        model,
        tokens,
        n_batches=2 if quick else 8,
        batch_size=8 if quick else 16,
        punctuation=head_analysis.punctuation_ids(tokenizer),
    )
    n, length = PROBE["quick" if quick else "full"]
    probes = probe_windows(tokens, n, length)
    features, distance = head_features(head_analysis.attention_weights(model, probes))
    coords = project(features)
    clusters = two_clusters(coords["pca"])
    table = []
    for i, h in enumerate(analysis["heads"]):
        table.append(
            {
                "layer": h["layer"],
                "head": h["head"],
                "labels": h["labels"],
                "type": head_type(h["labels"]),
                "mean_distance": float(distance[i]),
                "mask_loss_delta": h["mask_loss_delta"],
                "cluster": clusters[i],
                "pca": coords["pca"][i],
                "tsne": coords["tsne"][i],
            }
        )
    T = model.config.block_size
    return {
        "run": str(run_dir),
        "corpus": RunFolder(run_dir).config()["train"]["corpus"],
        "n_layer": model.config.n_layer,
        "probe": {"windows": n, "length": length},
        "base_loss": analysis["base_loss"],
        "val_loss": evaluate_loss(model.eval(), tokens, T, max(1, 8192 // T), None),
        "pca_explained": coords["pca_explained"],
        "heads": table,
        "counts": analysis["counts"],
        "statistics": map_statistics(table, clusters, analysis["base_loss"]),
    }


def _run(out: Path, quick: bool, seeds: tuple[int, ...], steps: dict[str, Any] | None, workers: int | None) -> dict:
    run_dirs = train_many(
        [Task(f"head-map-s{seed}", train_model, (out, quick, seed, steps)) for seed in seeds], workers
    )
    per_seed = [{"seed": seed, **probe_model(run_dir, quick)} for seed, run_dir in zip(seeds, run_dirs)]
    first = per_seed[0]
    table = first["heads"]
    print_table(
        ["layer", "head", "type", "labels", "mean distance", "mask Δloss", "cluster"],
        [
            [
                h["layer"],
                h["head"],
                h["type"],
                ", ".join(h["labels"]) or "-",
                f"{h['mean_distance']:.2f}",
                f"{h['mask_loss_delta']:+.4f}",
                h["cluster"],
            ]
            for h in table
        ],
        title=f"heads of a {first['n_layer']}x{N_HEAD}-head GPT ({PRESET}, seed {first['seed']}; base loss "
        f"{first['base_loss']:.3f})",
    )
    print_table(
        ["seed", "val loss", "cluster distance ratio", "rho(index, distance)", "spare share"],
        [
            [
                r["seed"],
                f"{r['val_loss']:.3f}",
                f"{r['statistics']['ratio']:.2f}",
                f"{r['statistics']['rho']:.2f}",
                f"{r['statistics']['spare_share']:.2f}",
            ]
            for r in per_seed
        ],
        title=f"seed 002 §6.1's descriptions per seed (bounds: ratio >= {DISTANCE_FACTOR:g}, rho >= {INDEX_RHO:g}, "
        f"share >= {SPARE_SHARE:g})",
    )
    corpus = first["corpus"]
    ngrams = ngram_baselines(corpus)
    print(baseline_line(corpus))
    premise = map_premise([r["val_loss"] for r in per_seed], ngrams["trigram"])
    claims = attach(map_claims([r["statistics"] for r in per_seed], list(seeds)), lambda record: premise)
    plot = plot_map(table, {"pca": [h["pca"] for h in table], "tsne": [h["tsne"] for h in table]}, out / "head_map.png")
    return {
        "quick": quick,
        "seeds": list(seeds),
        "run": first["run"],
        "probe": first["probe"],
        "base_loss": first["base_loss"],
        "pca_explained": first["pca_explained"],
        "heads": table,
        "counts": first["counts"],
        "per_seed": [{k: v for k, v in r.items() if k != "heads"} for r in per_seed],
        "ngram_baselines": ngrams,
        "not_tested": "heads 3/4 'semantic keywords': the corpus has no word-level semantic labels",
        "claims": claims,
        "plots": [str(plot)],
    }


EXPERIMENT = Experiment(
    name="head-map",
    description="each head of a trained GPT as a point: PCA / t-SNE map by layer and head type; tests seed 002 §6.1",
    tier=FULL_ONLY,
    run=run,
    estimate=(390, 3900),
)
