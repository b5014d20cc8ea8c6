"""Seed 000 against itself: three statements the lesson makes one way in one section and the other way in another.

Each record sets the passages side by side (quoted exactly) with what each says about the same
property; the verdict is the lesson's text alone (kind ``source``), and the other records of this
experiment say which passage is right.
"""

from __future__ import annotations

from typing import Any

from poslab.lab.evidence import SOURCE
from poslab.lab.lesson_quotes import quoted
from poslab.lab.verdicts import deterministic

#: property -> the passages that state it, each (where, verbatim text, what it says about the property)
PASSAGES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "contra_ntk": (
        ("Q4 table", "修正 base，高频少插值、低频多插值", "the low frequencies are interpolated"),
        ("§3.5 table", "修正 base 参数，低频维度保持、高频维度插值", "the high frequencies are interpolated"),
        (
            "Q4 text",
            "扩展长度时应该保持低频维度不变（它们的周期本来就长），只对高频维度做插值。",
            "the high frequencies are interpolated",
        ),
    ),
    "contra_alibi": (
        ("§2.2 table", "相对位置编码\tT5、ALiBi\t在 attention 计算时加入相对距离偏置\t中", "medium"),
        ("§4", "• 外推性好：距离是线性的，理论上可外推", "good"),
    ),
    "contra_rope": (
        ("§2.2 table", "旋转位置编码（RoPE）\tLLaMA、几乎所有现代 LLM\t用旋转把位置注入 Q/K\t好", "good"),
        ("§3.5", "但实际上会退化。原因是注意力熵爆炸：", "degrades past the training length"),
    ),
}
#: what each property is, in words, and which record of this experiment says which passage is right
PROPERTY = {
    "contra_ntk": ("which RoPE frequencies NTK-aware scaling interpolates", "the two NTK-aware records"),
    "contra_alibi": ("ALiBi's extrapolation", "the §2.2 table record (Press et al. 2022)"),
    "contra_rope": ("RoPE's extrapolation", "experiment extrapolation (RoPE's perplexity past the training length)"),
}


def contradiction_claim(key: str) -> dict[str, Any]:
    """One property the lesson states two ways: ``did not hold`` when its passages disagree."""
    passages = PASSAGES[key]
    what, settled = PROPERTY[key]
    readings = {reading for _, _, reading in passages}
    record = deterministic(
        f"seed 000 says one thing about {what}",
        "seed 000 " + " and ".join(dict.fromkeys(where.split()[0] for where, _, _ in passages)),
        "every passage that states it says the same (error = number of distinct statements - 1)",
        "; ".join(f"{where}: 「{text.replace(chr(9), ' | ')}」 ({reading})" for where, text, reading in passages)
        + f". Which is right: {settled}",
        error=float(len(readings) - 1),
        tolerance=0.0,
        details={"passages": [list(p) for p in passages]},
    )
    return quoted(
        key,
        record,
        "the lesson's passages, side by side",
        kind=SOURCE,
        reference="seed 000, " + ", ".join(where for where, _, _ in passages),
    )


def contradiction_claims() -> list[dict[str, Any]]:
    return [contradiction_claim(key) for key in PASSAGES]
