"""The Chinese of the texts experiments write (claims, criteria, measured figures, premises, reasons).

A gettext-style catalogue keyed by the English text: static texts exactly
(:data:`poslab.lab.report.zh_claims.EXACT`), generated ones (``"rope 14.340 ± 2.125 (n=3) vs learned ..."``)
through the templates of :mod:`poslab.lab.report.zh_templates`, numbers and scheme names passing through.
A text it does not know has no Chinese (:func:`translate` gives ``None``): the page shows the English, never a
guess, and ``tests/test_report_zh.py`` names every such text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: a number as the lab prints it (``1,050,624``, ``-0.952``, ``2.4e-07``, ``17%``)
NUM = r"[-+−]?(?:\d[\d,]*)?\.?\d+(?:e[-+]?\d+)?%?"
#: mean ± sd (n=k), as :func:`poslab.lab.records.pm_text` writes it
PM = rf"{NUM}(?: ± {NUM})?(?: \(n=\d+\))?"
#: a rule: the Chinese of a text, or ``None`` when the rule does not apply
Rule = Callable[[str], "str | None"]

_CJK = re.compile(r"[\u3400-\u9fff\u3000-\u303f\uff00-\uffef]")
#: two English words in a row (letters, 2+ each): what a neutral text (a scheme name, a number) does not hold
_PROSE = re.compile(r"(?<![\w.])[A-Za-z][a-z'’-]+(?:[ ,]+[A-Za-z][a-z'’-]+)+(?![\w.(])")
#: single English words that are prose, not names, even alone
_WORDS = re.compile(r"\b(?:and|of|the|vs|at|with|without|per|every|not|no|is|are|a|an|on|in|by|to|from|or)\b")


def neutral(text: str) -> bool:
    """Whether ``text`` needs no Chinese: numbers, symbols, code and names only (no two English words in a
    row and none of the small words of a sentence)."""
    # code spans, calls, dotted or snake_case names, bracketed shapes ([batch, seq, d_model])
    stripped = re.sub(r"`[^`]*`|\b[\w.]+\([^()]*\)|\b\w+[._]\w+(?:[._]\w+)*|\[[^\[\]]*\]", " ", text)
    return not _PROSE.search(stripped) and not _WORDS.search(stripped)


def split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets and quotes."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "([{「":
            depth += 1
        elif c in ")]}」":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def translate(text: str) -> str | None:
    """The Chinese of ``text`` (``None`` when the catalogue has none); a neutral text is its own Chinese."""
    from poslab.lab.report.zh_claims import EXACT
    from poslab.lab.report.zh_templates import RULES

    text = text.strip()
    if not text:
        return text
    if text in EXACT:
        return EXACT[text]
    for rule in RULES:
        out = rule(text)
        if out is not None:
            return out
    if neutral(text):
        return text
    return None


def localized(text: str) -> str:
    """``text`` in the language of the page being built: on the Chinese page :func:`translate`, or ``text`` itself
    where the catalogue has no Chinese; as written on the English."""
    from poslab.lab.report.i18n import language

    out = translate(text) if language() == "zh" else None
    return text if out is None else out


def fields(match: re.Match[str]) -> dict[str, str] | None:
    """The fields of a template's match: ``t_NAME`` translated (``None`` when one cannot be), others as matched."""
    out = {}
    for name, value in match.groupdict().items():
        value = value or ""
        if name.startswith("t_"):
            done = translate(value) if value else ""
            if done is None:
                return None
            out[name] = done
        else:
            out[name] = value
    return out


def template(pattern: str, form: str) -> Rule:
    """A rule from a regex (matched whole) and its Chinese ``form`` (``str.format`` with the regex's groups)."""
    compiled = re.compile(pattern, re.S)

    def rule(text: str) -> str | None:
        match = compiled.fullmatch(text)
        if match is None:
            return None
        values = fields(match)
        return None if values is None else form.format(**values)

    return rule


def joined(sep: str, joiner: str) -> Rule:
    """A rule for a list: ``text`` split at ``sep`` (outside brackets), every piece translated, joined by ``joiner``."""

    def rule(text: str) -> str | None:
        parts = split_top(text, sep)
        if len(parts) < 2:
            return None
        done = [translate(p) for p in parts]
        return None if any(d is None for d in done) else joiner.join(d for d in done if d is not None)

    return rule


def glossed(text: str) -> str | None:
    """A lesson quotation (or a formula) with an English gloss: ``中文 — gloss``, ``中文 (gloss)`` or ``中文: gloss``:
    the quotation as written, the gloss in Chinese."""
    for sep, close, form in ((" — ", "", "{} — {}"), (" (", ")", "{}（{}）"), (": ", "", "{}：{}")):
        head, found, gloss = text.partition(sep)
        quoted = _CJK.search(head) and not _PROSE.search(re.sub(r"\([^()]*\)", "", head))
        if found and (quoted or (sep == " — " and neutral(head))) and gloss.endswith(close):
            done = translate(gloss[: len(gloss) - len(close)] if close else gloss)
            if done is not None:
                return form.format(head, done)
    return None


def parentheticals(text: str) -> str:
    """``text`` (a source: names, years, sections) with each bracketed English gloss in Chinese where the
    catalogue has it."""

    def one(match: re.Match[str]) -> str:
        from poslab.lab.report.zh_claims import EXACT

        inner = match.group(1)
        done = EXACT.get(inner) or (None if neutral(inner) else translate(inner))
        return match.group(0) if done is None else f"（{done}）"

    return re.sub(r" ?\(([^()]*)\)", one, text)
