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


def test_loss_by_position_plot(tmp_path):
    from poslab.display import plot_loss_by_position

    out = plot_loss_by_position(
        {"a": [[3.0, 2.5, 2.0], [3.1, 2.4, 2.1]], "b": [[3.0, 3.0, 3.0]]},
        tmp_path / "p.png",
        baselines={"bigram": 2.49},
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="needs one or more curves of one length"):
        plot_loss_by_position({"a": [[1.0, 2.0], [1.0]]}, tmp_path / "q.png")


def test_seeded_curves_draw_each_scheme_in_its_own_style(tmp_path, monkeypatch):
    import poslab.display as display
    from poslab.lab.experiments.common import plot_seeded_curves, scheme_style_index

    figures = []
    monkeypatch.setattr(display, "save_figure", lambda fig, path: figures.append(fig) or path)
    names = positions.names()
    runs = {name: [[(10, 3.0), (20, 2.5)]] for name in reversed(names)}  # not in registry order
    plot_seeded_curves(runs, tmp_path / "c.png", "every scheme", style_index=scheme_style_index(list(runs)))
    lines = {line.get_label().split(":")[0]: line for line in figures[0].axes[0].get_lines()}
    assert set(names) <= set(lines)
    for name in names:  # a scheme's style is its place in the registry, whatever the order of the arms
        assert lines[name].get_color() == series_style(names.index(name))["color"]
    assert len({(lines[n].get_color(), lines[n].get_linestyle()) for n in names}) == len(names)


def test_labels_that_are_not_schemes_get_styles_past_the_schemes():
    from poslab.lab.experiments.common import scheme_style_index

    n = len(positions.names())
    index = scheme_style_index(["rope", "4 heads", "none", "8 heads"])
    assert index["rope"] == positions.names().index("rope") and index["none"] == positions.names().index("none")
    assert index["4 heads"] >= n and index["8 heads"] >= n and index["4 heads"] != index["8 heads"]
