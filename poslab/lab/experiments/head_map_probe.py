"""The head-map experiment's probe: each head of a trained model as a point (its attention on fixed windows), its
mean attention distance, its zeroing cost, and seed 002 §6.1's statistics of one model."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from poslab.analysis import heads as head_analysis
from poslab.lab.experiments.common import even_windows, spearman
from poslab.runs import RunFolder, load_run
from poslab.training.loop import evaluate_loss

PROBE = {"quick": (4, 64), "full": (16, 64)}  # (windows, length)
#: a head is spare when zeroing it raises the loss by less than this fraction of the base loss
SPARE_LOSS = 0.01


@dataclass(frozen=True)
class HeadRow:
    """One head of a probed model: where it is, what ``poslab heads`` found, its mean attention distance, the loss
    its zeroing costs, its k-means cluster and its map coordinates."""

    layer: int
    head: int
    labels: list[str]
    type: str
    mean_distance: float
    mask_loss_delta: float
    cluster: int
    pca: list[float]
    tsne: list[float]


@dataclass(frozen=True)
class MapStatistics:
    """One model's values of seed 002 §6.1's testable descriptions (:func:`map_statistics`)."""

    ratio: float
    cluster_medians: list[float]
    cluster_sizes: list[int]
    rho: float
    spare_share: float
    spare_heads: list[list[int]]
    n_heads: int


@dataclass(frozen=True)
class Probe:
    windows: int
    length: int


@dataclass(frozen=True)
class SeedProbe:
    """One seed's probed model: its losses, its map's explained variance, the head types counted, its statistics."""

    seed: int
    run: str
    corpus: str
    n_layer: int
    probe: Probe
    base_loss: float
    val_loss: float
    pca_explained: list[float]
    counts: dict[str, Any]
    statistics: MapStatistics


def head_features(weights: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, from each layer's weights ``[B, h, T, T]``: the flattened lower-triangle attention on the probes
    ``[L*h, B*T*(T+1)/2]`` and the mean attention distance ``[L*h]`` (expected ``i - j`` under each query's weights,
    averaged over queries ``i >= 1``)."""
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


def map_statistics(table: list[HeadRow], clusters: list[int], base_loss: float) -> MapStatistics:
    """One model's values of seed 002 §6.1's testable descriptions: ``ratio``, the long-range cluster's median mean
    attention distance over the local one's (1 when both are 0); ``rho``, Spearman of head index and distance (0
    when every head has one distance); the spare heads and their share."""
    dist = [h.mean_distance for h in table]
    by_cluster = [[d for d, c in zip(dist, clusters) if c == k] for k in (0, 1)]
    groups = sorted((g for g in by_cluster if g), key=statistics.median)
    medians = [statistics.median(g) for g in groups]
    if len(medians) < 2 or medians[-1] == 0:
        ratio = 1.0  # one cluster, or every head at distance 0: no separation
    else:
        ratio = medians[-1] / max(medians[0], 1e-9)
    rho = spearman([float(h.head) for h in table], dist)
    cheap = [h for h in table if h.mask_loss_delta < SPARE_LOSS * base_loss]
    return MapStatistics(
        ratio=ratio,
        cluster_medians=medians,
        cluster_sizes=[len(g) for g in groups],
        rho=0.0 if math.isnan(rho) else rho,  # every head at one distance: no correlation
        spare_share=len(cheap) / len(table),
        spare_heads=[[h.layer, h.head] for h in cheap],
        n_heads=len(table),
    )


def head_type(labels: list[str]) -> str:
    """One colour class per head: the first label ``poslab heads`` gave it, or ``none``."""
    for prefix in ("induction", "previous-token", "positional", "punctuation"):
        for label in labels:
            if label.startswith(prefix):
                return prefix
    return "none"


def probe_model(seed: int, run_dir: Path, quick: bool) -> tuple[SeedProbe, list[HeadRow]]:
    """One trained model's probe (statistics, whole-split validation loss) and its heads' table."""
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
    features, distance = head_features(head_analysis.attention_weights(model, even_windows(tokens, n, length)))
    coords = project(features)
    clusters = two_clusters(coords["pca"])
    table = [
        HeadRow(
            h["layer"],
            h["head"],
            h["labels"],
            head_type(h["labels"]),
            float(distance[i]),
            h["mask_loss_delta"],
            clusters[i],
            coords["pca"][i],
            coords["tsne"][i],
        )
        for i, h in enumerate(analysis["heads"])
    ]
    T = model.config.block_size
    probe = SeedProbe(
        seed=seed,
        run=str(run_dir),
        corpus=RunFolder(run_dir).config()["train"]["corpus"],
        n_layer=model.config.n_layer,
        probe=Probe(n, length),
        base_loss=analysis["base_loss"],
        val_loss=evaluate_loss(model.eval(), tokens, T, max(1, 8192 // T), None),
        pca_explained=coords["pca_explained"],
        counts=analysis["counts"],
        statistics=map_statistics(table, clusters, analysis["base_loss"]),
    )
    return probe, table
