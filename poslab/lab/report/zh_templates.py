"""The Chinese templates of generated texts: measured figures, criteria, premises and Holm reasons.

Each rule matches a whole text the lab writes (regexes compiled once, at import) and gives its Chinese
form; named groups ``t_*`` are translated again (an arm's label, a metric, a nested premise), the
others (numbers, scheme names, seeds) pass through as written. The generators are
:mod:`poslab.lab.comparisons` (``A m ± s (n=3) vs B ...; paired difference ...``, the criteria),
:mod:`poslab.lab.plan` (the Holm reason), :mod:`poslab.lab.premises` and
:mod:`poslab.lab.verdicts` (premise texts), :mod:`poslab.lab.experiments.tang_heads` (the head analysis).
"""

from __future__ import annotations

import re

from poslab.lab.report import zh_lesson_items
from poslab.lab.report.zh_measured import MEASURED
from poslab.lab.report.zh_text import NUM, PM, Rule, glossed, joined, split_top, template, translate

#: the probe tasks (names, as the results write them)
TASKS = "copy|reverse|retrieve|mqar|count|counting|passkey"


def _pair_split(text: str, word: str) -> list[tuple[str, str]]:
    """Every way of cutting ``text`` at `` word `` into two non-empty parts."""
    out, start = [], 0
    sep = f" {word} "
    while (i := text.find(sep, start)) != -1:
        out.append((text[:i], text[i + len(sep) :]))
        start = i + 1
    return out


def metric_of(text: str) -> str | None:
    """``METRIC of LABEL`` (as :func:`poslab.lab.comparisons.bound` writes it): LABEL 的 METRIC, trying every cut."""
    for metric, label in _pair_split(text, "of"):
        m, lab = translate(metric), translate(label)
        if m is not None and lab is not None:
            return f"{spaced(lab, '的', m)}{' ' if m[-1:].isascii() else ''}"
    return None


def spaced(*parts: str) -> str:
    """``parts`` joined with a space where Latin text meets Chinese, none between two Chinese characters."""
    out = parts[0]
    for part in parts[1:]:
        out += (" " if out[-1:].isascii() != part[:1].isascii() or out[-1:].isascii() else "") + part
    return out


_BOUND = re.compile(rf"(?P<head>.+?) (?P<v>{PM}) \(limit (?P<lim>{NUM})\)")


def bound_measured(text: str) -> str | None:
    """``METRIC of LABEL m ± s (n=3) (limit X)``."""
    match = _BOUND.fullmatch(text)
    if not match:
        return None
    head = metric_of(match["head"])
    return None if head is None else f"{head.rstrip()} {match['v']}（界限 {match['lim']}）"


_GAP = re.compile(
    rf"(?P<head2>.+?) at most (?P<at>{NUM}) (?P<word2>higher|lower) than (?P<worse2>.+)"
    rf"|(?P<head>.+?) (?P<word>lower|higher) than (?P<worse>.+?)(?: by more than (?P<by>{NUM}))?"
)
_WORD = {"lower": "低于", "higher": "高于"}


def gap(text: str) -> str | None:
    """The criterion :func:`poslab.lab.comparisons._gap` writes: ``METRIC of A lower than B [by more than X]``."""
    match = _GAP.fullmatch(text)
    if not match:
        return None
    if match["head"]:
        head, worse = metric_of(match["head"]), translate(match["worse"])
        if head is None or worse is None:
            return None
        by = f"，且差距大于 {match['by']}" if match["by"] else ""
        return spaced(head.rstrip(), _WORD[match["word"]], worse) + by
    head, worse = metric_of(match["head2"]), translate(match["worse2"])
    if head is None or worse is None:
        return None
    return spaced(head.rstrip(), "比", worse, "至多" + ("高" if match["word2"] == "higher" else "低"), match["at"])


_LIMIT = re.compile(rf"(?P<head>.+?) (?P<word>below|above) (?P<x>{NUM})")


def limit(text: str) -> str | None:
    """The criterion :func:`poslab.lab.comparisons.bound` writes: ``METRIC of LABEL below X``."""
    match = _LIMIT.fullmatch(text)
    head = metric_of(match["head"]) if match else None
    return (
        None
        if head is None or match is None
        else f"{head}{'低于' if match['word'] == 'below' else '高于'} {match['x']}"
    )


def arm_list(text: str) -> str | None:
    """``a: m ± s (n=3), b: ...`` (the arms of a ranking) or ``arm value, arm value`` (a premise's per-arm figures)."""
    items = split_top(text, ", ")
    if len(items) < 2 and not re.search(rf"^.+(?::)? (?:{NUM}|-)$", text):
        return None
    out = []
    for item in items:
        match = re.fullmatch(rf"(?P<label>.+?)(?P<colon>:?) (?P<v>{PM}|-)", item)
        label = translate(match["label"]) if match else None
        if label is None or match is None:
            whole = (
                translate(item) if len(items) > 1 else None
            )  # an item of its own form (a probe's arm with its margin)
            if whole is None:
                return None
            out.append(whole)
            continue
        out.append(f"{label}{'：' if match['colon'] else ' '}{match['v']}")
    return "，".join(out)


TEMPLATES: tuple[tuple[str, str], ...] = (
    # plan.py: the Holm reason
    (
        rf"not significant after Holm–Bonferroni within '(?P<f>[\w-]+)' \((?P<m>\d+) claims\): p = (?P<p>{NUM}) > "
        rf"(?P<a>{NUM})/(?P<k>\d+) = (?P<th>{NUM}) \(or a smaller p-value before it failed\)",
        "在 '{f}' 内（{m} 条论断）做 Holm–Bonferroni 校正后不显著："
        "p = {p} > {a}/{k} = {th}（或在它之前某个更小的 p 值已未通过）",
    ),
    # verdicts.py: an unmet premise
    (
        r"premise not met: (?P<t_p>.+?) \(measured: (?P<t_m>.*)\)",
        "前提未满足：{t_p}（实测：{t_m}）",
    ),
    # comparisons.py: two arms, and the paired difference
    (rf"(?P<t_a>.+?) (?P<a>{PM}) vs (?P<t_b>.+?) (?P<b>{PM})", "{t_a} {a} 对比 {t_b} {b}"),
    (rf"paired difference of ln (?P<d>{PM})", "配对差（取对数）{d}"),
    (rf"paired difference (?P<d>{PM})", "配对差 {d}"),
    (r"deciding pair (?P<t_a>.+?) vs (?P<t_b>.+)", "决定胜负的一对：{t_a} 对 {t_b}"),
    (
        rf"extra training: (?P<s>{NUM}) steps x (?P<t>{NUM}) tokens = (?P<n>{NUM}) tokens each arm",
        "额外训练：{s} 步 × {t} 个 token = 每组 {n} 个 token",
    ),
    # comparisons.py: the criteria's suffixes
    (r"(?P<t_c>.+) \(on ln of the values\)", "{t_c}（取值的对数）"),
    (
        r"(?P<t_c>.+) \(paired by seed: the per-seed differences, paired t\)",
        "{t_c}（按种子配对：逐种子的差，配对 t 检验）",
    ),
    (
        r"decided when the margin exceeds the 95% interval of the difference of the means "
        r"\(Welch, at least (?P<n>\d+) seeds each\)",
        "差值超出两组均值之差的 95% 区间即判定（Welch，每组至少 {n} 个种子）",
    ),
    (
        r"decided when the margin exceeds the 95% interval of the mean \(one-sample t, at least (?P<n>\d+) seeds\)",
        "差值超出均值的 95% 区间即判定（单样本 t，至少 {n} 个种子）",
    ),
    (
        r"(?P<t_m>.+?): the best arm is one of \[(?P<arms>[^\]]*)\]; decided pairwise \(each pair's margin against "
        r"its 95% interval, (?P<t_how>paired by seed|Welch), at least (?P<n>\d+) seeds each\)",
        "{t_m}：最好的一组是 [{arms}] 之一；两两判定（每一对的差值对照其 95% 区间，{t_how}，每组至少 {n} 个种子）",
    ),
    (
        rf"(?P<t_m>.+?) of (?P<t_a>.+?) within ±(?P<w>{NUM}) of (?P<t_b>.+?), paired by seed; decided by two "
        rf"one-sided tests \(the 90% interval of the mean difference inside ±(?P<w2>{NUM}): held; wholly outside: "
        rf"did not hold; at least (?P<n>\d+) seeds\)",
        "{t_a} 的{t_m}在 {t_b} 的 ±{w} 之内，按种子配对；用两个单侧检验判定（均值差的 90% 区间落在 ±{w2} 之内："
        "课文正确；完全在外：课文有误；至少 {n} 个种子）",
    ),
    # premises.py
    (
        rf"every seed's loss <= (?P<t_n>\w+) baseline (?P<b>{NUM}) - (?P<m>{NUM}) = (?P<l>{NUM}) nats/token",
        "每个种子的损失 ≤ {t_n}基线 {b} − {m} = {l} nats/token",
    ),
    (r"worst seed per arm: (?P<t_l>.+)", "每组最差的种子：{t_l}"),
    (r"smallest gain per arm: (?P<t_l>.+)", "每组最小的增益：{t_l}"),
    (
        rf"every seed: mean loss at positions (?P<a>\d+)-(?P<b>\d+) minus mean loss at the last quarter of the "
        rf"window >= (?P<m>{NUM}) nats/token \(the model uses its context within L\)",
        "每个种子：位置 {a}-{b} 的平均损失减去窗口最后四分之一的平均损失 ≥ {m} nats/token（模型在 L 之内用到了上下文）",
    ),
    (
        r"the model uses its context within L \(positions (?P<a>\d+)-(?P<b>\d+) vs the last quarter\)",
        "模型在 L 之内用到了上下文（位置 {a}-{b} 对比最后四分之一）",
    ),
    (
        r"not measurable: a window of (?P<n>\d+) positions is too short",
        "无法测量：{n} 个位置的窗口太短",
    ),
    (r"(?P<n>\d+) seeds", "{n} 个种子"),
    (
        rf"at least (?P<n>\d+) seeds: a paired variance test detects a (?P<r>{NUM})x sd ratio with (?P<p>{NUM}) power "
        r"from that many \(Pitman–Morgan, Fisher's z\)",
        "至少 {n} 个种子：配对方差检验要这么多种子才能以 {p} 的功效检测"
        "出 {r} 倍的标准差之比（Pitman–Morgan，Fisher z）",
    ),
    (r"with (?P<k>\d+) that test has (?P<df>\d+) degrees? of freedom", "{k} 个种子时这个检验只有 {df} 个自由度"),
    (rf"(?P<s>[\w-]+) (?P<task>{TASKS}) seed (?P<n>\d+)", "{s} {task} 种子 {n}"),
    (rf"(?P<s>[\w-]+) (?P<task>{TASKS}) run (?P<n>\d+)", "{s} {task} 第 {n} 次训练"),
    (r"(?P<s>[\w-]+) seed (?P<n>\d+)", "{s} 种子 {n}"),
    (r"(?P<s>[\w-]+) run (?P<n>\d+)", "{s} 第 {n} 次训练"),
    (rf"(?P<s>[\w-]+) (?P<task>{TASKS})", "{s} {task}"),
    (
        r"(?P<w>[§Q][\d.]+)(?P<t_k> table| text)?: (?P<q>「.*」) \((?P<t_g>[^()]+)\)",
        "{w}{t_k}：{q}（{t_g}）",
    ),
    (r"(?P<t_a>.+)\. (?P<t_b>Which is right: .+)", "{t_a}。{t_b}"),
    (
        rf"the (?P<t_who>base models|plain fine-tunes) retrieve the passkey at (?P<f>\d+)x L, every seed: accuracy >= "
        rf"(?P<b>{NUM}) \(halfway from chance (?P<c>{NUM}) to 1\)",
        "{t_who}在 {f}x L 处能检索到密钥，每个种子：准确率 ≥ {b}（从随机水平 {c} 到 1 的一半）",
    ),
    (
        rf"mean passkey retrieval at L >= (?P<b>{NUM}) \(halfway from chance (?P<c>{NUM}) to 1\) in every arm",
        "每组在 L 处的平均密钥检索准确率 ≥ {b}（从随机水平 {c} 到 1 的一半）",
    ),
    (r"retrieval at (?P<f>\d+x )?L: (?P<t_l>.+)", "{f}L 处的检索：{t_l}"),
    (r"seed (?P<n>\d+)", "种子 {n}"),
    (r"forgetting inconclusive: (?P<t_x>.+)", "遗忘无定论：{t_x}"),
    (rf"every seed's accuracy at L >= (?P<x>{NUM}) in every arm", "每组每个种子在 L 处的准确率 ≥ {x}"),
    (r"lowest seed at L: (?P<t_l>.+)", "L 处最低的种子：{t_l}"),
    (rf"below (?P<x>{NUM}): (?P<t_l>.+)", "低于 {x}：{t_l}"),
    (r"(?P<f>\d*L) (?P<t_u>used|not used): (?P<t_l>.+)", "{f} {t_u}：{t_l}"),
    (
        rf"(?P<s>\S+) (?P<task>\w+) (?P<v>{NUM}) \(margin (?P<m>{NUM}), 95% ±(?P<h>{NUM}|-): "
        r"(?P<t_a>above|not above)\)",
        "{s} {task} {v}（差值 {m}，95% ±{h}：{t_a}）",
    ),
    (
        r"(?P<t_arm>.+?) beats NoPE on (?P<t_m>.+?) by more than the noise",
        "{t_arm} 在{t_m}上胜过 NoPE，且超出噪声",
    ),
    # claims of one shape, one per arm (context-extension, probes, position-training)
    (
        r"without fine-tuning, (?P<t_a>.+?) reads 4x L better than no scaling",
        "不微调时，{t_a} 在 4x L 上的困惑度低于不缩放",
    ),
    (
        r"without fine-tuning, (?P<t_a>.+?) reads 4x L better than PI "
        r'\("YaRN or NTK-aware first, much better than PI"\)',
        "不微调时，{t_a} 在 4x L 上的困惑度低于 PI（「第一选择总是 YaRN 或 NTK-aware，比直接 PI 效果好得多」）",
    ),
    (
        r"after (?P<n>\d+) fine-tuning steps at 4x L, (?P<t_a>\w+) is close to the base model's in-length perplexity "
        r"\(within 5%; the PI paper fine-tunes up to 1000 steps, this run (?P=n)\)",
        "在 4x L 上微调 {n} 步后，{t_a} 接近基座模型在训练长度内的困惑度"
        "（相差 5% 以内；PI 论文最多微调 1000 步，本次 {n} 步）",
    ),
    (
        r"fine-tuning at 4x L makes (?P<t_a>\w+) retrieve the passkey at 4x L better than (?P=t_a) without it",
        "在 4x L 上微调后，{t_a} 在 4x L 处的密钥检索比不微调的 {t_a} 好",
    ),
    (
        r"(?P<a>[\w-]+) generalises past the training length better than (?P<b>[\w-]+)",
        "超过训练长度后，{a} 的泛化好于 {b}",
    ),
    (
        r"attention needs position: on (?P<task>\w+), rope beats NoPE in length",
        "注意力需要位置：在 {task} 任务的训练长度内，rope 胜过 NoPE",
    ),
    (r"(?P<s>ALiBi|RoPE) adds no parameters", "{s} 不增加参数"),
    # metrics the comparisons name
    (r"ppl at (?P<f>\d+)x L", "{f}x L 处的困惑度"),
    (r"entropy rise at (?P<f>\d+)x L \(nats\)", "{f}x L 处的熵增（nats）"),
    (r"normalised entropy rise at (?P<f>\d+)x L", "{f}x L 处归一化的熵增"),
    (r"(?P<task>\w+) accuracy at L", "{task} 在 L 处的准确率"),
    (r"ms per training step at T=(?P<t>\d+)", "T={t} 时每个训练步的毫秒数"),
    (r"delayed-copy loss at T=(?P<t>\d+)", "T={t} 时延迟复制任务的损失"),
    (r"ratio of perplexity at (?P<f>\d+)x L \((?P<how>[\w-]+)\)", "{f}x L 处困惑度之比（{how}）"),
    (r"(?P<n>\d+) heads? \(d_k (?P<k>\d+)\)", "{n} 个头（d_k {k}）"),
    (r"(?P<n>\d+) heads?", "{n} 个头"),
    (r"(?P<n>\d+) layers?", "{n} 层"),
    (r"mean of the last (?P<n>\d+)", "最后 {n} 个检查点的平均"),
    (r"(?P<t_a>.+) / (?P<t_b>.+)", "{t_a} / {t_b}"),
    (r"(?P<t_a>[^()]+) at inference \(the same steps at L\)", "推理时用 {t_a}（在 L 上训练同样步数）"),
    (r"(?P<t_a>\w+) fine-tuned at (?P<f>\d+)x L", "在 {f}x L 微调的 {t_a}"),
    (r"(?P<t_a>\w+) fine-tuned", "微调后的 {t_a}"),
    (r"(?P<t_a>\w+) inference-only", "只在推理时用 {t_a}"),
    (r"base with (?P<a>\w+)", "基座加 {a}"),
    # the head analysis (poslab.lab.experiments.tang_heads)
    (
        r"(?P<t_x>.+) \(measured on the lab's one trained Tang model: a property of that model, not a seeded "
        r"comparison\)",
        "{t_x}（在实验室唯一训练过的唐诗模型上测得：这是该模型的性质，不是多种子比较）",
    ),
    (rf"the strongest head's previous-token score ≥ (?P<x>{NUM})", "最强的头的前一个字得分 ≥ {x}"),
    (
        rf"the strongest head's share of attention on punctuation ≥ (?P<x>{NUM})",
        "最强的头落在标点上的注意力比例 ≥ {x}",
    ),
    (
        rf"relative loss increase after pruning 30% of heads ≤ (?P<x>{NUM})",
        "剪掉 30% 的头后损失的相对增量 ≤ {x}",
    ),
    (
        rf"(?P<a>\d+) previous-token, (?P<b>\d+) induction, (?P<c>\d+) positional of (?P<n>\d+) heads; strongest "
        rf"previous-token head (?P<h>L\d+H\d+) \((?P<v>{NUM}) of its attention on the previous token\)",
        "{n} 个头中前一个字头 {a} 个、归纳头 {b} 个、位置头 {c}"
        " 个；最强的前一个字头 {h}（注意力的 {v} 落在前一个字上）",
    ),
    (
        rf"(?P<k>\d+) of (?P<n>\d+) heads put ≥ (?P<t>{NUM}) of their attention on punctuation; strongest "
        rf"(?P<h>L\d+H\d+) \((?P<v>{NUM})\); punctuation is (?P<p>{NUM}) of the text",
        "{n} 个头中有 {k} 个把 ≥ {t} 的注意力放在标点上；最强的是 {h}（{v}）；标点占文本的 {p}",
    ),
    (
        rf"masking the (?P<k>\d+) least important heads \(30%\) moves the loss (?P<a>{NUM}) → (?P<b>{NUM}) "
        rf"\((?P<r>{NUM})\); 60%: (?P<c>{NUM})",
        "屏蔽最不重要的 {k} 个头（30%），损失从 {a} 变为 {b}（{r}）；60%：{c}",
    ),
    (
        rf"the analysed model's loss at least (?P<m>{NUM}) nats/token below its text's trigram baseline",
        "被分析模型的损失比其文本的三元语法基线至少低 {m} nats/token",
    ),
)

#: every rule, in the order tried (a whole-text template before the lists it could be cut into)
RULES: tuple[Rule, ...] = (
    glossed,
    *(template(p, f) for p, f in zh_lesson_items.MEASURED),
    *(template(p, f) for p, f in MEASURED),
    *(template(p, f) for p, f in TEMPLATES[:2]),
    joined("; ", "；"),  # before the templates whose free fields could run across a "; "
    bound_measured,
    gap,
    limit,
    *(template(p, f) for p, f in TEMPLATES[2:]),
    joined(" | ", " | "),
    arm_list,
)

__all__ = ["RULES", "TEMPLATES", "arm_list", "bound_measured", "gap", "metric_of"]
