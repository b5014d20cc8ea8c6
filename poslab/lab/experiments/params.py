"""Multi-head attention adds no parameters (seed 000 §1.3, seed 001 §2).

Seed 000 compares one ``nn.Linear(512, 512)`` (262,656 parameters) with four of them (1,050,624,
4.0x) and makes the point that single-head attention also needs the four matrices ``W_Q, W_K, W_V,
W_O``: the head count does not change the total ``4 d^2 + 4 d``. Seed 001 prints, for ``n_embd = 32``,
``qkv 3168, proj 1056`` whatever the number of heads. Both claims are read here from poslab's real
:class:`~poslab.nn.attention.MultiHeadAttention` modules. Grouped-query attention (Ainslie et al. 2023,
https://arxiv.org/abs/2305.13245) is the counterpoint: fewer key/value heads do shrink ``qkv``.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from poslab.display import print_table
from poslab.nn.attention import MultiHeadAttention

NAME = "params"
DESCRIPTION = "multi-head attention has the same parameter count as single-head (seeds 000 §1.3, 001)"
IN_ALL = True


def count(module: nn.Module) -> int:
    """Number of parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())


def attention_counts(d_model: int, n_heads: int, n_kv_heads: int | None = None) -> dict[str, int]:
    """Parameter counts of a real ``MultiHeadAttention``: its ``qkv``, ``proj`` and total."""
    attn = MultiHeadAttention(d_model, n_heads, n_kv_heads)
    return {
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": attn.n_kv_heads,
        "head_dim": attn.head_dim,
        "qkv": count(attn.qkv),
        "proj": count(attn.proj),
        "total": count(attn),
    }


def run(out: Path, quick: bool = False) -> dict:
    """Print and return the parameter counts (``out`` unused: this experiment writes only results.json)."""
    d_model = 512
    # seed 000 §1.3, verbatim: one Linear vs the four matrices of an attention layer
    single = nn.Linear(d_model, d_model)
    four = [nn.Linear(d_model, d_model) for _ in range(4)]  # W_Q, W_K, W_V, W_O
    n_single = count(single)
    n_four = sum(count(m) for m in four)
    print_table(
        ["module", "parameters"],
        [
            [f"one nn.Linear({d_model},{d_model})", f"{n_single:,}"],
            ["four nn.Linear (W_Q, W_K, W_V, W_O)", f"{n_four:,}"],
            ["ratio four / one", f"{n_four / n_single:.1f}x"],
        ],
        title="seed 000 §1.3: one Linear vs the four matrices of attention",
    )

    formula = 4 * d_model * d_model + 4 * d_model
    mha_512 = [attention_counts(d_model, h) for h in (1, 8)]
    print_table(
        ["MultiHeadAttention", "d_k", "qkv", "proj", "total", "= 4d^2+4d?"],
        [
            [f"d_model={r['d_model']}, h={r['n_heads']}", r["head_dim"], f"{r['qkv']:,}", f"{r['proj']:,}",
             f"{r['total']:,}", "yes" if r["total"] == formula else "NO"]
            for r in mha_512
        ],
        title=f"poslab MultiHeadAttention at d_model={d_model}: the head count changes nothing (4d^2+4d = {formula:,})",
    )

    n_embd = 32
    mha_32 = [attention_counts(n_embd, h) for h in (1, 2, 4, 8)]
    gqa = attention_counts(n_embd, 8, 2)
    rows = [[f"h={r['n_heads']}, d_k={r['head_dim']}", r["n_kv_heads"], r["qkv"], r["proj"], r["total"]] for r in mha_32]
    rows.append([f"GQA: h={gqa['n_heads']}, d_k={gqa['head_dim']}", gqa["n_kv_heads"], gqa["qkv"], gqa["proj"], gqa["total"]])
    print_table(
        ["n_embd=32", "kv heads", "qkv", "proj", "total"],
        rows,
        title="seed 001: qkv 3168 and proj 1056 for any head count; only GQA (fewer kv heads) shrinks qkv",
    )
    return {
        "seed000_one_linear_512": n_single,
        "seed000_four_linear_512": n_four,
        "seed000_ratio_four_over_one": n_four / n_single,
        "formula_4d2_plus_4d_512": formula,
        "multihead_attention_512": mha_512,
        "seed001_multihead_attention_32": mha_32,
        "seed001_qkv_params_by_heads": {str(r["n_heads"]): r["qkv"] for r in mha_32},
        "seed001_proj_params_by_heads": {str(r["n_heads"]): r["proj"] for r in mha_32},
        "gqa_counterpoint_32": gqa,
    }
