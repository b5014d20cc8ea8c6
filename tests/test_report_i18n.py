"""The report in two languages and its four kinds of verdict."""

from __future__ import annotations

import html as html_mod
import json
import re
import string
from pathlib import Path

import pytest
from lab_helpers import TANG_HEADS, copy_lab, quiet, shared_lab

from poslab.cli.app import main
from poslab.lab.experiments import corrections
from poslab.lab.report import build_report, load_results
from poslab.lab.report import claims as report_claims
from poslab.lab.report.builder import kind
from poslab.lab.report.i18n import LESSONS, SECTION_ZH, STRINGS, name_lessons, use_language
from poslab.lab.report.sections import SECTIONS
from poslab.lab.verdicts import Arm, ClaimRecord, Metric, Premise, compare, deterministic, not_testable, with_premise

pytestmark = pytest.mark.usefixtures("single_thread")


def fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def visible_ui_text(page: str) -> str:
    """The page's text without what experiments wrote: data spans, the raw-number dumps, figures, styles."""
    text = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    text = re.sub(r"<details[^>]*>.*?</details>", "", text, flags=re.S)
    text = re.sub(r"<figure>.*?</figure>", "", text, flags=re.S)
    text = re.sub(r"<span class='d'>.*?</span>", " ", text, flags=re.S)
    return html_mod.unescape(re.sub(r"<[^>]+>", "\n", text))


def english_left(page: str) -> list[tuple[str, str]]:
    """Every English string of the table (each piece between its fields, 4 characters or more) seen on ``page``."""
    text = visible_ui_text(page)
    left = []
    for key, message in STRINGS.items():
        for piece in re.split(r"\{[^}]*\}", message["en"]):
            piece = piece.strip(" ;:.,()")
            if (
                len(piece) >= 4
                and piece not in message["zh"]
                and re.search(r"(?<![\w-])" + re.escape(piece) + r"(?![\w-])", text)
            ):
                left.append((key, piece))
    return left


# ------------------------------------------------------------------------------ the string table
def test_every_string_exists_in_both_languages_with_the_same_fields():
    for key, message in STRINGS.items():
        assert set(message) == {"en", "zh"}, key
        assert message["en"].strip() and message["zh"].strip(), f"{key} is empty in one language"
        if "{" in message["en"] and not key.startswith("section."):
            assert fields(message["en"]) == fields(message["zh"]), key
    assert set(SECTION_ZH) == {s.key for s in SECTIONS}  # a new section needs its Chinese


def test_lessons_are_named_by_their_titles():
    assert name_lessons("seed 000 §1.4 and Q3") == "「11 · 多头注意力与位置编码」 §1.4 and Q3"
    assert name_lessons("seeds 000 and 002") == f"{LESSONS['000']} and {LESSONS['002']}"
    with use_language("zh"):
        assert name_lessons("seed 001 exercise 3") == "「多頭注意力和位置編碼」 练习 3"
    with pytest.raises(ValueError, match="report language must be one of"):
        with use_language("fr"):
            pass


# ------------------------------------------------------------------------------ the Chinese page
@pytest.fixture(scope="module")
def zh_page() -> str:
    return build_report(shared_lab(), shared_lab() / "zh.html", lang="zh").read_text(encoding="utf-8")


def test_chinese_page_has_no_english_ui_string_left(zh_page):
    assert "<html lang='zh-Hans'>" in zh_page
    assert english_left(zh_page) == []
    for section in SECTIONS:
        assert f"<section id='{section.key}'><h2>{html_mod.escape(SECTION_ZH[section.key][0])}</h2>" in zh_page
    assert "课文有误" in zh_page and "此规模无法检验" in zh_page and "从课文章节到图表" in zh_page
    assert not re.search(r"seeds? 00\d", visible_ui_text(zh_page))
    for title in LESSONS.values():
        assert title in zh_page  # the guide names each lesson by its title


def test_the_scan_finds_an_english_string_left():
    page = build_report(shared_lab(), shared_lab() / "zh2.html", lang="zh").read_text(encoding="utf-8")
    planted = page.replace("<h4>判定</h4>", "<h4>Verdicts</h4>", 1)
    assert ("section.verdicts", "Verdicts") in english_left(planted)
    assert english_left(build_report(shared_lab(), shared_lab() / "en.html").read_text(encoding="utf-8"))


def test_english_stays_the_default_and_names_the_lessons():
    page = build_report(shared_lab(), shared_lab() / "default.html").read_text(encoding="utf-8")
    assert "<html lang='en'>" in page and "Claims checked" in page
    assert not re.search(r"seeds? 00\d", visible_ui_text(page))
    assert "「11 · 多头注意力与位置编码」 §1.2–1.3" in page


# ------------------------------------------------------------------------------ four kinds of verdict
def four_kinds_lab(tmp_path: Path) -> Path:
    lab_dir = copy_lab(tmp_path / "lab")
    held = compare(
        "rope beats none",
        "seed 000 §2.2",
        Arm("rope", [1.0, 1.01, 0.99]),
        Arm("none", [2.0, 2.01, 1.99]),
        Metric("val loss"),
    )
    wrong = deterministic(
        "the lesson's table is right",
        "seed 000 §3.4",
        "error within 0",
        "off by 3",
        error=3.0,
        tolerance=0.0,
        details={"evidence": "the table recomputed", "quote": "波动仅 1e-6"},
    )
    untestable = with_premise(held, Premise("accuracy at L >= 0.9 in both arms", "rope 0.41, none 0.12", False))
    untestable = type(held)(**{**untestable.to_dict(), "claim": "alibi beats rope"})
    close = compare(
        "learned beats none",
        "seed 001",
        Arm("learned", [1.0, 1.1, 0.9]),
        Arm("none", [1.02, 1.12, 0.92]),
        Metric("val loss"),
    )
    folder = lab_dir / "experiments" / "position-training"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(
        json.dumps({"claims": [r.to_dict() for r in (held, wrong, untestable, close)]}), encoding="utf-8"
    )
    return lab_dir


def test_four_kinds_have_their_own_badge_meaning_and_count(tmp_path):
    lab_dir = four_kinds_lab(tmp_path)
    page = build_report(lab_dir).read_text(encoding="utf-8")
    header = page.split("</header>")[0]
    for badge in ("held", "wrong", "untestable", "inconclusive"):
        assert f"<span class='badge {badge}'>" in header  # the legend: every badge with its meaning
        assert re.search(rf"\.badge\.{badge}, \.count\.{badge} {{ background:var\(--{badge}-bg\)", page)
    assert "the lesson is wrong" in header and "not testable at this scale" in header
    colours = set(re.findall(r"--(?:held|wrong|untestable|inconclusive)-bg:(#[0-9a-f]+)", page))
    assert len(colours) == 4
    counts = re.findall(r"<span class='count (\w+)'>(\d+) ", header)
    by_kind = dict(counts)
    # the planted record, and the head analysis's claims on the shared lab's tiny (bigram-level) model
    tiny = [
        v
        for v in report_claims.evaluate(load_results(lab_dir))
        if v.experiment == TANG_HEADS and not_testable(v.record)
    ]
    assert int(by_kind["untestable"]) == 1 + len(tiny) and int(by_kind["wrong"]) >= 1
    claims = page.split("<section id='claims'>")[1].split("</section>")[0]
    main_table, apart = claims.split("<h3 id='untestable'>")
    assert "alibi beats rope" not in main_table  # shown apart, with what was missing
    assert "alibi beats rope" in apart and "premise not met: accuracy at L &gt;= 0.9 in both arms" in apart
    assert "rope 0.41, none 0.12" in apart
    row = re.search(
        r"<tr class='v-wrong'>(?:(?!</tr>).)*the lesson&#x27;s table is right(?:(?!</tr>).)*</tr>", main_table
    )
    assert row and "the table recomputed" in row.group(0)  # the correction's evidence
    zh = build_report(lab_dir, lang="zh").read_text(encoding="utf-8")
    assert "波动仅 1e-6" in zh  # the Chinese page quotes the lesson itself
    assert "<span class='badge untestable'>此规模无法检验</span>" in zh


def test_every_correction_shows_the_lesson_error_badge(tmp_path):
    lab_dir = tmp_path / "lab"
    with quiet():
        results = corrections.run(lab_dir / "experiments" / "corrections")
    (lab_dir / "experiments" / "corrections" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    page = build_report(lab_dir).read_text(encoding="utf-8")
    section = page.split("<section id='corrections'>")[1].split("</section>")[0]
    records = [ClaimRecord.from_dict(c) for c in results["claims"]]
    assert section.count("<tr class='v-") == len(records) == 32  # the d_k sentence is the model zoo's record
    badges = {
        "wrong": "did not hold",
        "cited-wrong": "did not hold (per source)",
        "cited-held": "held (per source)",
        "held": "held",
        "untestable": "not testable",
        "withdrawn": "withdrawn",
    }
    kinds = [kind(r) for r in records]
    for name, text in badges.items():
        assert kinds.count(name) and section.count(f"<span class='badge {name}'>{text}</span>") == kinds.count(name)
    # a source record shows its reference; a withdrawn one its reason
    assert section.count("Reference:") == sum(k.startswith("cited-") for k in kinds)
    assert section.count("Withdrawn because:") == kinds.count("withdrawn") == 1


# ------------------------------------------------------------------------------ the command
def test_report_command(tmp_path, capsys):
    lab_dir = copy_lab(tmp_path / "lab")
    assert main(["report", "--out", str(lab_dir), "--lang", "zh"]) == 0
    assert (lab_dir / "report.zh.html").is_file() and "report.zh.html" in capsys.readouterr().out
    assert main(["report", "--out", str(lab_dir), "--html", str(tmp_path / "p.html")]) == 0
    assert "<html lang='en'>" in (tmp_path / "p.html").read_text(encoding="utf-8")
    assert main(["report", "--out", str(tmp_path / "missing")]) == 2
    assert "is not a lab folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["report", "--lang", "fr"])
    assert stop.value.code == 2
    assert main(["lab", "--report-only", "--out", str(lab_dir), "--lang", "zh"]) == 0


def test_the_shipped_font_covers_every_chinese_string():
    from poslab.display.fonts import covered_chars

    text = "".join(m["zh"] for m in STRINGS.values()) + "".join(LESSONS.values())
    missing = sorted({c for c in text if ord(c) >= 0x2E80 and c not in covered_chars()})
    assert missing == [], f"characters the shipped font lacks (add them to poslab/display/make_font.py): {missing}"


def test_lab_lang_zh_writes_the_chinese_page_after_the_run(tmp_path, monkeypatch):
    from poslab.lab import lab

    lab_dir = copy_lab(tmp_path / "lab")
    ran = []
    monkeypatch.setattr(lab, "run_lab", lambda out, mode, fresh, only, **kw: ran.append((out, mode)) or {"steps": []})
    monkeypatch.setattr(lab, "succeeded", lambda manifest, only: True)
    with quiet():
        assert main(["lab", "--quick", "--out", str(lab_dir), "--lang", "zh"]) == 0
    assert ran == [(lab_dir, "quick")]
    assert "<html lang='zh-Hans'>" in (lab_dir / "report.zh.html").read_text(encoding="utf-8")
