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
loss of focus. Both are reported.

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
from poslab.lab.experiments.extrapolation import (
    FACTORS,
    SCHEMES,
    claim,
    load_model,
    print_claims,
    shared_model,
    size_of,
)
from poslab.nn import positions
from poslab.nn.attention import attend
from poslab.nn.model import GPT
from poslab.runs import RunFolder

NAME = "attention-entropy"
DESCRIPTION = "attention entropy vs query position and length, per scheme, with/without YaRN temperature and log-n (seed 000 §3.5)"
IN_ALL = False  # trains ten models (or reuses the extrapolation experiment's)

QUERY_BLOCK = 256
#: a rise must be smaller by more than this (nats) to count as "reduced"
MARGIN = 0.01
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
        _, weights = attend(q[:, :, s:e], k[:, :, :k_end], v[:, :, :k_end], pos[s:e], pos[:k_end], causal=attn.causal,
                            window=attn.effective_window(), bias_fn=bias_fn, scale=attn.scale, need_weights=True)
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
        scheme = kwargs.get("position") or module.position
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


def sample_windows(tokens: Tensor, length: int, count: int) -> Tensor:
    """``count`` windows of ``length`` tokens evenly spread over ``tokens``, ``[count, length]``."""
    span = tokens.numel() - length
    starts = torch.linspace(0, span, count).long() if count > 1 else torch.zeros(1, dtype=torch.long)
    return tokens[starts[:, None] + torch.arange(length)[None, :]]  # [count, length]


# ------------------------------------------------------------------------------------ claims
def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var > 0 else float("nan")


def entropy_claims(results: dict[str, dict[str, Any]], factor: int = 4) -> list[dict[str, Any]]:
    """The claims this experiment tests, with figures and verdicts (at ``factor`` x L)."""
    key = str(factor)

    def at(variant: str) -> dict[str, Any] | None:
        cell = results.get(variant, {}).get("entropy", {}).get(key)
        return cell if cell and "rise" in cell else None

    out = []
    rope = at("rope")
    out.append(claim(f"plain RoPE's attention entropy past L rises above its in-length value (at {factor}x L)",
                     "seed 000 §3.5, Q4 (注意力熵爆炸)", f"mean entropy of queries past L > of queries in [L/2, L) + {MARGIN} nats",
                     {} if rope is None else {"in_window": rope["in_window"], "past_window": rope["past_window"], "rise": rope["rise"]},
                     None if rope is None else rope["rise"] > MARGIN))
    out.append(claim("the rise is more than the growing key count explains (normalised entropy H/ln n rises too)",
                     "seed 000 Q4 (注意力分布变得均匀或混乱)", "normalised entropy past L > in [L/2, L) + 0.01",
                     {} if rope is None else {"in_window": rope["in_window_normalised"], "past_window": rope["past_window_normalised"],
                                              "rise": rope["rise_normalised"]},
                     None if rope is None else rope["rise_normalised"] > 0.01))
    yarn, no_temp, logn = at("rope + YaRN x4"), at("rope + YaRN x4 no temperature"), at("rope + log-n")
    out.append(claim("YaRN's temperature reduces the entropy rise (vs the same YaRN frequencies without it)",
                     "Peng et al. 2023 (YaRN §3.4)", f"rise(YaRN) < rise(YaRN, attention factor 1) - {MARGIN} nats",
                     {} if None in (yarn, no_temp) else {"rise_yarn": yarn["rise"], "rise_no_temperature": no_temp["rise"]},
                     None if None in (yarn, no_temp) else yarn["rise"] < no_temp["rise"] - MARGIN))
    out.append(claim("YaRN (with its temperature) rises less than plain RoPE", "Peng et al. 2023 (YaRN)",
                     f"rise(YaRN) < rise(plain RoPE) - {MARGIN} nats",
                     {} if None in (yarn, rope) else {"rise_yarn": yarn["rise"], "rise_rope": rope["rise"]},
                     None if None in (yarn, rope) else yarn["rise"] < rope["rise"] - MARGIN))
    out.append(claim("log-n scaling reduces the entropy rise", "Chiang & Cholak 2022",
                     f"rise(log-n) < rise(plain RoPE) - {MARGIN} nats",
                     {} if None in (logn, rope) else {"rise_logn": logn["rise"], "rise_rope": rope["rise"]},
                     None if None in (logn, rope) else logn["rise"] < rope["rise"] - MARGIN))
    pairs = [(v["entropy"][key]["rise"], v["ppl_ratio"]) for v in results.values()
             if key in v.get("entropy", {}) and "rise" in v["entropy"][key] and v.get("ppl_ratio") is not None]
    rho = spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) >= 3 else None
    normalised_pairs = [(v["entropy"][key]["rise_normalised"], v["ppl_ratio"]) for v in results.values()
                        if key in v.get("entropy", {}) and "rise_normalised" in v["entropy"][key] and v.get("ppl_ratio") is not None]
    rho_normalised = spearman([p[0] for p in normalised_pairs], [p[1] for p in normalised_pairs]) if len(normalised_pairs) >= 3 else None
    out.append(claim("the entropy rise is what degrades perplexity: across models, larger rises go with larger perplexity ratios",
                     "seed 000 §3.5 (degradation 'because' of the entropy explosion)",
                     f"Spearman rank correlation of rise({factor}L) and ppl({factor}L)/ppl(L) across all variants > 0.5",
                     {"spearman": rho, "spearman_normalised_rise": rho_normalised, "n_variants": len(pairs)},
                     None if rho is None or math.isnan(rho) else rho > 0.5))
    return out


# ------------------------------------------------------------------------------------ run
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
            xs = [b + (cell["bin_starts"][1] if len(cell["bin_starts"]) > 1 else 1) / 2 for b in cell["bin_starts"]]  # bin centres
            axes[0].plot(xs, cell["by_position"], style, color=color, label=label, linewidth=1.2)
        lengths = [int(f) * lab.train_length for f in entry["entropy"]]
        axes[1].plot(lengths, [c["mean"] for c in entry["entropy"].values()], style, color=color, marker="o", label=label, linewidth=1.2)
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
    axes[1].set_title("mean over every query, layer and head")
    axes[1].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)


def run(out: Path, quick: bool = False, size: str | None = None, schemes: tuple[str, ...] = SCHEMES) -> dict:
    """Measure entropies (and perplexity at L and 4x L) of every lab model and variant; table, plot, claims."""
    lab = size_of(quick, size)
    out = Path(out)
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    bin_width = max(1, lab.train_length // 2)
    for scheme in schemes:
        run_dir = shared_model(scheme, lab, out)
        for label, scaling, logn in variants_of(scheme):
            model, tokenizer, config = load_model(run_dir)
            if scaling is not None or logn:
                apply_rope_scaling(model, scaling, True if logn else None, original_max_len=lab.train_length)
            tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
            entry: dict[str, Any] = {"scheme": scheme, "rope_scaling": scaling, "logn_scaling": logn, "entropy": {}}
            for factor in FACTORS:
                length = factor * lab.train_length
                limit = model.position.max_positions
                if limit is not None and length > limit:
                    continue  # a learned table: nothing to measure past it
                idx = sample_windows(tokens, length, lab.entropy_batch)
                entry["entropy"][str(factor)] = summarise(attention_entropy(model, idx), lab.train_length, bin_width)
            ppl = {}
            for factor in (1, 4):
                cell = evaluate_length(model, tokens, factor * lab.train_length, lab.n_targets)
                ppl[str(factor)] = None if "cannot" in cell else cell["nonoverlapping"]["ppl"]
            entry["ppl"] = ppl
            entry["ppl_ratio"] = None if None in ppl.values() else ppl["4"] / ppl["1"]
            results[label] = entry

    headers = ["model"] + [f"{f}x" for f in FACTORS] + ["in [L/2,L) @4x", "past L @4x", "rise @4x", "norm. rise @4x", "ppl 4x/1x"]
    rows = []
    for label, entry in results.items():
        cells = entry["entropy"]
        four = cells.get("4", {})
        rows.append([label] + [f"{cells[str(f)]['mean']:.3f}" if str(f) in cells else "cannot" for f in FACTORS]
                    + [f"{four.get('in_window', cells['1']['in_window']):.3f}",
                       f"{four['past_window']:.3f}" if "past_window" in four else "-",
                       f"{four['rise']:+.3f}" if "rise" in four else "-",
                       f"{four['rise_normalised']:+.3f}" if "rise_normalised" in four else "-",
                       f"{entry['ppl_ratio']:.3f}" if entry["ppl_ratio"] is not None else "-"])
    print_table(headers, rows, title=f"mean attention entropy (nats) per evaluation length; trained at L={lab.train_length} "
                                     f"({lab.entropy_batch} sequences per length)")
    claims = entropy_claims(results)
    print_claims(claims)
    figure = plot(results, lab, out / "attention_entropy.png")
    return {
        "experiment": NAME,
        "size": dataclasses.asdict(lab),
        "train_length": lab.train_length,
        "factors": list(FACTORS),
        "bin_width": bin_width,
        "query_block": QUERY_BLOCK,
        "models": results,
        "claims": claims,
        "figure": str(figure),
        "seconds": time.perf_counter() - start,
    }
