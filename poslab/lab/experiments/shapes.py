"""The head split and merge, read from forward hooks on a real attention layer (seed 000 §1.2, seed 001 §2).

Seed 000 draws the walk ``[batch, seq, d_model] -> [batch, seq, h, d_k] -> [batch, h, seq, d_k] ->
scores [batch, h, seq, seq] -> [batch, h, seq, d_k] -> [batch, seq, h, d_k] -> [batch, seq, d_model]``;
seed 001 prints ``q (1, 5, 32) -> (1, 4, 5, 8)``, ``scores (1, 4, 5, 5)``. Here every shape is
recorded by forward hooks on the submodules of :class:`~poslab.nn.attention.MultiHeadAttention`
(``qkv``, ``split_q``, ``split_kv``, ``scores_probe`` in the eager backend, ``merge``, ``proj``),
then named by matching each size against the layer's dimensions.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from poslab.display import print_table
from poslab.lab.experiments.common import FOUNDATION, Experiment
from poslab.lab.verdicts import ClaimRecord, deterministic, get
from poslab.nn.attention import AttentionConfig, MultiHeadAttention, use_backend

# the lesson's drawing, in order: (step, symbolic shape)
SEED000_WALK = (
    ("input X", "[batch, seq, d_model]"),
    ("fused qkv = X [W_Q W_K W_V]", "[batch, seq, 3*d_model]"),
    ("Q", "[batch, seq, d_model]"),
    ("Q viewed as heads", "[batch, seq, h, d_k]"),
    ("Q transposed", "[batch, h, seq, d_k]"),
    ("K transposed", "[batch, h, seq, d_k]"),
    ("V transposed", "[batch, h, seq, d_k]"),
    ("softmax(Q K^T / sqrt(d_k))", "[batch, h, seq, seq]"),
    ("weights @ V", "[batch, h, seq, d_k]"),
    ("transposed back", "[batch, seq, h, d_k]"),
    ("heads concatenated", "[batch, seq, d_model]"),
    ("output (W_O)", "[batch, seq, d_model]"),
)


def record_walk(attn: MultiHeadAttention, x: Tensor) -> list[tuple[str, str, tuple[int, ...]]]:
    """Run ``attn`` (eager backend) on ``x`` and return ``(step, submodule, shape)`` in the order seen.

    Shapes come from forward hooks on ``qkv``, ``split_q``, ``split_kv``, ``scores_probe``, ``merge``
    and ``proj``. The ``[B, T, h, d_k]`` view inside ``SplitHeads``/``MergeHeads`` is read as the hooked
    ``[B, h, T, d_k]`` tensor transposed back (the same view the module takes).
    """
    walk: list[tuple[str, str, tuple[int, ...]]] = []
    kv_calls = {"n": 0}

    def on_qkv(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        walk.append(("input X", "qkv (input)", tuple(inputs[0].shape)))
        walk.append(("fused qkv = X [W_Q W_K W_V]", "qkv", tuple(output.shape)))

    def on_split_q(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        walk.append(("Q", "split_q (input)", tuple(inputs[0].shape)))
        walk.append(("Q viewed as heads", "split_q (view)", tuple(output.transpose(1, 2).shape)))
        walk.append(("Q transposed", "split_q", tuple(output.shape)))

    def on_split_kv(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        label = "K transposed" if kv_calls["n"] == 0 else "V transposed"
        kv_calls["n"] += 1
        walk.append((label, "split_kv", tuple(output.shape)))

    def on_scores(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        walk.append(("softmax(Q K^T / sqrt(d_k))", "scores_probe", tuple(output.shape)))

    def on_merge(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        walk.append(("weights @ V", "merge (input)", tuple(inputs[0].shape)))
        walk.append(("transposed back", "merge (view)", tuple(inputs[0].transpose(1, 2).shape)))
        walk.append(("heads concatenated", "merge", tuple(output.shape)))

    def on_proj(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        walk.append(("output (W_O)", "proj", tuple(output.shape)))

    hooks = [
        attn.qkv.register_forward_hook(on_qkv),
        attn.split_q.register_forward_hook(on_split_q),
        attn.split_kv.register_forward_hook(on_split_kv),
        attn.scores_probe.register_forward_hook(on_scores),
        attn.merge.register_forward_hook(on_merge),
        attn.proj.register_forward_hook(on_proj),
    ]
    try:
        with torch.no_grad():
            with use_backend(attn, "eager"):
                attn(x)
    finally:
        for hook in hooks:
            hook.remove()
    return walk


def symbolic(shape: tuple[int, ...], names: dict[int, str]) -> str:
    """Name each size of ``shape`` from ``names`` (size -> dimension name), e.g. ``[batch, seq, d_model]``."""
    return "[" + ", ".join(names.get(size, str(size)) for size in shape) + "]"


def run(out: Path, quick: bool = False) -> dict:
    """Print both walks and return them (``out`` unused beyond results.json)."""
    torch.manual_seed(0)
    # sizes chosen pairwise distinct so each observed size names exactly one dimension
    batch, seq, d_model, n_heads = 2, 10, 512, 8
    attn = MultiHeadAttention(d_model, n_heads, attention=AttentionConfig(causal=True, backend="eager"))
    walk = record_walk(attn, torch.randn(batch, seq, d_model))
    names = {
        batch: "batch",
        seq: "seq",
        d_model: "d_model",
        n_heads: "h",
        attn.head_dim: "d_k",
        3 * d_model: "3*d_model",
    }
    if len(names) != 6:
        raise AssertionError(f"walk sizes must be distinct to be named unambiguously: {names}")
    rows, seed000 = [], []
    for (step, module, shape), (lesson_step, lesson_shape) in zip(walk, SEED000_WALK, strict=True):
        named = symbolic(shape, names)
        match = step == lesson_step and named == lesson_shape
        rows.append([step, module, str(list(shape)), named, lesson_shape, "yes" if match else "NO"])
        seed000.append(
            {
                "step": step,
                "submodule": module,
                "shape": list(shape),
                "named": named,
                "lesson_shape": lesson_shape,
                "matches_lesson": match,
            }
        )
    print_table(
        ["step", "hooked submodule", "observed", "named", "lesson (seed 000 §1.2)", "match"],
        rows,
        title=f"seed 000 §1.2: MultiHeadAttention(d_model={d_model}, "
        f"h={n_heads}), x = randn({batch}, {seq}, {d_model})",
        align="llllll",
    )

    # seed 001: n_embd 32 in 4 heads of 8 dims, one five-character line
    attn_small = MultiHeadAttention(32, 4, attention=AttentionConfig(causal=True, backend="eager"))
    small = {step: shape for step, _, shape in record_walk(attn_small, torch.randn(1, 5, 32))}
    seed001 = {
        "q": list(small["Q"]),
        "q_heads": list(small["Q transposed"]),
        "scores": list(small["softmax(Q K^T / sqrt(d_k))"]),
        "output": list(small["output (W_O)"]),
    }
    print("\nseed 001: 32-dim vectors in 4 heads of 8 dims (hooked on MultiHeadAttention(32, 4))")
    print(f"  q shape              {tuple(seed001['q'])}")
    print(f"  split into heads     {tuple(seed001['q_heads'])}  (sentences, heads, characters, head dim)")
    print(f"  attention scores     {tuple(seed001['scores'])}  (one 5x5 table per head)")
    print(f"  output               {tuple(seed001['output'])}")
    results = {
        "seed000_walk": seed000,
        "seed000_all_steps_match_lesson": all(r["matches_lesson"] for r in seed000),
        "seed001_walk": seed001,
    }
    return {**results, "claims": [c.to_dict() for c in claims(results)]}


# ------------------------------------------------------------------------------------ claims


def _shapes(r: dict) -> ClaimRecord:
    walk = get(r, "seed000_walk")
    matched = sum(bool(step.get("matches_lesson")) for step in walk)
    return deterministic(
        "[batch, seq, d_model] → [batch, h, seq, d_k] → … → [batch, seq, d_model] — the head split/merge shape walk",
        "seed 000 §1.2",
        "every step of the shape walk has the lesson's shape (tolerance: 0 mismatches)",
        f"{matched} of {len(walk)} steps of the shape walk have the lesson's shape",
        error=float(len(walk) - matched),
        tolerance=0.0,
    )


def claims(results: dict) -> list[ClaimRecord]:
    """The lesson's claims this experiment tests, decided from its results (what ``run`` returns under ``claims``)."""
    return [_shapes(results)]


EXPERIMENT = Experiment(
    name="shapes",
    description="the multi-head shape walk, recorded by hooks on the real module (seeds 000 §1.2, 001)",
    tier=FOUNDATION,
    run=run,
)
