"""What each attention head does: head-type detection and head importance on any poslab GPT.

Head types (scores in [0, 1], one per layer and head):

* **previous-token** score: mean attention from position ``i`` to ``i - 1`` on real text.
* **induction** score (Olsson et al. 2022, "In-context Learning and Induction Heads",
  https://arxiv.org/abs/2209.11895): on a random token sequence repeated twice, the mean attention
  from each token of the second copy to the token that *followed* its earlier occurrence
  (prefix matching). Induction heads need two or more layers.
* **sink rate** (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
  https://arxiv.org/abs/2309.17453): the mean attention weight on the first token (key position 0)
  over queries ``i >= 1`` (query 0 has no other key) on real text. Heads at or above
  :data:`SINK_THRESHOLD` are labelled "sink".
* **positional** heads (Voita et al. 2019, "Analyzing Multi-Head Self-Attention",
  https://arxiv.org/abs/1905.09418): heads whose strongest key sits at one fixed relative offset
  for at least 90% of queries. The offset and that fraction (the confidence) are reported.

Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?",
https://arxiv.org/abs/1905.10650): the loss change when one head's output is zeroed
(the ``head_mask`` of :class:`~poslab.nn.attention.MultiHeadAttention`), Michel's gradient proxy
``I_h = E|dL/d xi_h|`` (``xi`` the head mask at 1), and the loss after pruning the least important
heads (30% and 60% of them, and a full curve against a random pruning order).

Everything here is computed from the model; nothing is looked up.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from poslab.nn.attention import use_backend
from poslab.nn.model import GPT

PREV_TOKEN_THRESHOLD = 0.5  # mean attention to i-1 to call a head previous-token
INDUCTION_THRESHOLD = 0.3  # mean prefix-matching attention to call a head an induction head
POSITIONAL_THRESHOLD = 0.9  # fraction of queries whose argmax key sits at the head's offset (Voita)
PUNCTUATION_THRESHOLD = 0.5  # mean attention mass on punctuation keys to call a head a punctuation head
SINK_THRESHOLD = 0.5  # mean attention on the first token to call a head a sink head (Xiao et al. 2023)
PUNCTUATION = "，。！？；：、,.!?;:"
PRUNE_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


# ------------------------------------------------------------------------------------ weights, masks
_CAPTURE_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_CAPTURE_LOCKS_GUARD = threading.Lock()


def capture_lock(model: torch.nn.Module) -> threading.Lock:
    """The lock that serialises captures of ``model``'s attention (forward hooks are shared by every thread)."""
    with _CAPTURE_LOCKS_GUARD:
        lock = _CAPTURE_LOCKS.get(model)
        if lock is None:
            lock = _CAPTURE_LOCKS[model] = threading.Lock()
        return lock


@torch.no_grad()
def attention_weights(model: GPT, idx: Tensor) -> list[Tensor]:
    """Attention weights of every layer for token ids ``idx [B, T]``.

    Runs the model once with the eager backend and reads each layer's ``scores_probe``.

    Returns:
        One ``[B, h, T, T]`` fp32 tensor per layer (rows sum to 1; GQA heads already expanded).
    """
    captured: list[Tensor] = []
    with capture_lock(model):  # the hooks see every forward of the model: one capture at a time
        handles = [
            block.attn.scores_probe.register_forward_hook(lambda _m, _i, out: captured.append(out.detach().float()))
            for block in model.blocks
        ]
        was_training = model.training
        model.eval()
        try:
            with use_backend(model, "eager"):
                model(idx)
        finally:
            for handle in handles:
                handle.remove()
            model.train(was_training)
    if len(captured) != len(model.blocks):
        raise RuntimeError(f"captured {len(captured)} attention maps for {len(model.blocks)} layers")
    return captured


@contextlib.contextmanager
def masked_heads(model: GPT, mask: Tensor) -> Iterator[None]:
    """Inside the block, layer ``l`` multiplies head ``h``'s output by ``mask[l, h]``.

    Args:
        model: the GPT.
        mask: ``[n_layer, n_head]`` floating point (may require grad).
    """
    n_layer, n_head = len(model.blocks), model.config.n_head
    if tuple(mask.shape) != (n_layer, n_head):
        raise ValueError(f"head mask must have shape [{n_layer}, {n_head}] (layers, heads), got {list(mask.shape)}")

    for i, block in enumerate(model.blocks):
        block.attn.head_mask = mask[i]
    try:
        yield
    finally:
        for block in model.blocks:
            block.attn.head_mask = None


def mean_loss(model: GPT, batches: list[tuple[Tensor, Tensor]], mask: Tensor | None = None) -> float:
    """Mean next-token loss over ``(idx, targets)`` batches, optionally with a head mask ``[L, h]``."""
    model.eval()
    total, count = 0.0, 0
    context = masked_heads(model, mask) if mask is not None else contextlib.nullcontext()
    with torch.no_grad(), context:
        for idx, targets in batches:
            _, loss = model(idx, targets)
            total += float(loss) * idx.numel()
            count += idx.numel()
    return total / count


# ------------------------------------------------------------------------------------ head types
def previous_token_scores(weights: list[Tensor]) -> Tensor:
    """Mean attention from position ``i`` to ``i - 1`` (queries ``i >= 1``), ``[L, h]``."""
    scores = []
    for w in weights:  # [B, h, T, T]
        T = w.shape[-1]
        rows = torch.arange(1, T)
        scores.append(w[:, :, rows, rows - 1].mean(dim=(0, 2)))  # [B, h, T-1] -> [h]
    return torch.stack(scores)


def sink_scores(weights: list[Tensor]) -> Tensor:
    """Sink rate (Xiao et al. 2023): mean attention on key position 0 over queries ``i >= 1``, ``[L, h]``.

    Args:
        weights: per-layer ``[B, h, T, T]`` attention weights (``T >= 2``).
    """
    scores = []
    for w in weights:  # [B, h, T, T]
        if w.shape[-1] < 2:
            raise ValueError(f"sink rates need sequences of at least 2 tokens, got T={w.shape[-1]}")
        scores.append(w[:, :, 1:, 0].mean(dim=(0, 2)))  # [B, h, T-1] -> [h]
    return torch.stack(scores)


def punctuation_ids(tokenizer: Any) -> list[int]:
    """Ids of the punctuation marks (:data:`PUNCTUATION`) that are single tokens of ``tokenizer``."""
    ids = set()
    for mark in PUNCTUATION:
        try:
            encoded = tokenizer.encode(mark)
        except ValueError:  # not in a char vocabulary
            continue
        if len(encoded) == 1:
            ids.add(int(encoded[0]))
    return sorted(ids)


def punctuation_scores(weights: list[Tensor], idx: Tensor, marks: list[int]) -> Tensor:
    """Mean attention mass on punctuation keys, over queries that have one in view, ``[L, h]``.

    Seed 000 Q1: some heads attend to the full stop (「句号」). Returns zeros when ``marks`` is empty.

    Args:
        weights: per-layer ``[B, h, T, T]`` attention weights of the token ids ``idx [B, T]``.
        marks: punctuation token ids.
    """
    L, h = len(weights), weights[0].shape[1]
    if not marks:
        return torch.zeros(L, h)
    is_mark = torch.isin(idx, torch.tensor(marks)).float()  # [B, T]
    seen = is_mark.cumsum(dim=1) > 0  # [B, T]: a punctuation key at or before the query
    if not seen.any():
        return torch.zeros(L, h)
    scores = []
    for w in weights:
        mass = (w * is_mark[:, None, None, :]).sum(-1)  # [B, h, T]
        scores.append(mass.permute(1, 0, 2)[:, seen].mean(-1))  # [h, B, T] -> [h, n] -> [h]
    return torch.stack(scores)


def repeated_random_tokens(vocab_size: int, half: int, batch: int, generator: torch.Generator) -> Tensor:
    """``[batch, 2*half]``: ``half`` random tokens (distinct within a row) followed by the same tokens again."""
    if half < 2:
        raise ValueError(f"the repeated sequence needs at least 2 tokens per copy, got {half}")
    if half > vocab_size:
        raise ValueError(f"cannot draw {half} distinct tokens from a vocabulary of {vocab_size}")
    first = torch.stack([torch.randperm(vocab_size, generator=generator)[:half] for _ in range(batch)])  # [B, half]
    return torch.cat([first, first], dim=1)  # [B, 2*half]


def induction_scores(weights: list[Tensor], half: int) -> Tensor:
    """Prefix-matching score (Olsson et al. 2022) on a sequence repeated twice, ``[L, h]``.

    Query ``i = half + j`` (token ``r_j`` of the second copy) should attend to key ``j + 1``, the
    token that followed ``r_j``'s first occurrence.
    """
    j = torch.arange(half)
    queries, keys = half + j, j + 1
    return torch.stack([w[:, :, queries, keys].mean(dim=(0, 2)) for w in weights])  # [B, h, half] -> [h]


def positional_scores(weights: list[Tensor], min_query: int = 4) -> tuple[Tensor, Tensor]:
    """Each head's most frequent argmax offset and the fraction of queries at it (Voita et al. 2019).

    Args:
        weights: per-layer ``[B, h, T, T]`` attention weights (causal: offsets are ``i - j >= 0``).
        min_query: skip the first queries, whose few keys make any offset look fixed.

    Returns:
        ``(offset [L, h] int64, confidence [L, h])``.
    """
    offsets, confidences = [], []
    for w in weights:
        T = w.shape[-1]
        if T <= min_query:
            raise ValueError(f"positional scores need sequences longer than min_query={min_query}, got T={T}")
        query_pos = torch.arange(min_query, T)
        argmax_key = w[:, :, min_query:, :].argmax(dim=-1)  # [B, h, T-min_query]
        offset = query_pos - argmax_key  # [B, h, Tq]
        B, h, Tq = offset.shape
        flat = offset.permute(1, 0, 2).reshape(h, B * Tq)  # [h, B*Tq]
        mode = flat.mode(dim=1).values  # [h]
        offsets.append(mode)
        confidences.append((flat == mode[:, None]).float().mean(dim=1))
    return torch.stack(offsets), torch.stack(confidences)


# ------------------------------------------------------------------------------------ importance
def masking_importance(model: GPT, batches: list[tuple[Tensor, Tensor]]) -> tuple[float, Tensor]:
    """Loss with all heads, and the loss increase when each head alone is masked, ``[L, h]``."""
    n_layer, n_head = len(model.blocks), model.config.n_head
    base = mean_loss(model, batches)
    delta = torch.zeros(n_layer, n_head)
    for layer in range(n_layer):
        for head in range(n_head):
            mask = torch.ones(n_layer, n_head)
            mask[layer, head] = 0.0
            delta[layer, head] = mean_loss(model, batches, mask) - base
    return base, delta


def gradient_importance(model: GPT, batches: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Michel et al.'s proxy ``I_h = E_x |dL/d xi_h|`` at ``xi = 1``, ``[L, h]``."""
    n_layer, n_head = len(model.blocks), model.config.n_head
    model.eval()
    importance = torch.zeros(n_layer, n_head)
    for idx, targets in batches:
        mask = torch.ones(n_layer, n_head, requires_grad=True)
        with masked_heads(model, mask):
            _, loss = model(idx, targets)
        (grad,) = torch.autograd.grad(loss, mask)
        importance += grad.abs()
    return importance / len(batches)


def pruning_curve(
    model: GPT,
    batches: list[tuple[Tensor, Tensor]],
    order: list[tuple[int, int]],
    fractions: tuple[float, ...] = PRUNE_FRACTIONS,
) -> list[float]:
    """Loss after masking the first ``round(f * n_heads)`` heads of ``order``, for each fraction ``f``."""
    n_layer, n_head = len(model.blocks), model.config.n_head
    losses = []
    for fraction in fractions:
        mask = torch.ones(n_layer, n_head)
        for layer, head in order[: round(fraction * len(order))]:
            mask[layer, head] = 0.0
        losses.append(mean_loss(model, batches, mask))
    return losses


# ------------------------------------------------------------------------------------ all together
def text_batches(
    tokens: Tensor, block_size: int, n_batches: int, batch_size: int, generator: torch.Generator
) -> list[tuple[Tensor, Tensor]]:
    """Random ``(idx, targets)`` windows ``[batch_size, block_size]`` from a 1-D token tensor."""
    if tokens.dim() != 1 or tokens.numel() < block_size + 2:
        raise ValueError(
            f"evaluation text must hold more than block_size+1={block_size + 1} tokens, got {tokens.numel()}"
        )
    batches = []
    for _ in range(n_batches):
        starts = torch.randint(0, tokens.numel() - block_size - 1, (batch_size,), generator=generator)
        idx = torch.stack([tokens[s : s + block_size] for s in starts.tolist()])  # [B, T]
        targets = torch.stack([tokens[s + 1 : s + block_size + 1] for s in starts.tolist()])  # [B, T]
        batches.append((idx, targets))
    return batches


def head_labels(
    prev: float, induction: float, offset: int, confidence: float, punctuation: float = 0.0, sink: float = 0.0
) -> list[str]:
    """Names for one head from its scores (thresholds are the module constants)."""
    labels = []
    if prev >= PREV_TOKEN_THRESHOLD:
        labels.append("previous-token")
    if induction >= INDUCTION_THRESHOLD:
        labels.append("induction")
    if confidence >= POSITIONAL_THRESHOLD and not (offset == 1 and "previous-token" in labels):
        labels.append(f"positional (offset {offset})")
    if punctuation >= PUNCTUATION_THRESHOLD:
        labels.append("punctuation")
    if sink >= SINK_THRESHOLD:
        labels.append("sink")
    return labels


def analyze(
    model: GPT,
    tokens: Tensor,
    *,
    seq_len: int | None = None,
    n_batches: int = 4,
    batch_size: int = 16,
    induction_half: int | None = None,
    punctuation: list[int] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Detect head types and measure head importance.

    Args:
        model: a trained (or untrained) :class:`~poslab.nn.model.GPT`.
        tokens: evaluation text as token ids ``[N]`` (held-out text of the model's corpus).
        seq_len: window length (default: the model's ``block_size``).
        n_batches, batch_size: evaluation windows for losses and scores.
        induction_half: length of each copy of the repeated random sequence (default ``seq_len // 2``);
            the induction score averages this period, 3/4 of it and 1/2 of it, so a head that merely
            attends to one fixed offset does not pass for an induction head.
        punctuation: token ids of punctuation marks (:func:`punctuation_ids`) for the punctuation score.
        seed: for the windows, the random tokens and the random pruning orders.

    Returns:
        A JSON-serialisable dict (see ``docs/lab.md``): per-head scores and labels, the base loss,
        the pruning curves and the losses at 30% / 60% pruned.
    """
    cfg = model.config
    seq_len = seq_len or cfg.block_size
    half = induction_half or seq_len // 2
    generator = torch.Generator().manual_seed(seed)
    batches = text_batches(tokens, seq_len, n_batches, batch_size, generator)

    text_weights = [torch.cat(ws) for ws in zip(*(attention_weights(model, idx) for idx, _ in batches))]
    prev = previous_token_scores(text_weights)
    punct = punctuation_scores(text_weights, torch.cat([idx for idx, _ in batches]), punctuation or [])
    offset, confidence = positional_scores(text_weights)
    sink = sink_scores(text_weights)
    # three periods: a head attending to one fixed offset (positional) cannot score high on all of them
    periods = sorted({half, max(2, (3 * half) // 4), max(2, half // 2)}, reverse=True)
    per_period = {}
    for period in periods:
        repeated = repeated_random_tokens(cfg.vocab_size, period, batch_size, generator)
        per_period[period] = induction_scores(attention_weights(model, repeated), period)
        if period == half:
            repeat_losses = _repeat_losses(model, repeated, half)
    induction = torch.stack(list(per_period.values())).mean(dim=0)  # [L, h]

    base, delta = masking_importance(model, batches)
    grad = gradient_importance(model, batches)
    heads = [(layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)]
    by_importance = sorted(heads, key=lambda lh: float(delta[lh]))  # least important first
    curve = pruning_curve(model, batches, by_importance)
    random_curves = []
    for _ in range(3):
        shuffled = [heads[i] for i in torch.randperm(len(heads), generator=generator).tolist()]
        random_curves.append(pruning_curve(model, batches, shuffled))
    random_curve = [sum(c) / len(c) for c in zip(*random_curves)]

    table = []
    for layer, head in heads:
        p, ind, off, conf = (
            float(prev[layer, head]),
            float(induction[layer, head]),
            int(offset[layer, head]),
            float(confidence[layer, head]),
        )
        mark, sink_rate = float(punct[layer, head]), float(sink[layer, head])
        table.append(
            {
                "layer": layer,
                "head": head,
                "previous_token": p,
                "induction": ind,
                "induction_by_period": {str(period): float(score[layer, head]) for period, score in per_period.items()},
                "positional_offset": off,
                "positional_confidence": conf,
                "punctuation": mark,
                "sink_rate": sink_rate,
                "mask_loss_delta": float(delta[layer, head]),
                "grad_importance": float(grad[layer, head]),
                "labels": head_labels(p, ind, off, conf, mark, sink_rate),
            }
        )
    counts = {
        "previous-token": sum("previous-token" in h["labels"] for h in table),
        "induction": sum("induction" in h["labels"] for h in table),
        "positional": sum(any(x.startswith("positional") for x in h["labels"]) for h in table),
        "punctuation": sum("punctuation" in h["labels"] for h in table),
        "sink": sum("sink" in h["labels"] for h in table),
    }
    # uniform causal attention puts 1/(i+1) on key 0 at query i: the sink rate a head with no
    # preference for the first token would show, for reading the per-head rates
    uniform_sink = float((1.0 / torch.arange(2, seq_len + 1, dtype=torch.float64)).mean())
    index = {f: i for i, f in enumerate(PRUNE_FRACTIONS)}
    return {
        "model": {
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_embd": cfg.n_embd,
            "position": cfg.position,
            "vocab_size": cfg.vocab_size,
        },
        "eval": {
            "seq_len": seq_len,
            "n_batches": n_batches,
            "batch_size": batch_size,
            "induction_periods": periods,
            "seed": seed,
        },
        "thresholds": {
            "previous_token": PREV_TOKEN_THRESHOLD,
            "induction": INDUCTION_THRESHOLD,
            "positional": POSITIONAL_THRESHOLD,
            "punctuation": PUNCTUATION_THRESHOLD,
            "sink": SINK_THRESHOLD,
        },
        "sink_rate_uniform": uniform_sink,
        "punctuation_ids": list(punctuation or []),
        "punctuation_share_of_keys": float(torch.isin(tokens, torch.tensor(punctuation or [-1])).float().mean()),
        "base_loss": base,
        "repeat_loss": repeat_losses,
        "heads": table,
        "counts": counts,
        "pruning": {
            "fractions": list(PRUNE_FRACTIONS),
            "loss_by_importance": curve,
            "loss_random_order": random_curve,
            "order": [list(lh) for lh in by_importance],
        },
        "pruned_30": {
            "fraction": 0.3,
            "heads_masked": round(0.3 * len(heads)),
            "loss": curve[index[0.3]],
            "loss_increase": curve[index[0.3]] - base,
        },
        "pruned_60": {
            "fraction": 0.6,
            "heads_masked": round(0.6 * len(heads)),
            "loss": curve[index[0.6]],
            "loss_increase": curve[index[0.6]] - base,
        },
        "rank_agreement": _spearman(delta.flatten(), grad.flatten()),
    }


@torch.no_grad()
def _repeat_losses(model: GPT, repeated: Tensor, half: int) -> dict[str, float]:
    """Loss on the first vs the second copy of the repeated random sequence (in-context copying)."""
    model.eval()
    logits = model(repeated[:, :-1])  # [B, 2*half-1, V]
    losses = torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), repeated[:, 1:], reduction="none"
    )  # [B, 2*half-1]
    return {"first_copy": float(losses[:, : half - 1].mean()), "second_copy": float(losses[:, half:].mean())}


def _spearman(a: Tensor, b: Tensor) -> float | None:
    """Spearman rank correlation of two 1-D tensors (``None`` when undefined)."""
    if a.numel() < 3:
        return None
    ra, rb = a.argsort().argsort().float(), b.argsort().argsort().float()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / denominator if denominator else None


# ------------------------------------------------------------------------------------ plot, CLI
def plot(results: dict[str, Any], path: Path) -> Path:
    """Heatmaps of the three head-type scores and the masking importance, plus the pruning curves."""
    import matplotlib

    from poslab.display import new_figure, save_figure
    from poslab.display.fonts import use_in_matplotlib

    n_layer, n_head = results["model"]["n_layer"], results["model"]["n_head"]

    def grid_of(key: str) -> list[list[float]]:
        values = [[0.0] * n_head for _ in range(n_layer)]
        for row in results["heads"]:
            values[row["layer"]][row["head"]] = row[key]
        return values

    panels = [
        ("previous_token", "previous-token score", "Blues", (0, 1)),
        ("induction", "induction score (prefix matching)", "Purples", (0, 1)),
        ("positional_confidence", "positional: most frequent offset (confidence)", "Greens", (0, 1)),
        ("punctuation", "attention on punctuation (，。…)", "Reds", (0, 1)),
        ("sink_rate", "sink rate: attention on the first token", "Greys", (0, 1)),
        ("mask_loss_delta", "loss increase when masked", "Oranges", None),
    ]
    with matplotlib.rc_context(use_in_matplotlib()):
        height = 0.45 * max(n_layer, 3) + 1.6
        fig, _ = new_figure(1, 1, size=(20.0, 2 * height + 0.6))
        fig.clear()
        fig.set_layout_engine("constrained")
        grid = fig.add_gridspec(2, 4)
        axes = [fig.add_subplot(grid[row, col]) for row, col in ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1))]
        for ax, (key, title, cmap, limits) in zip(axes, panels):
            values = grid_of(key) if key in results["heads"][0] else [[0.0] * n_head for _ in range(n_layer)]
            vmin, vmax = limits if limits else (min(min(r) for r in values), max(max(r) for r in values))
            image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
            fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
            for row in results["heads"]:
                text = (
                    f"{row.get(key, 0.0):.2f}"
                    if key != "positional_confidence"
                    else f"{row['positional_offset']:+d} ({row[key]:.2f})"
                )
                if key == "mask_loss_delta":
                    text = f"{row[key]:+.3f}"
                ax.text(row["head"], row["layer"], text, ha="center", va="center", fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(n_head))
            ax.set_yticks(range(n_layer))
        ax = fig.add_subplot(grid[1, 2:])
        pruning = results["pruning"]
        percent = [100 * f for f in pruning["fractions"]]
        ax.plot(percent, pruning["loss_by_importance"], "o-", label="least important first")
        ax.plot(percent, pruning["loss_random_order"], "s--", label="random order (mean of 3)")
        ax.axhline(results["base_loss"], color="grey", lw=0.8, label="all heads")
        ax.set_xlabel("% of heads masked")
        ax.set_ylabel("validation loss")
        ax.set_title("pruning heads (Michel et al. 2019)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return save_figure(fig, path)


def print_summary(results: dict[str, Any]) -> None:
    """A readable table of every head."""
    from poslab.display import print_table

    rows = [
        [
            f"L{r['layer']}H{r['head']}",
            f"{r['previous_token']:.2f}",
            f"{r['induction']:.2f}",
            f"{r['positional_offset']:+d} ({r['positional_confidence']:.2f})",
            f"{r.get('punctuation', 0.0):.2f}",
            f"{r.get('sink_rate', 0.0):.2f}",
            f"{r['mask_loss_delta']:+.4f}",
            f"{r['grad_importance']:.4f}",
            ", ".join(r["labels"]) or "-",
        ]
        for r in results["heads"]
    ]
    print_table(
        ["head", "prev", "induction", "offset (conf)", "punct", "sink", "dloss masked", "|dL/dxi|", "type"],
        rows,
        title=f"Heads (base loss {results['base_loss']:.4f})",
        align="lrrrrrrrl",
    )
    if "sink_rate_uniform" in results:
        print(
            f"  sink = mean attention on the first token (queries >= 1); uniform causal attention gives "
            f"{results['sink_rate_uniform']:.3f} at this length"
        )
    for key in ("pruned_30", "pruned_60"):
        p = results[key]
        print(
            f"  pruning {p['heads_masked']} least important heads ({p['fraction']:.0%}): "
            f"loss {p['loss']:.4f} ({p['loss_increase']:+.4f})"
        )


def head_results(run_dir: Path, quick: bool = False, text: str | None = None) -> dict[str, Any]:
    """Analyze a trained run's heads on its validation split (:func:`analyze`), with the run and the text measured.

    Args:
        run_dir: a run folder written by :func:`poslab.session.train`.
        quick: fewer evaluation batches.
        text: evaluate on this corpus name or file instead (its last 10%).

    Raises:
        ValueError: the model's loss on the text is not finite (its weights overflow fp32).
    """
    from poslab.runs import RunFolder, load_run

    run_dir = Path(run_dir)
    run = RunFolder(run_dir)
    model, tokenizer, _ = load_run(run)
    tokens = run.split_tokens("val", tokenizer) if text is None else text_tokens(tokenizer, text)
    results = analyze(
        model,
        tokens,
        n_batches=2 if quick else 8,
        batch_size=8 if quick else 16,
        punctuation=punctuation_ids(tokenizer),
    )
    if not math.isfinite(results["base_loss"]):  # nothing of it means anything: said, never printed as nan
        raise ValueError(
            f"the model's loss on the evaluation text is {results['base_loss']}, not finite: its weights overflow "
            "fp32; the checkpoint is damaged or was not trained by poslab"
        )
    results["run"] = str(run_dir)
    train = run.config().get("train", {})
    # what base_loss was measured on: the lab compares it with that corpus's n-gram baselines
    results["text"] = {
        "corpus": train.get("corpus") if text is None else text,
        "tokenizer": train.get("tokenizer"),
        "val_fraction": train.get("val_fraction", 0.1),
    }
    return results


def run_heads(run_dir: Path, out: Path, quick: bool = False, text: str | None = None) -> dict[str, Any]:
    """:func:`head_results` of a trained run, written to ``out/results.json`` and drawn in ``out/heads.png``.

    Args:
        run_dir: a run folder written by :func:`poslab.session.train`.
        out: output folder.
        quick: fewer evaluation batches.
        text: evaluate on this corpus name or file instead (its last 10%).
    """
    from poslab.fileio import atomic_write_json

    results = head_results(run_dir, quick, text)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "heads.png")
    atomic_write_json(out / "results.json", results, allow_nan=False)  # strict JSON: no NaN/Infinity
    print_summary(results)
    return results


def text_tokens(tokenizer: Any, text: str) -> Tensor:
    """The last 10% of corpus ``text`` (a name or a file) as token ids ``[N]`` (``--text``)."""
    from poslab.data import encode_corpus, load_text, split_text

    _, val_text = split_text(load_text(text), 0.1)
    return encode_corpus(tokenizer, val_text)
