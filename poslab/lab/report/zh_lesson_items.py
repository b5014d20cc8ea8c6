"""The Chinese of the correction records on lesson 000's §3.1, §4, Q2 reason 4 and Q3 推测 2 and 4, and on
lesson 002's §2.1 and §4.2 (:mod:`poslab.lab.experiments.corrections.lesson000_reasons` and
:mod:`poslab.lab.experiments.corrections.lesson002_formulas`): static texts exactly, measured texts whose
float figures depend on the machine as templates (:mod:`poslab.lab.report.zh_text`)."""

from __future__ import annotations

from poslab.lab.report.zh_text import NUM

#: English text -> Chinese
STATIC: dict[str, str] = {
    # §3.1: whose insight
    "Su et al. 2021's insight: absolute position embeddings weaken attention because position and content are "
    "mixed in one vector": "Su 等 2021 的洞察：绝对位置嵌入把位置和内容混在一个向量里，因而削弱注意力",
    "RoFormer's abstract, where the paper states what RoPE is for, gives this as its motivation (error = 1 if the "
    "properties it states do not include it)": "RoFormer 的摘要（论文在这里说明 RoPE 的用途）把这一点列为动机"
    "（所列性质中没有它则误差 = 1）",
    "the RoFormer and TUPE abstracts": "RoFormer 与 TUPE 两篇论文的摘要",
    "Su et al. 2021 (arXiv:2104.09864), abstract; Ke et al. 2021, 'Rethinking Positional Encoding in Language "
    "Pre-training' (arXiv:2006.15595, ICLR 2021), abstract": "Su 等 2021（arXiv:2104.09864），摘要；Ke 等 2021，"
    "'Rethinking Positional Encoding in Language Pre-training'（arXiv:2006.15595，ICLR 2021），摘要",
    "RoFormer's abstract gives RoPE's properties as: encodes the absolute position with a rotation matrix; "
    "incorporates the explicit relative position dependency in self-attention; flexibility of sequence length; "
    "decaying inter-token dependency with increasing relative distances; equipping linear self-attention with "
    "relative position encoding. The argument the lesson quotes is Ke et al. 2021 (TUPE)'s: the addition of "
    "positional and word embeddings 'brings mixed correlations between the two heterogeneous information "
    "resources', which 'may bring unnecessary randomness in the attention and further limit the expressiveness of "
    "the model'. Nor does RoPE separate the two in the score: its logit Re Σ z_q conj(z_k) e^{i(m-n)θ} multiplies "
    "content and offset; what it keeps apart is the residual stream, which position never enters (the Q2 reason 2 "
    "record)": "RoFormer 摘要列出的 RoPE 性质：用旋转矩阵编码绝对位置；在"
    "自注意力中引入显式的相对位置依赖；序列长度灵活；"
    "词间依赖随相对距离增大而衰减；可为线性自注意力配上相对位"
    "置编码。课文引用的论证出自 Ke 等 2021（TUPE）：位置嵌入与"
    "词嵌入相加"
    "「在两种异质信息之间带来混合的相关」，「可能给注意力带来"
    "不必要的随机性，并进一步限制模型的表达能力」。RoPE 在分数"
    "里也没有把"
    "两者分开：它的 logit Re Σ z_q conj(z_k) e^{i(m-n)θ} 把内容与位置差相乘；它分开的是残差流，位置从不进入残差流"
    "（见 Q2 理由 2 的记录）",
    # §4: a fixed penalty vs learned relations
    "ALiBi penalises distance by a fixed rule, RoPE lets the model learn the position relations: more flexible": (
        "ALiBi 按固定规则惩罚距离，RoPE 让模型自己学位置关系：后者更灵活"
    ),
    "with one content at every key, ALiBi's logit falls with distance in every head whatever the weights, while "
    "RoPE's peaks at whichever offset the content of q and k sets (error = ALiBi heads whose bias ever rises with "
    "distance + target offsets RoPE misses)": "每个键的内容相同时，无论权重如何，ALiBi 的 logit 在每个头"
    "里都随距离下降，"
    "而 RoPE 的 logit 在 q 和 k 的内容所设定的任意位置差处取最"
    "大（误差 = 偏置曾随距离上升的 ALiBi 头数 + RoPE 没命中的"
    "目标位置差数）",
    "poslab's alibi score_bias and rope rotate on T = 32, d = 64 (k = R_r0 q for each target offset r0); the t5 "
    "scheme's parameter count": "poslab 的 alibi score_bias 与 rope rotate，T = 32，d = 64（对每个目标位置差 r0 取 "
    "k = R_r0 q）；t5 编码的参数量",
    "ALiBi (8 heads): the bias -m·r falls with distance r in 8 of 8 heads, with 0 parameters; RoPE: with k = R_r0 "
    "q, the logit over distances 0..31 peaks at 0 (r0 = 0), 3 (r0 = 3), 7 (r0 = 7), 12 (r0 = 12), with 0 position "
    "parameters: what the model learns is W_Q and W_K. Learned relations are not RoPE's alone: T5's bias learns one "
    "value per distance bucket (256 parameters for 8 heads). ALiBi's penalty is added to the content logits (a "
    "fixed prior that content can outweigh, not a mask); which trains better is experiment position-training's "
    "question": "ALiBi（8 个头）：偏置 −m·r 在 8 个头中全部随距离 r 下降，"
    "0 个参数；RoPE：令 k = R_r0 q，距离 0..31 上的 "
    "logit 最大值落在 0（r0 = 0）、3（r0 = 3）、7（r0 = 7）、12（r0 = 12），0 个位置参数：模型学的是 W_Q 和 W_K。"
    "可学习的位置关系并非 RoPE 独有：T5 的偏置为每个距离桶学一个值（8 个头 256 个参数）。ALiBi 的惩罚加在内容 logit 上"
    "（内容可以压过的固定先验，不是掩码）；哪个训练得更好是 position-training 实验的问题",
    # Q2 reason 4: orthogonal
    "RoPE's rotation is orthogonal (RᵀR = I) and keeps inner products (Q2 理由 4)": (
        "RoPE 的旋转是正交变换（RᵀR = I），保持内积（Q2 理由 4）"
    ),
    "poslab's RoPE rotation at positions 1, 100 and 4095 (d 64, fp32) has |RᵀR - I| <= 1e-5 and changes neither a "
    "vector's norm nor q·k of q and k at the same position by more than 1e-5 (error = the largest)": (
        "poslab 的 RoPE 旋转在位置 1、100 和 4095（d 64，fp32）上 |RᵀR - I| <= 1e-5，向量长度和同一位置上 q 与 k 的 "
        "q·k 的变化都不超过 1e-5（误差 = 其中最大者）"
    ),
    "poslab's rope rotate applied to the basis vectors and to q, k ~ N(0, 1)": (
        "poslab 的 rope rotate 作用于基向量和 q, k ~ N(0, 1)"
    ),
    # Q3 推测 2: overfitting
    "a larger d_k gives each head more expressive power and so overfits more easily (Q3 推测 2)": (
        "d_k 越大，每个头的表达能力越强，因而越容易过拟合（Q3 推测 2）"
    ),
    "each head's score form q·k = x W_Q^h (W_K^h)ᵀ xᵀ has rank d_k while the layer's parameters do not change with "
    "d_k (error = rank differences + distinct parameter count"
    "s - 1)": "每个头的分数形式 q·k = x W_Q^h (W_K^h)ᵀ xᵀ 的秩是 "
    "d_k，而这一层的参数量不随 d_k 变化（误差 = 秩的差异数 + 不同参数量的个数 - 1）",
    "poslab's MultiHeadAttention(64, h) at init: matrix rank of head 0's W_Q W_Kᵀ and the parameter count": (
        "poslab 的 MultiHeadAttention(64, h) 初始化时：头 0 的 W_Q W_Kᵀ 的矩阵秩与参数量"
    ),
    "d_model 64: 1 head: d_k 64, rank 64, 4 heads: d_k 16, rank 16, 16 heads: d_k 4, rank 4; parameters 16,640 at "
    "every head count. A larger d_k is a richer score per head with fewer heads, not more parameters": (
        "d_model 64：1 个头：d_k 64，秩 64；4 个头：d_k 16，秩 16；16 个头：d_k 4，秩 4；每种头数的参数量都是 16,640。"
        "d_k 大意味着每个头的分数更丰富、头更少，不是参数更多"
    ),
    "premise not met: trainings that overfit (validation loss above training loss by a clear margin) at several d_k "
    "with the same parameters: 'a larger d_k overfits more easily' is about those (measured: no trainings here (the "
    "corrections experiment trains nothing). The lesson's next sentence says LLMs control overfitting by data, so "
    "overfitting would not explain their fixed d_k even if it"
    " held)": "前提未满足：在参数量相同、d_k 不同的几组训练中出现过拟合"
    "（验证损失明显高于训练损失）：「d_k 越大越容易过拟合」说"
    "的是这种训练（测得：这里没有训练（勘误实验不训练）。课文"
    "下一句说 LLM "
    "靠数据控制过拟合，所以即使它成立，也解释不了 LLM 固定的 d_k）",
    # Q3 推测 4: tensor cores
    "d_k = 128 is a tensor-core-friendly size (Q3 推测 4)": "d_k = 128 是对 tensor core 友好的尺寸（Q3 推测 4）",
    "128 is a multiple of 8 fp16/bf16 elements, the dimension rule for tensor cores (error = 1 if not)": (
        "128 是 8 个 fp16/bf16 元素的整数倍，即 tensor core 的维度规则（不是则误差 = 1）"
    ),
    "NVIDIA's tensor-core dimension rule against 128 and the model zoo's d_k column": (
        "用 NVIDIA 的 tensor core 维度规则检查 128 和模型表的 d_k 列"
    ),
    "NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001), §2.2 Tensor Core Requirements; Dao 2023, "
    "FlashAttention-2 (arXiv:2307.08691); poslab/lab/data/model_zoo.json": "NVIDIA，Matrix Multiplication Background "
    "User's Guide（DU-09799-001），§2.2 Tensor Core Requirements；Dao 2023，FlashAttention-2（arXiv:2307.08691）；"
    "poslab/lab/data/model_zoo.json",
    "128 = 16 x 8: it meets the rule. So do all 6 of the 6 d_k values in the model zoo (64, 96, 112, 128, 192, 256), "
    "256 included, and FlashAttention-2 takes head dimensions up to 256: the rule asks for alignment, not a small "
    "d_k. Whether a smaller d_k runs faster is a timing on a tensor-core GPU, which this experiment does not do": (
        "128 = 16 x 8：满足规则。模型表中 6 种 d_k（64、96、112、"
        "128、192、256）6 种全都满足，包括 256；FlashAttention-2 "
        "支持到 256 的头维度：规则要求的是对齐，不是小的 d_k。更小"
        "的 d_k 是否更快，要在有 tensor core 的 GPU 上计时，本实验"
        "不计时"
    ),
    # lesson 002 §4.2: the complex form
    "RoPE keeps the inner product relative: f_q(x_m)^T f_k(x_n) = g(x_m, x_n) e^{i(m-n)θ}": (
        "RoPE 让内积只依赖相对位置：f_q(x_m)^T f_k(x_n) = g(x_m, x_n) e^{i(m-n)θ}"
    ),
    "the lesson's formula holds under one of its two readings within 1e-5 at four position pairs with the same "
    "offset: as complex numbers, its left side f_q^T f_k (no conjugate) is the attention score; or as 2-D vectors, "
    "its right side g e^{i(m-n)θ} (g = z_q conj(z_k), no real part taken) is the real score (error = the smaller of "
    "the two failures: |left side - score| and the right side"
    "'s imaginary part)": "在位置差相同的四对位置上，课文的公式在"
    "两种读法之一下成立（误差 1e-5 以内）：按复数读，左边 f_q^T f_k（不取共轭）就是注意力分数；或按二维向量读，右边 "
    "g e^{i(m-n)θ}（g = z_q conj(z_k)，不取实部）就是实数分数（误差 = 两种失败中较小者：|左边 - 分数| 与右边的虚部）",
    "poslab's rope (interleaved pairs) against each complex form in float64 (Su et al. 2021, arXiv:2104.09864, "
    "§3.2.1: g = Re[(W_q x_m)(W_k x_n)^* e^{i(m-n)θ}])": "poslab 的 rope（交错成对）在 float64 下与每种复数形式比较"
    "（Su 等 2021，arXiv:2104.09864，§3.2.1：g = Re[(W_q x_m)(W_k x_n)^* e^{i(m-n)θ}]）",
    # lesson 002 §2.1: the LaTeX
    "the sinusoidal formula's LaTeX source typesets (§2.1)": "正余弦公式（§2.1）的 LaTeX 源码能正常排版",
    "each line of the formula has balanced braces, a line break where one is meant, and parses (error = number of "
    "faults over the lines)": "公式的每一行括号配对、该换行处有换行、且能被解析（误差 = 各行错误数之和）",
    "a brace count per line and matplotlib's mathtext parser (a TeX subset) on the lesson's lines and on the fixed "
    "ones": "对课文的各行和改正后的各行逐行数括号，并用 matplotlib 的 mathtext 解析器（TeX 的子集）解析",
    "the lesson: line 1: braces -1, single backslash yes, parses no; line 2: braces -1, single backslash no, parses "
    "no. Each line closes one brace more than it opens (`^{2i/d_{model}}}`), and the first ends in a single `\\`, "
    "TeX's control space, so the two equations would run together on one line. Fixed (0 faults): \\begin{aligned} "
    "PE_{(pos,2i)} &= \\sin\\left(pos/10000^{2i/d_{model}}\\right) \\\\ PE_{(pos,2i+1)} &= "
    "\\cos\\left(pos/10000^{2i/d_{model}}\\right) \\end{aligned}. §4.2's complex form ends its first line the same "
    "way. The mathematics of §2.1 is right (poslab.nn.positions.absolute.sinusoid_table)": "课文：第 1 行：括号 -1，"
    "单个反斜杠：是，能解析：否；第 2 行：括号 -1，单个反斜杠"
    "：否，能解析：否。每行闭括号比开括号多一个（`^{2i/d_{mod"
    "el}}}`），"
    "第一行末尾是单个 `\\`（TeX 的控制空格），两个等式会挤在同一行。改正后（0 处错误）：\\begin{aligned} "
    "PE_{(pos,2i)} &= \\sin\\left(pos/10000^{2i/d_{model}}\\right) \\\\ PE_{(pos,2i+1)} &= "
    "\\cos\\left(pos/10000^{2i/d_{model}}\\right) \\end{align"
    "ed}。§4.2 的复数形式第一行末尾也一样。§2.1 的数学本身是对"
    "的"
    "（poslab.nn.positions.absolute.sinusoid_table）",
}

#: measured texts whose float figures depend on the machine: (regex, Chinese form)
MEASURED: tuple[tuple[str, str], ...] = (
    (
        rf"\|RᵀR - I\| up to (?P<a>{NUM}); norm change up to (?P<b>{NUM}) \(relative\); q·k at the same position "
        rf"changes by up to (?P<c>{NUM})\. Between positions m and 0 it changes by up to (?P<d>{NUM}): the rotation "
        r"keeps the inner product of q and k only at one position, and the change across positions is how it "
        r"encodes the offset \(⟨R_m q, R_n k⟩ = ⟨q, R_\(n-m\) k⟩\)\. 'Does not break the semantic structure' says "
        r"no more than this",
        "|RᵀR - I| 最大 {a}；长度变化最大 {b}（相对）；同一位置上"
        "的 q·k 变化最大 {c}。在位置 m 与 0 之间，它的变化可达 {d"
        "}："
        "旋转只在同一位置保持 q 与 k 的内积，跨位置的变化正是它编码位置差的方式（⟨R_m q, R_n k⟩ = ⟨q, R_(n-m) k⟩）。"
        "「不破坏语义结构」说的不过如此",
    ),
    (
        rf"poslab's rope score at offset (?P<o>\d+): (?P<s>{NUM}) at every pair \(spread (?P<sp>{NUM})\)\. "
        rf"Re Σ z_q conj\(z_k\) e\^\(i\(m-n\)θ\) \(RoFormer's form\) matches it to (?P<r>{NUM})\. The lesson's left "
        rf"side, Σ z_q z_k e\^\(i\(m\+n\)θ\) without the conjugate, differs from it by up to (?P<l>{NUM}) and "
        rf"changes with m \+ n \(spread (?P<ls>{NUM})\); its right side agrees in its real part but carries an "
        rf"imaginary part up to (?P<im>{NUM})\. Correct: (?P<c>.+)",
        "poslab 的 rope 在位置差 {o} 处的分数：每对位置都是 {s}（波动 {sp}）。Re Σ z_q conj(z_k) e^(i(m-n)θ)"
        "（RoFormer 的形式）与之相差不超过 {r}。课文的左边 Σ z_q "
        "z_k e^(i(m+n)θ) 不取共轭，与之最多差 {l}，且随 m + n 变化"
        "（波动 {ls}）；右边的实部一致，但带有最大 {im} 的虚部。正确形式：{c}",
    ),
)
