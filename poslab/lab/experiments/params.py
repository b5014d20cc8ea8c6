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
from poslab.lab.experiments.common import FOUNDATION, Experiment
from poslab.lab.verdicts import ClaimRecord, deterministic, get, num
from poslab.nn.attention import MultiHeadAttention


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
            [
                f"d_model={r['d_model']}, h={r['n_heads']}",
                r["head_dim"],
                f"{r['qkv']:,}",
                f"{r['proj']:,}",
                f"{r['total']:,}",
                "yes" if r["total"] == formula else "NO",
            ]
            for r in mha_512
        ],
        title=f"poslab MultiHeadAttention at d_model={d_model}: the head count changes nothing (4d^2+4d = {formula:,})",
    )

    n_embd = 32
    mha_32 = [attention_counts(n_embd, h) for h in (1, 2, 4, 8)]
    gqa = attention_counts(n_embd, 8, 2)
    rows = [
        [f"h={r['n_heads']}, d_k={r['head_dim']}", r["n_kv_heads"], r["qkv"], r["proj"], r["total"]] for r in mha_32
    ]
    rows.append(
        [f"GQA: h={gqa['n_heads']}, d_k={gqa['head_dim']}", gqa["n_kv_heads"], gqa["qkv"], gqa["proj"], gqa["total"]]
    )
    print_table(
        ["n_embd=32", "kv heads", "qkv", "proj", "total"],
        rows,
        title="seed 001: qkv 3168 and proj 1056 for any head count; only GQA (fewer kv heads) shrinks qkv",
    )
    results = {
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
    return {**results, "claims": [c.to_dict() for c in claims(results)]}


# ------------------------------------------------------------------------------------ claims


def _params_same_total(r: dict) -> ClaimRecord:
    rows = get(r, "multihead_attention_512")
    formula = get(r, "formula_4d2_plus_4d_512")
    small = get(r, "seed001_multihead_attention_32")
    measured = (
        "d_model 512: "
        + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in rows)
        + f" (4d²+4d = {num(formula)}); d_model 32: "
        + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in small)
    )
    error = max(
        [abs(x["total"] - formula) for x in rows] + [max(x["total"] for x in small) - min(x["total"] for x in small)]
    )
    return deterministic(
        "多头不增加参数量 — multi-head attention has exactly the parameters of single-head (4·d²+4·d)",
        "seed 000 §1.2–1.3",
        "every head count's parameter count equals 4d²+4d exactly (integer counts, tolerance 0)",
        measured,
        error=float(error),
        tolerance=0.0,
    )


def _params_lesson_printout(r: dict) -> ClaimRecord:
    one, four, ratio = (
        get(r, "seed000_one_linear_512"),
        get(r, "seed000_four_linear_512"),
        get(r, "seed000_ratio_four_over_one"),
    )
    error = abs(one - 262_656) + abs(four - 1_050_624)
    return deterministic(
        "单头 Linear(512,512): 262,656；多头 4 个矩阵: 1,050,624；倍数 4.0x — the lesson's printout",
        "seed 000 §1.3",
        "parameter counts equal the lesson's 262,656 and 1,050,624 exactly (tolerance 0)",
        f"one Linear {num(one)}, four {num(four)}, ratio {ratio:.1f}x",
        error=float(error),
        tolerance=0.0,
    )


def _params_seed001(r: dict) -> ClaimRecord:
    qkv, proj = get(r, "seed001_qkv_params_by_heads"), get(r, "seed001_proj_params_by_heads")
    measured = "; ".join(f"h={h}: qkv {num(qkv[h])}, proj {num(proj[h])}" for h in qkv)
    error = max(abs(v - 3168) for v in qkv.values()) + max(abs(v - 1056) for v in proj.values())
    return deterministic(
        "qkv 3168 个，proj 1056 个，头数多少都不影响这个数 — at n_embd 32 the head count does not change qkv/proj",
        "seed 001 §2",
        "qkv = 3168 and proj = 1056 for every head count (tolerance 0)",
        measured,
        error=float(error),
        tolerance=0.0,
    )


def claims(results: dict) -> list[ClaimRecord]:
    """The lesson's claims this experiment tests, decided from its results (what ``run`` returns under ``claims``)."""
    return [_params_same_total(results), _params_lesson_printout(results), _params_seed001(results)]


EXPERIMENT = Experiment(
    name="params",
    description="multi-head attention has the same parameter count as single-head (seeds 000 §1.3, 001)",
    tier=FOUNDATION,
    run=run,
)
