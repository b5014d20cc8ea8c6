"""The lessons' errata (``docs/zh/errata.md``), one page ranked by severity, generated from the correction records.

Every record of ``poslab experiment corrections`` whose verdict says the lesson is wrong (by a measurement
or by a source) is listed once, under the severity of the passage it judges (:data:`SEVERITY_OF`, keyed
like :data:`poslab.lab.lesson_quotes.QUOTES`):

1. ``formula``: a formula or a piece of code that computes the wrong thing (or does not run);
2. ``claim``: a statement of fact about the methods that the measurement or the literature contradicts;
3. ``citation``: a wrong source, date, dataset or author;
4. ``nitpick``: a figure off by an order of magnitude in an aside, a table row written twice, the lesson
   saying two things in two places.

Withdrawn and undecided records are counted under the list, not listed as errors. The verdicts, the
lesson's sentence and the evidence come from the records; only the severity and the one-line Chinese
summary are written here. ``tests/test_errata.py`` fails when the page differs from the rendering::

    python -m poslab.lab.errata --write      # rewrite docs/zh/errata.md
    python -m poslab.lab.errata --check      # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poslab.lab.evidence import REFERENCE_KEY, SENTENCE_KEY
from poslab.lab.experiments.corrections import all_corrections
from poslab.lab.lesson_quotes import SENTENCES
from poslab.lab.report.builder import kind
from poslab.lab.report.i18n import STRINGS, name_lessons, use_language
from poslab.lab.verdicts import ClaimRecord

PAGE = Path("docs/zh/errata.md")
#: severities, most severe first: key -> Chinese heading
SEVERITIES: dict[str, str] = {
    "formula": "公式与代码错误",
    "claim": "说法错误",
    "citation": "出处错误",
    "nitpick": "小处",
}
#: the passage a correction judges (its key in QUOTES) -> (severity, what is wrong, in one Chinese line)
SEVERITY_OF: dict[str, tuple[str, str]] = {
    "alibi": ("formula", "ALiBi 偏置的符号和方向反了：过去的 key 应得 −m·(i−j)，课文给 0，未来的 key 反而得到正偏置"),
    "local_mask": ("formula", "局部注意力掩码写反了：保留窗口外、遮住窗口本身（连对角线也遮住）"),
    "pe_cache_code": ("formula", "`PositionalEncoding` 不能运行：`d_model` 未定义（NameError）"),
    "adaptive_span_code": (
        "formula",
        "自适应跨度的代码不能运行，也不是按头的掩码：`diagonal` 要整数，`+=` 得到的是计数",
    ),
    "autocast_fp32": ("formula", "在 autocast 里 `.float()` 不起作用：分数仍是低精度"),
    "ntk_table": ("formula", "NTK-aware 的方向说反了：保持的是高频维度，插值的是低频维度"),
    "ntk_q4": ("formula", "NTK-aware 是增大 base，不是减小"),
    "q4_high_freq": ("claim", "离开训练范围的是低频维度（周期长于训练长度），不是高频维度"),
    "rope_memory": ("claim", "RoPE 在 7B 模型上省下的只是位置表，远不到课文说的 12% 显存"),
    "fp16_clip": ("claim", "FP16 训练不用改裁剪阈值：在裁剪前调用 `scaler.unscale_(optimizer)`"),
    "llama3_averaging": ("citation", "Llama 3 的检查点平均在退火和后训练阶段，不在长上下文扩展阶段"),
    "xl_pg19": ("citation", "Transformer-XL 论文没有 PG-19 的结果（PG-19 在它之后才发布）"),
    "xl_learned_r": ("citation", "Transformer-XL 的 R 是固定的正弦编码；学习的是投影 W_R 和偏置 u、v"),
    "adaptive_span": ("citation", "Adaptive Attention Span 是 Facebook AI Research 2019 年的工作，没有 PG-19 的结果"),
    "adaptive_span_heading": ("citation", "自适应跨度调的是每个头的跨度，不是头数"),
    "head_rule_imagenet": ("citation", "「最优头数 ≈ √(d_model/16)」没有出处，ImageNet 上的 ViT 也不符合它"),
    "table_22": ("nitpick", "§2.2 的表把同一种方法写了两行，漏了正余弦编码"),
    "rope_spread": ("nitpick", "同一距离的内积波动是 1e-5 量级（fp32 舍入），不是 1e-6"),
    "contra_ntk": ("nitpick", "课文前后不一：Q4 的表写对了 NTK-aware，§3.5 的表和 Q4 的正文说反了"),
    "contra_alibi": ("nitpick", "课文前后不一：§2.2 给 ALiBi 的外推打「中」，§4 说「外推性好」"),
    "contra_rope": ("nitpick", "课文前后不一：§2.2 给 RoPE 的外推打「好」，§3.5 说「但实际上会退化」"),
    "dk": ("claim", "d_k 固定在 64 或 128"),
    "dk_variance": ("claim", "除以 √d_k 之后仍要精细校准"),
    "llama3_ntk": ("claim", "Llama 3 用 NTK-aware 扩展上下文"),
    "alibi_modern": ("claim", "现代 LLM 基本不用 ALiBi"),
    "q2_space": ("claim", "加位置向量占用表示空间，RoPE 不占"),
    "rope_complex": (
        "formula",
        "RoPE 复数形式的内积少了共轭和实部：应为 Re[(W_q x_m)(W_k x_n)^* e^{i(m−n)θ}]，照写的左边随 m+n 变化",
    ),
    "pe_latex": ("nitpick", "§2.1 公式的 LaTeX 源码每行多一个「}」，换行写成了单个「\\」，无法排版；数学本身正确"),
    "su_insight": ("citation", "「位置和内容混在一个向量里」的论证出自 Ke 等 2021（TUPE），不是 RoPE 原论文的洞察"),
    "alibi_hard": ("claim", "ALiBi 是固定的惩罚，RoPE 让模型自己学位置关系"),
    "q2_orthogonal": ("claim", "RoPE 的旋转是正交变换，保持内积"),
    "q3_overfit": ("claim", "d_k 大更容易过拟合"),
    "q3_tensor_core": ("claim", "d_k=128 是 tensor core 的友好尺寸"),
}
#: the kinds of record that say the lesson is wrong
WRONG = ("wrong", "cited-wrong")


def _key_of(record: dict[str, Any]) -> str:
    """The QUOTES key of the passage a correction record judges (by its verbatim sentence)."""
    keys = {sentence: key for key, sentence in SENTENCES.items()}
    sentence = (record.get("details") or {}).get(SENTENCE_KEY)
    if sentence not in keys:
        raise ValueError(f"correction {record.get('claim', '?')!r} judges no known sentence: {sentence!r}")
    return keys[sentence]


def _cell(text: str) -> str:
    """``text`` on one line of a markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def entries(records: Sequence[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(severity, key, record) of every record saying the lesson is wrong, most severe first (stable within one).

    Raises ``ValueError`` naming a record whose passage has no severity in :data:`SEVERITY_OF`.
    """
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    out = []
    for record in records:
        key = _key_of(record)
        if key not in SEVERITY_OF:
            raise ValueError(f"correction {key!r} has no severity: add it to poslab.lab.errata.SEVERITY_OF")
        if kind(ClaimRecord.from_dict(record)) in WRONG:
            out.append((SEVERITY_OF[key][0], key, record))
    return sorted(out, key=lambda e: rank[e[0]])


def render(records: Sequence[dict[str, Any]]) -> str:
    """The errata page for the correction records ``records`` (``all_corrections()``)."""
    listed = entries(records)
    with use_language("zh"):
        kinds = [kind(ClaimRecord.from_dict(r)) for r in records]
        lines = [
            "# 勘误表",
            "",
            "<!-- 由 `python -m poslab.lab.errata --write` 从 `poslab experiment corrections` 的记录生成，请勿手改 -->",
            "",
            f"三篇课文中被证明有误的 {len(listed)} 处，按严重程度排列："
            + "、".join(f"{name}（{sum(e[0] == s for e in listed)} 处）" for s, name in SEVERITIES.items())
            + "。每一处的判据和全部数字见 `poslab experiment corrections`"
            "（报告的「勘误」一节，`report.html#corrections`）；「判定」一列是报告上的标记，"
            "「证据」一列是记录原文（英文，数字照录）。",
            "",
        ]
        for severity, heading in SEVERITIES.items():
            mine = [e for e in listed if e[0] == severity]
            if not mine:
                continue
            lines += [f"## {heading}", "", "| # | 课文 | 错在哪里 | 判定 | 证据 |", "|---|---|---|---|---|"]
            for i, (_, key, record) in enumerate(mine, 1):
                details = record["details"]
                badge = STRINGS["kind." + kind(ClaimRecord.from_dict(record))]["zh"]
                evidence = record["measured"]
                if details.get(REFERENCE_KEY):
                    evidence += f"（出处：{details[REFERENCE_KEY]}）"
                lines.append(
                    f"| {i} | {_cell(name_lessons(record['source']))} | {_cell(SEVERITY_OF[key][1])} | {badge} "
                    f"| {_cell(name_lessons(evidence))} |"
                )
            lines.append("")
        others = {k: kinds.count(k) for k in dict.fromkeys(kinds) if k not in WRONG}
        lines.append(
            "不在表中的记录（课文没有错，或者检验判定不了）："
            + "、".join(f"{STRINGS['kind.' + k]['zh']} {n} 条" for k, n in others.items())
            + "。"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poslab.lab.errata", description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the errata page (default {PAGE})")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the page")
    action.add_argument("--check", action="store_true", help="exit 1 when the page differs from the records")
    args = parser.parse_args(argv)
    try:
        text = render(all_corrections())
        if args.write:
            args.page.write_text(text, encoding="utf-8")
            return 0
        current = args.page.read_text(encoding="utf-8")
    except (OSError, ValueError) as err:
        print(f"errata: error: {err}", file=sys.stderr)
        return 2
    if current != text:
        print(f"{args.page} differs from the correction records: run `python -m poslab.lab.errata --write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
