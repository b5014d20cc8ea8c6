"""Plot series styles (poslab.display.series_style): every registered scheme looks different."""

from __future__ import annotations

import pytest

from poslab.display import series_style
from poslab.nn import positions


def test_every_scheme_has_its_own_colour_and_style():
    styles = [series_style(i) for i in range(len(positions.names()))]
    assert len({s["color"] for s in styles}) == len(styles)
    assert len({(s["color"], s["linestyle"], s["marker"]) for s in styles}) == len(styles)
    assert len({s["linestyle"] for s in styles}) > 1


def test_first_140_series_differ_in_some_attribute():
    combos = {tuple(series_style(i).values()) for i in range(140)}
    assert len(combos) == 140


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_bad_index(bad):
    with pytest.raises(ValueError, match="series index must be a non-negative integer"):
        series_style(bad)
