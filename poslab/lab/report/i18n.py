"""Every string the report shows, in English and in simplified Chinese: :data:`STRINGS`, ``message id ->
{"en": ..., "zh": ...}`` (``str.format`` fields in both), the sections' texts under ``section.KEY.FIELD``.

The texts experiments write are not messages here: the Chinese page shows them through the catalogue of
:mod:`poslab.lab.report.zh_text`, keyed by their English.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator

from poslab.lab.report.sections import SECTIONS

LANGS = ("en", "zh")

#: the lessons by their own titles (000 and 002 in simplified, 001 in traditional characters)
LESSONS = {
    "000": "「11 · 多头注意力与位置编码」",
    "001": "「多頭注意力和位置編碼」",
    "002": "「多头注意力机制与位置编码的深度解析」",
}

_LANG: contextvars.ContextVar[str] = contextvars.ContextVar("poslab_report_lang", default="en")

UI: dict[str, dict[str, str]] = {
    # page
    "page.title": {"en": "poslab lab report", "zh": "poslab 实验报告"},
    "page.intro": {
        "en": "Multi-head attention and position encodings: the three lessons' claims, measured on this "
        "machine ({mode} run, report built {built}).",
        "zh": "多头注意力与位置编码：三篇课文的论断，在这台机器上实测（{mode}，报告生成于 {built}）。",
    },
    "mode.quick": {"en": "quick", "zh": "快速版"},
    "mode.full": {"en": "full", "zh": "完整版"},
    "mode.unknown": {"en": "unknown mode", "zh": "未知模式"},
    # the four kinds of verdict
    "kind.held": {"en": "held", "zh": "课文正确"},
    "kind.wrong": {"en": "did not hold", "zh": "课文有误"},
    "kind.untestable": {"en": "not testable", "zh": "此规模无法检验"},
    "kind.inconclusive": {"en": "inconclusive", "zh": "无定论"},
    "kind.held.meaning": {
        "en": "the lesson is right: the measurement went the claimed way by more than its noise",
        "zh": "课文说得对：测量结果朝论断的方向，且超出噪声",
    },
    "kind.wrong.meaning": {
        "en": "the lesson is wrong: the measurement went the other way by more than its noise "
        "(a correction, or a test on models that met its premise)",
        "zh": "课文说错了：测量结果与论断相反，且超出噪声（勘误，或在满足前提的模型上的检验）",
    },
    "kind.untestable.meaning": {
        "en": "not testable at this scale: the models did not meet the claim's premise (what was missing is shown)",
        "zh": "在这个规模上无法检验：模型没有达到论断的前提（下面列出缺了什么）",
    },
    "kind.inconclusive.meaning": {
        "en": "inconclusive: the difference is inside the noise, or too few seeds",
        "zh": "无定论：差别在噪声之内，或种子数不够",
    },
    "kind.cited-held": {"en": "held (per source)", "zh": "课文正确（据文献）"},
    "kind.cited-held.meaning": {
        "en": "the lesson is right, by a source (a paper, a date, a published config), not by a measurement; "
        "the reference is shown",
        "zh": "课文说得对，依据是文献（论文、日期、公开的配置），不是测量；下面写明出处",
    },
    "kind.cited-wrong": {"en": "did not hold (per source)", "zh": "课文有误（据文献）"},
    "kind.cited-wrong.meaning": {
        "en": "the lesson is wrong, by a source (what a paper reports, who wrote it, or the lesson's own text "
        "contradicting itself), not by a measurement; the reference is shown",
        "zh": "课文说错了，依据是文献（论文的内容、作者，或课文自相矛盾的两处原文），不是测量；下面写明出处",
    },
    "kind.withdrawn": {"en": "withdrawn", "zh": "勘误撤回"},
    "kind.withdrawn.meaning": {
        "en": "withdrawn: a correction the lab takes back, because its test cannot settle the statement (why is shown)",
        "zh": "勘误撤回：实验室收回的勘误，因为它的检验无法判定这句话（下面写明原因）",
    },
    "kind.unusable": {"en": "unusable", "zh": "记录不可用"},
    "kind.unusable.meaning": {
        "en": "unusable: the record in the results file breaks the rule (a number that is not finite, or a verdict "
        "its margin and noise do not give); why is shown",
        "zh": "记录不可用：结果文件中的记录违反判定规则（数字不是有限数，或结论与差值和噪声不符）；下面写明原因",
    },
    "kind.note": {"en": "poslab note", "zh": "poslab 附注"},
    "kind.note.meaning": {
        "en": "a poslab note: a check of poslab's own (no sentence of the lessons), shown with its result and left "
        "out of every count of the lessons' claims",
        "zh": "poslab 附注：poslab 自己的检查（不是课文中的论断），列出结果，但不计入课文论断的统计",
    },
    "count": {"en": "{n} {name}", "zh": "{name} {n} 条"},
    "share": {
        "en": "of the {testable} seeded claims on models that met their premises, {decided} decided ({percent}%)",
        "zh": "在模型满足前提的 {testable} 条多种子论断中，{decided} 条得出结论（{percent}%）",
    },
    "legend.title": {"en": "What the badges mean", "zh": "标记的含义"},
    # navigation and sections
    "nav.claims": {"en": "Claims checked", "zh": "检验的论断"},
    "nav.guide": {"en": "From a lesson section to its figure", "zh": "从课文章节到图表"},
    "nav.machine": {"en": "Machine and versions", "zh": "机器与软件版本"},
    "nav.other": {"en": "Other results", "zh": "其他结果"},
    "other.claim": {"en": "Results of experiments no lesson section lists.", "zh": "没有对应课文章节的实验结果。"},
    "other.measured": {"en": "See each experiment's description.", "zh": "见各实验的说明。"},
    "claims.intro": {
        "en": "Every quantitative claim of the lessons that a machine can test, with the figure measured by this lab",
        "zh": "课文中机器可以检验的每一个定量论断，以及本实验测得的数字",
    },
    "claims.untestable": {"en": "Not testable at this scale", "zh": "此规模无法检验的论断"},
    "claims.untestable.intro": {
        "en": "These claims were not decided: the models did not reach what the claim needs "
        "(its premise). The comparison alone would have said the verdict in the last column.",
        "zh": "这些论断没有判定：模型没有达到论断所需的能力（前提）。最后一列是只看比较本身会得到的结论。",
    },
    "rule": {
        "en": "How a verdict is decided: training comparisons run every arm with at least 3 seeds; the margin is "
        "the difference of the means in the claim's direction and the noise the half-width of its 95% "
        "interval (Welch). held: margin > noise; did not hold: margin < -noise; inconclusive otherwise, or "
        "with fewer than 3 seeds. A claim on trained models has a premise (what the models must be able to "
        "do, fixed before the runs); when it is not met the claim is not testable at this scale. "
        "Deterministic claims (counts, tables, float identities) are decided against the tolerance in "
        "their criterion. docs/lab.md explains the rule.",
        "zh": "判定规则：训练比较的每一组至少跑 3 个种子；差值（margin）是两组均值之差（按论断的方向），噪声是这个差的 "
        "95% 置信区间半宽（Welch）。差值 > 噪声：成立；差值 < −噪声：不成立；否则无定论（种子少于 3 个也是无定论）。"
        "针对训练模型的论断都有一个前提（模型必须先会做的事，在训练前定好）；前提未满足时，论断在此规模下无法检验。"
        "确定性论断（参数计数、表格、浮点恒等式）按其判据中的容差判定。docs/lab.md 有详细说明。",
    },
    "guide.intro": {
        "en": "Each lesson by its own title, section by section: where on this page its claims are "
        "measured, the figures shown there, and the verdicts.",
        "zh": "按课文标题逐节列出：每一节的论断在本页哪里测量、那里有哪些图，以及判定结果。",
    },
    "guide.section": {"en": "lesson section", "zh": "课文章节"},
    "guide.where": {"en": "measured in", "zh": "测量位置"},
    "guide.figures": {"en": "figures", "zh": "图表"},
    "guide.verdicts": {"en": "verdicts", "zh": "判定"},
    "guide.nofigure": {"en": "no figure (tables only)", "zh": "无图（只有表格）"},
    # verdict tables
    "table.lesson": {"en": "lesson", "zh": "出处"},
    "table.claim": {"en": "claim", "zh": "论断"},
    "table.measured": {"en": "measured here (mean ± sd)", "zh": "本机测得（均值 ± 标准差）"},
    "table.margin": {"en": "margin vs noise", "zh": "差值与噪声"},
    "table.verdict": {"en": "verdict", "zh": "判定"},
    "table.reason": {"en": "what was missing", "zh": "缺了什么"},
    "table.without": {"en": "the comparison alone", "zh": "只看比较"},
    "table.criterion": {"en": "criterion:", "zh": "判据："},
    "table.reference": {"en": "Reference:", "zh": "出处："},
    "table.withdrawn": {"en": "Withdrawn because:", "zh": "撤回原因："},
    "table.evidence": {"en": "evidence:", "zh": "证据："},
    "table.unusable": {"en": "why unusable:", "zh": "不可用的原因："},
    "table.none": {
        "en": "No claim of this section could be checked: its experiments did not run.",
        "zh": "本节的论断都没有检验：相关实验没有运行。",
    },
    "margin.unmeasurable": {"en": "not measurable", "zh": "无法测量"},
    "margin.deterministic": {
        "en": "margin {margin} (deterministic: no seeds; the tolerance is in the criterion)",
        "zh": "差值 {margin}（确定性计算，无种子；容差见判据）",
    },
    "margin.nonoise": {
        "en": "margin {margin} (no measured noise; the tolerance is in the criterion)",
        "zh": "差值 {margin}（没有测得噪声；容差见判据）",
    },
    "margin.seeded": {"en": "margin {margin} vs noise ±{noise} (n={n})", "zh": "差值 {margin}，噪声 ±{noise}（n={n}）"},
    "margin.fewseeds": {"en": "; fewer than {n} seeds", "zh": "；种子少于 {n} 个"},
    "margin.missed": {"en": "; missed by {by}", "zh": "；还差 {by}"},
    "margin.design": {
        "en": "; {test}, p = {p}, Holm within {family} (step {step} of {m}: p ≤ {threshold})",
        "zh": "；{test}，p = {p}，在 {family} 内做 Holm 校正（第 {step}/{m} 步：需 p ≤ {threshold}）",
    },
    "margin.decide": {
        "en": "; at this noise, {n} seeds an arm would detect the measured effect",
        "zh": "；按此噪声，每组 {n} 个种子可检测到测得的效应",
    },
    "margin.undecidable": {
        "en": "; at this noise, not even {n} seeds an arm would detect the measured effect",
        "zh": "；按此噪声，每组 {n} 个种子也检测不到测得的效应",
    },
    "test.paired t-test": {"en": "paired t-test", "zh": "配对 t 检验"},
    "test.Welch t-test": {"en": "Welch t-test", "zh": "Welch t 检验"},
    "test.one-sample t-test": {"en": "one-sample t-test", "zh": "单样本 t 检验"},
    "test.paired TOST": {"en": "paired equivalence test (TOST)", "zh": "配对等效性检验（TOST）"},
    "test.pairwise t-tests (every pair)": {"en": "pairwise t-tests (every pair)", "zh": "两两 t 检验（每一对）"},
    "test.ln": {"en": " on ln", "zh": "（取对数）"},
    # sections and folders
    "section.claimhead": {"en": "The lesson's claim", "zh": "课文的论断"},
    "section.measuredhead": {"en": "What was measured", "zh": "测量了什么"},
    "section.verdicts": {"en": "Verdicts", "zh": "判定"},
    "folder.step": {"en": "This step {status}: ", "zh": "这一步{status}："},
    "status.failed": {"en": "failed", "zh": "失败"},
    "status.interrupted": {"en": "was interrupted", "zh": "被中断"},
    "status.skipped": {"en": "was skipped", "zh": "被跳过"},
    "status.unavailable": {"en": "is unavailable", "zh": "不可用"},
    "folder.notrun": {"en": "Not run in this lab (no results.json).", "zh": "本次实验没有运行（没有 results.json）。"},
    "folder.numbers": {"en": "All numbers of {path}", "zh": "{path} 的全部数字"},
    "folder.more": {"en": "… {n} more rows in results.json", "zh": "…… results.json 中还有 {n} 行"},
    "cell.yes": {"en": "yes", "zh": "是"},
    "cell.no": {"en": "no", "zh": "否"},
    "cell.values": {"en": "{n} values: {first}, {second} … {last}", "zh": "共 {n} 个值：{first}、{second} …… {last}"},
    # machine
    "machine.recorded": {"en": "recorded by the lab run", "zh": "由实验运行时记录"},
    "machine.here": {
        "en": "of the machine that built this report (no lab.json)",
        "zh": "生成本报告的机器（没有 lab.json）",
    },
    "machine.shared": {
        "en": "{origin}; the machine may have been shared with other work, so timings are noisy.",
        "zh": "{origin}；这台机器可能同时在做别的工作，计时有噪声。",
    },
    "machine.cpu": {"en": "CPU", "zh": "处理器"},
    "machine.cores": {"en": "cores", "zh": "核心数"},
    "machine.threads": {"en": "torch threads", "zh": "torch 线程数"},
    "machine.cuda": {"en": "CUDA", "zh": "CUDA"},
    "machine.platform": {"en": "platform", "zh": "平台"},
    "machine.lab": {"en": "lab {key}", "zh": "实验 {key}"},
    "machine.steps": {
        "en": "lab steps (seconds: wall time; cpu_seconds: CPU time of the step's process)",
        "zh": "实验步骤（seconds：墙钟时间；cpu_seconds：该步骤进程的 CPU 时间）",
    },
    # key tables
    "key.scheme": {"en": "scheme", "zh": "位置编码"},
    "key.run": {"en": "run", "zh": "训练"},
    "key.model": {"en": "model", "zh": "模型"},
    "key.extrapolation": {
        "en": "validation perplexity, {label} (trained at L = {length}; mean ± sd over seeds {seeds}){baseline}",
        "zh": "验证集困惑度，{label}（训练长度 L = {length}；种子 {seeds} 的均值 ± 标准差）{baseline}",
    },
    "key.nonoverlapping": {"en": "non-overlapping chunks", "zh": "不重叠分块"},
    "key.sliding": {"en": "sliding window", "zh": "滑动窗口"},
    "key.baseline": {
        "en": "; unigram-entropy baseline of {corpus}: {value} nats (perplexity {ppl})",
        "zh": "；{corpus} 的单字熵基线：{value} nats（困惑度 {ppl}）",
    },
    "key.ctx.scaling": {"en": "scaling at inference", "zh": "推理时的缩放"},
    "key.ctx.spec": {"en": "spec", "zh": "配置"},
    "key.ctx.pplat": {"en": "ppl at {n}", "zh": "{n} 处困惑度"},
    "key.ctx.base": {
        "en": "RoPE model trained at L = {length}; its perplexity at L: {ppl}",
        "zh": "RoPE 模型在 L = {length} 训练；在 L 处的困惑度：{ppl}",
    },
    "key.ctx.finetuned": {"en": "fine-tuned", "zh": "微调方式"},
    "key.ctx.back": {"en": "ppl back at {n}", "zh": "回到 {n} 的困惑度"},
    "key.ctx.after": {"en": "after fine-tuning at 4×L", "zh": "在 4×L 微调之后"},
    "key.ctx.forgetting": {"en": "ppl at L = {n} (forgetting)", "zh": "L = {n} 处困惑度（遗忘）"},
    "key.ctx.passkey": {"en": "passkey at {f}×L", "zh": "{f}×L 处的密钥检索"},
    "key.ctx.averaging": {
        "en": "checkpoint averaging of the {ft} fine-tune: last {last} checkpoints, base ⊕ fine-tuned "
        "{w}/{w2} (mean ± sd over seeds {seeds})",
        "zh": "{ft} 微调的检查点平均：最后 {last} 个检查点，基座 ⊕ 微调 {w}/{w2}（种子 {seeds} 的均值 ± 标准差）",
    },
    "key.entropy.rise": {"en": "entropy rise at 4×L", "zh": "4×L 处熵的增量"},
    "key.entropy.caption": {
        "en": "mean attention entropy (nats) by evaluation length (means over seeds {seeds})",
        "zh": "按评估长度的平均注意力熵（nats，种子 {seeds} 的均值）",
    },
    "key.train.val": {"en": "val loss, whole split (mean ± sd)", "zh": "整个验证集的损失（均值 ± 标准差）"},
    "key.train.best": {"en": "best val loss (sampled)", "zh": "最佳验证损失（抽样）"},
    "key.train.params": {"en": "parameters", "zh": "参数量"},
    "key.train.caption": {
        "en": "{steps} training steps each on {corpus}, seeds {seeds}{baseline}",
        "zh": "每个在 {corpus} 上训练 {steps} 步，种子 {seeds}{baseline}",
    },
    "key.heads.head": {"en": "head", "zh": "头"},
    "key.heads.prev": {"en": "previous-token", "zh": "前一个字"},
    "key.heads.induction": {"en": "induction", "zh": "归纳"},
    "key.heads.offset": {"en": "offset", "zh": "偏移"},
    "key.heads.confidence": {"en": "confidence", "zh": "置信度"},
    "key.heads.punct": {"en": "punctuation", "zh": "标点"},
    "key.heads.masked": {"en": "Δloss masked", "zh": "屏蔽后的 Δ损失"},
    "key.heads.type": {"en": "type", "zh": "类型"},
    "key.heads.caption": {"en": "every head (base loss {loss})", "zh": "所有头（基础损失 {loss}）"},
    "key.heads.pruned": {"en": "pruned", "zh": "剪掉"},
    "key.heads.nmasked": {"en": "heads masked", "zh": "屏蔽的头数"},
    "key.heads.loss": {"en": "loss", "zh": "损失"},
    "key.heads.increase": {"en": "increase", "zh": "增量"},
    "key.heads.prune": {
        "en": "pruning the least important heads (by Δloss when masked alone)",
        "zh": "剪掉最不重要的头（按单独屏蔽时的 Δ损失排序）",
    },
    "key.missing": {
        "en": "{experiment}: the table “{table}” cannot be built: results.json has no field “{field}”",
        "zh": "{experiment}：无法生成表格“{table}”：results.json 中没有字段“{field}”",
    },
    "key.failed": {
        "en": "{experiment}: the table “{table}” cannot be built: {problem}",
        "zh": "{experiment}：无法生成表格“{table}”：{problem}",
    },
    "key.runs.corpus": {"en": "corpus", "zh": "语料"},
    "key.runs.steps": {"en": "steps", "zh": "步数"},
    "key.runs.final": {"en": "final val loss (nats)", "zh": "最终验证损失（nats）"},
    "key.runs.baseline": {"en": "unigram-entropy baseline (nats)", "zh": "单字熵基线（nats）"},
    "key.runs.caption": {
        "en": "the model these heads belong to: how far below the character-frequency baseline it trained",
        "zh": "这些头所属的模型：训练后比字频基线低了多少",
    },
}

#: the Chinese of every section of :data:`poslab.lab.report.sections.SECTIONS`: key -> (title, claim, measured)
SECTION_ZH: dict[str, tuple[str, str, str]] = {
    "multihead": (
        "多头注意力：许多小头，不增加参数",
        "「多头不增加参数量，只是改变了计算的方式」：把 d_model 拆成 h 个 d_k = d_model/h 的头，仍是四个 d×d 矩阵 "
        "W_Q、W_K、W_V、W_O，所以参数量与 h 无关。「多頭注意力和位置編碼」在 n_embd 32 时打印 qkv 3168 / proj 1056，"
        "与头数无关，并在练习 2 中要求分别训练 1、4、8 个头比较验证损失。「11 · 多头注意力与位置编码」§1.4 说小头（小 "
        "d_k）往往更好；「多头注意力机制与位置编码的深度解析」§3.2 给出「最优头数 ≈ √(d_model/16)」。",
        "poslab 真实注意力模块在几种头数下的参数量；拆头与合头过程中每个张量的形状（由钩子读出）；同一个 GPT 用 "
        "1、2、4、8、16 个头训练（同样的数据、步数和种子）：完整版是课文的设置（唐诗，n_embd 128），快速版是 "
        "tinyshakespeare 上 2 层、n_embd 64 的小模型。",
    ),
    "order": (
        "注意力看不见顺序",
        "「Attention 是置换等变的」：打乱输入只会打乱输出，所以「狗咬人」和「人咬狗」看起来一样。「多頭注意力和位置編碼"
        "」发现了意外：有因果掩码且两层以上时，没有任何位置编码的模型仍能分辨「白日依山尽」和「山依日白尽」——掩码本身泄"
        "露了顺序（Haviv et al. 2022）。",
        "课文的原始矩阵实验，以及每种已注册位置编码的一层注意力在随机置换下的表现；一个未训练的字符级 GPT（1、2、3 层）"
        "读这两句五言，有无位置信息各一次；完整版还有 Haviv 等人的对照：因果语言模型和双向掩码语言模型，各有无位置编码"
        "，每组 3 个种子。",
    ),
    "training": (
        "哪种位置编码训练效果最好",
        "「11 · 多头注意力与位置编码」的表格给绝对、可学习、相对（T5、ALiBi）和旋转编码排了名；它说 ALiBi「性能略低于 "
        "RoPE」，RoPE 是现代默认选择。「多頭注意力和位置編碼」指出没有位置编码的因果模型仍能学到位置，「效果只比加了位"
        "置编码的差一点」，并在练习 3 中要求把 pos_emb 换成 RoPE 比较。",
        "同一个小 GPT 在唐诗上按每种位置编码各训练一次（同样的数据、步数和种子）：损失曲线和最终验证损失。",
    ),
    "sinusoidal": (
        "正余弦编码及其预计算缓存",
        "「多头注意力机制与位置编码的深度解析」写出 PE(pos, 2i) = sin(pos/10000^(2i/d))，说数值在 [-1, 1] 之间、波长从 "
        "2π 到 10000·2π，并称预计算的表「预计算版本比实时计算快40倍」。",
        "在这台机器上交替计时取中位数：poslab 缓存的正余弦表查表与对同样位置现算 sin/cos 的比较、两种方式的嵌入步骤 "
        "x + PE，以及整个 GPT 前向中使用缓存与每次重算的比较。另测数值范围和波长。",
    ),
    "rope": (
        "RoPE：把位置变成旋转",
        "「<R_m q, R_n k> = <q, R_{n−m} k>」：旋转之后，内积只依赖偏移 n − m；课文的表在每个绝对位置给出同样的值"
        "（波动约 1e-6）。频率 θ_i = base^(−2i/d) 成几何级数：低维转得快（周期短，管近处），高维转得慢（周期长，管远处"
        "）。",
        "用 poslab 的 rope 逐位复现课文的实验，再对每种 RoPE 布局和缩放做同样的“只依赖偏移”检验（绝对编码必须不通过）；"
        "课文的 inv_freq 表，以及每种 RoPE 缩放（PI、NTK、动态、YaRN、Llama 3、LongRoPE）的频谱。",
    ),
    "extrapolation": (
        "超出训练长度",
        "绝对和可学习嵌入「超出训练长度就崩」；相对编码外推中等，RoPE 好，但超过训练长度后 RoPE "
        "也会退化：「注意力熵爆炸」，「困惑度急剧上升——实测通常从 10 飙到 100+」。「多头注意力机制与位置编码的深度解析"
        "」说相对编码解决了长序列泛化。ALiBi 论文（Press et al. 2022）测得正余弦编码在超过 L 后困惑度暴涨，而 ALiBi "
        "保持平稳。",
        "每种位置编码训练一个小 GPT，训练长度 L，在 1×、2×、4×、8×、16× L 上评估；每层平均注意力熵随评估长度的变化，"
        "有无 YaRN 温度和 log-n 缩放。完整版还有论文原样的 Transformer-XL（Dai et al. 2019）：相对编码加段级循环，"
        "带长度 L 记忆训练的模型与同样段落上不带记忆训练的模型对比，逐段读取，记忆长度 L、2L、4L，按段内位置看损失。",
    ),
    "context": (
        "拉长上下文：PI、NTK-aware、YaRN",
        "「扩展上下文长度时，第一选择总是 YaRN 或 NTK-aware，比直接 PI 效果好得多」；表中 YaRN ★★★、NTK ★★☆、"
        "PI ★★（有损）、继续预训练 ★★★（慢但最可靠）。\n\n"
        "Q4 还说：「LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 + "
        "平均检查点（averaging checkpoints）避免灾难性遗忘。」在 Llama 3 论文（Dubey et al. 2024，“The Llama 3 Herd of "
        "Models”）中，检查点平均属于预训练的退火阶段（§3.4.3）和后训练（§4.1.5，在每个 RM、SFT、DPO "
        "阶段平均模型），而不是课文所说的长上下文阶段（§3.4.2）。",
        "RoPE 模型在 4× 训练长度上评估，推理时分别不缩放、用 PI、NTK、动态 NTK、YaRN 和 Llama 3；然后在 4× L "
        "上用不缩放、PI 和 YaRN 各做短暂微调，再在 4× L 和原长度 L 上评估。检查点平均（在 YaRN 微调上）：最后 k "
        "个检查点的平均，以及基座与微调权重 0.5/0.5 的平均，与普通微调和基座模型对比，看 L 处（遗忘）、4× L "
        "处和密钥检索（不额外训练）。",
    ),
    "heads": (
        "各个头在做什么",
        "「有些头专门做「前一个词」的关注，有些头做「句号」的关注」；「多头注意力机制与位置编码的深度解析」§6.1 "
        "描述了管局部语法、关键词和长距离依赖的头，以及充当「备用通道」的头。Olsson et al. 2022 "
        "补充了归纳头（需要两层以上）；Voita et al. 2019 有位置头；Michel et al. 2019 发现大多数头去掉后代价很小。",
        "一个在唐诗上训练的 GPT：每层每个头在「白日依山尽，黄河入海流。」上的注意力、前一个字得分、重复随机字符上的归纳"
        "（前缀匹配）得分、每个头的位置偏移及其置信度、单独屏蔽每个头时的损失变化，以及剪掉最不重要的 30% 和 60% "
        "的头后的损失。",
    ),
    "probes": (
        "合成探针：由位置决定答案的任务",
        "没有位置信息的注意力无法给字排序，所以倒序、取第 k 个位置的字这类任务需要位置编码。Kazemnejad et al. 2023 的"
        "长度泛化排名是 NoPE > T5 > ALiBi > RoPE > 绝对；「11 · 多头注意力与位置编码」Q1 "
        "说头越多，一层能同时承载的关系越多。",
        "每种已注册的位置编码训练几秒钟的小 GPT，做复制、倒序、取第 k 个、多查询联想回忆、计数、密钥检索，在 L 上训练，"
        "在 L、2L、4L 上测试，每组 3 个种子。",
    ),
    "sparse": (
        "稀疏注意力：保留了什么，省下了什么",
        "「多头注意力机制与位置编码的深度解析」把局部、轴向、LSH 和自适应跨度注意力作为降低平方复杂度的办法，并称自适应"
        "跨度在 PG-19 上减少 23% 计算量；§6.1 描述了管局部语法、关键词和长距离依赖的头以及备用头。",
        "全注意力、滑动窗口、轴向、LSH 和自适应跨度注意力，在一个有长距离依赖的任务上随长度增长：质量、每步时间和峰值内"
        "存并排比较，以及每个头学到的跨度（完整版）；训练模型的各个头在 PCA / t-SNE 图上的位置，对照课文的描述检验。",
    ),
    "modern": (
        "近期模型的机制",
        "StreamingLLM 在滚动窗口旁保留最前面几个字（注意力汇聚点），报告在远长于窗口的流上困惑度稳定；Barbero et al. "
        "2024 发现 RoPE 模型用最低的频率承载内容、最高的频率承载位置。",
        "长文本流上的困惑度：汇聚点缓存、普通滚动窗口和全注意力；训练好的 RoPE 模型中 q、k 按频率的范数（完整版）。",
    ),
    "zoo": (
        "真实模型的头结构",
        "「d_k 几乎总是 64 或 128」（「11 · 多头注意力与位置编码」Q3）和「最优头数 ≈ √(d_model/16)」（「多头注意力机制"
        "与位置编码的深度解析」§3.2）；注意力参数是 4·d_model²，与头数无关。",
        "一张随代码发布的开源模型配置表（每行注明其 config.json 出处）：d_k 的分布、头数与 √(d/16) 规则的对照、GQA "
        "比例，以及缩小版构建的参数量。",
    ),
    "corrections": (
        "勘误：课文哪里错了",
        "实验证明是错误的课文原句，每条附原文引用。",
        "每条的测量或计算证据（ALiBi 的符号和方向、NTK-aware 缩放的方向、RoPE 在 7B 模型上省下的显存、反了的局部窗口掩"
        "码、梯度缩放下的梯度裁剪、autocast 下分数的精度、点积方差与 d_k 的关系、离开训练范围的 RoPE 维度等），以及 "
        "poslab 对课文空表测到的结果。",
    ),
}


#: the one table: message id -> {"en": ..., "zh": ...}
STRINGS: dict[str, dict[str, str]] = {
    **UI,
    **{
        f"section.{s.key}.{field}": {"en": getattr(s, field), "zh": zh}
        for s in SECTIONS
        for field, zh in zip(("title", "claim", "measured"), SECTION_ZH.get(s.key, ("", "", "")), strict=True)
    },
}


def language() -> str:
    """The language of the page being built (``"en"`` outside :func:`use_language`)."""
    return _LANG.get()


@contextlib.contextmanager
def use_language(lang: str) -> Iterator[None]:
    """Build the page in ``lang`` inside the ``with`` block."""
    if lang not in LANGS:
        raise ValueError(f"report language must be one of {list(LANGS)}, got {lang!r}")
    token = _LANG.set(lang)
    try:
        yield
    finally:
        _LANG.reset(token)


def t(key: str, /, **fields: object) -> str:
    """Message ``key`` in the current language, with ``fields`` filled in (``KeyError`` naming an unknown id)."""
    if key not in STRINGS:
        raise KeyError(f"no report string {key!r}")
    text = STRINGS[key][language()]
    return text.format(**fields) if fields else text  # texts without fields may hold braces (R_{n−m})


_SEEDS = re.compile(r"\b[Ss]eeds? (\d{3})((?:(?:, | and )\d{3})*)")


def name_lessons(text: str) -> str:
    """``text`` with every "seed 000" (or "seeds 000 and 002") replaced by the lessons' titles."""

    def titles(match: re.Match[str]) -> str:
        ids = [match.group(1), *re.findall(r"\d{3}", match.group(2))]
        joiner = "、" if language() == "zh" else " and "
        return joiner.join(LESSONS.get(i, f"lesson {i}") for i in ids)

    text = _SEEDS.sub(titles, text)
    if language() == "zh":
        text = re.sub(r"\bexercise (\d)", r"练习 \1", text)
        text = re.sub(r"\bexp\. (\d)", r"实验 \1", text).replace(" and §", "、§")
    return text
