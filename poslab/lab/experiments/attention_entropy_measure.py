"""The attention-entropy experiment's measurement: every attention row's entropy, per layer, head and position,
computed per block of queries (a ``[B, h, block, keys]`` tile), so memory grows linearly with the length."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, parse_rope_scaling
from poslab.lab.experiments.cells import Evaluation
from poslab.lab.scale import EXTRAPOLATION_FACTORS as FACTORS
from poslab.lab.scale import Scale
from poslab.nn import positions
from poslab.nn.attention import AttendOptions, AttentionSpec, attend
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run

QUERY_BLOCK = 256
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


@dataclass(frozen=True)
class EntropyCell:
    """The entropy figures of one model read at one length (nats): the mean, per layer and head, by position bin,
    and over the queries in ``[L/2, L)`` and past ``L`` (raw and normalised by ``ln(number of keys)``; the
    figures past ``L`` are ``None`` at ``L`` itself)."""

    length: int
    mean: float
    per_layer_head: list[list[float]]
    bin_starts: list[int]
    by_position: list[float]
    by_position_per_layer_head: list[list[list[float]]]
    in_window: float
    in_window_normalised: float
    past_window: float | None = None
    past_window_normalised: float | None = None
    rise: float | None = None
    rise_normalised: float | None = None


@dataclass(frozen=True)
class Reading:
    """One seed's model read one way: the entropy at each factor (``"4"`` -> its cell; none past a bounded
    table), the perplexity at 1x and 4x L (``None``: cannot) and their ratio."""

    entropy: dict[str, EntropyCell]
    ppl: dict[str, float | None]
    ppl_ratio: float | None


@dataclass(frozen=True)
class Variant:
    """One scheme's models read one way (as trained, or with a scaling): every seed's reading and run folder."""

    scheme: str
    rope_scaling: dict[str, Any] | None
    logn_scaling: bool
    by_seed: dict[str, Reading]
    runs: dict[str, str]


def summarise(entropy: Tensor, train_length: int, bin_width: int) -> EntropyCell:
    """The figures of one ``[n_layer, h, T]`` entropy map: means per head, by position bin, in/past the window."""
    T = entropy.shape[-1]
    bins = list(range(0, T, bin_width))
    by_bin = torch.stack([entropy[..., b : b + bin_width].mean(-1) for b in bins], dim=-1)  # [n_layer, h, n_bins]
    norm = normalised(entropy)  # [n_layer, h, T-1], index i-1 <-> position i
    half = train_length // 2
    in_window = float(entropy[..., half:train_length].mean())
    in_normalised = float(norm[..., half - 1 : train_length - 1].mean())
    past = past_normalised = None
    if T > train_length:
        past = float(entropy[..., train_length:].mean())
        past_normalised = float(norm[..., train_length - 1 :].mean())
    return EntropyCell(
        length=T,
        mean=float(entropy.mean()),
        per_layer_head=entropy.mean(-1).tolist(),
        bin_starts=bins,
        by_position=by_bin.mean((0, 1)).tolist(),
        by_position_per_layer_head=by_bin.tolist(),
        in_window=in_window,
        in_window_normalised=in_normalised,
        past_window=past,
        past_window_normalised=past_normalised,
        rise=None if past is None else past - in_window,
        rise_normalised=None if past_normalised is None else past_normalised - in_normalised,
    )


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


def variants_of(scheme: str) -> list[tuple[str, dict[str, Any] | None, bool]]:
    """``(label, scaling overrides, log-n)`` to measure for a scheme (+ YaRN and log-n for every scheme
    that takes a context-extension scaling, i.e. implements ``rescaled_config``: the RoPE family)."""
    out = [(scheme, None, False)]
    if positions.get(scheme).rescalable():
        out += [(f"{scheme} + {suffix}", scaling, logn) for suffix, (scaling, logn) in ROPE_VARIANTS.items()]
    return out


def measure_variant(run_dir: Path, lab: Scale, scaling: dict[str, Any] | None, logn: bool, bin_width: int) -> Reading:
    """Entropy maps at every factor and perplexity at 1x and 4x L of one model read one way."""
    model, tokenizer, _ = load_run(run_dir)
    if scaling is not None or logn:
        apply_rope_scaling(model, scaling, True if logn else None, original_max_len=lab.train_length)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    entropy = {}
    for factor in FACTORS:
        length = factor * lab.train_length
        limit = model.position.max_positions
        if limit is not None and length > limit:
            continue  # a bounded table: nothing to measure past it
        idx = sample_windows(tokens, length, lab.entropy_batch)
        entropy[str(factor)] = summarise(attention_entropy(model, idx), lab.train_length, bin_width)
    ppl: dict[str, float | None] = {}
    for factor in (1, 4):
        ppl[str(factor)] = Evaluation.of(evaluate_length(model, tokens, factor * lab.train_length, lab.n_targets)).ppl()
    one, four = ppl["1"], ppl["4"]
    return Reading(entropy, ppl, None if one is None or four is None else four / one)
