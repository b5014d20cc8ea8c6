"""The lessons' passages the corrections judge, quoted exactly, and seed 002's empty tables."""

from __future__ import annotations

from typing import Any

from poslab.lab.evidence import KIND_KEY, MEASURED, REFERENCE_KEY, SENTENCE_KEY, evidence_problems
from poslab.lab.verdicts import ClaimRecord

#: the quoted passages: key -> (where, Chinese text, English gloss)
QUOTES: dict[str, tuple[str, str, str]] = {
    "alibi": (
        "seed 000 §4",
        r"$$\text{bias}_{ij} = \begin{cases} 0 & j \le i \\ -\alpha(i - j) & j > i \end{cases}$$",
        "the ALiBi bias is 0 on past keys (j <= i) and -α(i-j) on future keys (j > i)",
    ),
    "ntk_table": (
        "seed 000 §3.5",
        "NTK-aware\t修正 base 参数，低频维度保持、高频维度插值",
        "NTK-aware: change the base; keep the low-frequency dimensions, interpolate the high-frequency ones",
    ),
    "ntk_q4": (
        "seed 000 Q4",
        "扩展长度时应该保持低频维度不变（它们的周期本来就长），"
        "只对高频维度做插值。而「保持不变」的直觉做法就是减小 base。",
        "when extending the length, keep the low-frequency dimensions unchanged (their periods are long already) and "
        "interpolate only the high-frequency ones; the intuitive way to 'keep them unchanged' is to decrease the base",
    ),
    "dk": (
        "seed 000 §1.4 and Q3",
        "关键观察：几乎所有 LLM 的 $d_k$ 都固定在 64 或 128，不管模型多大。",
        "almost every LLM's d_k is fixed at 64 or 128, whatever the model's size",
    ),
    "rope_memory": (
        "seed 002 §4.2",
        "在7B参数模型上节省12%显存",
        "(RoPE) saves 12% of GPU memory on a 7B-parameter model",
    ),
    "xl_pg19": (
        "seed 002 §4.1",
        "在PG-19数据集上提升17%的perplexity",
        "(Transformer-XL's relative encoding) improves perplexity by 17% on PG-19",
    ),
    "xl_learned_r": (
        "seed 002 §4.1",
        "其中r是学习到的相对位置向量，u/v是全局可学习偏置",
        "where r are learned relative position vectors and u/v learned global biases",
    ),
    "local_mask": (
        "seed 002 §3.1",
        "mask = torch.ones(L, L).tril(-window_size) + torch.ones(L, L).triu(window_size)\n"
        "scores = scores.masked_fill(mask == 0, -1e9)",
        "the local (sliding-window) attention mask, in code",
    ),
    "fp16_clip": (
        "seed 002 §7.2",
        "3. 梯度裁剪阈值需要调整为FP16适应范围",
        "3. the gradient-clipping threshold must be adjusted to suit the FP16 range",
    ),
    "llama3_averaging": (
        "seed 000 Q4",
        "LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 + 平均检查点"
        "（averaging checkpoints）避免灾难性遗忘。",
        "Llama 3's recipe: pre-train at 8K, extend to 128K in stages, with NTK-aware scaling + continued "
        "pre-training + averaging checkpoints in between to avoid catastrophic forgetting",
    ),
    "adaptive_span": (
        "seed 002 §7.1",
        "Google最新研究的Adaptive Attention Span：\n• 根据输入复杂度动态调整每个头的关注范围\n"
        "• 在PG-19任务上减少23%计算量",
        "Google's latest research, Adaptive Attention Span … cuts computation by 23% on PG-19",
    ),
    "autocast_fp32": (
        "seed 002 §7.2",
        "1. 注意力分数计算必须保持FP32：\nwith torch.cuda.amp.autocast():\n"
        "    scores = torch.matmul(q.float(), k.transpose(-2, -1).float())",
        "1. the attention scores must stay in FP32: (casting q and k with .float() inside autocast)",
    ),
    "pe_cache_code": (
        "seed 002 §5.2",
        "class PositionalEncoding:\n    def __init__(self, max_len=5000):\n"
        "        self.pe = torch.zeros(max_len, d_model)  # 预计算",
        "the precomputed positional-encoding cache, in code (d_model is not an argument)",
    ),
    "adaptive_span_code": (
        "seed 002 §7.1",
        "mask = torch.ones(seq_len, seq_len)\nfor h in range(self.num_heads):\n"
        "    span = self.span_predicter[h](x)\n"
        "    mask += torch.triu(torch.ones(seq_len, seq_len), diagonal=-span)",
        "the adaptive-span mask, in code: one span per head",
    ),
    "adaptive_span_heading": (
        "seed 002 §7.1",
        "7.1 动态头数调节\nGoogle最新研究的Adaptive Attention Span：\n• 根据输入复杂度动态调整每个头的关注范围",
        "7.1 dynamic adjustment of the number of heads: Adaptive Attention Span adjusts each head's span",
    ),
    "head_rule_imagenet": (
        "seed 002 §3.2",
        "通过ImageNet分类实验得到的经验公式：\n最优头数 ≈ \\sqrt{d_{model}/16}",
        "an empirical formula obtained from ImageNet classification experiments: optimal heads ≈ √(d_model/16)",
    ),
    "dk_variance": (
        "seed 000 §1.4 and Q3",
        "$d_k$ 越大，$q\\cdot k$ 的方差越大。即使除以 $\\sqrt{d_k}$，模型也需要精细校准才能让 softmax 工作在好的区间。",
        "the larger d_k, the larger the variance of q·k; even after dividing by √d_k the softmax needs fine "
        "calibration",
    ),
    "q4_high_freq": (
        "seed 000 Q4",
        "1. 旋转角度过大——$base=10000$ 下，高维的旋转周期很长，但低维在位置 $10^6$ 时已经转了无数圈，数值上不再有意义",
        "the rotation angles grow too large: the high dimensions have long periods, but the low dimensions "
        "(the high frequencies) have turned countless times at position 10^6 and no longer mean anything",
    ),
    "table_22": (
        "seed 000 §2.2",
        "绝对位置嵌入\tBERT、GPT-2\t把位置向量加到 token embedding\t差（超出训练长度就崩）\n"
        "可学习位置嵌入\tBERT、GPT-2\t位置也用可学习的向量\t差（同上）\n"
        "相对位置编码\tT5、ALiBi\t在 attention 计算时加入相对距离偏置\t中\n"
        "旋转位置编码（RoPE）\tLLaMA、几乎所有现代 LLM\t用旋转把位置注入 Q/K\t好",
        "four kinds of position encoding and their extrapolation: absolute (BERT, GPT-2) poor, learned "
        "(BERT, GPT-2) poor, relative (T5, ALiBi) medium, RoPE good",
    ),
    "llama3_ntk": (
        "seed 000 Q4",
        "LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware",
        "Llama 3's recipe: pre-train at 8K, extend to 128K in stages with NTK-aware scaling",
    ),
    "rope_spread": (
        "seed 000 §3.4",
        "→ 同一距离下内积完全一致（波动仅 1e-6，即浮点误差）",
        "at the same distance the inner products are identical (a spread of only 1e-6, float error)",
    ),
    "alibi_modern": (
        "seed 000 §4",
        "• 性能略低于 RoPE：现代 LLM 基本不用了",
        "slightly worse than RoPE: modern LLMs hardly use it any more",
    ),
    "q2_space": (
        "seed 000 Q2",
        "理由 2：不占据表示空间\n\n加位置向量时，$d_{model}$ 维里有一部分专门用来存位置信息，挤占了表示内容的空间。\n\n"
        "RoPE 不增加任何维度——它只是把 $q, k$ 旋转了一下，维度完全不变。",
        "reason 2: it takes no representation space. An added position vector uses part of the d_model dimensions "
        "for position, crowding out content; RoPE adds no dimension, it only rotates q and k",
    ),
    "contra_ntk": (
        "seed 000 Q4 and §3.5",
        "NTK-aware scaling\t修正 base，高频少插值、低频多插值\t★★☆ 简单有效",
        "Q4's table: NTK-aware changes the base, interpolating the high frequencies little and the low ones more",
    ),
    "contra_alibi": (
        "seed 000 §2.2 and §4",
        "• 外推性好：距离是线性的，理论上可外推",
        "(ALiBi) extrapolates well: the distance is linear, so in theory it extrapolates",
    ),
    "contra_rope": (
        "seed 000 §2.2 and §3.5",
        "但实际上会退化。原因是注意力熵爆炸：",
        "(RoPE) but in practice it degrades, because the attention entropy explodes",
    ),
    "su_insight": (
        "seed 000 §3.1",
        "原论文（Su et al., 2021）的洞察：\n\n"
        "绝对位置嵌入会削弱注意力机制——因为「位置」和「内容」被混在一个向量里，无法分离。",
        "the original paper's (Su et al., 2021) insight: absolute position embeddings weaken attention, because "
        "position and content are mixed in one vector and cannot be separated",
    ),
    "alibi_hard": (
        "seed 000 §4",
        "为什么 RoPE 更好：ALiBi 是「硬性惩罚远处 token」，而 RoPE 是「让模型自己学位置关系」。后者更灵活。",
        "why RoPE is better: ALiBi 'penalises distant tokens by a fixed rule', RoPE 'lets the model learn the "
        "position relations itself'; the latter is more flexible",
    ),
    "q2_orthogonal": (
        "seed 000 Q2",
        "理由 4：与 attention 的数学结构兼容\n\n"
        "RoPE 的旋转是正交变换，保持内积关系（旋转矩阵满足 $R^\\top R = I$）。"
        "这保证了它不会破坏 $q, k$ 原本的语义结构。",
        "reason 4: RoPE's rotation is an orthogonal transform that keeps inner products (R^T R = I), so it does not "
        "break the semantic structure of q and k",
    ),
    "q3_overfit": (
        "seed 000 Q3",
        "推测 2：过拟合\n\n$d_k$ 大 → 每个头的表达能力更强 → 更容易过拟合。"
        "LLM 靠数据规模控制过拟合，不需要靠小 $d_k$。",
        "speculation 2: a large d_k gives each head more expressive power, so it overfits more easily; LLMs control "
        "overfitting through the scale of their data and do not need a small d_k for it",
    ),
    "q3_tensor_core": (
        "seed 000 Q3",
        "推测 4：工程效率\n\n小 $d_k$ 的矩阵乘法更容易被 GPU 的 tensor core 优化（尤其是 fp16/bf16）。"
        "$d_k=128$ 是 tensor core 的友好尺寸。",
        "speculation 4: matrix products with a small d_k are easier for the GPU's tensor cores to optimise "
        "(fp16/bf16 above all); d_k = 128 is a tensor-core-friendly size",
    ),
    "rope_complex": (
        "seed 002 §4.2",
        "f_q(x_m) = (W_qx_m)e^{imθ} \\\nf_k(x_n) = (W_kx_n)e^{inθ}\n"
        "• 保持内积的相对性：$f_q(x_m)^Tf_k(x_n) = g(x_m,x_n)e^{i(m-n)θ}$",
        "RoPE in complex form, f_q(x_m) = (W_q x_m) e^{imθ}, f_k(x_n) = (W_k x_n) e^{inθ}, and its property: "
        "f_q(x_m)^T f_k(x_n) = g(x_m, x_n) e^{i(m-n)θ} (no real part, no conjugate)",
    ),
    "pe_latex": (
        "seed 002 §2.1",
        "PE_{(pos,2i)} = \\sin(pos/10000^{2i/d_{model}}}) \\\nPE_{(pos,2i+1)} = \\cos(pos/10000^{2i/d_{model}}})",
        "the sinusoidal formula's LaTeX source: one closing brace too many in each line, and a single backslash "
        "where a line break is meant",
    ),
}

#: seed 002's tables and figure announced but left empty, and what poslab measured instead
EMPTY_TABLES = [
    {
        "where": "seed 002 §2.2",
        "text": "固定式正余弦编码 vs 可学习embedding的实测差异：",
        "gloss": "measured differences, fixed sinusoidal vs learned embedding: (no table follows)",
        "poslab": "experiment position-training (the same GPT trained with every scheme, learned and sinusoidal "
        "included: curves and final val loss) and experiment extrapolation (perplexity at 1x..16x L)",
    },
    {
        "where": "seed 002 §3.2",
        "text": "常见配置参考表：",
        "gloss": "reference table of common configurations: (empty)",
        "poslab": "experiment model-zoo (39 open models' heads, kv heads, d_k from their config.json) and experiment "
        "heads (1..16 heads trained at n_embd 128)",
    },
    {
        "where": "seed 002 §6.1",
        "text": "通过t-SNE降维展示8个头在文本分类任务中的关注模式：（图缺）可见：",
        "gloss": "a t-SNE of the 8 heads' attention patterns on a text-classification task: (no figure) we see: ...",
        "poslab": "`poslab heads` classifies each head of a trained model (previous-token, local, long-range ...); "
        "experiment head-map projects them (PCA / t-SNE)",
    },
    {
        "where": "seed 002 §6.2",
        "text": "在WMT14英德翻译任务上的对比：",
        "gloss": "comparison on WMT14 English-German translation: (no table follows)",
        "poslab": "no translation task: the position ablation is measured on language modelling "
        "(position-training, extrapolation, context-extension)",
    },
]


#: the sentence of the lesson each record judges, verbatim (seed 000 or 002 contains it exactly): one verdict each;
#: the quote itself where a record quotes one sentence whole
SENTENCES: dict[str, str] = {
    **{k: QUOTES[k][1] for k in ("alibi", "ntk_table", "dk", "rope_memory", "xl_pg19", "fp16_clip", "contra_alibi")},
    "ntk_q4": "而「保持不变」的直觉做法就是减小 base。",
    "xl_learned_r": "其中r是学习到的相对位置向量",
    "local_mask": "mask = torch.ones(L, L).tril(-window_size) + torch.ones(L, L).triu(window_size)",
    "llama3_averaging": "平均检查点（averaging checkpoints）避免灾难性遗忘",
    "adaptive_span": "Google最新研究的Adaptive Attention Span：",
    "autocast_fp32": "    scores = torch.matmul(q.float(), k.transpose(-2, -1).float())",
    "pe_cache_code": "        self.pe = torch.zeros(max_len, d_model)  # 预计算",
    "adaptive_span_code": "        mask += torch.triu(torch.ones(seq_len, seq_len), diagonal=-span)",
    "adaptive_span_heading": "7.1 动态头数调节",
    "head_rule_imagenet": "通过ImageNet分类实验得到的经验公式：",
    "dk_variance": "即使除以 $\\sqrt{d_k}$，模型也需要精细校准才能让 softmax 工作在好的区间。",
    "q4_high_freq": "但低维在位置 $10^6$ 时已经转了无数圈，数值上不再有意义",
    "table_22": "可学习位置嵌入\tBERT、GPT-2\t位置也用可学习的向量\t差（同上）",
    "llama3_ntk": "中间用 NTK-aware",
    "rope_spread": "波动仅 1e-6，即浮点误差",
    "alibi_modern": "现代 LLM 基本不用了",
    "q2_space": "加位置向量时，$d_{model}$ 维里有一部分专门用来存位置信息，挤占了表示内容的空间。",
    "contra_ntk": "NTK-aware scaling\t修正 base，高频少插值、低频多插值",
    "contra_rope": "但实际上会退化。",
    "su_insight": "绝对位置嵌入会削弱注意力机制——因为「位置」和「内容」被混在一个向量里，无法分离。",
    "alibi_hard": "ALiBi 是「硬性惩罚远处 token」，而 RoPE 是「让模型自己学位置关系」。后者更灵活。",
    "q2_orthogonal": "RoPE 的旋转是正交变换，保持内积关系（旋转矩阵满足 $R^\\top R = I$）。",
    "q3_overfit": "$d_k$ 大 → 每个头的表达能力更强 → 更容易过拟合。",
    "q3_tensor_core": "$d_k=128$ 是 tensor core 的友好尺寸。",
    "rope_complex": "• 保持内积的相对性：$f_q(x_m)^Tf_k(x_n) = g(x_m,x_n)e^{i(m-n)θ}$",
    "pe_latex": "PE_{(pos,2i)} = \\sin(pos/10000^{2i/d_{model}}}) \\",
}


def quoted(
    key: str, record: ClaimRecord, evidence: str, *, kind: str = MEASURED, reference: str | None = None
) -> dict[str, Any]:
    """``record`` as a correction: its quote, gloss, evidence, evidence kind, judged sentence and reference.

    Raises ``ValueError`` when the record breaks the evidence rules (:func:`poslab.lab.evidence.evidence_problems`).
    """
    where, chinese, gloss = QUOTES[key]
    out = record.to_dict()
    extra: dict[str, Any] = {"quote": chinese, "gloss": gloss, "evidence": evidence}
    extra[KIND_KEY], extra[SENTENCE_KEY] = kind, SENTENCES[key]
    if reference is not None:
        extra[REFERENCE_KEY] = reference
    out["details"] = dict(out["details"], **extra)
    problems = evidence_problems(out)
    if problems:
        raise ValueError("; ".join(problems))
    return out
