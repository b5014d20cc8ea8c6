"""``poslab attention RUN --prompt TEXT``: a grid of attention heatmaps, one per layer and head.

Rows of the grid are layers, columns are heads; in each heatmap row ``i`` is the query token, column
``j`` the key token, and the colour is the attention weight ``softmax(q_i k_j^T / sqrt(d_k) + bias)``
read from the model (eager backend, fp32). Poem characters are drawn with the CJK font shipped in
``poslab/lab/report/assets`` (no system font needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from poslab.nn.model import GPT

DEFAULT_PROMPT = "白日依山尽，黄河入海流。"


def prompt_ids(model: GPT, tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of ``prompt``, or ``ValueError`` saying why the model cannot read it.

    Rejected: a non-string or empty prompt, characters outside the tokenizer's vocabulary (named),
    and prompts longer than the model's training context ``block_size``.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError("the prompt is empty: type at least one character")
    ids = tokenizer.encode(prompt)  # names unknown characters in a ValueError
    limit = model.config.block_size
    if len(ids) > limit:
        raise ValueError(f"the prompt has {len(ids)} tokens but this model reads at most {limit} (its block_size)")
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """One display string per token (a char tokenizer's character, a BPE piece, ``␣`` for spaces)."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i])
        labels.append(text.replace(" ", "␣").replace("\n", "⏎") or "�")
    return labels


def prompt_attention(model: GPT, tokenizer: Any, prompt: str) -> tuple[list[str], Tensor]:
    """Tokens of ``prompt`` and every layer's attention weights ``[L, h, T, T]`` (fp32)."""
    from poslab.analysis.heads import attention_weights

    ids = prompt_ids(model, tokenizer, prompt)
    weights = attention_weights(model, torch.tensor([ids], dtype=torch.long))  # L x [1, h, T, T]
    return token_labels(tokenizer, ids), torch.cat(weights)  # [L, h, T, T]


def plot_grid(weights: Tensor, tokens: list[str], path: Path, title: str | None = None) -> Path:
    """Save the ``[L, h, T, T]`` attention weights as a layer x head grid of heatmaps (PNG, atomic).

    Args:
        weights: attention weights ``[L, h, T, T]``.
        tokens: ``T`` token labels for both axes.
        path: where to write the PNG.
        title: figure title.
    """
    import matplotlib

    from poslab.display import new_figure, save_figure
    from poslab.display.fonts import use_in_matplotlib

    n_layer, n_head, T, _ = weights.shape
    if len(tokens) != T:
        raise ValueError(f"{len(tokens)} token labels for {T} positions")
    cell = max(1.9, min(3.2, 0.2 * T + 0.8))
    step = max(1, (T + 23) // 24)  # label at most ~24 ticks per axis
    ticks = list(range(0, T, step))
    font_size = 9 if T <= 16 else 7
    with matplotlib.rc_context(use_in_matplotlib()):
        fig, _ = new_figure(1, 1, size=(cell * n_head + 0.8, cell * n_layer + (0.7 if title else 0.3)))
        fig.clear()
        fig.set_layout_engine("constrained")
        axes = fig.subplots(n_layer, n_head, squeeze=False)  # [L, h] array of axes
        image = None
        for layer in range(n_layer):
            for head in range(n_head):
                ax = axes[layer][head]
                image = ax.imshow(
                    weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
                )
                ax.set_xticks(ticks)
                ax.set_yticks(ticks)
                ax.set_xticklabels([tokens[i] for i in ticks], fontsize=font_size)
                ax.set_yticklabels([tokens[i] for i in ticks], fontsize=font_size)
                ax.tick_params(length=0, pad=1)
                ax.set_title(f"layer {layer} · head {head}", fontsize=9)
                if head == 0:
                    ax.set_ylabel("query", fontsize=8)
                if layer == n_layer - 1:
                    ax.set_xlabel("key", fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
        fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01, label="attention weight")
        return save_figure(fig, path)


def summary(weights: Tensor, tokens: list[str]) -> dict[str, Any]:
    """Numbers describing a ``[L, h, T, T]`` attention grid: per head, the mean entropy of its rows
    (nats), the mean weight on the previous token and on the token itself, and its most-attended offset."""
    L, h, T, _ = weights.shape
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean(-1)  # [L, h]
    rows = torch.arange(1, T)
    previous = weights[:, :, rows, rows - 1].mean(-1) if T > 1 else torch.zeros(L, h)  # [L, h]
    diagonal = weights.diagonal(dim1=-2, dim2=-1).mean(-1)  # [L, h]
    offsets = (torch.arange(T) - weights.argmax(-1)).float()  # query position - argmax key, [L, h, T]
    return {
        "tokens": tokens,
        "n_layer": L,
        "n_head": h,
        "heads": [
            {
                "layer": l,
                "head": k,
                "mean_entropy_nats": float(entropy[l, k]),
                "previous_token_weight": float(previous[l, k]),
                "self_weight": float(diagonal[l, k]),
                "median_argmax_offset": float(offsets[l, k].median()),
            }
            for l in range(L)
            for k in range(h)
        ],
    }


def draw_attention(run_dir: Path, prompt: str, out: Path) -> dict[str, Any]:
    """Draw the prompt's attention grid of a run folder's model to the PNG ``out``; return what it shows: the
    prompt, the run, its position scheme, the PNG's name and :func:`summary` of the weights."""
    from poslab.runs import load_run

    run_dir = Path(run_dir)
    model, tokenizer, _ = load_run(run_dir)
    tokens, weights = prompt_attention(model, tokenizer, prompt)
    cfg = model.config
    title = f"{run_dir.name}: {cfg.position} positions, {cfg.n_layer} layers × {cfg.n_head} heads — {prompt}"
    plot_grid(weights, tokens, out, title=title)
    print(f"wrote {out} ({cfg.n_layer} layers x {cfg.n_head} heads, {len(tokens)} tokens)")
    shown = summary(weights, tokens)
    return {"prompt": prompt, "run": str(run_dir), "position": cfg.position, "png": out.name, **shown}


def run_attention(run_dir: Path, prompt: str, out: Path | None = None, json_path: Path | None = None) -> Path:
    """Load a run, draw the prompt's attention grid to ``out`` (default ``RUN/attention.png``).

    ``json_path`` also receives :func:`draw_attention`'s record: the prompt, the tokens and :func:`summary` of the
    weights.
    """
    from poslab.fileio import atomic_write_json

    run_dir = Path(run_dir)
    if not run_dir.is_dir() and (Path("runs") / run_dir).is_dir():
        run_dir = Path("runs") / run_dir
    out = Path(out) if out is not None else run_dir / "attention.png"
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out must be a .png file, got {str(out)!r}")
    record = draw_attention(run_dir, prompt, out)
    if json_path is not None:
        atomic_write_json(Path(json_path), record, allow_nan=False)  # strict JSON: no NaN/Infinity
    return out
