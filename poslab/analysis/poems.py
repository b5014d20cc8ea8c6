"""Whether sampled Tang poems scan: the lengths of their line segments.

A five-character (五言) poem is lines of five characters, each closed by a comma or a full stop
(``白日依山尽，黄河入海流。``). A sample scans when its complete segments have five characters.
"""

from __future__ import annotations

from collections.abc import Iterable

from poslab.checks import positive_int

#: the marks that close a line segment (the comma and full stop of the Tang corpora; the question and
#: exclamation marks and the semicolon close a line the same way)
LINE_MARKS = "，。？！；"
#: what opens a line besides a closing mark: a new poem (one per line in the corpora)
LINE_OPENERS = "\n"


def segment_lengths(text: str) -> list[int]:
    """The length of every complete line segment of ``text``: the characters before each closing mark
    (:data:`LINE_MARKS`), counted from the previous mark, newline or the start of the text.

    The text after the last mark (a sample cut mid-line) is not a segment. Two marks in a row make a
    segment of length 0, which does not scan.
    """
    lengths, current = [], 0
    for char in text:
        if char in LINE_MARKS:
            lengths.append(current)
            current = 0
        elif char in LINE_OPENERS:
            current = 0
        else:
            current += 1
    return lengths


def scan_fraction(texts: Iterable[str], length: int = 5) -> tuple[int, int]:
    """How many complete line segments of ``texts`` have ``length`` characters, and how many there are.

    Returns:
        ``(scanning, total)``; the fraction is ``scanning / total`` (undefined when ``total`` is 0).
    """
    positive_int("length", length)
    lengths = [n for text in texts for n in segment_lengths(text)]
    return sum(n == length for n in lengths), len(lengths)


__all__ = ["LINE_MARKS", "scan_fraction", "segment_lengths"]
