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
(:mod:`poslab.analysis.heads`: previous-token, induction, positional, punctuation).

What of §6.1 can be tested, and how (deterministic records about this trained model; no seed noise is
measured, so ``n_seeds`` is 0 and the verdict is about this model):

* "local" vs "long-range" heads exist and separate: split the heads into two clusters (k-means on
  the PCA coordinates); the claim holds if the clusters' median mean-attention-distances differ by
  a factor of at least 2.
* the roles follow the head *index* (1/2 local, 5/6 long range): within each layer the head index
  would rank the mean attention distance; it holds if the Spearman correlation between index and
  distance, over all heads, is at least 0.5. (Heads are interchangeable under permutation, so an
  index carries no role unless something breaks the symmetry.)
* some heads are "spare": zeroing one raises the loss by less than 1% of the base loss for at
  least a quarter of the heads (2 of 8).
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
from poslab.lab.experiments.common import FULL_ONLY, Experiment, spearman
from poslab.lab.experiments.training import train_or_resume
from poslab.lab.report.i18n import t
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import ClaimRecord, deterministic, num
from poslab.runs import RunFolder, load_run
from poslab.training import presets
from poslab.training.config import TrainConfig

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


def train_model(out: Path, quick: bool, seed: int = 1337) -> Path:
    """Train the probed GPT into ``out/runs/head-map`` and return the run folder."""
    config = presets.preset_config(PRESET)
    config.update(QUICK if quick else FULL)
    config["model"] = {**config["model"], **MODEL}
    config.update(
        lr_decay_steps=config["max_steps"], name="head-map", out_dir=str(out / "runs"), seed=seed, threads=1
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


def map_claims(table: list[dict[str, Any]], clusters: list[int], base_loss: float) -> list[ClaimRecord]:
    """Seed 002 §6.1's testable descriptions as records (criteria in the module docstring)."""
    dist = [h["mean_distance"] for h in table]
    by_cluster = [[d for d, c in zip(dist, clusters) if c == k] for k in (0, 1)]
    medians = sorted(statistics.median(g) for g in by_cluster if g)
    ratio = medians[-1] / max(medians[0], 1e-9) if len(medians) == 2 else 1.0
    local_k = 0 if statistics.median(by_cluster[0]) <= statistics.median(by_cluster[1]) else 1
    claims = [
        deterministic(
            "the heads split into local heads and long-range heads (头1/2主要捕捉局部语法关系 … 头5/6处理长距离依赖)",
            "seed 002 §6.1",
            "two k-means clusters of the heads' PCA points; the long-range cluster's median mean attention distance is "
            f"at least {DISTANCE_FACTOR:g}x the local cluster's (error = {DISTANCE_FACTOR:g} - ratio)",
            f"clusters of {len(by_cluster[local_k])} and {len(by_cluster[1 - local_k])} heads, median mean distance "
            f"{medians[0]:.2f} vs {medians[-1]:.2f} tokens (ratio {ratio:.2f})",
            error=DISTANCE_FACTOR - ratio,
            tolerance=0.0,
            details={"cluster_medians": medians},
        )
    ]
    index = [h["head"] for h in table]
    rho = spearman([float(i) for i in index], dist)
    rho = 0.0 if math.isnan(rho) else rho  # every head at one distance: no correlation
    claims.append(
        deterministic(
            "a head's role follows its index (heads 1/2 local, 3/4 keywords, 5/6 long range, 7/8 spare)",
            "seed 002 §6.1",
            f"Spearman correlation between head index and mean attention distance over all heads >= {INDEX_RHO:g} "
            "(error = threshold - rho)",
            f"rho = {rho:.2f} over {len(table)} heads",
            error=INDEX_RHO - rho,
            tolerance=0.0,
            details={"rho": rho},
        )
    )
    cheap = [h for h in table if h["mask_loss_delta"] < SPARE_LOSS * base_loss]
    share = len(cheap) / len(table)
    claims.append(
        deterministic(
            "some heads are spare channels (头7/8充当'备用通道')",
            "seed 002 §6.1",
            f"zeroing a head raises the loss by less than {SPARE_LOSS:.0%} of the base loss for at least "
            f"{SPARE_SHARE:.0%} of the heads (error = threshold - share)",
            f"{len(cheap)} of {len(table)} heads ({share:.0%}) cost < {SPARE_LOSS:.0%} each (base loss "
            f"{base_loss:.3f})",
            error=SPARE_SHARE - share,
            tolerance=0.0,
            details={"spare_heads": [[h["layer"], h["head"]] for h in cheap]},
        )
    )
    return claims


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


def run(out: Path, quick: bool = False) -> dict:
    """Train a fresh run, probe it, project, plot, judge (on one thread, restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny GPT gains nothing from more threads, and the machine is shared
    try:
        return _run(Path(out), quick)
    finally:
        torch.set_num_threads(threads)


def _run(out: Path, quick: bool) -> dict:
    run_dir = train_model(out, quick)
    model, tokenizer, config = load_run(run_dir)
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
        title=f"heads of a {model.config.n_layer}x{N_HEAD}-head GPT ({PRESET}; base loss {analysis['base_loss']:.3f})",
    )
    claims = map_claims(table, clusters, analysis["base_loss"])
    plot = plot_map(table, coords, out / "head_map.png")
    return {
        "quick": quick,
        "run": str(run_dir),
        "probe": {"windows": n, "length": length},
        "base_loss": analysis["base_loss"],
        "pca_explained": coords["pca_explained"],
        "heads": table,
        "counts": analysis["counts"],
        "not_tested": "heads 3/4 'semantic keywords': the corpus has no word-level semantic labels",
        "claims": [c.to_dict() for c in claims],
        "plots": [str(plot)],
    }


def heads_table(r: dict) -> Table:
    """Every head of ``poslab heads``' results (``LAB/heads``): its scores, its Δloss when masked, its labels."""
    return Table(
        t("key.heads.caption", loss=num(r["base_loss"])),
        (
            *(t("key.heads." + k) for k in ("head", "prev", "induction", "offset", "confidence", "punct", "masked")),
            "|∂L/∂ξ|",
            t("key.heads.type"),
        ),
        tuple(
            (
                f"L{h['layer']}H{h['head']}",
                h["previous_token"],
                h["induction"],
                f"{h['positional_offset']:+d}",
                h["positional_confidence"],
                h.get("punctuation"),
                h["mask_loss_delta"],
                h["grad_importance"],
                ", ".join(h["labels"]) or "—",
            )
            for h in r["heads"]
        ),
    )


def pruning_table(r: dict) -> Table:
    """The loss with the least important 30% and 60% of the heads masked."""
    return Table(
        t("key.heads.prune"),
        tuple(t("key.heads." + k) for k in ("pruned", "nmasked", "loss", "increase")),
        tuple(
            (f"{share}%", p["heads_masked"], p["loss"], p["loss_increase"])
            for share, p in ((30, r["pruned_30"]), (60, r["pruned_60"]))
        ),
    )


#: the key tables of the head analysis the lab runs as a step of its own (``LAB/heads``)
HEAD_ANALYSIS_TABLES = (KeyTable("every head", heads_table), KeyTable("pruning", pruning_table))


EXPERIMENT = Experiment(
    name="head-map",
    description="each head of a trained GPT as a point: PCA / t-SNE map by layer and head type; tests seed 002 §6.1",
    tier=FULL_ONLY,
    run=run,
    estimate=(130, 1300),
)
