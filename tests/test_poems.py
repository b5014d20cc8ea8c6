"""Whether sampled poems scan (poslab/analysis/poems.py), and the demo poem model (preset ``tang-demo``)."""

from __future__ import annotations

import pytest

from poslab.analysis.poems import scan_fraction, segment_lengths


def test_segment_lengths_by_hand():
    assert segment_lengths("白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。\n") == [5, 5, 5, 5]
    assert segment_lengths("白日依山尽，黄河入") == [5]  # the cut last line is not a segment
    assert segment_lengths("半句\n白日依山尽，") == [5]  # a new poem opens a line
    assert segment_lengths("，，白日依山尽？") == [0, 0, 5]  # an empty segment does not scan
    assert segment_lengths("白日依山尽黄河入海流") == []


def test_scan_fraction_counts_over_every_sample():
    # the quick-lab poem: 4 of its 6 complete segments have five characters
    poem = "白日依山尽，无北更饥到。青见圃簷能，鸣满身映莺霞。风来醉几归，妓从台终。…"
    assert scan_fraction([poem]) == (4, 6)
    assert scan_fraction([poem, "白日依山尽，黄河入海流。"]) == (6, 8)
    assert scan_fraction(["七个字的一行诗，"], length=7) == (1, 1)
    assert scan_fraction([]) == (0, 0)
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        scan_fraction([poem], length=0)


def test_the_corpus_itself_scans():
    from poslab.data import load_corpus

    scanning, total = scan_fraction([load_corpus("tang5")])
    assert total > 300_000 and scanning / total > 0.99
