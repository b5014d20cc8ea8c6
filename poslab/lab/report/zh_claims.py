"""The Chinese of the static texts experiments write: claims (or their English glosses), criteria, evidence,
references, withdrawn reasons, the glosses in sources, and the words arms and metrics are named by.

The English text is the key, exactly as the experiment writes it (:mod:`poslab.lab.report.zh_text`). A claim
written as ``中文 — gloss`` keeps its quotation as written; only the gloss is listed here. Generated texts with
numbers are templates (:mod:`poslab.lab.report.zh_templates`, :mod:`poslab.lab.report.zh_measured`).
"""

from __future__ import annotations

from poslab.lab.report import zh_lesson_items
from poslab.lab.report.zh_measured import STATIC

#: verdict words, arm labels, metrics and small pieces other texts are made of
WORDS: dict[str, str] = {
    "held": "课文正确",
    "did not hold": "课文有误",
    "inconclusive": "无定论",
    "bigram": "二元语法",
    "trigram": "三元语法",
    "unigram": "一元语法",
    "above": "高于",
    "not above": "不高于",
    "below": "低于",
    "used": "采用",
    "not used": "未采用",
    "paired by seed": "按种子配对",
    "base models": "基座模型",
    "plain fine-tunes": "普通微调的模型",
    "base": "基座",
    "base RoPE": "基座 RoPE",
    "the base model at L": "基座模型在 L 处",
    "analysed model (one training, no seeds)": "被分析的模型（一次训练，无种子）",
    "no scaling": "不缩放",
    "dynamic NTK": "动态 NTK",
    "plain fine-tune": "普通微调",
    "base ⊕ fine-tuned": "基座 ⊕ 微调",
    "continued training": "继续训练",
    "no position encoding": "无位置编码",
    "rope + YaRN x4 no temperature": "rope + YaRN x4（不加温度）",
    "all variants": "所有变体",
    "val loss": "验证损失",
    "val loss (whole validation split)": "验证损失（整个验证集）",
    "in-length loss": "训练长度内的损失",
    "Spearman correlation": "Spearman 相关系数",
    "needs punctuation in the vocabulary": "词表中需要有标点",
    "not measurable: the results do not name the character-level text of the loss": (
        "无法测量：结果没有写明损失所在的字符级文本"
    ),
    "the plain YaRN fine-tune forgets (its claim held: ln perplexity at L above the base model's, paired t at 0.05)": (
        "普通的 YaRN 微调会遗忘（其论断成立：L 处的对数困惑度高于基座模型，配对 t 检验，0.05 水平）"
    ),
    "at least one test length past L where every arm's accuracy is above chance by more than its 95% interval "
    "(one-sample t per scheme and task)": "L 之外至少有一个测试长度上每组的准确率都高于随机水平且超出其 95% 区间"
    "（每种编码、每个任务做单样本 t 检验）",
    "the comparison is made at those lengths only": "比较只在这些长度上进行",
    "table": "的表",
    # metrics the experiments compare on
    "perplexity (non-overlapping)": "困惑度（不重叠分块）",
    "non-overlapping": "不重叠分块",
    "nonoverlapping": "不重叠分块",
    "sliding": "滑动窗口",
    "training tokens per CPU second (arms alternating in one process)": (
        "每 CPU 秒训练的 token 数（各组在同一进程中交替运行）"
    ),
    "mean q/k pair norm of trained models": "训练模型中 q/k 维度对的平均范数",
    "low/high quarter norm ratio": "最低与最高四分之一频率的范数之比",
    "Spearman correlation of head index and mean attention distance over all heads": (
        "所有头上头序号与平均注意力距离的 Spearman 相关系数"
    ),
    "ratio of the two k-means clusters' median mean attention distances (long-range over local)": (
        "两个 k-means 簇的平均注意力距离中位数之比（远程比局部）"
    ),
    "loss of (a) without memory minus (b) with memory L": "（a）无记忆的损失减去（b）记忆长度 L 的损失",
    "ppl(4L)/ppl(L) of RoPE < that of T5 and of ALiBi": "RoPE 的 ppl(4L)/ppl(L) < T5 的，也 < ALiBi 的",
    "not measured (a variant is missing)": "没有测量（缺少一个变体）",
    "text": "正文",
}

#: the English gloss of each ``中文 — gloss`` claim, and the claims written in English
CLAIMS: dict[str, str] = {
    # the head analysis
    "some heads specialise in the previous token": "有的头专门关注前一个字",
    "some heads attend to punctuation (the full stop)": "有的头关注标点（句号）",
    "some heads are spare: pruning the least important 30% costs < 2% of the loss": (
        "有的头是备用的：剪掉最不重要的 30% 的头，损失增加不到 2%"
    ),
    # attention-entropy
    "plain RoPE's attention entropy past L rises more than the growing key count explains (at 4x L)": (
        "超过 L 之后，普通 RoPE 的注意力熵上升得比键数增多所能解释的更多（在 4x L 处）"
    ),
    "YaRN's temperature reduces the entropy rise (vs the same YaRN frequencies without it)": (
        "YaRN 的温度减小了熵增（对比同样频率但不加温度的 YaRN）"
    ),
    "YaRN (with its temperature) rises less than plain RoPE": "YaRN（带温度）的熵增小于普通 RoPE",
    "log-n scaling reduces the entropy rise": "log-n 缩放减小了熵增",
    "the entropy rise is what degrades perplexity: across models, larger rises go with larger perplexity ratios": (
        "困惑度变差是熵增造成的：在各模型之间，熵增越大，困惑度之比越大"
    ),
    # causal-leak
    "one layer without positions cannot tell 白日依山尽 from 山依日白尽": (
        "没有位置信息的一层注意力分不清白日依山尽和山依日白尽"
    ),
    "from two layers on, the causal mask leaks order": "从两层起，因果掩码泄露了顺序",
    # context-extension
    "YaRN is the best inference-time scaling": "YaRN 是推理时最好的缩放",
    "after fine-tuning, YaRN <= PI": "微调之后，YaRN ≤ PI",
    "plain fine-tuning (no scaling) is the worst of the three": "普通微调（不缩放）是三者中最差的",
    "continued training (plain fine-tuning at 4x L) reads 4x L better than every inference-only scaling at an equal "
    "token budget": "同样的 token 预算下，继续训练（在 4x L 上普通微调）在 4x L 上的困惑度低于每一种只在推理时用的缩放",
    "continued training is the most reliable: its spread across seeds at 4x L is below every inference-only "
    "scaling's": "继续训练最可靠：它在 4x L 上的种子间离散度低于每一种只在推理时用的缩放",
    "without fine-tuning, PI retrieves the passkey at 4x L better than no scaling": (
        "不微调时，PI 在 4x L 处的密钥检索比不缩放好"
    ),
    "the plain YaRN fine-tune forgets (higher perplexity at L than the base model; the premise of the forgetting "
    "claims below)": "普通的 YaRN 微调会遗忘（在 L 处的困惑度高于基座模型；这是下面几条遗忘论断的前提）",
    "averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting (lower perplexity at L than the plain "
    "fine-tune)": "平均 YaRN 微调的最后 3 个检查点能减轻遗忘（在 L 处的困惑度低于普通微调）",
    "averaging the last 3 checkpoints does not hurt perplexity at 4x L (within 1% of the plain fine-tune)": (
        "平均最后 3 个检查点不会损害 4x L 处的困惑度（与普通微调相差 1% 以内）"
    ),
    "base ⊕ fine-tuned (0.5/0.5) reduces forgetting (lower perplexity at L than the plain fine-tune)": (
        "基座 ⊕ 微调（0.5/0.5）能减轻遗忘（在 L 处的困惑度低于普通微调）"
    ),
    "base ⊕ fine-tuned keeps the extension (lower perplexity at 4x L than the base model with YaRN at inference)": (
        "基座 ⊕ 微调保住了扩展（在 4x L 处的困惑度低于推理时用 YaRN 的基座模型）"
    ),
    "averaging the last 3 checkpoints keeps passkey retrieval at 4x L (at most 0.05 below the plain fine-tune)": (
        "平均最后 3 个检查点保住了 4x L 处的密钥检索（比普通微调至多低 0.05）"
    ),
    # corrections
    "ALiBi's bias is 0 for j <= i and -α(i-j) for j > i": "ALiBi 的偏置在 j <= i 时为 0，在 j > i 时为 -α(i-j)",
    "NTK-aware scaling keeps the low-frequency dimensions and interpolates the high-frequency ones": (
        "NTK-aware 缩放保持低频维度不变，对高频维度插值"
    ),
    "NTK-aware scaling keeps the low frequencies by decreasing the base": "NTK-aware 缩放通过减小 base 来保持低频",
    "RoPE saves 12% of GPU memory on a 7B model": "RoPE 在 7B 模型上节省 12% 的显存",
    "Transformer-XL's relative encoding improves perplexity by 17% on PG-19": (
        "Transformer-XL 的相对编码在 PG-19 上把困惑度改善了 17%"
    ),
    "Adaptive Attention Span is recent Google research and cuts computation by 23% on PG-19": (
        "Adaptive Attention Span 是 Google 的最新研究，在 PG-19 上减少 23% 的计算量"
    ),
    "Llama 3 averages checkpoints while extending the context, against catastrophic forgetting": (
        "Llama 3 在扩展上下文时平均检查点，以避免灾难性遗忘"
    ),
    "Transformer-XL's r_{i-j} are learned relative position vectors": (
        "Transformer-XL 的 r_{i-j} 是可学习的相对位置向量"
    ),
    "the local-attention mask keeps each query's window": "局部注意力的掩码保留每个查询的窗口",
    "with FP16 training the gradient-clipping threshold must be changed to suit the FP16 range": (
        "FP16 训练时，梯度裁剪的阈值必须改成适合 FP16 范围的值"
    ),
    "casting q and k with .float() inside autocast keeps the attention scores in FP32": (
        "在 autocast 中用 .float() 转换 q 和 k，注意力分数就保持 FP32"
    ),
    "the PositionalEncoding class precomputes the sinusoidal table": "PositionalEncoding 类预先计算正余弦表",
    "get_attention_mask gives each head its own learned attention span": (
        "get_attention_mask 给每个头各自学到的注意力跨度"
    ),
    "Adaptive Attention Span adjusts the number of heads dynamically (the heading 动态头数调节)": (
        "Adaptive Attention Span 动态调整头数（小标题「动态头数调节」）"
    ),
    "√(d_model/16) heads is an empirical formula from ImageNet classification experiments": (
        "√(d_model/16) 个头是来自 ImageNet 分类实验的经验公式"
    ),
    "even after dividing by √d_k, a larger d_k needs finer calibration of the softmax (Q3 推测 1)": (
        "即使除以 √d_k，更大的 d_k 仍需要更精细地校准 softmax（Q3 推测 1）"
    ),
    "past the training length the low dimensions (high frequencies) are what stop making sense": (
        "超过训练长度后，失去意义的是低维（高频）"
    ),
    "four kinds of position encoding, with their extrapolation (the §2.2 table)": "四种位置编码及其外推性（§2.2 的表）",
    "Llama 3 extends its context with NTK-aware scaling": "Llama 3 用 NTK-aware 缩放扩展上下文",
    "at a fixed distance the RoPE inner products vary by only 1e-6": "在固定距离上，RoPE 内积的波动只有 1e-6",
    "modern LLMs hardly use ALiBi any more (现代 LLM 基本不用了)": (
        "现代 LLM 基本不再用 ALiBi（「现代 LLM 基本不用了」）"
    ),
    "an added position vector takes representation space in d_model; RoPE takes none (Q2 理由 2)": (
        "相加的位置向量占用 d_model 中的表示空间；RoPE 不占（Q2 理由 2）"
    ),
    "seed 000 says one thing about which RoPE frequencies NTK-aware scaling interpolates": (
        "seed 000 对 NTK-aware 缩放插值哪些 RoPE 频率的说法前后一致"
    ),
    "seed 000 says one thing about ALiBi's extrapolation": "seed 000 对 ALiBi 外推性的说法前后一致",
    "seed 000 says one thing about RoPE's extrapolation": "seed 000 对 RoPE 外推性的说法前后一致",
    # extrapolation
    "ALiBi's perplexity at 4x L stays within 1.10x its value at L": (
        "ALiBi 在 4x L 处的困惑度保持在其 L 处数值的 1.10 倍以内"
    ),
    "sinusoidal degrades past L: perplexity at 4x L at least 1.5x its value at L": (
        "正余弦编码超过 L 就变差：4x L 处的困惑度至少是 L 处的 1.5 倍"
    ),
    "plain RoPE degrades past L: perplexity at 4x L at least 1.5x its value at L": (
        "普通 RoPE 超过 L 就变差：4x L 处的困惑度至少是 L 处的 1.5 倍"
    ),
    "at 8x L: ALiBi < RoPE": "在 8x L 处：ALiBi < RoPE",
    "at 8x L: RoPE < sinusoidal": "在 8x L 处：RoPE < 正余弦编码",
    "a learned absolute table collapses past the training length (its rows past L were never trained)": (
        "可学习的绝对位置表超过训练长度就崩（L 之后的行从未训练过）"
    ),
    "RoPE reads past the training length better than a learned table": (
        "超过训练长度后，RoPE 的困惑度低于可学习的位置表"
    ),
    "RoPE extrapolates better than the relative-bias schemes T5 and ALiBi": "RoPE 的外推性好于相对偏置编码 T5 和 ALiBi",
    "RoPE's perplexity 'jumps from 10 to 100+' past the training length": (
        "超过训练长度后，RoPE 的困惑度「从 10 飙到 100+」"
    ),
    "Transformer-XL's relative encoding solves long-sequence generalization": (
        "Transformer-XL 的相对编码解决了长序列泛化"
    ),
    # frequencies, heads, model-zoo, params, pe-cache, permutation, position-training
    "RoPE periods grow geometrically with the dimension": "RoPE 的周期随维度成几何级数增长",
    "the best head count is the one nearest √(64/16) = 2.00": "最好的头数是最接近 √(64/16) = 2.00 的那个",
    "smaller heads (more of them) do better than one big head": "更小（更多）的头比一个大头效果好",
    "d_k does not grow with the model size (几乎所有 LLM 的 d_k 都固定在 64 或 128，不管模型多大)": (
        "d_k 不随模型规模增长（「几乎所有 LLM 的 d_k 都固定在 64 或 128，不管模型多大」）"
    ),
    "d_model = h × d_k: the width is set by the number of heads at a fixed d_k": (
        "d_model = h × d_k：d_k 固定，宽度由头数决定"
    ),
    "optimal number of heads ≈ sqrt(d_model / 16) (最优头数 ≈ √(d_model/16)), as the head counts real models chose": (
        "最优头数 ≈ sqrt(d_model / 16)（「最优头数 ≈ √(d_model/16)」），按真实模型选用的头数检验"
    ),
    "multi-head attention has 4·d_model² parameters (+4d biases) whatever the head count": (
        "多头注意力有 4·d_model² 个参数（另加 4d 个偏置），与头数无关"
    ),
    "poslab note: the 4·d_model² count carries over to the grouped-query models of the zoo": (
        "poslab 附注：4·d_model² 的计数能否推广到模型表中的分组查询（GQA）模型"
    ),
    "multi-head attention has exactly the parameters of single-head (4·d²+4·d)": (
        "多头注意力的参数与单头完全相同（4·d²+4·d）"
    ),
    "the lesson's printout": "课文的打印结果",
    "at n_embd 32 the head count does not change qkv/proj": "n_embd 32 时头数不改变 qkv/proj 的参数量",
    "the precomputed positional encoding is 40x faster than computing it": "预先计算的位置编码比现算快 40 倍",
    "sinusoidal values stay in [-1, 1]": "正余弦编码的值在 [-1, 1] 之内",
    "wavelengths from 2*pi to 10000*2*pi": "波长从 2π 到 10000·2π",
    "attention without positions is permutation-equivariant": "没有位置信息的注意力是置换等变的",
    "every position scheme breaks the equivariance": "每一种位置编码都打破了等变性",
    "a causal model learns better with positions: the learned table beats none in-length": (
        "因果模型有位置信息学得更好：在训练长度内，可学习位置表胜过 none"
    ),
    "no position encoding is at most a little worse (within 5% of the learned table's loss)": (
        "没有位置编码至多差一点（损失在可学习位置表的 5% 以内）"
    ),
    "ALiBi trains to a slightly worse loss than RoPE": "ALiBi 训练出的损失比 RoPE 略差",
    "RoPE beats adding a learned or sinusoidal position vector": "RoPE 胜过加一个可学习或正余弦的位置向量",
    "ALiBi trains at (nearly) the speed of no position encoding (tokens/s within 10% of it, either way)": (
        "ALiBi 的训练速度（几乎）与没有位置编码时一样（tokens/s 相差 10% 以内，快慢皆算）"
    ),
    # probes
    "more heads carry more relations at once: 4 heads beat 1 on multi-query associative recall at fixed width": (
        "头越多，同时承载的关系越多：宽度固定时，4 个头在多查询联想回忆上胜过 1 个头"
    ),
    # rope-relative, shapes
    "RoPE inner products depend only on the offset (the size of the spread, 波动仅 1e-6, is judged by experiment "
    "corrections)": "RoPE 内积只依赖偏移（波动的大小，即「波动仅 1e-6」，由 corrections 实验判定）",
    "every RoPE layout/scaling is offset-only; absolute codes are not": (
        "每一种 RoPE 布局/缩放都只依赖偏移；绝对编码不是"
    ),
    "the head split/merge shape walk": "拆头与合头的形状变化",
}

#: the English glosses in brackets of a claim's source (``seed 001 (NoPE learns, 'only a little worse')``)
SOURCES: dict[str, str] = {
    "NoPE learns, 'only a little worse'": "NoPE 也能学，「只差一点」",
    "RoPE 'good', learned 'collapses'": "RoPE「好」，可学习嵌入「崩」",
    "table: RoPE 'good', T5/ALiBi 'medium'": "表：RoPE「好」，T5/ALiBi「中」",
    "and Q4's explanation": "及 Q4 的解释",
    "degradation 'because' of the entropy explosion": "退化「是因为」注意力熵爆炸",
    "LLaMA3: 平均检查点 avoids catastrophic forgetting": "LLaMA3：平均检查点避免灾难性遗忘",
    "WiSE-FT: interpolating base and fine-tuned weights": "WiSE-FT：在基座与微调权重之间插值",
    "继续预训练 ★★★ 慢但最可靠: continued pre-training, slow but the most reliable": "继续预训练 ★★★ 慢但最可靠",
    "the recipe keeps the extension": "这套做法保住了扩展",
    "seed 000 §1.2's count applied to the zoo's GQA/MQA rows; the lessons make no GQA claim": (
        "把 seed 000 §1.2 的计数用在模型表的 GQA/MQA 行上；课文没有关于 GQA 的论断"
    ),
}

#: the one table the catalogue looks texts up in (criteria, evidence, references and reasons: zh_measured.py)
EXACT: dict[str, str] = {**WORDS, **CLAIMS, **SOURCES, **STATIC, **zh_lesson_items.STATIC}
