"""Perplexity per evaluation length, and inference-time RoPE scaling overrides.

``poslab eval RUN --lengths 64,128,256,512,1024`` scores the same held-out tokens at every length, two
ways (Press et al. 2022, "Train Short, Test Long", https://arxiv.org/abs/2108.12409, §B):

* **non-overlapping**: the text is cut into chunks of ``length`` tokens and each chunk is one forward
  pass. A token's context is its offset inside its chunk, so on average ``length/2``: early tokens of
  every chunk see almost nothing (the "early-token curse"), and longer chunks hide it.
* **sliding window** with a stride ``S``: windows of ``length`` tokens move by ``S``; each token is
  scored exactly once, in the first window where it is among the last ``S`` (the first window scores
  all its tokens), so every token after the first window sees at least ``length - S`` tokens of
  context. ``S = length`` is exactly the non-overlapping evaluation.

Both score exactly the targets ``tokens[1 : n_targets + 1]`` at every length (the last non-overlapping
chunk is shorter when ``length`` does not divide ``n_targets``), so the numbers are comparable across
lengths. A position scheme that cannot encode a length (a learned table with fewer rows) gets a
``cannot`` cell instead of a crash or a silent clamp.

RoPE overrides (:func:`apply_rope_scaling`) rebuild the model's rotary scheme with a context-extension
scaling -- PI (Chen et al. 2023), NTK-aware, dynamic NTK, YaRN (Peng et al. 2023), Llama 3, LongRoPE
(Ding et al. 2024) -- and/or log-n query scaling (Chiang & Cholak 2022, https://arxiv.org/abs/2202.12172)
without retraining: the rotary schemes hold no trained parameters, so the weights are untouched.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.checks import int_at_least, positive_int
from poslab.nn import positions
from poslab.nn.model import GPT
from poslab.nn.positions.rope import parse_scaling

#: Tokens per forward pass when batching windows (a window longer than this runs alone).
DEFAULT_BATCH_TOKENS = 4096
#: the largest mean loss (nats) whose perplexity ``exp(loss)`` a float holds (exp overflows past 709.78)
MAX_LOSS = 700.0


# ------------------------------------------------------------------------------------ parsing
def parse_lengths(spec: str | Sequence[int]) -> list[int]:
    """``"64,128,256"`` (or a sequence) -> ``[64, 128, 256]``; anything not a positive integer raises.

    Raises:
        ValueError: naming the bad entry.
    """
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    if not items or items == [""]:
        raise ValueError(f"--lengths needs at least one positive integer, got {spec!r}")
    lengths = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"evaluation length {item!r} is not a positive integer")
        if isinstance(item, int):
            value = item
        else:
            try:
                value = int(str(item), 10)
            except ValueError:
                raise ValueError(
                    f"evaluation length {item!r} is not a positive integer (from --lengths {spec!r})"
                ) from None
        if value <= 0:
            raise ValueError(f"evaluation length {item!r} is not a positive integer (from --lengths {spec!r})")
        lengths.append(value)
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"--lengths {spec!r} repeats a length")
    return lengths


def parse_rope_scaling(spec: str) -> dict[str, Any]:
    """Parse ``--rope-scaling`` (the spec language of :func:`poslab.nn.positions.rope.parse_scaling`).

    Forms: ``none``, ``NAME:FACTOR`` (``yarn:4``), ``longrope:FACTOR:LONG[:SHORT]``, ``longrope:PATH.json``.

    Raises:
        ValueError: unknown scaling, a factor that is not a number > 0, malformed LongRoPE lists.
    """
    return parse_scaling(spec, "--rope-scaling")


# ------------------------------------------------------------------------------------ overrides
def rescalable_schemes() -> list[str]:
    """Registered schemes with a context-extension scaling (they implement ``rescaled_config``)."""
    return [name for name in positions.names() if positions.get(name).rescalable()]


def is_rotary(model: GPT) -> bool:
    """Whether the model's position scheme takes a context-extension scaling (the RoPE family)."""
    return type(model.position).rescalable()


def rotary_frequencies(model: GPT, seq_len: int | None = None) -> tuple[Tensor, float]:
    """``(inv_freq [r/2], attention_factor)`` the model's rotary scheme uses at ``seq_len`` positions."""
    if not is_rotary(model):
        raise ValueError(f"model uses position={model.config.position!r}, which has no rotary frequencies")
    return model.position.frequencies(seq_len if seq_len is not None else 0)


def apply_rope_scaling(
    model: GPT,
    scaling: dict[str, Any] | str | None = None,
    logn_scaling: bool | None = None,
    original_max_len: int | None = None,
) -> dict[str, Any]:
    """Rebuild a RoPE-family model's position scheme with a new scaling, in place, without retraining.

    The scheme owns the scaling language and its keys (``rescaled_config``); the model swaps the
    scheme with :meth:`~poslab.nn.model.GPT.replace_position`, which keeps ``model.config`` in sync.

    Args:
        model: a :class:`~poslab.nn.model.GPT` whose scheme takes a scaling (``rope``, ``xpos``).
        scaling: a spec (``"yarn:4"``, a dict from :func:`parse_rope_scaling`); ``None`` keeps the run's.
        logn_scaling: turn log-n query scaling on/off (``None`` keeps the run's setting).
        original_max_len: the window ``L0`` the scaling extends from; default: the run's own
            ``original_max_len`` if its config gives one, else its ``block_size`` (the model fills it).

    Returns:
        Every field of the new scheme's config (the effective values, ``original_max_len`` included).

    Raises:
        ValueError: the model's scheme takes no scaling, or the config is invalid (e.g. LongRoPE lists
            of the wrong length).
    """
    cfg = model.config
    if not is_rotary(model):
        what = "--rope-scaling" if scaling is not None else "--logn-scaling"
        raise ValueError(
            f"{what} needs a RoPE-family model ({', '.join(rescalable_schemes())}); this run uses "
            f"position={cfg.position!r}"
        )
    config = type(model.position).rescaled_config(
        cfg.position_config, scaling, logn_scaling=logn_scaling, original_max_len=original_max_len
    )
    scheme = model.replace_position(config=config)
    return dataclasses.asdict(scheme.config)


def max_length(model: GPT) -> int | None:
    """Longest sequence the model's position scheme can encode (``None`` = unbounded)."""
    return model.position.max_positions


def cannot_reason(model: GPT, length: int) -> str | None:
    """Why the model cannot be evaluated at ``length`` (``None`` if it can)."""
    limit = max_length(model)
    if limit is not None and length > limit:
        return f"{model.config.position} table has {limit} rows"
    return None


# ------------------------------------------------------------------------------------ scoring
def token_losses(model: GPT, idx: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of every target, ``[B, T]`` fp32 (no reduction).

    Args:
        model: a GPT (call under ``torch.no_grad`` in eval mode).
        idx: inputs ``[B, T]``; targets: next tokens ``[B, T]``.
    """
    logits = model(idx)  # [B, T, V]
    B, T, V = logits.shape
    flat = F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none")  # [B*T]
    return flat.view(B, T)  # [B*T] -> [B, T]


def loss_by_position(model: GPT, tokens: Tensor, length: int, max_windows: int | None = 64, chunk: int = 256) -> Tensor:
    """Mean loss at each position of a window: how much a model uses its context.

    The stream is cut into non-overlapping windows of ``length`` inputs (at most ``max_windows``,
    from the start; ``None``: every whole window of the stream); position ``t`` of a window predicts
    its target from ``t + 1`` tokens of context. A model that uses its context has a lower loss at
    late positions than at early ones; a bigram model's curve is flat after position 0.

    A few windows put the same few tokens at each position, so the curve then carries the noise of
    those tokens (on tinyshakespeare, 64 windows give each position 64 targets: a noise of about 0.1
    nats at each point); the whole split averages each position over all its windows.

    Args:
        model: a GPT (put in eval mode by the caller).
        tokens: a 1-D token stream ``[N]`` with ``N > length``.
        length: the window length (at most the model's block size for a learned table).
        max_windows: how many windows to average (``None``: all).
        chunk: windows per forward pass (memory only; the result does not depend on it).

    Returns:
        ``[length]`` fp32: the mean cross-entropy (nats) at each position.

    Raises:
        ValueError: ``length``, ``max_windows`` or ``chunk`` not a positive integer, or the stream holds
            no whole window.
    """
    for name, value in (
        ("length", length),
        ("max_windows", 1 if max_windows is None else max_windows),
        ("chunk", chunk),
    ):
        positive_int(name, value)
    whole = (tokens.numel() - 1) // length
    n = whole if max_windows is None else min(max_windows, whole)
    if n < 1:
        raise ValueError(f"a stream of {tokens.numel()} tokens holds no window of {length} inputs and their targets")
    idx = tokens[: n * length].view(n, length)  # [N] -> [n, L]
    targets = tokens[1 : n * length + 1].view(n, length)  # [n, L]
    total = torch.zeros(length, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, n, chunk):
            total += token_losses(model, idx[start : start + chunk], targets[start : start + chunk]).double().sum(dim=0)
    return (total / n).float()  # [L]


@dataclass
class Window:
    """One forward pass of the evaluation: inputs ``tokens[start : start + length]``, of which the
    last ``n_scored`` positions are scored (their targets are ``tokens[start + 1 : start + length + 1]``)."""

    start: int
    length: int
    n_scored: int


def nonoverlapping_windows(n_targets: int, length: int) -> list[Window]:
    """Chunks ``[0, L), [L, 2L), ...`` covering targets ``1..n_targets`` (last chunk possibly shorter)."""
    windows = []
    for start in range(0, n_targets, length):
        size = min(length, n_targets - start)
        windows.append(Window(start, size, size))
    return windows


def sliding_windows(n_targets: int, length: int, stride: int) -> list[Window]:
    """Windows of ``length`` moving by ``stride``; each target in ``1..n_targets`` scored exactly once.

    The first window scores all of its ``length`` targets; each later window ends ``stride`` targets
    further (the last one possibly fewer) and scores only the targets no earlier window scored, so
    each has at least ``length - stride`` tokens of context.
    """
    check_stride(stride, length)
    if n_targets < length:
        raise ValueError(f"sliding window of length {length} needs at least {length} targets, got {n_targets}")
    windows = [Window(0, length, length)]
    scored_until = length  # targets 1..scored_until are done
    while scored_until < n_targets:
        end = min(scored_until + stride, n_targets)
        windows.append(Window(end - length, length, end - scored_until))
        scored_until = end
    return windows


def check_stride(stride: int, length: int) -> None:
    """Raise ``ValueError`` unless ``0 < stride <= length``."""
    positive_int("stride", stride)
    if stride > length:
        raise ValueError(
            f"stride {stride} is larger than the evaluation length {length}; a stride must be <= every length"
        )


@torch.no_grad()
def score_windows(
    model: GPT, tokens: Tensor, windows: list[Window], batch_tokens: int = DEFAULT_BATCH_TOKENS
) -> dict[str, float]:
    """Sum the losses of the scored targets of ``windows``, batching windows of equal length.

    Args:
        model: the GPT (switched to eval mode).
        tokens: 1-D int64 token ids; ``tokens[w.start + w.length]`` must exist for every window.
        windows: from :func:`nonoverlapping_windows` / :func:`sliding_windows`.
        batch_tokens: tokens per forward pass (windows per batch = ``batch_tokens // length``, >= 1).

    Returns:
        ``{"loss": mean nats per token, "ppl": exp(loss), "n_tokens": scored targets}``.
    """
    model.eval()
    device = model.tok_emb.weight.device
    total, count = 0.0, 0
    by_length: dict[int, list[Window]] = {}
    for w in windows:
        by_length.setdefault(w.length, []).append(w)
    for length, group in by_length.items():
        per_batch = max(1, batch_tokens // length)
        for i in range(0, len(group), per_batch):
            batch = group[i : i + per_batch]
            starts = torch.tensor([w.start for w in batch])
            offsets = starts[:, None] + torch.arange(length + 1)[None, :]  # [b, L+1]
            chunk = tokens[offsets].to(device)  # [b, L+1]
            losses = token_losses(model, chunk[:, :-1], chunk[:, 1:])  # [b, L]
            keep = (
                torch.arange(length, device=device)[None, :]
                >= torch.tensor([length - w.n_scored for w in batch], device=device)[:, None]
            )  # [b, L]: the last n_scored positions of each window
            total += float(losses[keep].double().sum())
            count += int(keep.sum())
    loss = total / count
    if not math.isfinite(loss) or loss > MAX_LOSS:
        raise ValueError(
            f"the model's loss is {'not finite (NaN/inf)' if not math.isfinite(loss) else f'{loss:.4g} nats'} "
            f"at length {max(w.length for w in windows)}: its weights overflow fp32 (a perplexity needs a finite loss "
            f"<= {MAX_LOSS:.0f}); the checkpoint is damaged or was not trained by poslab"
        )
    return {"loss": loss, "ppl": math.exp(loss), "n_tokens": count}


def evaluate_length(
    model: GPT,
    tokens: Tensor,
    length: int,
    n_targets: int,
    stride: int | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> dict[str, Any]:
    """Non-overlapping and (if ``stride``) sliding-window loss/perplexity at one length.

    Returns:
        ``{"length", "nonoverlapping": {...}, "sliding": {... , "stride"} | None}``, or
        ``{"length", "cannot": reason}`` when the scheme cannot encode ``length`` positions.
    """
    reason = cannot_reason(model, length)
    if reason is not None:
        return {"length": length, "cannot": reason}
    result: dict[str, Any] = {"length": length}
    result["nonoverlapping"] = score_windows(model, tokens, nonoverlapping_windows(n_targets, length), batch_tokens)
    if stride is not None:
        result["sliding"] = {
            **score_windows(model, tokens, sliding_windows(n_targets, length, stride), batch_tokens),
            "stride": stride,
        }
    return result


def check_eval_inputs(tokens: Tensor, lengths: list[int], n_targets: int | None, stride: int | None) -> int:
    """Validate the text length and stride against the lengths; return the number of targets.

    ``n_targets`` defaults to all targets the text holds, rounded down to a multiple of the longest
    length (so every length's non-overlapping chunks are full).

    Raises:
        ValueError: a text shorter than the longest length (+1 for the last target), a stride
            outside ``(0, min(lengths)]``, a ``n_targets`` outside ``[max(lengths), len(tokens) - 1]``.
    """
    longest = max(lengths)
    available = int(tokens.numel()) - 1
    if available < longest:
        raise ValueError(
            f"the evaluation text has {tokens.numel()} tokens, shorter than the longest length {longest} "
            f"(+1 token for the last target); use shorter --lengths or a longer text"
        )
    if stride is not None:
        check_stride(stride, min(lengths))
    if n_targets is None:
        return (available // longest) * longest
    int_at_least(
        "the number of evaluation tokens", n_targets, longest, rule=f"an integer >= the longest length {longest}"
    )
    if n_targets > available:
        raise ValueError(f"{n_targets} evaluation tokens requested but the text has only {available} targets")
    return n_targets


#: token positions (windows x length) above which ``eval_run`` prints its cost estimate before scoring
WARN_TOKEN_POSITIONS = 20_000_000


def estimate_cost(model: GPT, n_targets: int, lengths: Sequence[int], stride: int | None) -> dict[str, float]:
    """What :func:`evaluate` will compute, from the sizes alone (nothing is run).

    Returns:
        ``{"windows", "token_positions", "flops"}``: forward windows over all lengths (non-overlapping
        plus sliding), the token positions they process (windows x length) and the matmul FLOPs,
        ``2 * params * tokens`` plus the attention's ``4 * n_layer * length^2 * n_embd`` per window.
    """
    params = sum(p.numel() for p in model.parameters())
    windows = positions = flops = 0.0
    cfg = model.config
    for length in lengths:
        count = math.ceil(n_targets / length)
        if stride is not None:
            count += 1 + math.ceil(max(n_targets - length, 0) / stride)
        windows += count
        positions += count * length
        flops += count * (2 * params * length + 4 * cfg.n_layer * length * length * cfg.n_embd)
    return {"windows": windows, "token_positions": positions, "flops": flops}


def evaluate(
    model: GPT,
    tokens: Tensor,
    lengths: Sequence[int],
    stride: int | None = None,
    n_targets: int | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> list[dict[str, Any]]:
    """:func:`evaluate_length` at every length, on the same targets ``tokens[1 : n_targets + 1]``.

    Args:
        model: the GPT.
        tokens: 1-D int64 token ids of the evaluation text.
        lengths: evaluation lengths (positive integers).
        stride: sliding-window stride (``None``: non-overlapping only).
        n_targets: targets scored at every length (default: see :func:`check_eval_inputs`).
        batch_tokens: tokens per forward pass.
    """
    lengths = parse_lengths(list(lengths))
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    n_targets = check_eval_inputs(tokens, lengths, n_targets, stride)
    return [evaluate_length(model, tokens, length, n_targets, stride, batch_tokens) for length in lengths]


def ppl_of(cell: dict[str, Any], mode: str = "nonoverlapping") -> float | None:
    """Perplexity of a result cell in ``mode`` (``None`` for a ``cannot`` cell or a missing mode)."""
    entry = cell.get(mode)
    return None if entry is None else entry["ppl"]


def format_cell(cell: dict[str, Any], mode: str, key: str = "ppl") -> str:
    """Table text of one cell: the number, or ``cannot (reason)``."""
    if "cannot" in cell:
        return f"cannot ({cell['cannot']})"
    entry = cell.get(mode)
    return "-" if entry is None else f"{entry[key]:.3f}"


def results_table(cells: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows (one per length) for :func:`poslab.display.print_table`."""
    has_sliding = any("sliding" in c for c in cells)
    headers = ["length", "loss", "ppl"] + (["loss (sliding)", "ppl (sliding)", "stride"] if has_sliding else [])
    rows = []
    for c in cells:
        row = [str(c["length"])]
        if "cannot" in c:
            row += [f"cannot ({c['cannot']})", ""] + (["", "", ""] if has_sliding else [])
        else:
            row += [format_cell(c, "nonoverlapping", "loss"), format_cell(c, "nonoverlapping")]
            if has_sliding:
                row += [format_cell(c, "sliding", "loss"), format_cell(c, "sliding"), str(c["sliding"]["stride"])]
        rows.append(row)
    return headers, rows


# ------------------------------------------------------------------------------------ runs + CLI
#: allocations from this size up are served by mmap and go back to the OS when freed (glibc)
MMAP_THRESHOLD = 1 << 20


def return_freed_memory_to_os(threshold: int = MMAP_THRESHOLD) -> bool:
    """Make glibc serve allocations of ``threshold`` bytes and more with ``mmap`` (``mallopt``).

    Long evaluations allocate one bias tile per query block (tens of MiB at ``T = 8192``). glibc's
    default *dynamic* mmap threshold rises to the size of the largest freed block (up to 32 MiB), after
    which such tiles come from the heap, which fragments and keeps the peak resident memory growing
    faster than ``T`` although no tensor outlives its block (``benchmarks/eval_memory.py`` measures
    both). A fixed threshold returns every freed tile to the OS. Process-wide; used by ``poslab eval``.

    Returns:
        Whether the setting was applied (``False`` off glibc).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(threshold)))  # M_MMAP_THRESHOLD = -3
    except (OSError, AttributeError):
        return False


def eval_run(
    run_dir: str | Path,
    lengths: Sequence[int],
    stride: int | None = None,
    rope_scaling: dict[str, Any] | None = None,
    logn_scaling: bool = False,
    split: str = "val",
    n_targets: int | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """Evaluate a training run's checkpoint at every length (see the module docstring), in batches of
    :data:`DEFAULT_BATCH_TOKENS` tokens (:func:`evaluate` takes another batch size).

    Returns:
        JSON-ready results: run, step, split, scheme, train length, scaling, and one cell per length.
    """
    from poslab.runs import RunFolder, load_run

    lengths = parse_lengths(list(lengths))
    run = RunFolder(run_dir)
    model, tokenizer, _ = load_run(run, step=step)
    train_length = model.config.block_size
    override = None
    if rope_scaling is not None or logn_scaling:
        override = apply_rope_scaling(model, rope_scaling, True if logn_scaling else None)
    tokens = run.split_tokens(split, tokenizer)
    n_targets = check_eval_inputs(tokens, lengths, n_targets, stride)
    cost = estimate_cost(model, n_targets, lengths, stride)
    if cost["token_positions"] > WARN_TOKEN_POSITIONS:  # said before the minutes (or hours) are spent
        print(
            f"poslab: warning: this evaluation runs {cost['windows']:,.0f} windows ({cost['token_positions']:,.0f} "
            f"token positions, about {cost['flops'] / 1e12:,.1f} TFLOP); a larger --stride or fewer --tokens "
            "makes it shorter",
            file=sys.stderr,
            flush=True,
        )
    start = time.perf_counter()
    cells = evaluate(model, tokens, lengths, stride=stride, n_targets=n_targets)
    return {
        "run": str(run_dir),
        "step": step if step is not None else run.latest_step(),
        "split": split,
        "scheme": model.config.position,
        "train_length": train_length,
        "rope_scaling": rope_scaling,
        "logn_scaling": bool(logn_scaling),
        "position_config": override,
        "n_targets": n_targets,
        "stride": stride,
        "seconds": time.perf_counter() - start,
        "estimated_flops": cost["flops"],
        "lengths": cells,
    }


__all__ = [
    "apply_rope_scaling",
    "estimate_cost",
    "evaluate",
    "evaluate_length",
    "eval_run",
    "nonoverlapping_windows",
    "parse_lengths",
    "parse_rope_scaling",
    "score_windows",
    "sliding_windows",
    "token_losses",
]
