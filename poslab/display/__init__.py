"""Helpers shared by the experiments: fixed-width tables, atomic PNG writes, number formatting."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poslab.checks import non_negative_int
from poslab.fileio import atomic_write


def _width(text: str) -> int:
    """Display width of ``text`` in a terminal (CJK characters take two columns)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """Render a plain-text table.

    Args:
        headers: column titles.
        rows: one sequence of cells per row (cells are turned into strings with ``str``).
        align: one character per column, ``"l"`` or ``"r"`` (default: first column left, the rest right).

    Returns:
        The table as lines joined by newlines (header, rule, rows).
    """
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    n_cols = len(headers)
    for row in cells:
        if len(row) != n_cols:
            raise ValueError(f"table row has {len(row)} cells, expected {n_cols}: {row}")
    align = align or ("l" + "r" * (n_cols - 1))
    widths = [max(_width(row[i]) for row in cells) for i in range(n_cols)]

    def line(row: list[str]) -> str:
        parts = []
        for i, cell in enumerate(row):
            pad = " " * (widths[i] - _width(cell))
            parts.append(cell + pad if align[i] == "l" else pad + cell)
        return "  " + "  ".join(parts).rstrip()

    rule = "  " + "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, align: str | None = None
) -> None:
    """Print :func:`format_table`, preceded by ``title`` if given."""
    if title:
        print(f"\n{title}")
    print(format_table(headers, rows, align))


def cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal columns (a CJK character takes two) with an ellipsis: a console table stays
    readable; results.json and the report keep every record whole."""
    if _width(text) <= width:
        return text
    out, used = [], 1  # the ellipsis takes one column
    for ch in text:
        used += _width(ch)
        if used > width:
            break
        out.append(ch)
    return "".join(out) + "…"


def sci(value: float, digits: int = 1) -> str:
    """``1.2e-06`` style (the lessons print spreads and differences this way)."""
    return f"{value:.{digits}e}"


def new_figure(n_rows: int = 1, n_cols: int = 1, size: tuple[float, float] = (8.0, 5.0)) -> tuple[Any, Any]:
    """A matplotlib ``Figure`` on the Agg canvas and its axes, without touching pyplot's global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols)
    return fig, axes


#: 20 distinct colours (matplotlib's tab20, dark shades first, then light) for plot series
SERIES_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
#: line styles and markers, cycled with a period prime to the colours' so that pairs repeat late
SERIES_LINES = ("-", "--", "-.", ":")
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def series_style(index: int) -> dict[str, str]:
    """Colour, line style and marker of plot series ``index`` (matplotlib keyword arguments).

    Series ``0 .. 19`` each get their own colour; the line style cycles every 4 and the marker every
    7, so no two of the first 140 series share all three. Give a series the same ``index`` in every
    plot (for position schemes: its place in ``positions.names()``) and it looks the same everywhere.

    Raises:
        ValueError: ``index`` is not a non-negative integer.
    """
    non_negative_int("series index", index)
    return {
        "color": SERIES_COLORS[index % len(SERIES_COLORS)],
        "linestyle": SERIES_LINES[index % len(SERIES_LINES)],
        "marker": SERIES_MARKERS[index % len(SERIES_MARKERS)],
    }


def plot_loss_by_position(
    curves: dict[str, Sequence[Sequence[float]]],
    path: Path,
    *,
    style_index: dict[str, int] | None = None,
    baselines: dict[str, float] | None = None,
    title: str = "loss at each position of the window",
) -> Path:
    """Loss vs position inside the window, mean ± sd over seeds, one line per series; written as PNG.

    Args:
        curves: label -> one curve per seed, each ``[T]`` (nats at positions ``0 .. T-1``, e.g.
            :func:`poslab.analysis.eval.loss_by_position`).
        path: the PNG to write.
        style_index: label -> :func:`series_style` index (default: the order of ``curves``), so a
            series looks the same in every plot.
        baselines: label -> a horizontal reference line (e.g. the corpus's unigram, bigram, trigram loss).
        title: the axes title.

    Returns:
        ``path``.

    Raises:
        ValueError: a series has no curve or curves of different lengths.
    """
    fig, ax = new_figure(1, 1, size=(8.0, 5.0))
    for i, (label, seeds) in enumerate(curves.items()):
        if not seeds or len({len(c) for c in seeds}) != 1:
            raise ValueError(
                f"series {label!r} needs one or more curves of one length, got lengths {[len(c) for c in seeds]}"
            )
        n, T = len(seeds), len(seeds[0])
        mean = [sum(c[t] for c in seeds) / n for t in range(T)]
        sd = [(sum((c[t] - mean[t]) ** 2 for c in seeds) / (n - 1)) ** 0.5 if n > 1 else 0.0 for t in range(T)]
        style = series_style((style_index or {}).get(label, i))
        xs = list(range(T))
        ax.plot(xs, mean, label=f"{label} (n={n})", markersize=2, markevery=max(1, T // 8), linewidth=1.2, **style)
        ax.fill_between(
            xs, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)], color=style["color"], alpha=0.15
        )
    for k, (label, value) in enumerate((baselines or {}).items()):
        ax.axhline(
            value,
            color="black",
            linestyle=SERIES_LINES[(k + 1) % len(SERIES_LINES)],
            linewidth=0.8,
            label=f"{label} {value:.2f}",
        )
    ax.set_xlabel("position in the window (tokens of context - 1)")
    ax.set_ylabel("loss (nats), mean ± sd over seeds")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Write a figure to ``path`` as PNG atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight"))
