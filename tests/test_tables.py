"""The lab's one table type (:mod:`poslab.lab.tables`): its three renderers and the cells they share."""

from __future__ import annotations

import pytest

from poslab.lab.tables import (
    KeyTable,
    MeanSd,
    Table,
    TableFailure,
    build_tables,
    mean_sd_text,
    print_tables,
)


def test_mean_sd_formats_mean_spread_and_count():
    assert str(MeanSd.of([1.0, 2.0, 3.0])) == "2.000 ± 1.000 (n=3)"
    assert str(MeanSd.of([2.5], digits=2)) == "2.50 (n=1)"
    assert str(MeanSd.of([1.0, None, 3.0], digits=1, show_n=False)) == "2.0 ± 1.4"
    assert MeanSd.of([None]) is None
    assert mean_sd_text([]) == "cannot" and mean_sd_text([0.5, 0.7]) == "0.600 ± 0.141"


TABLE = Table(
    "a <b>|title</b> & more",
    ("scheme", "ppl", "flag"),
    (("rope", 12.345678, True), ("<script>", MeanSd.of([1.0, 2.0]), None), ("a|b", 1234567, [1, 2.5])),
    note="note <i>",
)


def test_text_is_aligned_and_cut_to_width():
    text = TABLE.to_text()
    assert text.splitlines() == [
        "a <b>|title</b> & more",
        "  scheme                    ppl    flag",
        "  --------  -------------------  ------",
        "  rope                    12.35     yes",
        "  <script>  1.500 ± 0.707 (n=2)       —",
        "  a|b                 1,234,567  1, 2.5",
        "  note <i>",
    ]
    wide = Table("", ("x",), (("y" * 100,),))
    assert wide.to_text(width=10).splitlines()[-1] == "  " + "y" * 9 + "…"


def test_html_escapes_every_text():
    page = TABLE.to_html()
    assert "<script>" not in page and "<b>" not in page and "<i>" not in page
    assert "<caption>a &lt;b&gt;|title&lt;/b&gt; &amp; more</caption>" in page
    assert "<td><span class='d'>&lt;script&gt;</span></td>" in page
    assert "<td><span class='d'>1.500 ± 0.707 (n=2)</span></td>" in page
    assert page.endswith("</table><p class='note'><span class='d'>note &lt;i&gt;</span></p>")


def test_markdown_escapes_pipes_and_marks_right_aligned_columns():
    assert TABLE.to_markdown().splitlines() == [
        "a <b>|title</b> & more",
        "",
        "| scheme | ppl | flag |",
        "|---|---:|---:|",
        "| rope | 12.35 | yes |",
        "| <script> | 1.500 ± 0.707 (n=2) | — |",
        "| a\\|b | 1,234,567 | 1, 2.5 |",
        "",
        "note <i>",
    ]
    three = Table("", ("a", "b"), (("x", 0.123456),), align="ll", digits=3)
    assert three.to_markdown() == "| a | b |\n|---|---|\n| x | 0.123 |\n"


def test_a_row_of_another_width_or_a_bad_alignment_is_refused():
    with pytest.raises(ValueError, match="a row has 1 cells, expected 2"):
        Table("t", ("a", "b"), (("x",),))
    with pytest.raises(ValueError, match="align 'lx'"):
        Table("t", ("a", "b"), (), align="lx")


def test_a_table_its_results_cannot_build_is_a_failure_naming_it():
    declared = (
        KeyTable("good", lambda r: Table("t", ("a",), ((r["a"],),))),
        KeyTable("renamed", lambda r: Table("t", ("b",), ((r["b"],),))),
        KeyTable("optional", lambda r: None),
        KeyTable("wrong type", lambda r: Table("t", ("c",), ((r["a"]["c"],),))),
    )
    built = build_tables("experiments/x", declared, {"a": 1})
    assert isinstance(built[0], Table) and built[0].rows == ((1,),)
    assert built[1:] == [
        TableFailure("experiments/x", "renamed", field="b"),
        TableFailure("experiments/x", "wrong type", error="TypeError: 'int' object is not subscriptable"),
    ]
    assert built[1].line() == "experiments/x: table 'renamed' cannot be built: results.json has no field 'b'"


def test_the_console_prints_the_declared_tables_and_names_the_one_it_cannot_build(capsys):
    from lab_helpers import extrapolation_result

    from poslab.lab.experiments import extrapolation

    seeds = {"ppl": 9.5, "ppl_sd": 0.7, "ppl_seeds": [9.0, 10.0]}
    cell = {"length": 32, "nonoverlapping": seeds, "sliding": {"ppl": 9.0, "ppl_sd": None, "ppl_seeds": [9.0]}}
    results = extrapolation_result({"rope": {"1": cell, "2": {"length": 64, "cannot": "past its table"}}})
    tables = extrapolation.EXPERIMENT.tables
    print_tables("experiments/extrapolation", tables, results)
    built = [spec.build(results) for spec in tables]
    assert capsys.readouterr().out == "".join(f"\n{table.to_text()}\n" for table in built)
    assert "9.500 ± 0.707 (n=2)" in built[0].to_text() and "cannot" in built[1].to_text()
    del results["train_length"]
    print_tables("experiments/extrapolation", tables[:1], results)
    assert capsys.readouterr().out == (
        "\nexperiments/extrapolation: table 'perplexity (nonoverlapping)' cannot be built: "
        "results.json has no field 'train_length'\n"
    )
