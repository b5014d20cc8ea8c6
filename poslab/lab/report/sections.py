"""The report's sections: one per lesson topic, each naming the results folders that hold its evidence.

The text here says what a lesson claims and what the lab measures; it holds no measured number.
The numbers, plots and verdicts of a section come from the ``results.json`` files and PNGs of the
folders listed in ``folders`` (``experiments/NAME`` under the lab folder).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    """One lesson topic of the report.

    Attributes:
        key: HTML anchor.
        title: heading.
        lessons: where the lessons make the claims.
        claim: the lessons' claim, quoted and glossed (plain text; blank lines separate paragraphs).
        measured: what the lab measures for it (plain text).
        folders: results folders shown in this section, in order.
    """

    key: str
    title: str
    lessons: str
    claim: str
    measured: str
    folders: tuple[str, ...]


SECTIONS: tuple[Section, ...] = (
    Section(
        "multihead",
        "Multi-head attention: many small heads, no extra parameters",
        "seed 000 §1, seed 001 §2, seed 002 §3.2",
        "「多头不增加参数量，只是改变了计算的方式」: splitting d_model into h heads of d_k = d_model/h keeps the four "
        "d×d matrices W_Q, W_K, W_V, W_O, so the parameter count does not depend on h. Seed 001 prints qkv 3168 / "
        "proj 1056 for n_embd 32 whatever the head count, and asks (exercise 2) to train 1, 4 and 8 heads and compare "
        "validation loss. Seed 000 §1.4 says smaller heads (smaller d_k) tend to work better; seed 002 §3.2 gives "
        "「最优头数 ≈ √(d_model/16)」.",
        "The parameters of poslab's real attention modules for several head counts; the shape of every tensor along "
        "the head split and merge (read from hooks); the same GPT trained with 1, 2, 4, 8 and 16 heads with the same "
        "data, steps and seeds: in the quick form 2 layers at n_embd 64 on tinyshakespeare for 600 steps, in the "
        "full form the lesson's setting (n_embd 128 on the Tang poems, 1000 steps).",
        ("experiments/params", "experiments/shapes", "experiments/heads"),
    ),
    Section(
        "order",
        "Attention cannot see order",
        "seed 000 §2.1 (exp. 3), seed 001",
        "「Attention 是置换等变的」: permuting the input only permutes the output, so 狗咬人 and 人咬狗 look the same. "
        "Seed 001 finds the surprise: with a causal mask and two or more layers, a model without any position "
        "encoding still tells 白日依山尽 from 山依日白尽 — the mask itself leaks order (Haviv et al. 2022).",
        "The lesson's raw-matrix experiment and one attention layer per registered position scheme under a random "
        "permutation; an untrained character GPT with 1, 2 and 3 layers reading the two five-character lines, with "
        "and without position information; and (full lab) Haviv et al.'s control: a causal LM and a bidirectional "
        "masked LM, each with and without positions, at 3 seeds.",
        ("experiments/permutation", "experiments/causal-leak", "experiments/bidirectional"),
    ),
    Section(
        "training",
        "Which position encoding trains best",
        "seed 000 §2.2 and §4, seed 001 exercise 3",
        "Seed 000's table ranks absolute, learned, relative (T5, ALiBi) and rotary encodings; it says ALiBi "
        "「性能略低于 RoPE」 and that RoPE is the modern default. Seed 001 notes that a causal model with no position "
        "encoding still learns positions, 「效果只比加了位置编码的差一点」, and asks to swap pos_emb for RoPE and "
        "compare.",
        "The same small GPT trained on the Tang poems once per position scheme (same data, steps and seed): loss "
        "curves and final validation loss.",
        ("experiments/position-training",),
    ),
    Section(
        "sinusoidal",
        "Sinusoidal encoding and its precomputed cache",
        "seed 002 §2.1, §5.2",
        "Seed 002 writes PE(pos, 2i) = sin(pos/10000^(2i/d)), says the values stay in [-1, 1] and the wavelengths run "
        "from 2π to 10000·2π, and claims 「预计算版本比实时计算快40倍」 for the precomputed table.",
        "Timed on this machine, alternating and taking medians: a lookup in poslab's cached sinusoidal table against "
        "computing sin/cos for the same positions, the embedding step x + PE both ways, and a whole GPT forward pass "
        "with the cache against recomputing the table on every call. Also the value range and the wavelengths.",
        ("experiments/pe-cache",),
    ),
    Section(
        "rope",
        "RoPE: position as a rotation",
        "seed 000 §3",
        "「<R_m q, R_n k> = <q, R_{n−m} k>」: after the rotation, the inner product depends only on the offset n − m; "
        "the lesson's table shows the same value at every absolute position (spread ~1e-6). The frequencies "
        "θ_i = base^(−2i/d) are geometric: low dimensions turn fast (short periods, near tokens), high dimensions "
        "slowly (long periods, far tokens).",
        "The lesson's experiment digit for digit with poslab's rope scheme, then the same offset-only check for every "
        "RoPE layout and scaling (and for absolute codes, which must fail it); the lesson's inv_freq table and the "
        "spectrum of each RoPE scaling (PI, NTK, dynamic, YaRN, Llama 3, LongRoPE).",
        ("experiments/rope-relative", "experiments/frequencies"),
    ),
    Section(
        "extrapolation",
        "Past the training length",
        "seed 000 §2.2, §3.5, Q4; seed 002 §4.1",
        "Absolute and learned embeddings 「超出训练长度就崩」; relative encodings are medium and RoPE good at "
        "extrapolation, yet past the training length RoPE degrades: 「注意力熵爆炸」 and 「困惑度急剧上升——实测通常从 "
        "10 飙到 100+」. Seed 002 says relative encodings solve long-sequence generalisation. The ALiBi paper (Press "
        "et al. 2022) measured sinusoidal perplexity exploding past L while ALiBi stays flat.",
        "One small GPT per position scheme trained at length L and evaluated at 1×, 2×, 4×, 8× and 16× L; the mean "
        "attention entropy per layer as a function of evaluation length, with and without YaRN's temperature and "
        "log-n scaling. In the full lab, Transformer-XL as the paper has it (Dai et al. 2019): the relative encoding "
        "plus segment-level recurrence, a model trained with a memory of L against the same model trained on the "
        "same segments without one, read segment after segment with memories of L, 2L and 4L, the loss by place "
        "inside the segment.",
        ("experiments/extrapolation", "experiments/attention-entropy", "experiments/transformer-xl"),
    ),
    Section(
        "context",
        "Stretching the context: PI, NTK-aware, YaRN",
        "seed 000 §3.5, Q4",
        "「扩展上下文长度时，第一选择总是 YaRN 或 NTK-aware，比直接 PI 效果好得多」; the table ranks YaRN ★★★, NTK "
        "★★☆, PI ★★ (lossy), continued pre-training ★★★ (slow but most reliable).\n\n"
        "Q4 adds: 「LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 + "
        "平均检查点（averaging checkpoints）避免灾难性遗忘。」 (Llama 3 extends 8K to 128K in stages with NTK-aware "
        "scaling, continued pre-training and checkpoint averaging against catastrophic forgetting). In the Llama 3 "
        "paper (Dubey et al. "
        '2024, "The Llama 3 Herd of Models") checkpoint averaging belongs to the annealing stage of pre-training '
        "(§3.4.3) and to post-training (§4.1.5, models averaged at each RM, SFT and DPO stage), not to the "
        "long-context stage (§3.4.2) the lesson ties it to.",
        "The RoPE model evaluated at 4× its training length with no scaling, PI, NTK, dynamic NTK, YaRN and Llama 3 "
        "applied at inference; then a short fine-tune at 4× L with none, PI and YaRN, evaluated again at 4× L and "
        "back at L. Checkpoint averaging, on the YaRN fine-tune: the mean of its last k checkpoints and the "
        "0.5/0.5 mean of the base and fine-tuned weights, against the plain fine-tune and the base model, at L "
        "(forgetting), at 4× L and on the passkey (no extra training step).",
        ("experiments/context-extension",),
    ),
    Section(
        "heads",
        "What the heads do",
        "seed 000 Q1, seed 002 §6.1",
        "「有些头专门做「前一个词」的关注，有些头做「句号」的关注」; seed 002 §6.1 describes heads for local syntax, "
        "keywords and long-range dependencies, and heads that serve as a 「备用通道」 (spare channel). Olsson et al. "
        "2022 add induction heads (they need two or more layers); Voita et al. 2019 positional heads; Michel et al. "
        "2019 find that most heads can be removed at little cost.",
        "A GPT trained on the Tang poems: the attention of every layer and head on 白日依山尽，黄河入海流。, a "
        "previous-token score, an induction (prefix-matching) score on repeated random tokens, the positional "
        "offset and its confidence per head, and the loss change when each head is masked, with the loss after "
        "pruning the least important 30% and 60% of heads.",
        ("experiments/tang-heads",),
    ),
    Section(
        "probes",
        "Synthetic probes: where position decides the answer",
        "seed 000 §2.1, Q1; Kazemnejad et al. 2023",
        "Attention without positions cannot order tokens, so tasks such as reversing a sequence or fetching the "
        "token at position k need a position encoding. Kazemnejad et al. 2023 rank length generalisation "
        "NoPE > T5 > ALiBi > RoPE > absolute; seed 000 Q1 says more heads let a layer carry more relations at once.",
        "Tiny GPTs trained in seconds per registered scheme on copy / reverse / retrieve-at-k / multi-query "
        "associative recall / counting / passkey, trained at L and tested at L, 2L and 4L, 3 seeds each.",
        ("experiments/probes",),
    ),
    Section(
        "sparse",
        "Sparse attention: what it keeps and what it saves",
        "seed 002 §6.1, §7.1",
        "Seed 002 presents local, axial, LSH and adaptive-span attention as ways to cut the quadratic cost, and "
        "claims adaptive span saves 23% of computation on PG-19; §6.1 describes heads for local grammar, keywords "
        "and long-range dependencies and spare heads.",
        "Full, sliding-window, axial, LSH and adaptive-span attention on a task with a long-range dependency at "
        "growing length: quality, step time and peak memory side by side, and the spans each head learns (full "
        "lab); the heads of a trained model as points of a PCA / t-SNE map, tested against seed 002's descriptions.",
        ("experiments/sparse", "experiments/head-map"),
    ),
    Section(
        "modern",
        "Mechanisms of recent models",
        "seed 000 §3; Xiao et al. 2023; Barbero et al. 2024",
        "StreamingLLM keeps a few first tokens (attention sinks) beside a rolling window and reports stable "
        "perplexity on streams far longer than the window; Barbero et al. 2024 find that RoPE models use the lowest "
        "frequencies for content and the highest for position.",
        "Perplexity over a long stream with a sink cache, a plain rolling window and full attention; the per-frequency "
        "norms of q and k of a trained RoPE model (full lab).",
        ("experiments/streaming", "experiments/rope-frequency-usage"),
    ),
    Section(
        "zoo",
        "Real models' head geometry",
        "seed 000 §1.4, Q3; seed 002 §3.2",
        "「d_k 几乎总是 64 或 128」 (seed 000 Q3) and 「最优头数 ≈ √(d_model/16)」 (seed 002 §3.2); the attention "
        "parameters are 4·d_model² whatever the head count.",
        "A shipped table of published configs of open models (each row citing its config.json): the d_k "
        "distribution, head counts against the √(d/16) rule, GQA ratios, and parameter counts of scaled-down builds.",
        ("experiments/model-zoo",),
    ),
    Section(
        "corrections",
        "Corrections: what the lessons get wrong",
        "seeds 000 and 002",
        "Statements of the lessons that the lab shows to be wrong, each quoted with an English gloss.",
        "For each, the measurement or computation that shows it (ALiBi's sign and direction, NTK-aware scaling's "
        "direction, the memory RoPE saves on a 7B model, the inverted local-window mask, gradient clipping under a "
        "gradient scaler), and what poslab measured in place of the lessons' empty tables.",
        ("experiments/corrections",),
    ),
)

#: Folders produced by ``poslab lab`` that no section lists (shown in an "Other results" section).
KNOWN_FOLDERS = {folder for section in SECTIONS for folder in section.folders}
