"""The errata page (docs/zh/errata.md) is the rendering of today's correction records, ranked by severity."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from poslab.lab import errata
from poslab.lab.experiments.corrections import all_corrections
from poslab.lab.lesson_quotes import QUOTES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return all_corrections()


def test_the_page_is_up_to_date(records):
    page = (ROOT / errata.PAGE).read_text(encoding="utf-8")
    assert page == errata.render(records), "docs/zh/errata.md is stale: run `python -m poslab.lab.errata --write`"


def test_every_passage_has_a_severity():
    assert set(errata.SEVERITY_OF) == set(QUOTES)
    assert {s for s, _ in errata.SEVERITY_OF.values()} <= set(errata.SEVERITIES)


def test_entries_are_the_wrong_records_most_severe_first(records):
    listed = errata.entries(records)
    ranks = [list(errata.SEVERITIES).index(severity) for severity, _, _ in listed]
    assert ranks == sorted(ranks) and listed
    wrong = [r for r in records if r["verdict"] == "did not hold"]
    assert len(listed) == len(wrong)
    # a formula bug (the ALiBi sign) ranks above a citation error (PG-19) and a nitpick (the 1e-6 spread)
    keys = [key for _, key, _ in listed]
    assert keys.index("alibi") < keys.index("xl_pg19") < keys.index("rope_spread")


def test_a_record_that_turns_right_leaves_the_page(records):
    changed = copy.deepcopy(records)
    alibi = next(r for r in changed if errata._key_of(r) == "alibi")
    alibi.update(verdict="held", margin=abs(alibi["margin"]))
    assert "ALiBi 偏置的符号" in errata.render(records)
    assert "ALiBi 偏置的符号" not in errata.render(changed)


def test_a_record_without_severity_or_sentence_is_an_error(records, monkeypatch):
    monkeypatch.delitem(errata.SEVERITY_OF, "alibi")
    with pytest.raises(ValueError, match="'alibi' has no severity"):
        errata.entries(records)
    stray = copy.deepcopy(records[:1])
    stray[0]["details"]["sentence"] = "not in any lesson"
    with pytest.raises(ValueError, match="judges no known sentence"):
        errata.entries(stray)


def test_the_command_checks_and_writes(tmp_path, capsys):
    page = tmp_path / "errata.md"
    page.write_text("stale\n", encoding="utf-8")
    assert errata.main(["--page", str(page), "--check"]) == 1
    assert "differs from the correction records" in capsys.readouterr().out
    assert errata.main(["--page", str(page), "--write"]) == 0
    assert errata.main(["--page", str(page), "--check"]) == 0
    assert errata.main(["--page", str(tmp_path / "missing.md"), "--check"]) == 2
