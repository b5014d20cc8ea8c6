"""One table type for the console, the report and the docs, and the reading of the cells they share.

An experiment declares its key tables as :class:`KeyTable` values; :func:`build_tables` builds them, a table
whose results lack a field as a :class:`TableFailure` naming the experiment, the table and the field, which the
report shows in the table's place.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from poslab.display import format_table
from poslab.lab.verdicts import mean_sd, num, pm_text

#: a cell longer than this many characters is cut (with "…") in the console
TEXT_CELL_WIDTH = 60


@dataclass(frozen=True)
class MeanSd:
    """Mean ± sample standard deviation of per-seed values: ``"2.314 ± 0.021 (n=3)"`` (no ``± sd`` for one value).

    Attributes:
        mean: the mean.
        sd: the sample standard deviation (``None`` for one value).
        n: how many values.
        digits: decimals of the mean and the sd.
        show_n: append ``(n=N)``.
    """

    mean: float
    sd: float | None
    n: int
    digits: int = 3
    show_n: bool = True

    @classmethod
    def of(cls, values: Sequence[float | None], digits: int = 3, show_n: bool = True) -> MeanSd | None:
        """The spread of the values that are not ``None`` (``None`` when there are none)."""
        kept = [v for v in values if v is not None]
        if not kept:
            return None
        mean, sd = mean_sd(kept)
        return cls(mean, sd, len(kept), digits, show_n)

    def __str__(self) -> str:
        return pm_text(self.mean, self.sd, self.n if self.show_n else None, self.digits)


def mean_sd_text(values: Sequence[float | None], digits: int = 3) -> str:
    """``"mean ± sd"`` of the values that are not ``None`` (no ``(n=)``), ``"cannot"`` when there are none."""
    spread = MeanSd.of(values, digits, show_n=False)
    return "cannot" if spread is None else str(spread)


def values_text(values: Sequence[float | None], digits: int = 3) -> str:
    """Per-seed values side by side, ``—`` for a missing one: ``"1.700, —, 1.800"``."""
    return ", ".join("—" if v is None else f"{v:.{digits}f}" for v in values)


def spread(values: Any, digits: int = 4) -> Any:
    """Per-seed values as a :class:`MeanSd`; anything else (a scalar, an empty list) as itself."""
    if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
        return MeanSd.of(values, digits)
    return values


#: what a table cell may hold
Cell = str | int | float | bool | None | MeanSd | Sequence[Any] | Mapping[str, Any]


def is_scalar(value: Any) -> bool:
    """Whether ``value`` is one cell value: none, a text, a number, a truth value or a :class:`MeanSd`."""
    return value is None or isinstance(value, (str, int, float, bool, MeanSd))


def cell_text(value: Any, digits: int = 4) -> str:
    """One cell as text: numbers by :func:`poslab.lab.verdicts.num`, ``—`` for none, yes/no in the page's
    language, short lists inline, long ones as their count and ends."""
    from poslab.lab.report.i18n import t  # the report package imports this module

    if isinstance(value, bool):
        return t("cell.yes") if value else t("cell.no")
    if value is None:
        return "—"
    if isinstance(value, (int, float)):
        return num(value, digits)
    if is_scalar(value):
        return str(value)
    if isinstance(value, list) and all(is_scalar(v) for v in value):
        if len(value) <= 8:
            return ", ".join(cell_text(v, digits) for v in value)
        return t("cell.values", n=len(value), first=num(value[0]), second=num(value[1]), last=num(value[-1]))
    if isinstance(value, dict) and all(is_scalar(v) for v in value.values()) and len(value) <= 6:
        return ", ".join(f"{k}={cell_text(v, digits)}" for k, v in value.items())
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "…"


def esc(value: Any) -> str:
    """Any value as HTML text, quotes included."""
    return html.escape(str(value), quote=True)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class Table:
    """A titled table of typed cells, rendered the same way on the console, in the report and in docs/.

    Attributes:
        title: what the table shows (the console's heading line, the page's caption; may be empty).
        headers: one title per column.
        rows: one tuple of cells per row, as many as there are headers.
        note: a line shown under the table (may be empty).
        align: one ``"l"``/``"r"`` per column (default: the first column left, the rest right).
        digits: significant digits of a float cell (:func:`poslab.lab.verdicts.num`).
    """

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    note: str = ""
    align: str = ""
    digits: int = 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple(self.headers))
        object.__setattr__(self, "rows", tuple(tuple(row) for row in self.rows))
        for row in self.rows:
            if len(row) != len(self.headers):
                raise ValueError(f"table {self.title!r}: a row has {len(row)} cells, expected {len(self.headers)}")
        if not self.align:
            object.__setattr__(self, "align", "l" + "r" * (len(self.headers) - 1))
        if len(self.align) != len(self.headers) or set(self.align) - {"l", "r"}:
            raise ValueError(f"table {self.title!r}: align {self.align!r} needs one 'l' or 'r' per column")

    def texts(self) -> list[list[str]]:
        """Every cell as :func:`cell_text`."""
        return [[cell_text(c, self.digits) for c in row] for row in self.rows]

    def to_text(self, width: int = TEXT_CELL_WIDTH) -> str:
        """The console's form: the title, then the aligned columns (cells over ``width`` characters cut), then
        the note."""
        rows = [[c if len(c) <= width else c[: width - 1] + "…" for c in row] for row in self.texts()]
        lines = [self.title] if self.title else []
        lines.append(format_table(self.headers, rows, self.align))
        if self.note:
            lines.append(f"  {self.note}")
        return "\n".join(lines)

    def to_html(self) -> str:
        """The report's form: ``<table class='key'>`` with the title as caption, every cell marked as data, the
        note in a paragraph under it."""
        head = "".join(f"<th>{esc(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td><span class='d'>{esc(c)}</span></td>" for c in row) + "</tr>" for row in self.texts()
        )
        note = f"<p class='note'><span class='d'>{esc(self.note)}</span></p>" if self.note else ""
        return (
            f"<table class='key'><caption>{esc(self.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}"
        )

    def to_markdown(self) -> str:
        """The docs' form: a GitHub table (``---:`` for a right-aligned column), the title above it and the note
        under it, each as its own paragraph."""
        lines = [self.title, ""] if self.title else []
        lines += [
            "| " + " | ".join(_md(h) for h in self.headers) + " |",
            "|" + "".join("---:|" if a == "r" else "---|" for a in self.align),
        ]
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in self.texts()]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class KeyTable:
    """A key table an experiment declares: its name and how it is built from the experiment's results.json
    (several tables of one kind, e.g. one per task, as a tuple; ``None`` where the results legitimately hold no
    such table, e.g. an optional part not run)."""

    name: str
    build: Callable[[dict], Table | tuple[Table, ...] | None]


@dataclass(frozen=True)
class TableFailure:
    """A key table that could not be built: the experiment, the table, and the field its results lack (``field``)
    or, for a value of another shape, the error (``error``)."""

    experiment: str
    table: str
    field: str | None = None
    error: str = ""

    def problem(self) -> str:
        """What is wrong, in English."""
        return f"results.json has no field {self.field!r}" if self.field is not None else self.error

    def line(self) -> str:
        """One line naming the experiment, the table and the problem (English, for the console)."""
        return f"{self.experiment}: table {self.table!r} cannot be built: {self.problem()}"


def _failure(experiment: str, table: str, err: Exception) -> TableFailure:
    if isinstance(err, KeyError) and err.args:
        return TableFailure(experiment, table, field=str(err.args[0]))
    return TableFailure(experiment, table, error=f"{type(err).__name__}: {err}")


def build_tables(experiment: str, declared: Sequence[KeyTable], results: dict) -> list[Table | TableFailure]:
    """Every declared table built from ``results``, each one that cannot be (a missing field, a value of another
    type) as a :class:`TableFailure` in its place."""
    built: list[Table | TableFailure] = []
    for spec in declared:
        try:
            table = spec.build(results)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, ZeroDivisionError) as err:
            built.append(_failure(experiment, spec.name, err))
            continue
        if isinstance(table, Table):
            built.append(table)
        elif table is not None:
            built.extend(table)
    return built


def print_tables(experiment: str, declared: Sequence[KeyTable], results: dict) -> None:
    """Print every declared table (:meth:`Table.to_text`), a table that cannot be built as its one-line failure."""
    for table in build_tables(experiment, declared, results):
        print(f"\n{table.line() if isinstance(table, TableFailure) else table.to_text()}")
