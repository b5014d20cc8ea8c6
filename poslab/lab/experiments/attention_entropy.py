"""Attention entropy past the training length: does it "explode"?

Seed 000 §3.5 and Q4 explain RoPE's degradation past the training length by 「注意力熵爆炸」: the
attention distribution becomes unstable and its entropy rises sharply, the model "looks everywhere".
YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071, §3.4) adds a temperature (logits scaled by
``(0.1 ln s + 1)^2``) and Chiang & Cholak 2022 ("Overcoming a Theoretical Limitation of
Self-Attention", https://arxiv.org/abs/2202.12172) scale logits by ``log n / log L`` so that entropy
does not grow with the length. This experiment measures, for each lab model (one per position
scheme, trained at ``L``; see :mod:`poslab.lab.experiments.extrapolation`), the Shannon entropy
``H_i = -sum_j a_ij ln a_ij`` (nats) of every query's attention row, per layer and head, as a function
of the query position and of the evaluation length (``1x .. 16x L``). The RoPE-family models are also
read with YaRN (factor 4) with and without its temperature, and with log-n scaling.

A uniform row over ``n`` keys has entropy ``ln n``, so some growth with the position is expected of any
model that spreads attention; the normalised entropy ``H_i / ln(i + 1)`` separates that from a real
loss of focus. Both are reported; the claim about RoPE tests the normalised one, and the variants (the
same trained models read differently) are compared paired by seed.

Attention weights are computed per block of queries (``attend(..., need_weights=True)`` on a
``[B, h, block, keys]`` tile), so memory grows linearly with the length.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, parse_rope_scaling
from poslab.display import new_figure, print_table, save_figure
from poslab.lab.experiments.common import LAB, Experiment, baseline_line, ngram_baselines, spearman, unigram_entropy
from poslab.lab.experiments.lab_models import shared_models
from poslab.lab.premises import attach, below_bigram
from poslab.lab.report.i18n import t
from poslab.lab.scale import CORPUS, SEEDS, Scale, schemes_of, size_of
from poslab.lab.scale import EXTRAPOLATION_FACTORS as FACTORS
from poslab.lab.tables import KeyTable, MeanSd, Table, print_tables
from poslab.lab.verdicts import INCONCLUSIVE, ClaimRecord, Premise, bound, mean_sd, paired, pm
from poslab.nn import positions
from poslab.nn.attention import AttendOptions, AttentionSpec, attend
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run

QUERY_BLOCK = 256
#: a rise must be smaller by more than this (nats) to count as "reduced": a hundredth of a nat, 1.4% of the
#: ln 2 a row gains by spreading evenly over twice as many keys; any reduction the papers describe is larger
MARGIN = 0.01
#: the normalised entropy H / ln(number of keys) must rise by more than this for RoPE to "lose focus" past L:
#: 1% of the way from attention on one key (0) to uniform attention (1), the same hundredth as :data:`MARGIN`
NORMALISED_MARGIN = 0.01
#: variants of the RoPE-family models: label suffix -> (--rope-scaling overrides or None, log-n)
ROPE_VARIANTS: dict[str, tuple[dict[str, Any] | None, bool]] = {
    "YaRN x4": (parse_rope_scaling("yarn:4"), False),
    "YaRN x4 no temperature": ({**parse_rope_scaling("yarn:4"), "attention_factor": 1.0}, False),
    "log-n": (None, True),
}


# ------------------------------------------------------------------------------------ measurement
def _layer_entropy(attn: Any, x: Tensor, pos: Tensor, scheme: Any, query_block: int) -> Tensor:
    """Entropy of every attention row of one layer, ``[B, h, T]`` fp32, computed per query block.

    Recomputes the layer's queries and keys as :class:`~poslab.nn.attention.MultiHeadAttention` does
    (fused projection, head split, the scheme's ``rotate``), then calls :func:`poslab.nn.attention.attend`
    with ``need_weights=True`` on ``[block, keys]`` tiles with the layer's own bias and masks.
    """
    B, T, _ = x.shape
    h, hkv, dk = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = attn.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)  # [B, T, h*dk], [B, T, hkv*dk] x2
    q, k, v = attn.split_q(q), attn.split_kv(k), attn.split_kv(v)  # [B, h|hkv, T, dk]
    if scheme is not None:
        q, k = scheme.rotate(q, k, pos, pos)
    bias_fn = attn.bias_fn(scheme)
    rows = []
    for s in range(0, T, query_block):
        e = min(s + query_block, T)
        k_end = e if attn.causal else T  # a causal block never reads keys past its last query
        _, weights = attend(
            q[:, :, s:e],
            k[:, :, :k_end],
            v[:, :, :k_end],
            pos[s:e],
            pos[:k_end],
            AttentionSpec(causal=attn.causal, window=attn.effective_window(), scale=attn.scale, bias_fn=bias_fn),
            options=AttendOptions(need_weights=True),
        )
        rows.append(torch.special.entr(weights).sum(-1))  # -sum a ln a over keys: [B, h, e-s]
    return torch.cat(rows, dim=-1)  # [B, h, T]


@torch.no_grad()
def attention_entropy(model: GPT, idx: Tensor, query_block: int = QUERY_BLOCK) -> Tensor:
    """Mean over the batch of every layer's per-head, per-query attention entropy.

    Args:
        model: a :class:`~poslab.nn.model.GPT` (run in eval mode with its usual backend; the entropies
            are computed alongside, per block of ``query_block`` queries).
        idx: token ids ``[B, T]``.

    Returns:
        ``[n_layer, h, T]`` fp32 entropies in nats.
    """
    captured: list[Tensor] = []

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        x = args[0]
        pos = args[1] if len(args) > 1 else kwargs.get("pos")
        if pos is None:
            pos = torch.arange(x.shape[1], device=x.device)
        scheme = module.position_scheme
        captured.append(_layer_entropy(module, x, pos, scheme, query_block).mean(0))  # [h, T]

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks]
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return torch.stack(captured)  # [n_layer, h, T]


def normalised(entropy: Tensor) -> Tensor:
    """``H_i / ln(i + 1)`` for query positions ``i >= 1`` (position 0 has one key: ``[..., T-1]``)."""
    T = entropy.shape[-1]
    uniform = torch.log(torch.arange(2, T + 1, dtype=torch.float32))  # ln(number of keys), [T-1]
    return entropy[..., 1:] / uniform


def summarise(entropy: Tensor, train_length: int, bin_width: int) -> dict[str, Any]:
    """Figures of one ``[n_layer, h, T]`` entropy map: means per head, by position bin, in/past the window."""
    T = entropy.shape[-1]
    layer_head = entropy.mean(-1)  # [n_layer, h]
    bins = list(range(0, T, bin_width))
    by_bin = torch.stack([entropy[..., b : b + bin_width].mean(-1) for b in bins], dim=-1)  # [n_layer, h, n_bins]
    norm = normalised(entropy)  # [n_layer, h, T-1], index i-1 <-> position i
    half = train_length // 2
    out: dict[str, Any] = {
        "length": T,
        "mean": float(entropy.mean()),
        "per_layer_head": layer_head.tolist(),
        "bin_starts": bins,
        "by_position": by_bin.mean((0, 1)).tolist(),
        "by_position_per_layer_head": by_bin.tolist(),
        "in_window": float(entropy[..., half:train_length].mean()),
        "in_window_normalised": float(norm[..., half - 1 : train_length - 1].mean()),
    }
    if T > train_length:
        out["past_window"] = float(entropy[..., train_length:].mean())
        out["past_window_normalised"] = float(norm[..., train_length - 1 :].mean())
        out["rise"] = out["past_window"] - out["in_window"]
        out["rise_normalised"] = out["past_window_normalised"] - out["in_window_normalised"]
    return out


def uniform_rise(train_length: int, factor: int) -> float:
    """The rise :func:`summarise` measures at ``factor`` x ``train_length`` for uniform attention rows.

    A query at position ``i`` reads ``i + 1`` keys, and a uniform row over them has entropy ``ln(i + 1)``:
    the mean of that past ``L`` minus its mean over ``[L/2, L)`` is what the growing key count alone
    adds to the raw rise (about ``ln 4 - 0.23`` at 4x).
    """
    entropy = torch.log(torch.arange(1, factor * train_length + 1, dtype=torch.float64))
    return float(entropy[train_length:].mean() - entropy[train_length // 2 : train_length].mean())


def sample_windows(tokens: Tensor, length: int, count: int) -> Tensor:
    """``count`` windows of ``length`` tokens evenly spread over ``tokens``, ``[count, length]``."""
    span = tokens.numel() - length
    starts = torch.linspace(0, span, count).long() if count > 1 else torch.zeros(1, dtype=torch.long)
    return tokens[starts[:, None] + torch.arange(length)[None, :]]  # [count, length]


# ------------------------------------------------------------------------------------ claims
def entropy_claims(results: dict[str, dict[str, Any]], factor: int = 4) -> list[dict[str, Any]]:
    """The claims this experiment tests, as :class:`poslab.lab.verdicts.ClaimRecord` dicts (at ``factor`` x L).

    ``results``: variant label -> ``{"by_seed": {seed: entry}}`` (an entry as :func:`measure_variant`
    returns it). The design decides the test (:mod:`poslab.lab.plan`):

    * RoPE's loss of focus past ``L`` is the rise of its *normalised* entropy ``H / ln(number of keys)``:
      a query past ``L`` at ``4 L`` reads up to 4x more keys, and a uniform row over ``n`` keys has entropy
      ``ln n``, so a raw rise near ``ln 4`` is expected of any model that spreads its attention
      (:func:`uniform_rise`: 1.15 nats for uniform rows). The raw rise is a measured number (the table's
      column, and this claim's details), not a claim. The
      per-seed normalised rises are tested against :data:`NORMALISED_MARGIN` (one-sample t).
    * The variants (YaRN with and without its temperature, log-n scaling) are the same trained models
      read differently: their rises are compared paired by seed (:func:`poslab.lab.verdicts.paired`),
      where the key counts, the model and the windows of a seed cancel.
    """
    key = str(factor)
    seeds = sorted({s for v in results.values() for s in v.get("by_seed", {})}, key=int)

    def per_seed(variant: str, field: str = "rise") -> list[float] | None:
        entries = results.get(variant, {}).get("by_seed", {})
        cells = [entries[s].get("entropy", {}).get(key) if s in entries else None for s in seeds]
        if not cells or any(c is None or field not in c for c in cells):
            return None
        return [float(c[field]) for c in cells]

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
            a,
            b,
            better_label=better,
            worse_label=worse,
            metric=f"entropy rise at {factor}x L (nats)",
            offset=MARGIN,
            criterion=criterion + " (the same models read both ways)",
            seeds=[int(s) for s in seeds],
        ).to_dict()

    out = []
    text = "plain RoPE's attention entropy past L rises more than the growing key count explains (at {}x L)"
    text = text.format(factor)
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
            normalised_rises,
            NORMALISED_MARGIN,
            below=False,
            label="rope",
            metric=f"normalised entropy rise at {factor}x L",
            criterion=criterion,
            details={"seeds": [int(s) for s in seeds], "raw_rise": raw},
        ).to_dict()
        if raw is not None:
            length = next(iter(results["rope"]["by_seed"].values()))["entropy"][key]["length"]
            uniform = uniform_rise(length // factor, factor)
            record["details"]["uniform_rise"] = uniform
            record["measured"] += f"; raw rise {pm(raw, 3)} nats (uniform rows: {uniform:.3f})"
        out.append(record)
    out.append(
        reduces(
            "YaRN's temperature reduces the entropy rise (vs the same YaRN frequencies without it)",
            "Peng et al. 2023 (YaRN §3.4)",
            "rope + YaRN x4",
            "rope + YaRN x4 no temperature",
        )
    )
    out.append(
        reduces(
            "YaRN (with its temperature) rises less than plain RoPE",
            "Peng et al. 2023 (YaRN)",
            "rope + YaRN x4",
            "rope",
        )
    )
    out.append(reduces("log-n scaling reduces the entropy rise", "Chiang & Cholak 2022", "rope + log-n", "rope"))
    rhos, rhos_normalised, counts, rho_seeds = [], [], [], []
    for seed in seeds:
        entries = [v["by_seed"][seed] for v in results.values() if seed in v.get("by_seed", {})]
        pairs = [
            (e["entropy"][key]["rise"], e["ppl_ratio"])
            for e in entries
            if key in e.get("entropy", {}) and "rise" in e["entropy"][key] and e.get("ppl_ratio") is not None
        ]
        npairs = [
            (e["entropy"][key]["rise_normalised"], e["ppl_ratio"])
            for e in entries
            if key in e.get("entropy", {}) and "rise_normalised" in e["entropy"][key] and e.get("ppl_ratio") is not None
        ]
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
            rhos,
            0.5,
            below=False,
            label="all variants",
            metric="Spearman correlation",
            criterion=criterion,
        ).to_dict()
    entry.setdefault("details", {}).update(
        spearman_normalised_rise=rhos_normalised, n_variants=counts, seeds=[int(s) for s in rho_seeds]
    )
    out.append(entry)
    return out


# ------------------------------------------------------------------------------------ run
def premise_of(record: ClaimRecord, results: dict[str, dict[str, Any]], bigram: float) -> Premise:
    """How a model spreads its attention past ``L`` says something only about a language model: every seed
    of each scheme the claim reads (as trained, without scaling) clearly below the bigram baseline at L."""
    plain = {e["scheme"]: e for e in results.values() if e["rope_scaling"] is None and not e["logn_scaling"]}
    named = [scheme for scheme in plain if scheme in str(record.details.get("label", ""))] or list(plain)
    return below_bigram(
        {scheme: [math.log(e["ppl"]["1"]) for e in plain[scheme]["by_seed"].values()] for scheme in named}, bigram
    )


def variants_of(scheme: str) -> list[tuple[str, dict[str, Any] | None, bool]]:
    """``(label, scaling overrides, log-n)`` to measure for a scheme (+ YaRN and log-n for every scheme
    that takes a context-extension scaling, i.e. implements ``rescaled_config``: the RoPE family)."""
    out = [(scheme, None, False)]
    if positions.get(scheme).rescalable():
        out += [(f"{scheme} + {suffix}", scaling, logn) for suffix, (scaling, logn) in ROPE_VARIANTS.items()]
    return out


def plot(results: dict[str, dict[str, Any]], lab: Any, path: Path) -> Path:
    """Entropy vs query position at 16x L (left) and mean entropy vs evaluation length (right)."""
    from matplotlib import colormaps

    colors = colormaps["tab20"]
    fig, axes = new_figure(1, 2, size=(14.0, 5.2))
    longest = str(max(FACTORS))
    for i, (label, entry) in enumerate(results.items()):
        style = "--" if " + " in label else "-"
        color = colors(i % 20)
        cell = entry["entropy"].get(longest)
        if cell is not None:
            xs = [
                b + (cell["bin_starts"][1] if len(cell["bin_starts"]) > 1 else 1) / 2 for b in cell["bin_starts"]
            ]  # bin centres
            axes[0].plot(xs, cell["by_position"], style, color=color, label=label, linewidth=1.2)
        lengths = [int(f) * lab.train_length for f in entry["entropy"]]
        means = [c["mean"] for c in entry["entropy"].values()]
        seeds = [
            [e["entropy"][f]["mean"] for e in entry.get("by_seed", {}).values() if f in e["entropy"]] or [m]
            for f, m in zip(entry["entropy"], means)
        ]
        yerr = [[m - min(v) for m, v in zip(means, seeds)], [max(v) - m for m, v in zip(means, seeds)]]
        axes[1].errorbar(
            lengths, means, yerr=yerr, fmt=style, color=color, marker="o", label=label, linewidth=1.2, capsize=2
        )
    T = max(FACTORS) * lab.train_length
    n = torch.arange(1, T + 1, dtype=torch.float32)
    axes[0].plot(n.tolist(), torch.log(n).tolist(), color="black", linestyle=":", linewidth=1, label="uniform (ln n)")
    axes[0].axvline(lab.train_length, color="grey", linestyle=":", linewidth=1)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("query position")
    axes[0].set_ylabel("attention entropy (nats), mean over layers and heads")
    axes[0].set_title(f"at 16x L = {T} tokens; trained at L = {lab.train_length} (dotted line)")
    axes[1].axvline(lab.train_length, color="grey", linestyle=":", linewidth=1)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("evaluation length")
    axes[1].set_ylabel("mean attention entropy (nats)")
    axes[1].set_title("mean over every query, layer and head (bars: min..max over seeds)")
    axes[1].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)


def measure_variant(
    run_dir: Path, lab: Any, scaling: dict[str, Any] | None, logn: bool, bin_width: int
) -> dict[str, Any]:
    """Entropy maps at every factor and perplexity at 1x and 4x L of one model read one way."""
    model, tokenizer, config = load_run(run_dir)
    if scaling is not None or logn:
        apply_rope_scaling(model, scaling, True if logn else None, original_max_len=lab.train_length)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    entry: dict[str, Any] = {"entropy": {}}
    for factor in FACTORS:
        length = factor * lab.train_length
        limit = model.position.max_positions
        if limit is not None and length > limit:
            continue  # a bounded table: nothing to measure past it
        idx = sample_windows(tokens, length, lab.entropy_batch)
        entry["entropy"][str(factor)] = summarise(attention_entropy(model, idx), lab.train_length, bin_width)
    ppl = {}
    for factor in (1, 4):
        cell = evaluate_length(model, tokens, factor * lab.train_length, lab.n_targets)
        ppl[str(factor)] = None if "cannot" in cell else cell["nonoverlapping"]["ppl"]
    entry["ppl"] = ppl
    entry["ppl_ratio"] = None if None in ppl.values() else ppl["4"] / ppl["1"]
    return entry


_SCALARS = (
    "mean",
    "in_window",
    "in_window_normalised",
    "past_window",
    "past_window_normalised",
    "rise",
    "rise_normalised",
)


def mean_entry(by_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The seeds' entries averaged: scalar entropy figures and ``by_position`` (mean), with each scalar's sd."""
    entries = list(by_seed.values())
    out: dict[str, Any] = {"entropy": {}}
    for key in entries[0]["entropy"]:
        cells = [e["entropy"][key] for e in entries if key in e["entropy"]]
        cell: dict[str, Any] = {k: cells[0][k] for k in ("length", "bin_starts")}
        for field in _SCALARS:
            if all(field in c for c in cells):
                mean, sd = mean_sd([c[field] for c in cells])
                cell[field], cell[f"{field}_sd"] = mean, sd
        cell["by_position"] = [sum(v) / len(v) for v in zip(*(c["by_position"] for c in cells))]
        out["entropy"][key] = cell
    ratios = [e["ppl_ratio"] for e in entries if e.get("ppl_ratio") is not None]
    out["ppl_ratio"] = sum(ratios) / len(ratios) if len(ratios) == len(entries) else None
    out["ppl_ratio_sd"] = mean_sd(ratios)[1] if out["ppl_ratio"] is not None else None
    return out


def run(
    out: Path,
    quick: bool = False,
    size: str | Scale | None = None,
    schemes: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] = SEEDS,
    workers: int | None = None,
) -> dict:
    """Measure entropies (and perplexity at L and 4x L) of every lab model, seed and variant; table, plot, claims.

    ``schemes``: ``None`` for the size's (:func:`poslab.lab.scale.schemes_of`).
    """
    lab = size_of(quick, size)
    schemes = schemes_of(lab) if schemes is None else tuple(schemes)
    out = Path(out)
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    bin_width = max(1, lab.train_length // 2)
    run_dirs = shared_models(schemes, lab, out, EXPERIMENT.reuses, tuple(seeds), workers)
    for scheme in schemes:
        for label, scaling, logn in variants_of(scheme):
            by_seed = {
                str(seed): measure_variant(run_dir, lab, scaling, logn, bin_width)
                for seed, run_dir in run_dirs[scheme].items()
            }
            entry = {
                "scheme": scheme,
                "rope_scaling": scaling,
                "logn_scaling": logn,
                **mean_entry(by_seed),
                "by_seed": by_seed,
                "runs": {str(seed): str(d) for seed, d in run_dirs[scheme].items()},
            }
            results[label] = entry

    headers = (
        ["model"]
        + [f"{f}x" for f in FACTORS]
        + ["in [L/2,L) @4x", "past L @4x", "rise @4x", "norm. rise @4x", "ppl 4x/1x"]
    )
    rows = []
    for label, entry in results.items():
        cells = entry["entropy"]
        four = cells.get("4", {})
        rows.append(
            [label]
            + [f"{cells[str(f)]['mean']:.3f}" if str(f) in cells else "cannot" for f in FACTORS]
            + [
                f"{four.get('in_window', cells['1']['in_window']):.3f}",
                f"{four['past_window']:.3f}" if "past_window" in four else "-",
                f"{four['rise']:+.3f}" if "rise" in four else "-",
                f"{four['rise_normalised']:+.3f}" if "rise_normalised" in four else "-",
                f"{entry['ppl_ratio']:.3f}" if entry["ppl_ratio"] is not None else "-",
            ]
        )
    print_table(
        headers,
        rows,
        title=f"mean attention entropy (nats) per evaluation length; trained at L={lab.train_length} "
        f"({lab.entropy_batch} sequences per length; means over {len(seeds)} seeds)",
    )
    shown = {"models": results, "factors": list(FACTORS), "seeds": list(seeds)}
    print_tables(EXPERIMENT.name, EXPERIMENT.tables, shown)
    print(baseline_line(CORPUS))
    bigram = ngram_baselines(CORPUS)["bigram"]
    claims = attach(entropy_claims(results), lambda record: premise_of(record, results, bigram))
    figure = plot(results, lab, out / "attention_entropy.png")
    return {
        "experiment": EXPERIMENT.name,
        "size": dataclasses.asdict(lab),
        "train_length": lab.train_length,
        "factors": list(FACTORS),
        "bin_width": bin_width,
        "query_block": QUERY_BLOCK,
        "seeds": list(seeds),
        "corpus": CORPUS,
        "unigram_entropy_nats": unigram_entropy(CORPUS),
        "ngram_baselines": ngram_baselines(CORPUS),
        "models": results,
        "claims": claims,
        "figure": str(figure),
        "seconds": time.perf_counter() - start,
    }


def entropy_table(r: dict) -> Table:
    """Mean attention entropy per model and evaluation length, with the raw and the normalised rise at 4×L and the
    perplexity ratio as mean ± sd over seeds (the raw rise is a measured number: :func:`entropy_claims` tests the
    normalised one)."""
    rows = []
    for label, entry in r["models"].items():
        cells = entry["entropy"]
        by_seed = (entry.get("by_seed") or {}).values()
        four = [e.get("entropy", {}).get("4", {}) for e in by_seed]
        rises = [c["rise"] for c in four if "rise" in c]
        normalised = [c["rise_normalised"] for c in four if "rise_normalised" in c]
        ratios = [e["ppl_ratio"] for e in by_seed if e.get("ppl_ratio") is not None]
        rows.append(
            (label, *(cells.get(str(f), {}).get("mean", "cannot") for f in r["factors"]))
            + (
                MeanSd.of(rises) or cells.get("4", {}).get("rise"),
                MeanSd.of(normalised) or cells.get("4", {}).get("rise_normalised"),
                MeanSd.of(ratios) or entry.get("ppl_ratio"),
            )
        )
    return Table(
        t("key.entropy.caption", seeds=r.get("seeds")),
        (
            t("key.model"),
            *(f"{f}×L" for f in r["factors"]),
            t("key.entropy.rise"),
            "H / ln n rise at 4×L",
            "ppl 4×L / L",
        ),
        tuple(rows),
    )


EXPERIMENT = Experiment(
    name="attention-entropy",
    description="attention entropy vs query position and length, per scheme, with/without YaRN temperature and log-n "
    "(seed 000 §3.5)",
    tier=LAB,
    run=run,
    reuses=("extrapolation", "position-training"),
    estimate=(15, 900),
    tables=(KeyTable("attention entropy by length", entropy_table),),
)
