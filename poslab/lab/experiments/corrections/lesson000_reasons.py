"""Seed 000's reasons for RoPE and for a fixed d_k: §3.1's attribution, §4's "fixed penalty vs learned", Q2 reason 4
and Q3's speculations 2 and 4, each with the evidence that can settle it (or the reason none here can).

Q3's speculation 3 ("more heads = more parallel relation patterns") is judged by experiment probes, which trains
1 and 4 heads on multi-query associative recall at one width: its record carries that sentence.
"""

from __future__ import annotations

from typing import Any

import torch

from poslab.lab.evidence import SOURCE
from poslab.lab.lesson_quotes import quoted
from poslab.lab.verdicts import Premise, deterministic, with_premise
from poslab.lab.zoo import load_zoo
from poslab.nn import positions
from poslab.nn.attention import MultiHeadAttention

# ----------------------------------------------------------------------------- seed 000 §3.1 attribution
#: what RoFormer's abstract gives as RoPE's properties (Su et al. 2021, arXiv:2104.09864)
ROFORMER_PROPERTIES = (
    "encodes the absolute position with a rotation matrix",
    "incorporates the explicit relative position dependency in self-attention",
    "flexibility of sequence length",
    "decaying inter-token dependency with increasing relative distances",
    "equipping linear self-attention with relative position encoding",
)
#: the paper that argues that adding position to the word embedding mixes the two (Ke et al. 2021, TUPE)
MIXING_ARGUMENT = (
    "Ke et al. 2021 (TUPE)",
    "the addition of positional and word embeddings 'brings mixed correlations between the two heterogeneous "
    "information resources', which 'may bring unnecessary randomness in the attention and further limit the "
    "expressiveness of the model'",
)


def su_insight_claim() -> dict[str, Any]:
    mixing_in_roformer = any("mix" in p or "content" in p for p in ROFORMER_PROPERTIES)
    record = deterministic(
        "Su et al. 2021's insight: absolute position embeddings weaken attention because position and content are "
        "mixed in one vector",
        "seed 000 §3.1",
        "RoFormer's abstract, where the paper states what RoPE is for, gives this as its motivation (error = 1 if "
        "the properties it states do not include it)",
        "RoFormer's abstract gives RoPE's properties as: " + "; ".join(ROFORMER_PROPERTIES) + ". The argument the "
        f"lesson quotes is {MIXING_ARGUMENT[0]}'s: {MIXING_ARGUMENT[1]}. Nor does RoPE separate the two in the "
        "score: its logit Re Σ z_q conj(z_k) e^{i(m-n)θ} multiplies content and offset; what it keeps apart is the "
        "residual stream, which position never enters (the Q2 reason 2 record)",
        error=float(not mixing_in_roformer),
        tolerance=0.0,
        details={"roformer_properties": list(ROFORMER_PROPERTIES), "mixing_argument": MIXING_ARGUMENT[0]},
    )
    return quoted(
        "su_insight",
        record,
        "the RoFormer and TUPE abstracts",
        kind=SOURCE,
        reference="Su et al. 2021 (arXiv:2104.09864), abstract; Ke et al. 2021, 'Rethinking Positional Encoding in "
        "Language Pre-training' (arXiv:2006.15595, ICLR 2021), abstract",
    )


# ----------------------------------------------------------------------------- seed 000 §4 fixed penalty vs learned
def distance_profiles(T: int = 32, d: int = 64, n_heads: int = 8, targets: tuple[int, ...] = (0, 3, 7, 12)) -> dict:
    """How the logit of the last query depends on the distance to keys that all hold the same content.

    ALiBi: its bias per head (poslab's ``score_bias``), which no content changes. RoPE: for each target offset r0,
    the key content ``k = R_{r0} q`` (a W_K can produce it) and the offset where the rotated logit peaks. T5: its
    learned bias table's size. Returns the number of ALiBi heads whose bias ever rises with distance, the RoPE peaks
    and the position parameters of each scheme.
    """
    pos = torch.arange(T)
    alibi = positions.build("alibi", n_heads=n_heads)
    zeros = torch.zeros(1, n_heads, T, d)
    bias = alibi.score_bias(zeros, zeros, pos, pos, 1.0)[0, :, -1, :].flip(-1)  # [h, T]: by distance 0..T-1
    rising = int((bias[:, 1:] > bias[:, :-1]).any(-1).sum())
    rope = positions.build("rope", head_dim=d)
    q = torch.randn(1, 1, 1, d, generator=torch.Generator().manual_seed(0))
    peaks = {}
    for r0 in targets:
        k, _ = rope.rotate(q, q, torch.tensor([r0]), torch.tensor([r0]))  # k = R_{r0} q: a content, not a position
        qr, kr = rope.rotate(q, k.expand(1, 1, T, d), torch.tensor([T - 1]), pos)
        logits = (qr * kr).sum(-1)[0, 0].flip(-1)  # [T]: by distance 0..T-1
        peaks[r0] = int(logits.argmax())
    t5 = positions.build("t5", n_heads=n_heads)
    params = {
        name: sum(p.numel() for p in s.parameters()) for name, s in (("alibi", alibi), ("rope", rope), ("t5", t5))
    }
    return {"alibi_rising_heads": rising, "heads": n_heads, "rope_peaks": peaks, "parameters": params, "T": T}


def alibi_hard_claim() -> dict[str, Any]:
    p = distance_profiles()
    missed = sum(r0 != peak for r0, peak in p["rope_peaks"].items())
    record = deterministic(
        "ALiBi penalises distance by a fixed rule, RoPE lets the model learn the position relations: more flexible",
        "seed 000 §4",
        "with one content at every key, ALiBi's logit falls with distance in every head whatever the weights, while "
        "RoPE's peaks at whichever offset the content of q and k sets (error = ALiBi heads whose bias ever rises "
        "with distance + target offsets RoPE misses)",
        f"ALiBi ({p['heads']} heads): the bias -m·r falls with distance r in {p['heads'] - p['alibi_rising_heads']} "
        f"of {p['heads']} heads, with {p['parameters']['alibi']} parameters; RoPE: with k = R_r0 q, the logit over "
        f"distances 0..{p['T'] - 1} peaks at "
        + ", ".join(f"{peak} (r0 = {r0})" for r0, peak in p["rope_peaks"].items())
        + f", with {p['parameters']['rope']} position parameters: what the model learns is W_Q and W_K. Learned "
        f"relations are not RoPE's alone: T5's bias learns one value per distance bucket ({p['parameters']['t5']} "
        f"parameters for {p['heads']} heads). ALiBi's penalty is added to the content logits (a fixed prior that "
        "content can outweigh, not a mask); which trains better is experiment position-training's question",
        error=float(p["alibi_rising_heads"] + missed),
        tolerance=0.0,
        details={"rope_peaks": {str(k): v for k, v in p["rope_peaks"].items()}, "parameters": p["parameters"]},
    )
    return quoted(
        "alibi_hard",
        record,
        "poslab's alibi score_bias and rope rotate on T = 32, d = 64 (k = R_r0 q for each target offset r0); "
        "the t5 scheme's parameter count",
    )


# ----------------------------------------------------------------------------- seed 000 Q2 reason 4
def rotation_orthogonality(d: int = 64, positions_: tuple[int, ...] = (1, 100, 4095), seed: int = 0) -> dict:
    """poslab's RoPE rotation as a matrix per position: ``|RᵀR - I|``, the same-position and cross-position change
    of ``q·k``, the norm change; fp32."""
    rope = positions.build("rope", head_dim=d)
    eye = torch.eye(d)[None, None]  # [1, 1, d, d]: basis vectors as d "tokens"
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, d, generator=g), torch.randn(1, 1, 1, d, generator=g)
    out = {"orthogonality": 0.0, "same_position": 0.0, "norm": 0.0, "cross_position": 0.0}
    for m in positions_:
        at_m = torch.full((d,), m)
        rows, _ = rope.rotate(eye, eye, at_m, at_m)  # row j = R_m e_j
        R = rows[0, 0].T  # [d, d]
        out["orthogonality"] = max(out["orthogonality"], float((R.T @ R - torch.eye(d)).abs().max()))
        qm, km = rope.rotate(q, k, torch.tensor([m]), torch.tensor([m]))
        out["same_position"] = max(out["same_position"], float(((qm * km).sum() - (q * k).sum()).abs()))
        out["norm"] = max(out["norm"], float((qm.norm() - q.norm()).abs() / q.norm()))
        qm, kn = rope.rotate(q, k, torch.tensor([m]), torch.tensor([0]))
        out["cross_position"] = max(out["cross_position"], float(((qm * kn).sum() - (q * k).sum()).abs()))
    return out


def q2_orthogonal_claim() -> dict[str, Any]:
    o = rotation_orthogonality()
    record = deterministic(
        "RoPE's rotation is orthogonal (RᵀR = I) and keeps inner products (Q2 理由 4)",
        "seed 000 Q2",
        "poslab's RoPE rotation at positions 1, 100 and 4095 (d 64, fp32) has |RᵀR - I| <= 1e-5 and changes "
        "neither a vector's norm nor q·k of q and k at the same position by more than 1e-5 (error = the largest)",
        f"|RᵀR - I| up to {o['orthogonality']:.1e}; norm change up to {o['norm']:.1e} (relative); q·k at the same "
        f"position changes by up to {o['same_position']:.1e}. Between positions m and 0 it changes by up to "
        f"{o['cross_position']:.2f}: the rotation keeps the inner product of q and k only at one position, and the "
        "change across positions is how it encodes the offset (⟨R_m q, R_n k⟩ = ⟨q, R_(n-m) k⟩). 'Does not break "
        "the semantic structure' says no more than this",
        error=max(o["orthogonality"], o["norm"], o["same_position"]),
        tolerance=1e-5,
        details=o,
    )
    return quoted("q2_orthogonal", record, "poslab's rope rotate applied to the basis vectors and to q, k ~ N(0, 1)")


# ----------------------------------------------------------------------------- seed 000 Q3 speculation 2
def head_ranks(d_model: int = 64, heads: tuple[int, ...] = (1, 4, 16)) -> dict[int, dict[str, int]]:
    """Per head count: the rank of one head's score form W_Q^h W_K^hᵀ (at init) and the layer's parameters."""
    out = {}
    for h in heads:
        torch.manual_seed(0)
        attn = MultiHeadAttention(d_model, h)
        d_k = d_model // h
        w = attn.qkv.weight  # [(h + 2h)·d_k, d_model]: q rows, then k rows, then v rows
        wq, wk = w[:d_k], w[h * d_k : h * d_k + d_k]  # head 0
        rank = int(torch.linalg.matrix_rank((wq.T @ wk).detach()))
        out[h] = {"d_k": d_k, "rank": rank, "parameters": sum(p.numel() for p in attn.parameters())}
    return out


#: what the overfitting half of Q3's speculation 2 needs, and why nothing here has it
OVERFITTING_RUNS = Premise(
    "trainings that overfit (validation loss above training loss by a clear margin) at several d_k with the same "
    "parameters: 'a larger d_k overfits more easily' is about those",
    "no trainings here (the corrections experiment trains nothing). The lesson's next sentence says LLMs control "
    "overfitting by data, so overfitting would not explain their fixed d_k even if it held",
    False,
)


def q3_overfit_claim() -> dict[str, Any]:
    r = head_ranks()
    params = {v["parameters"] for v in r.values()}
    record = deterministic(
        "a larger d_k gives each head more expressive power and so overfits more easily (Q3 推测 2)",
        "seed 000 Q3",
        "each head's score form q·k = x W_Q^h (W_K^h)ᵀ xᵀ has rank d_k while the layer's parameters do not change "
        "with d_k (error = rank differences + distinct parameter counts - 1)",
        "d_model 64: "
        + ", ".join(f"{h} head{'s' if h > 1 else ''}: d_k {v['d_k']}, rank {v['rank']}" for h, v in r.items())
        + f"; parameters {', '.join(f'{p:,}' for p in sorted(params))} at every head count. A larger d_k is a richer "
        "score per head with fewer heads, not more parameters",
        error=float(sum(abs(v["rank"] - v["d_k"]) for v in r.values()) + len(params) - 1),
        tolerance=0.0,
        details={"heads": {str(h): v for h, v in r.items()}},
    )
    return quoted(
        "q3_overfit",
        with_premise(record, OVERFITTING_RUNS),
        "poslab's MultiHeadAttention(64, h) at init: matrix rank of head 0's W_Q W_Kᵀ and the parameter count",
    )


# ----------------------------------------------------------------------------- seed 000 Q3 speculation 4
#: the fp16/bf16 element count a GEMM dimension must be a multiple of to run on tensor cores at full efficiency
#: (NVIDIA, Matrix Multiplication Background User's Guide, §2.2 "Tensor Core Requirements": 16 bytes = 8 elements)
TENSOR_CORE_MULTIPLE = 8
#: the largest head dimension FlashAttention-2's kernels take (Dao 2023, arXiv:2307.08691)
FLASH2_MAX_HEAD_DIM = 256


def q3_tensor_core_claim() -> dict[str, Any]:
    dks = sorted({int(r["head_dim"]) for r in load_zoo()})
    aligned = [d for d in dks if d % TENSOR_CORE_MULTIPLE == 0]
    record = deterministic(
        "d_k = 128 is a tensor-core-friendly size (Q3 推测 4)",
        "seed 000 Q3",
        f"128 is a multiple of {TENSOR_CORE_MULTIPLE} fp16/bf16 elements, the dimension rule for tensor cores "
        "(error = 1 if not)",
        f"128 = {128 // TENSOR_CORE_MULTIPLE} x {TENSOR_CORE_MULTIPLE}: it meets the rule. So do all {len(aligned)} of "
        f"the {len(dks)} d_k values in the model zoo ({', '.join(map(str, dks))}), 256 included, and FlashAttention-2 "
        f"takes head dimensions up to {FLASH2_MAX_HEAD_DIM}: the rule asks for alignment, not a small d_k. Whether a "
        "smaller d_k runs faster is a timing on a tensor-core GPU, which this experiment does not do",
        error=float(128 % TENSOR_CORE_MULTIPLE != 0),
        tolerance=0.0,
        details={"zoo_d_k": dks, "aligned": aligned},
    )
    return quoted(
        "q3_tensor_core",
        record,
        "NVIDIA's tensor-core dimension rule against 128 and the model zoo's d_k column",
        kind=SOURCE,
        reference="NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001), §2.2 Tensor Core "
        "Requirements; Dao 2023, FlashAttention-2 (arXiv:2307.08691); poslab/lab/data/model_zoo.json",
    )


def reason_claims() -> list[dict[str, Any]]:
    return [su_insight_claim(), alibi_hard_claim(), q2_orthogonal_claim(), q3_overfit_claim(), q3_tensor_core_claim()]
