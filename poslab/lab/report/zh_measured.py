"""The Chinese of what the deterministic experiments write: criteria, evidence, references, withdrawn reasons and
measured texts (exact where the text is fixed; templates where a figure depends on the machine or the run).
"""

from __future__ import annotations

from poslab.lab.report.zh_text import NUM, PM

#: criteria, evidence, references and reasons, by their English text
CRITERIA: dict[str, str] = {
    # causal-leak, frequencies, model-zoo, params, pe-cache, permutation, rope-relative, shapes
    "each dimension pair's period is longer than the previous one (smallest ratio of consecutive periods ≥ 1 + 1e-6)": (
        "每个维度对的周期都比前一个长（相邻周期之比的最小值 ≥ 1 + 1e-6）"
    ),
    "over the zoo's 39 models, the slope of log d_k on log d_model, up to its 95% upper bound, is below 0.5 (a fixed "
    "d_k: 0; a fixed head count: 1; MLA rows count their content dimensions, head_dim - 64; error = upper bound)": (
        "在模型表的 39 个模型上，log d_k 对 log d_model 的斜率（取 95% 上界）低于 0.5（d_k 固定：0；头数固定：1；"
        "MLA 行计其内容维度 head_dim - 64；误差 = 上界）"
    ),
    "every model's n_heads * head_dim equals d_model (error = number of models where it does not, of 39)": (
        "每个模型的 n_heads * head_dim 都等于 d_model（误差 = 39 个模型中不相等的个数）"
    ),
    "at least 50% of the models' head counts within a factor 1.41 of sqrt(d_model/16)": (
        "至少 50% 的模型的头数在 sqrt(d_model/16) 的 1.41 倍之内"
    ),
    "every full-size poslab MultiHeadAttention build of the 15 multi-head rows counts exactly 4d²+4d (error = largest "
    "difference)": "15 个多头行按原尺寸构建的 poslab MultiHeadAttention 参数都恰好是 4d²+4d（误差 = 最大差值）",
    "every full-size build of the 14 GQA/MQA rows within 1% of 4d²+4d (error = largest relative gap)": (
        "14 个 GQA/MQA 行按原尺寸构建，参数都在 4d²+4d 的 1% 之内（误差 = 最大相对差距）"
    ),
    "every head count's parameter count equals 4d²+4d exactly (integer counts, tolerance 0)": (
        "每种头数的参数量都恰好等于 4d²+4d（整数计数，容差 0）"
    ),
    "parameter counts equal the lesson's 262,656 and 1,050,624 exactly (tolerance 0)": (
        "参数量恰好等于课文的 262,656 和 1,050,624（容差 0）"
    ),
    "qkv = 3168 and proj = 1056 for every head count (tolerance 0)": "每种头数下 qkv = 3168、proj = 1056（容差 0）",
    "x + PE with the cached table at least 20x faster than computing it (T=512, d=512; median of 9 alternating timing "
    "samples, one thread; no seeds)": "用缓存表做 x + PE 至少比现算快 20 倍（T=512，d=512；9 次交替计时取中位数，"
    "单线程；无种子）",
    "max |PE| over 5000 positions x 512 dims ≤ 1 (exact: sin and cos are bounded; tolerance 0)": (
        "5000 个位置 × 512 维上 max |PE| ≤ 1（精确：sin 和 cos 有界；容差 0）"
    ),
    "shortest wavelength 2π (relative tolerance 1e-12) and longest in [0.9, 1) x 10000·2π": (
        "最短波长 2π（相对容差 1e-12），最长波长在 [0.9, 1) × 10000·2π 之内"
    ),
    "every step of the shape walk has the lesson's shape (tolerance: 0 mismatches)": (
        "形状变化的每一步都是课文写的形状（容差：0 处不符）"
    ),
    "every scheme offset-only exactly when expected (spread ≤ 1.0e-04; tolerance: 0 schemes wrong)": (
        "每种编码恰好在预期时只依赖偏移（波动 ≤ 1.0e-04；容差：0 种出错）"
    ),
    # corrections
    "the lesson's bias equals poslab's ALiBi (Press et al.: -m·(i-j) for j <= i) on the keys a causal model sees, "
    "within 1e-6 (error = largest difference over j <= i, T = 8, 8 heads)": "在因果模型看得到的键上，课文的偏置等于 "
    "poslab 的 ALiBi（Press et al.：j <= i 时为 -m·(i-j)），"
    "误差在 1e-6 以内（误差 = j <= i 上的最大差值，T = 8，8 个头）",
    "poslab.nn.positions.alibi.ALiBi.score_bias on T=8, 8 heads (slopes 2^-1..2^-8)": (
        "poslab.nn.positions.alibi.ALiBi.score_bias，T=8，8 个头（斜率 2^-1..2^-8）"
    ),
    "scaled/unscaled frequency is 1/s = 0.25 at the highest frequency and 1 at the lowest (error = sum of the two "
    "gaps, tolerance 0.05)": (
        "缩放后与缩放前的频率之比在最高频处为 1/s = 0.25，在最低频处为 1（误差 = 两处差距之和，容差 0.05）"
    ),
    "poslab rope scheme, scaling='ntk', d_k 128, base 10000, s = 4: frequencies(2048) / the unscaled frequencies (the "
    "frequencies experiment plots the same spectrum)": "poslab 的 rope 编码，"
    "scaling='ntk'，d_k 128，base 10000，s = 4："
    "frequencies(2048) / 未缩放的频率（frequencies 实验画出同一频谱）",
    "the NTK-aware base is below the original (error = base'/base - 1, tolerance 0)": (
        "NTK-aware 的 base 低于原值（误差 = base'/base - 1，容差 0）"
    ),
    "the learned position table RoPE removes is 12% of a 7B model's parameters, within 2 points (weights, gradients "
    "and optimizer state all scale with the parameter count; error = |12% - share|)": "RoPE 省掉的可学习位置表占 7B "
    "模型参数的 12%，误差在 2 个百分点以内（权重、梯度和优化器状态都与参数量成正比；误差 = |12% - 占比|）",
    "poslab.nn.model.GPT built on the meta device (no memory allocated)": (
        "在 meta 设备上构建的 poslab.nn.model.GPT（不分配内存）"
    ),
    "PG-19 is among the datasets the Transformer-XL paper (arXiv:1901.02860) reports (error = 1 if not)": (
        "PG-19 在 Transformer-XL 论文（arXiv:1901.02860）报告的数据集之中（不在则误差 = 1）"
    ),
    "the Transformer-XL paper's experiments section": "Transformer-XL 论文的实验部分",
    "the adaptive-span paper (arXiv:1905.07799) is Google's and reports PG-19 (error = number of the two that fail)": (
        "自适应跨度论文（arXiv:1905.07799）出自 Google，且报告了 PG-19（误差 = 两条中不成立的条数）"
    ),
    "the adaptive-span paper's title page and experiments; experiment sparse": (
        "自适应跨度论文的首页和实验；sparse 实验"
    ),
    "Sukhbaatar et al. 2019 (arXiv:1905.07799), title page and §4": (
        "Sukhbaatar et al. 2019（arXiv:1905.07799），首页和 §4"
    ),
    "the Llama 3 paper (arXiv:2407.21783) averages checkpoints in its long-context stage (error = 1 if not)": (
        "Llama 3 论文（arXiv:2407.21783）在长上下文阶段平均检查点（不是则误差 = 1）"
    ),
    "the Llama 3 paper, §3.4.2-§3.4.3 and §4.1.5; experiment context-extension (checkpoint averaging of the YaRN "
    "fine-tune)": "Llama 3 论文 §3.4.2-§3.4.3 和 §4.1.5；context-extension 实验（YaRN 微调的检查点平均）",
    "Dubey et al. 2024 (arXiv:2407.21783), §3.4.2, §3.4.3 and §4.1.5": (
        "Dubey et al. 2024（arXiv:2407.21783），§3.4.2、§3.4.3 和 §4.1.5"
    ),
    "the paper defines R_{i-j} as learned (error = 1 if it does not)": (
        "论文把 R_{i-j} 定义为可学习的（不是则误差 = 1）"
    ),
    "the paper's equation for the relative attention score": "论文中相对注意力分数的公式",
    "Dai et al. 2019 (arXiv:1901.02860), §3.3 (the four-term score A^rel_{i,j} and the text after it)": (
        "Dai et al. 2019（arXiv:1901.02860），§3.3（四项的分数 A^rel_{i,j} 及其后的正文）"
    ),
    "Dai et al. 2019 (arXiv:1901.02860), §4; Rae et al. 2019 (arXiv:1911.05507)": (
        "Dai et al. 2019（arXiv:1901.02860），§4；Rae et al. 2019（arXiv:1911.05507）"
    ),
    "the lesson's keep-mask equals poslab's sliding window (i - W < j <= i) at T = 8, W = 3 (error = number of "
    "disagreeing pairs)": (
        "课文的保留掩码等于 poslab 的滑动窗口（i - W < j <= i），T = 8，W = 3（误差 = 不一致的位置对数）"
    ),
    "tests/test_window.py::test_the_harness_catches_the_lessons_local_mask (the same mask against the brute-force "
    "definition)": "tests/test_window.py::test_the_harness_catches_the_lessons_local_mask（同一掩码对照暴力定义）",
    "the norm clip_grad_norm_ sees after GradScaler.unscale_ "
    "differs from the fp32 run's by more than 2% (else the fp32 "
    "threshold clips the same way; error = threshold - relative difference)": "GradScaler."
    "unscale_ 之后 clip_grad_norm_ "
    "看到的范数与 fp32 运行相差超过 2%（否则 fp32 的阈值裁剪效果相同；误差 = 阈值 - 相对差）",
    "torch.amp.GradScaler + torch.nn.utils.clip_grad_norm_ after unscale_ on a two-layer MLP (Micikevicius et al. "
    "2018: loss scaling leaves the unscaled gradients unchanged)": "在两层 MLP 上"
    "先 unscale_ 再用 torch.amp.GradScaler + "
    "torch.nn.utils.clip_grad_norm_（Micikevicius et al. 2018：损失缩放不改变还原后的梯度）",
    "the scores of the lesson's line under autocast are float32 (error = 1 if not)": (
        "autocast 下课文那一行得到的分数是 float32（不是则误差 = 1）"
    ),
    "torch.autocast on this machine's CPU (bf16, CPU autocast's dtype; CUDA's fp16 autocast casts matmul the same "
    "way: torch's autocast op list)": "本机 CPU 上的 torch.autocast（bf16，CPU autocast 的类型；CUDA 的 fp16 autocast "
    "对 matmul 的转换相同：见 torch 的 autocast 算子表）",
    "the lesson's class, run as written, builds its table (error = 1 if constructing it raises)": (
        "课文的类照原样运行能建出它的表（构造时抛出异常则误差 = 1）"
    ),
    "the lesson's class read with ast: the names it loads that nothing binds": (
        "用 ast 读课文的类：它读取却没有任何绑定的名字"
    ),
    "the lesson's mask (spans 1 and 3, T = 8) hides keys outside a span, keeps no future key, is one mask per head and "
    "takes a learned span (error = number of the four checks that fail)": "课文的掩码（跨度 1"
    " 和 3，T = 8）遮住跨度之外的键、"
    "不保留未来的键、每个头一个掩码、接受可学习的跨度（误差 = 四项检查中不通过的项数）",
    "the lesson's mask code run with integer spans (tests/test_sparse.py runs it too)": (
        "用整数跨度运行课文的掩码代码（tests/test_sparse.py 也运行它）"
    ),
    "the method the section presents changes the number of heads (error = 1 if it does not)": (
        "该节介绍的方法会改变头数（不改变则误差 = 1）"
    ),
    "the adaptive-span paper's method": "自适应跨度论文的方法",
    "Sukhbaatar et al. 2019 (arXiv:1905.07799), §3 (the soft mask m_z with a learned z per head)": (
        "Sukhbaatar et al. 2019（arXiv:1905.07799），§3（每个头一个可学习 z 的软掩码 m_z）"
    ),
    "the ImageNet transformers' head counts are within 25% of √(d_model/16) (error = number of the ViT configurations "
    "that are not)": "ImageNet 上的 transformer 的头数在 √(d_model/16) 的 25% 之内（误差 = 不满足的 ViT 配置数）",
    "ViT's configurations; experiment model-zoo": "ViT 的配置；model-zoo 实验",
    "Dosovitskiy et al. 2021 (arXiv:2010.11929), Table 1": "Dosovitskiy et al. 2021（arXiv:2010.11929），表 1",
    "var(q·k/√d_k) at d_k 256 is at least 1.2× its value at d_k 16 (unit-variance q, k, 20,000 samples each: the "
    "sampling error of a variance is about 1%)": "d_k 256 时的"
    " var(q·k/√d_k) 至少是 d_k 16 时的 1.2 倍（单位方差的 q、k，"
    "各 20,000 个样本：方差的抽样误差约 1%）",
    "sampled q, k ~ N(0, 1) per d_k (Vaswani et al. 2017, footnote 4: var(q·k) = d_k)": (
        "每个 d_k 抽样 q, k ~ N(0, 1)（Vaswani et al. 2017，脚注 4：var(q·k) = d_k）"
    ),
    "q and k as a trained model makes them (correlated, with norms that grow in training): the lesson's 'calibration "
    "after ÷√d_k' is about those": (
        "训练出的模型中的 q 和 k（相关，范数在训练中增长）：课文说的「÷√d_k 之后的校准」指的是它们"
    ),
    "this test draws independent N(0, 1) q and k, where var(q·k/√d_k) = 1 at every d_k by construction; trained q and "
    "k can grow their logits past that (the reason QK-norm exists: Dehghani et al. 2023, arXiv:2302.05442, §2.1.1)": (
        "本检验抽取独立的 N(0, 1) q 和 k，按构造在每个 d_k 上 var(q·k/√d_k) = 1；训练出的 q 和 k 可以让 logit 超过它"
        "（这正是 QK-norm 存在的原因：Dehghani et al. 2023，arXiv:2302.05442，§2.1.1）"
    ),
    "the RoPE pairs that meet angles unseen in training (positions up to 4L, L = 4096, d_k 128, base 10000) are "
    "high-frequency pairs (error = number of low-frequency pairs among them)": "遇到训练中没见过的角度的 RoPE 维度对"
    "（位置到 4L，L = 4096，d_k 128，base 10000）是高频对（误差 = 其中低频对的个数）",
    "poslab.nn.positions.rope.default_inv_freq (the frequencies experiment plots the periods against L)": (
        "poslab.nn.positions.rope.default_inv_freq（frequencies 实验把周期与 L 画在一起）"
    ),
    "the table has no repeated row, lists the sinusoidal encoding, and ranks ALiBi's extrapolation as Press et al. "
    "measured it (error = number of the three that fail)": "表中没有重复的行、列出"
    "了正余弦编码、对 ALiBi 外推性的排名与 "
    "Press et al. 的测量一致（误差 = 三条中不成立的条数）",
    "the lesson's table, read row by row": "课文的表，逐行阅读",
    "Press et al. 2022 (arXiv:2108.12409), Fig. 1 and §4; Vaswani et al. 2017 (arXiv:1706.03762), §3.5; experiment "
    "extrapolation measures every scheme at 1x..16x L here": "Press et al. 2022（arXiv:2108.12409），图 1 和 §4；"
    "Vaswani et al. 2017（arXiv:1706.03762），§3.5；extrapolation 实验在本机测量每种编码在 1x..16x L 的表现",
    "Llama 3.1's published RoPE scaling gives NTK-aware's frequencies at the same factor, within 1% per pair (error = "
    "largest relative difference)": "Llama 3.1 公开的 RoPE 缩放在同一倍数下给出 NTK-aware 的频率，每对相差 1% 以内"
    "（误差 = 最大相对差）",
    "demanding Llama 3.1's frequencies within 1% of static NTK"
    "-aware judges a narrower claim than the lesson's. Raising "
    "the RoPE base (Llama 3's 500000) is the NTK family's idea, and Llama 3.1's banded scaling is a member of that "
    "family; the lesson's loose name stands. Its checkpoint-averaging part is a separate record": (
        "要求 Llama 3.1 的频率与静态 NTK-aware 相差 1% 以内，检验的是比课文更窄的论断。提高 RoPE 的 base"
        "（Llama 3 的 500000）正是 NTK 一族的思路，Llama 3.1 的分段缩放也属于这一族；课文宽泛的叫法站得住。"
        "其中检查点平均的部分另有一条记录"
    ),
    "the model zoo's Llama 3 and 3.1 config.json rows; poslab's rope scheme, scaling='llama3' against scaling='ntk'": (
        "模型表中 Llama 3 和 3.1 的 config.json 行；poslab 的 rope 编码，scaling='llama3' 对照 scaling='ntk'"
    ),
    "the largest spread in the lesson's own printout is of the order of 1e-6: below 10^-5.5 = 3.2e-6, where rounding "
    "on a log scale turns to 1e-5 (error = that spread)": "课文自己打印结果中的最大波动"
    "是 1e-6 量级：低于 10^-5.5 = 3.2e-6"
    "（在对数尺度上从这里起四舍五入为 1e-5；误差 = 该波动）",
    "the lesson's printout and its code run here (experiment rope-relative reproduces its 4 decimals with poslab's "
    "rope)": "课文的打印结果及其代码在本机的运行（rope-relative 实验用 poslab 的 rope 复现了它的 4 位小数）",
    "none of the zoo's models released in 2024 or later uses ALiBi (error = how many do)": (
        "模型表中 2024 年及以后发布的模型都不用 ALiBi（误差 = 用的个数）"
    ),
    "the zoo's position and year columns": "模型表的位置编码列和年份列",
    "poslab/lab/data/model_zoo.json (each row's published config.json and release year)": (
        "poslab/lab/data/model_zoo.json（每行公开的 config.json 和发布年份）"
    ),
    "the sinusoidal encoding writes position into the residual stream's d_model coordinates and RoPE into none "
    "(error = 1 - sinusoidal's share + RoPE's share)": "正余弦编码把位置写进残差流的 d_model 个坐标，RoPE 一个也不写"
    "（误差 = 1 - 正余弦编码的占比 + RoPE 的占比）",
    "poslab's sinusoidal and rope schemes' embed() on zero token embeddings (Vaswani et al. 2017, §3.5: the encodings "
    "'have the same dimension d_model as the embeddings, so that the two can be summed'; Su et al. 2021, §3.2)": (
        "poslab 的 sinusoidal 和 rope 编码在全零字嵌入上的 embed()（Vaswani et al. 2017，§3.5：位置编码「与嵌入同为 "
        "d_model 维，所以两者可以相加」；Su et al. 2021，§3.2）"
    ),
    "every passage that states it says the same (error = number of distinct statements - 1)": (
        "每一处说到它的原文说法都相同（误差 = 不同说法的个数 - 1）"
    ),
    "the lesson's passages, side by side": "课文的几处原文并列",
    "seed 000, Q4 table, §3.5 table, Q4 text": "seed 000，Q4 的表、§3.5 的表、Q4 正文",
    "seed 000, §2.2 table, §4": "seed 000，§2.2 的表、§4",
    "seed 000, §2.2 table, §3.5": "seed 000，§2.2 的表、§3.5",
    "experiment model-zoo (poslab/lab/data/model_zoo.json, 39 published configs)": (
        "model-zoo 实验（poslab/lab/data/model_zoo.json，39 个公开配置）"
    ),
}

#: measured texts of the corrections (deterministic: the same text on every machine)
CORRECTIONS: dict[str, str] = {
    "1 row repeated (absolute and learned both cite BERT, GPT-2: their absolute embeddings are the learned ones); "
    "sinusoidal (Vaswani et al. 2017) listed: no; ALiBi ranked below RoPE, while Press et al. 2022 find that ALiBi "
    "extrapolates further than RoPE. Experiment extrapolation measures every scheme at 1x..16x L here": (
        "1 行重复（绝对和可学习两行都举 BERT、GPT-2：它们的绝对位置嵌入就是可学习的）；正余弦编码（Vaswani et al. "
        "2017）列出：否；ALiBi 排在 RoPE 之后，而 Press et al. 2022 发现 ALiBi 比 RoPE 外推得更远。extrapolation "
        "实验在本机测量每种编码在 1x..16x L 的表现"
    ),
    "18 of 64 pairs leave the trained range: pairs 46..63, all in the low-frequency half (periods from 4712 positions "
    "up); the high-frequency pairs turned many times inside L and see no new angle. The low frequencies are what PI, "
    "NTK and YaRN rescale": "64 对中有 18 对离开训练范围：第 46..63 对，全在低频的一半（周期从 4712 个位置起）；"
    "高频对在 L 之内已转过许多圈，见不到新的角度。PI、NTK 和 YaRN 重新缩放的正是低频",
    "23 of the zoo's 23 models from 2024-2025 use RoPE, 0 ALiBi; the zoo's ALiBi models are older: BLOOM 176B (2022), "
    "BLOOM 7B1 (2022), MPT 30B (2023), MPT 7B (2023)": "模型表中 2024-2025 年"
    "的 23 个模型有 23 个用 RoPE，0 个用 ALiBi；"
    "表中用 ALiBi 的模型更早：BLOOM 176B（2022）、BLOOM 7B1（2022）、MPT 30B（2023）、MPT 7B（2023）",
    "51 of 64 pairs disagree: the lesson keeps the pairs at distance >= W (past and future) and masks the window, the "
    "query itself included (diagonal kept: False)": "64 对中有 51 对不一致：课文保留距离 >= W 的位置对（过去和未来），"
    "反而遮住窗口，连查询自身也遮住（对角线保留：False）",
    "Dai et al. 2019, §3.3: R_{i-j}: the sinusoid encoding matrix, without learnable parameters; W_{k,R}: learned (the "
    "projection of R); u: learned (a global content bias); v: learned (a global position bias). The lesson's u/v are "
    "right; r is the fixed sinusoid of i-j, and W_{k,R} is what is learned": "Dai et al. "
    "2019，§3.3：R_{i-j}：正余弦编码"
    "矩阵，没有可学习参数；W_{k,R}：可学习（R 的投影）；u：可学习（全局内容偏置）；v：可学习（全局位置偏置）。"
    "课文的 u/v 没错；r 是 i-j 的固定正余弦，可学习的是 W_{k,R}",
    "Llama 3 8B: rope_theta 500000 (raised from Llama 2's 10000 for pre-training), rope_scaling None; Llama 3.1 8B: "
    "rope_type 'llama3', its own banded scaling: it keeps 29 of 64 pairs unchanged where NTK-aware keeps 1; largest "
    "per-pair difference 152%": "Llama 3 8B：rope_theta 500000（预训练时从 Llama 2 的 10000 调高），rope_scaling None；"
    "Llama 3.1 8B：rope_type 'llama3'，它自己的分段缩放：64 对中有 29 对保持不变，而 NTK-aware 只保持 1 对；"
    "每对的最大差异 152%",
    "Llama-2-7B-shaped poslab GPT (32 x 4096, SwiGLU 11008, vocab 32000, context 4096): learned 6,755,192,832, rope "
    "6,738,415,616 parameters; the 4096 x 4096 table is 16,777,216 = 0.25% (RoPE's inv_freq buffer: 64 floats)": (
        "Llama-2-7B 形状的 poslab GPT（32 × 4096，SwiGLU 11008，词表 32000，上下文 4096）：learned 6,755,192,832、"
        "rope 6,738,415,616 个参数；4096 × 4096 的位置表是 16,777,216 = 0.25%（RoPE 的 inv_freq 缓冲区：64 个浮点数）"
    ),
    "PositionalEncoding() raises NameError: name 'd_model' is not defined: d_model is neither an argument nor defined; "
    "poslab's sinusoidal scheme takes d_model and caches the table (experiment pe-cache times it)": (
        "PositionalEncoding() 抛出 NameError（d_model 未定义）：d_model 既不是参数也没有定义；poslab 的 "
        "sinusoidal 编码接受 d_model 并缓存表（pe-cache 实验为它计时）"
    ),
    "base' = base·s^(d/(d-2)) = 40890 = 4.089 × base: raised, not decreased": (
        "base' = base·s^(d/(d-2)) = 40890 = 4.089 × base：是提高，不是减小"
    ),
    "highest-frequency pair kept (1.0000), lowest-frequency pair divided by 4.00 (interpolated): the reverse of the "
    "lesson": "最高频的一对保持不变（1.0000），最低频的一对除以 4.00（被插值）：与课文相反",
    "it is Sukhbaatar, Grave, Bojanowski and Joulin 2019, Facebook AI Research; it reports text8, enwik8 (PG-19 came "
    "later). Experiment sparse measures what the learned spans save on this machine": "它是 Sukhbaatar、Grave、"
    "Bojanowski 和 Joulin 2019 年的工作，出自 Facebook AI Research；报告的是 text8、enwik8（PG-19 出现得更晚）。"
    "sparse 实验在本机测量学到的跨度省下多少",
    "lesson vs poslab: largest difference 3.500 on j <= i (the lesson puts 0 where the paper puts -m·(i-j)); lesson's "
    "future-key bias from 0.0039 to 3.50 (positive); poslab vs the paper's formula: 0.0e+00": "课文对照 poslab：j <= i "
    "上最大差值 3.500（论文写 -m·(i-j) 的地方课文写 0）；课文给未来键的偏置从 0.0039 到 3.50（为正）；poslab "
    "对照论文公式：0.0e+00",
    "masked pairs 0; future pairs kept 28 of 28; one [T, T] mask with values [1.0, 2.0, 3.0] summed over the heads; a "
    "tensor span in triu: TypeError. poslab.nn.sparse.AdaptiveSpanAttention has the paper's soft, per-head, causal, "
    "learned span": "遮住的位置对 0；未来的位置对保留 28/28；各头相加成一个 [T, T] 掩码，取值 [1.0, 2.0, 3.0]；"
    "triu 中用张量跨度：TypeError。"
    "poslab.nn.sparse.AdaptiveSpanAttention 实现了论文的软的、逐头的、因果的、可学习的跨度",
    "no paper gives this formula; the ImageNet transformers do not follow it: ViT-Base d 768: 12 heads vs √(d/16) = "
    "6.93, ViT-Large d 1024: 16 heads vs √(d/16) = 8.00, ViT-Huge d 1280: 16 heads vs √(d/16) = 8.94. Experiment "
    "model-zoo tests the rule on language models": "没有论文给出这个公式；ImageNet 上的 transformer 也不遵循它："
    "ViT-Base d 768：12 个头，√(d/16) = 6.93；ViT-Large d 1024：16 个头，√(d/16) = 8.00；ViT-Huge d 1280：16 个头，"
    "√(d/16) = 8.94。model-zoo 实验在语言模型上检验这条规则",
    "fp32 norm 0.23578; fp16 autocast + GradScaler (scale 65536): 15452.2 before unscale_, 0.23578 after (8.3e-06 "
    "relative); clipped to max_norm 0.1 the gradients match to 5.6e-04. Keep the threshold; call unscale_ before "
    "clipping": "fp32 范数 0.23578；fp16 autocast + GradScaler（scale 65536）：unscale_ 之前 15452.2，之后 0.23578"
    "（相对差 8.3e-06）；裁剪到 max_norm 0.1 后梯度一致到 5.6e-04。阈值不用改；裁剪前调用 unscale_",
    "share of the d_model = 64 coordinates position is added to: sinusoidal 100%, RoPE 0%. The added vector shares the "
    "coordinates the content uses (no dimensions are set apart for it, as 专门用来 suggests, but the space is "
    "shared); RoPE rotates q and k inside attention only": "位置被加到的 d_model = 64 个坐标中的占比：sinusoidal 100%，"
    "RoPE 0%。相加的向量与内容共用坐标（并没有像「专门用来」说"
    "的那样划出专门的维度，但空间是共用的）；RoPE 只在注意力内部"
    "旋转 q 和 k",
    "the lesson's printout: spreads from 1.2e-06 to 1.2e-05 (offset 16); its code run here: largest 1.1e-05. Both are "
    "fp32 rounding of inner products near 3 (float32's step there is 2.4e-7), of the order of 1e-5, not 1e-6": (
        "课文的打印结果：波动从 1.2e-06 到 1.2e-05（偏移 16）；它的代码在本机运行：最大 1.1e-05。两者都是 3 附近内积的 "
        "fp32 舍入（float32 在那里的步长是 2.4e-7），量级是 1e-5，不是 1e-6"
    ),
    "the paper averages checkpoints or models in annealing, §3.4.3 and in post-training, §4.1.5 (the average of the "
    "annealing checkpoints is the final pre-trained model; RM, SFT and DPO models of several runs are averaged); its "
    "long-context pre-training, §3.4.2 grows 8K to 128K in six stages of continued pre-training, with no averaging. "
    "Experiment context-extension measures what averaging does to a context extension": "论文在退火阶段（§3.4.3）和"
    "后训练（§4.1.5）中平均检查点或模型（退火检查点的平均就是最终的预训练模型；多次运行的 RM、SFT 和 DPO 模型取平均）；"
    "它的长上下文预训练（§3.4.2）分六个阶段继续预训练，从 8K 扩展到 128K，没有平均。context-extension 实验测量平均对"
    "上下文扩展的作用",
    "the paper learns each head's attention span; the number of heads is fixed; the section's own bullet says the same "
    "(每个头的关注范围). The heading names the wrong thing: the span adapts, not the head count": "论文学习的是每个头的"
    "注意力跨度；头数是固定的；该节自己的要点也这么说（「每个头"
    "的关注范围」）。小标题说错了对象：自适应的是跨度，不是头数",
    "the paper reports WikiText-103, enwik8, text8, One Billion Word, Penn Treebank; PG-19 was released after it (Rae "
    "et al. 2019, arXiv:1911.05507, with the Compressive Transformer). No 17% figure can come from it": "论文报告的是 "
    "WikiText-103、enwik8、text8、One Billion Word、Penn Treebank；PG-19 在它之后才发布（Rae et al. 2019，"
    "arXiv:1911.05507，与 Compressive Transformer 一起）。17% 这个数字不可能出自它",
    "under torch.autocast('cpu', bfloat16) the lesson's matmul(q.float(), k.float()) gives bfloat16 scores: autocast "
    "casts the matmul's inputs back down. Inside autocast(enabled=False) the same line gives float32": (
        "在 torch.autocast('cpu', bfloat16) 下，课文的 matmul(q.float(), k.float()) 得到 bfloat16 的分数：autocast "
        "把 matmul 的输入又转回低精度。在 autocast(enabled=False) 里同一行得到 float32"
    ),
    "built / (4d²+4d) from 0.507 to 0.667: k and v are n_kv_heads/n_heads as wide": (
        "构建所得 / (4d²+4d) 从 0.507 到 0.667：k 和 v 的宽度是 n_kv_heads/n_heads 倍"
    ),
    "var(q·k/√d_k): d_k 16: 1.003, d_k 32: 0.987, d_k 64: 0.998, d_k 128: 0.976, d_k 256: 1.004; var(q·k) before "
    "scaling: 16: 16, 32: 32, 64: 64, 128: 125, 256: 257. For independent unit-variance q and k, dividing by √d_k "
    "makes the variance 1 at every d_k; the lesson's speculation is about trained q and k, which this test does not "
    "have": "var(q·k/√d_k)：d_k 16：1.003，d_k 32：0.987，d_k 64：0.998，d_k 128：0.976，d_k 256：1.004；缩放前的 "
    "var(q·k)：16：16，32：32，64：64，128：125，256：25"
    "7。对独立的单位方差 q 和 k，除以 √d_k 使每个 d_k 上的方差都是 1；"
    "课文的推测说的是训练出的 q 和 k，而本检验没有这样的 q 和 k",
    "Which is right: the two NTK-aware records": "哪个对：见 NTK-aware 的两条记录",
    "Which is right: the §2.2 table record (Press et al. 2022)": "哪个对：见 §2.2 表的那条记录（Press et al. 2022）",
    "Which is right: experiment extrapolation (RoPE's perplexity past the training length)": (
        "哪个对：见 extrapolation 实验（RoPE 超过训练长度后的困惑度）"
    ),
    "the low frequencies are interpolated": "低频被插值",
    "the high frequencies are interpolated": "高频被插值",
    "medium": "中",
    "good": "好",
    "degrades past the training length": "超过训练长度就退化",
}

#: every exact text of this module
STATIC: dict[str, str] = {**CRITERIA, **CORRECTIONS}

#: templates of measured texts whose figures depend on the machine or the run, and of the criteria the training
#: experiments write: (regex, Chinese form)
MEASURED: tuple[tuple[str, str], ...] = (
    # extrapolation, attention-entropy, context-extension, probes: criteria and metrics
    (
        rf"ppl\((?P<f>\d+)L\) / ppl\(L\) of (?P<s>[\w-]+) (?P<op><=|>=) (?P<x>{NUM}), per seed "
        r"\(one model read at two lengths\)",
        "{s} 的 ppl({f}L) / ppl(L) {op} {x}，逐种子（同一个模型在两个长度上读）",
    ),
    (
        r"ln ppl at (?P<f>\d+)x L of (?P<a>[\w-]+) < that of (?P<b>[\w-]+)",
        "{a} 在 {f}x L 处的对数困惑度 < {b} 的",
    ),
    (
        rf"ppl\(16L\) of rope >= the corpus's unigram perplexity(?P<u> {NUM})?, per seed: the lesson's "
        r"(?P<q>「[^」]*」) is a subword-scale number; judged against this corpus's collapse level, the perplexity "
        r"of a model that ignores its context",
        "rope 的 ppl(16L) ≥ 语料的一元语法困惑度{u}，逐种子：课文的{q}是子词尺度的数字；这里对照本语料的崩溃水平，"
        "即不看上下文的模型的困惑度",
    ),
    (
        rf"normalised entropy H / ln\(number of keys\) of the queries past L minus of those in \[L/2, L\) > "
        rf"(?P<m>{NUM}), per seed \(the raw rise, about ln (?P<f>\d+) for uniform rows, is shown, not tested\)",
        "L 之后查询的归一化熵 H / ln(键数) 减去 [L/2, L) 内查询的归一化熵 > {m}，逐种子（原始增量只列出，不检验；"
        "均匀注意力行约为 ln {f}）",
    ),
    (
        r"Spearman rank correlation of rise\((?P<f>\d+)L\) and ppl\((?P<g>\d+)L\)/ppl\(L\) across all variants > "
        r"0\.5 \(one correlation per seed\)",
        "所有变体上 rise({f}L) 与 ppl({g}L)/ppl(L) 的 Spearman 秩相关 > 0.5（每个种子一个相关系数）",
    ),
    (
        rf"(?P<t_m>.+?) of (?P<t_a>.+?) within ±(?P<w>{NUM}) of (?P<t_b>.+?) on ln, paired by seed \(TOST\)",
        "{t_a} 的{t_m}在 {t_b} 的 ±{w} 之内（取对数，按种子配对，TOST）",
    ),
    (r"(?P<f>\d+)x L is too short for the needle", "{f}x L 太短，放不下密钥"),
    (rf"(?P<t_m>.+?) of the mean at most (?P<x>{NUM}) below", "平均模型的 {t_m}至多低 {x}"),
    (
        r"perplexity at (?P<f>\d+x )?L \((?P<t_h>non-overlapping|nonoverlapping|sliding)\)",
        "{f}L 处的困惑度（{t_h}）",
    ),
    (
        r"ln perplexity \(nats/token\) at (?P<f>\d+)x L \(non-overlapping\)",
        "{f}x L 处的对数困惑度（nats/token，不重叠分块）",
    ),
    (r"(?P<t_m>.+), the highest is the worst", "{t_m}，最高的最差"),
    (r"absolute deviation from the arm's median (?P<t_m>.+)", "与该组中位数的绝对偏差（{t_m}）"),
    (r"ratio of (?P<t_m>perplexity at [^()]*\([\w-]+\))", "{t_m}之比"),
    (r"passkey accuracy at (?P<f>\d+)x L", "{f}x L 处的密钥检索准确率"),
    (r"MQAR accuracy at L \((?P<s>[\w-]+), n_embd (?P<n>\d+)\)", "L 处的 MQAR 准确率（{s}，n_embd {n}）"),
    (r"perplexity after the first eviction on an (?P<f>\d+)x stream", "在 {f}x 长的流上第一次淘汰之后的困惑度"),
    (
        rf"share of the heads whose zeroing raises the loss by less than (?P<p>{NUM}) of the base loss",
        "置零后损失增加不到基础损失 {p} 的头所占比例",
    ),
    (
        rf"max \|logit difference\| of the two orders ≤ (?P<x>{NUM}) \(fp32 float tolerance\)",
        "两种顺序的 logit 最大差 |Δ| ≤ {x}（fp32 浮点容差）",
    ),
    (
        rf"from (?P<n>\d+) layers on, the two orders' logits differ by ≥ (?P<x>{NUM}) \(far above float noise\)",
        "从 {n} 层起，两种顺序的 logit 相差 ≥ {x}（远高于浮点噪声）",
    ),
    (
        rf"1 layer, no positions: (?P<a>{NUM}); with learned positions: (?P<b>{NUM})",
        "1 层，无位置信息：{a}；有可学习位置：{b}",
    ),
    (
        rf"max \|difference\| after un-permuting ≤ (?P<x>{NUM}) \(fp32 float tolerance\)",
        "还原顺序后的最大差 |Δ| ≤ {x}（fp32 浮点容差）",
    ),
    (
        rf"every position scheme changes the un-permuted output by ≥ (?P<x>{NUM}) \(far above the fp32 float noise\)",
        "每种位置编码使还原顺序后的输出变化 ≥ {x}（远高于 fp32 浮点噪声）",
    ),
    (
        rf"max \|difference\| after un-permuting: (?P<x>{NUM}) \(0 up to fp32 float error, as §3.4 reads 1e-6: the "
        r"lesson's own code prints its 差异为 0 without measuring it\)",
        "还原顺序后的最大差 |Δ|：{x}（在 fp32 浮点误差之内为 0，就像 §3.4 把 1e-6 读作 0：课文自己的代码没有测量就打印"
        "「差异为 0」）",
    ),
    (
        rf"(?P<k>\d+) of (?P<n>\d+) position schemes change the output; smallest change (?P<x>{NUM}) \((?P<s>[\w-]+)\)",
        "{n} 种位置编码中有 {k} 种改变了输出；最小的变化 {x}（{s}）",
    ),
    (
        r"(?P<k>\d+) of (?P<n>\d+) steps of the shape walk have the lesson's shape",
        "形状变化的 {n} 步中有 {k} 步是课文写的形状",
    ),
    (
        r"(?P<k>\d+) of (?P<n>\d+) rotary variants offset-only; (?P<a>\d+) of (?P<b>\d+) others not",
        "{n} 种旋转变体中有 {k} 种只依赖偏移；其他 {b} 种中有 {a} 种不是",
    ),
    (
        rf"spread of <R_m q, R_n k> over positions at a fixed offset ≤ (?P<x>{NUM}) \(fp32 float tolerance\) and the "
        r"lesson's 4 decimals reproduced",
        "固定偏移时 <R_m q, R_n k> 在各位置上的波动 ≤ {x}（fp32 浮点容差），并复现课文的 4 位小数",
    ),
    (
        rf"(?P<d>Δ=.+); largest spread over positions (?P<x>{NUM}); lesson's digits matched: (?P<m>True|False)",
        "{d}；各位置上的最大波动 {x}；与课文的数字一致：{m}",
    ),
    (rf"(?P<n>\d+) builds, largest difference (?P<x>{NUM})", "{n} 次构建，最大差值 {x}"),
    (
        rf"(?P<p>{NUM}) within a factor (?P<f>{NUM}); median real/rule (?P<m>{NUM}); fitted h ≈ (?P<c>{NUM}) "
        rf"d_model\^(?P<e>{NUM}) \(rule: 0.25 d\^0.5\)",
        "{p} 在 {f} 倍之内；实际/规则的中位数 {m}；拟合 h ≈ {c} d_model^{e}（规则：0.25 d^0.5）",
    ),
    (
        r"(?P<k>\d+) of (?P<n>\d+) differ: (?P<l>.+)",
        "{n} 个中有 {k} 个不符：{l}",
    ),
    (
        rf"d_model from (?P<a>{NUM}) to (?P<b>{NUM}) \((?P<r>{NUM})x\), d_k from (?P<c>{NUM}) to (?P<d>{NUM}): slope "
        rf"(?P<s>{NUM}) \(95% upper (?P<u>{NUM})\): the head count carries the growth\. (?P<p>{NUM}) have d_k 64 or "
        r"128; the others: (?P<l>.+)",
        "d_model 从 {a} 到 {b}（{r} 倍），d_k 从 {c} 到 {d}"
        "：斜率 {s}（95% 上界 {u}）：增长由头数承担。{p} 的 d_k 是 64 "
        "或 128；其余：{l}",
    ),
    (
        rf"encoding alone (?P<a>{NUM})x, x \+ PE (?P<b>{NUM})x, whole GPT forward (?P<c>{NUM})x \(T=(?P<t>\d+), "
        rf"d=(?P<d>\d+)\)",
        "仅编码 {a} 倍，x + PE {b} 倍，整个 GPT 前向 {c} 倍（T={t}，d={d}）",
    ),
    (
        rf"min (?P<a>{NUM}), max (?P<b>{NUM}) over (?P<p>\d+) positions x (?P<d>\d+) dims",
        "{p} 个位置 × {d} 维上：最小 {a}，最大 {b}",
    ),
    (rf"2pi x (?P<a>{NUM}) to 2pi x (?P<b>{NUM}) \(d=(?P<d>\d+)\)", "2π × {a} 到 2π × {b}（d={d}）"),
    (r"period per dimension: (?P<l>.+) positions", "每个维度的周期：{l} 个位置"),
    (
        rf"one Linear (?P<a>{NUM}), four (?P<b>{NUM}), ratio (?P<r>{NUM})x",
        "一个 Linear {a}，四个 {b}，倍数 {r}x",
    ),
    (r"model parameters: (?P<t_l>.+)", "模型参数量：{t_l}"),
    (rf"(?P<a>h=\d+: qkv {NUM}, proj {NUM}(?:; h=\d+: qkv {NUM}, proj {NUM})*)", "{a}"),
    (
        r"(?P<a>d_model \d+: h=\d+ → .+)",
        "{a}",
    ),
    (
        r"not measured at this size: needs (?P<a>[\w, ]+?); this size trains (?P<b>[\w, ]*) \(the full form trains "
        r"every scheme\)",
        "此规模没有测量：需要 {a}；此规模只训练 {b}（完整版训练每一种编码）",
    ),
    (
        r"its schemes trained at this size \(the quick size trains the five schemes of the lessons' main claims; the "
        r"full form trains every scheme\)",
        "它的各编码在此规模下训练过（快速版只训练课文主要论断的五种编码；完整版训练每一种编码）",
    ),
    (
        rf"each scheme learned in-length \(perplexity at L below the corpus's unigram perplexity and at most "
        rf"(?P<x>{NUM})x the median over schemes\)",
        "每种编码在训练长度内学到了东西（L 处的困惑度低于语料的一元困惑度，且至多为各编码中位数的 {x} 倍）",
    ),
    (
        rf"(?P<s>\w+) did not train \(ppl at L (?P<a>{NUM}) (?P<rel>>=|>) (?P<t_b>.+?)\): its curve says nothing "
        r"about extrapolation",
        "{s} 没有训练好（L 处困惑度 {a} {rel} {t_b}）：它的曲线说明不了外推",
    ),
    (rf"the unigram baseline's (?P<b>{NUM})", "一元基线的 {b}"),
    (rf"(?P<k>{NUM})x the median (?P<m>{NUM})", "中位数 {m} 的 {k} 倍"),
    (r"(?P<task>\w+) was not trained with both schemes in this form", "此版本中 {task} 任务没有用两种编码都训练"),
    (
        r"its arms trained in this form \(the quick lab trains an arm only where the pilot, (?P<f>[\w/._-]+), "
        r"decides a claim it enters within (?P<n>\d+) seeds; `poslab lab --full` or `--seeds N` trains every arm\)",
        "它的各组在此版本中训练过（快速版只训练这样的组：据试点 {f}，它参与的某条论断在 {n} 个种子以内能判定；"
        "`poslab lab --full` 或 `--seeds N` 训练每一组）",
    ),
    (r"(?P<a>[\w, ]+): the full form only", "{a}：只在完整版中训练"),
    ("not trained in this form", "此版本中没有训练"),
    (
        rf"raw rise (?P<r>{PM}) nats \(uniform rows: (?P<u>{NUM})\)",
        "原始增量 {r} nats（均匀注意力行：{u}）",
    ),
    (
        r"sd of ln perplexity across seeds: (?P<t_l>.+)",
        "对数困惑度在种子间的标准差：{t_l}",
    ),
)
