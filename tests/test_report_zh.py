"""The Chinese page in Chinese: every text an experiment writes shown in Chinese on ``report.zh.html``."""

from __future__ import annotations

import html as html_mod
import json
import re
from pathlib import Path

import pytest
from lab_helpers import copy_lab, quiet, snapshot_lab

from poslab.lab import comparisons, premises
from poslab.lab.experiments import corrections
from poslab.lab.experiments.attention_entropy import entropy_claims
from poslab.lab.experiments.extrapolation_verdicts import extrapolation_claims
from poslab.lab.report import build_report, builder
from poslab.lab.report.builder import lesson_refs
from poslab.lab.report.i18n import use_language
from poslab.lab.report.zh_claims import EXACT
from poslab.lab.report.zh_text import translate
from poslab.lab.verdicts import with_premise

pytestmark = pytest.mark.usefixtures("single_thread")

SNAPSHOT = Path(__file__).parents[1] / "docs" / "results" / "lab-quick.json"
#: titles a page may name in English (papers, datasets, labs): a run of words inside one is a name, not a sentence
TITLES = (
    "The Llama 3 Herd of Models",
    "One Billion Word",
    "Facebook AI Research",
    "Adaptive Attention Span",
    "Rethinking Positional Encoding in Language Pre-training",
    "Matrix Multiplication Background User's Guide",
)
#: an English sentence: four words of letters in a row, separated by spaces only
SENTENCE = re.compile(r"[A-Za-z][A-Za-z'’-]*(?:[ \t]+[A-Za-z][A-Za-z'’-]*){3,}")


def english_sentences(page: str) -> list[str]:
    """Every English sentence the reader of ``page`` sees outside code, numbers and titles.

    An English sentence is a run of four or more words of letters (``A-Z``, ``a-z``, with ``'`` or ``-``
    inside a word) separated by spaces only. Four is where prose starts and names stop: scheme and model
    names (``rope + YaRN x4``, ``Gemma 2 9B``, ``DeepSeek-V2-Lite``), units (``nats/token``), sections and
    numbers are broken up by a digit, a symbol or a Chinese word, and a list of names by its commas
    (``none, learned, sinusoidal``); a sentence of three words or fewer is a name or a label too short to
    translate (``no scaling`` is, and is, but the rule does not demand it). What the reader sees excludes:

    * ``<style>``, ``<code>`` and figures (the CSS, code, base64 images and their file names);
    * ``<details>``: the raw dump of each results.json (field names and values as the file holds them,
      folded by default) is the file's data, shown verbatim like code;
    * ``<span class='zh'>``: a lesson's own quotation (its code included), shown exactly as the lesson writes it;
    * ``<p class='warn'>``: a line naming a file, a key table or a field the results lack, by the name the code and
      the console give it (an identifier, like code);
    * the titles of :data:`TITLES` (a paper, a dataset, a lab), which stay in their language.
    """
    text = re.sub(
        r"<style>.*?</style>|<code>.*?</code>|<figure>.*?</figure>|<details[^>]*>.*?</details>"
        r"|<span class='zh'>.*?</span>|<p class='warn'>.*?</p>",
        " ",
        page,
        flags=re.S,
    )
    text = html_mod.unescape(re.sub(r"<[^>]+>", "\n", text))
    for title in TITLES:
        text = text.replace(title, " ")
    return sorted(set(SENTENCE.findall(text)))


def untranslated(texts: set[str]) -> list[str]:
    """The texts of ``texts`` the catalogue has no Chinese for."""
    return sorted(t for t in texts if t and translate(t) is None)


# ------------------------------------------------------------------------------ the pages
@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory) -> Path:
    """A lab folder of the snapshot's 100 claim records."""
    return snapshot_lab(tmp_path_factory.mktemp("snapshot") / "lab")


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory) -> Path:
    """The shared smoke-size lab (four cheap experiments, a tiny model's heads and attention) with the corrections
    experiment run into it (the records with criteria, evidence, references and quotes)."""
    lab_dir = copy_lab(tmp_path_factory.mktemp("smoke") / "lab")
    with quiet():
        results = corrections.run(lab_dir / "experiments" / "corrections")
    (lab_dir / "experiments" / "corrections" / "results.json").write_text(json.dumps(results), encoding="utf-8")
    return lab_dir


def test_the_snapshot_page_has_no_english_sentence(snapshot_dir):
    page = build_report(snapshot_dir, snapshot_dir / "report.zh.html", lang="zh").read_text(encoding="utf-8")
    assert english_sentences(page) == []
    # numbers and scheme names as measured: the snapshot's English measured text, its words in Chinese
    claim = "RoPE reads past the training length better than a learned table"
    record = next(c for c in json.loads(SNAPSHOT.read_text(encoding="utf-8"))["claims"] if c["claim"].startswith(claim))
    arms, diff = record["measured"].split("; paired difference of ln ")
    rope, learned = arms.split(" vs ")
    assert f"配对差（取对数）{diff}" in page
    assert f"{rope} 对比 {learned}" in page


def test_the_smoke_lab_page_has_no_english_sentence(smoke_dir):
    page = build_report(smoke_dir, smoke_dir / "report.zh.html", lang="zh").read_text(encoding="utf-8")
    assert english_sentences(page) == []
    assert "课文的偏置等于 poslab 的 ALiBi" in page  # a correction's criterion, in Chinese


def test_the_scan_finds_the_english_the_page_would_show(snapshot_dir, monkeypatch):
    """Without the catalogue (the page as it was: every experiment's text as written) the scan finds thousands of
    English words; a planted sentence is found on the translated page."""
    monkeypatch.setattr(builder, "localized", lambda text: text)
    monkeypatch.setattr(builder, "parentheticals", lambda text: text)
    page = build_report(snapshot_dir, snapshot_dir / "raw.zh.html", lang="zh").read_text(encoding="utf-8")
    found = english_sentences(page)
    assert sum(len(s.split()) for s in found) > 1000
    assert "RoPE reads past the training length better than a learned table" in found
    monkeypatch.undo()
    page = build_report(snapshot_dir, snapshot_dir / "ok.zh.html", lang="zh").read_text(encoding="utf-8")
    planted = page.replace("<h4>判定</h4>", "<h4>判定</h4><p>the lesson is right here</p>", 1)
    assert english_sentences(planted) == ["the lesson is right here"]


def test_the_english_page_shows_the_texts_as_written(snapshot_dir):
    page = build_report(snapshot_dir, snapshot_dir / "report.html").read_text(encoding="utf-8")
    claim = "RoPE reads past the training length better than a learned table"
    record = next(c for c in json.loads(SNAPSHOT.read_text(encoding="utf-8"))["claims"] if c["claim"].startswith(claim))
    assert claim in page and " ± " in record["measured"]
    assert html_mod.escape(record["measured"], quote=False) in page  # the snapshot's measured text, as written
    assert "对比" not in page and "前提未满足" not in page


# ------------------------------------------------------------------------------ the catalogue
def test_every_text_of_the_snapshot_and_the_corrections_has_chinese(smoke_dir):
    """A text with no Chinese would stay English on the page: each one is named here."""
    snap = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    texts = {c[k] for c in snap["claims"] for k in ("claim", "measured", "reason")}
    for folder in ("corrections", "params", "shapes", "rope-relative", "permutation"):
        for c in json.loads((smoke_dir / "experiments" / folder / "results.json").read_text(encoding="utf-8"))[
            "claims"
        ]:
            details = c.get("details") or {}
            texts |= {c["claim"], c["criterion"], c["measured"]}
            texts |= {str(details[k]) for k in ("evidence", "reference", "reason") if details.get(k)}
    assert untranslated(texts) == []


def test_generated_texts_keep_their_numbers_and_names():
    cases = {
        "rope 14.340 ± 2.125 (n=3) vs learned 23.520 ± 1.717 (n=3); paired difference of ln 0.501 ± 0.117 (n=3)": (
            "rope 14.340 ± 2.125 (n=3) 对比 learned 23.520 ± 1.717 (n=3)；配对差（取对数）0.501 ± 0.117 (n=3)"
        ),
        "not significant after Holm–Bonferroni within 'extrapolation' (8 claims): p = 0.0178 > 0.05/4 = 0.0125 "
        "(or a smaller p-value before it failed)": "在 'extrapolation' 内（8 条论断）做 Holm–Bonferroni 校正后不显著："
        "p = 0.0178 > 0.05/4 = 0.0125（或在它之前某个更小的 p 值已未通过）",
        "ppl(4L) / ppl(L) of alibi 0.981 ± 0.001 (n=3) (limit 1.1)": (
            "alibi 的 ppl(4L) / ppl(L) 0.981 ± 0.001 (n=3)（界限 1.1）"
        ),
        "有些头做「句号」的关注 — some heads attend to punctuation (the full stop)": (
            "有些头做「句号」的关注 — 有的头关注标点（句号）"
        ),
    }
    for english, chinese in cases.items():
        assert translate(english) == chinese
    assert translate("a sentence no experiment writes, with 3 numbers 1.5") is None
    assert translate("rope + YaRN x4") == "rope + YaRN x4"  # a name is its own Chinese


def test_the_criteria_and_premises_the_comparisons_write_have_chinese():
    """The criterion and measured text of every kind of comparison, and the premises, on made-up numbers."""
    b, w = [1.0, 1.1, 0.9], [1.5, 1.6, 1.4]
    records = [
        comparisons.compare(
            "c", "s", comparisons.Arm("rope", b), comparisons.Arm("none", w), comparisons.Metric("val loss")
        ),
        comparisons.compare(
            "c", "s", comparisons.Arm("rope", b), comparisons.Arm("none", w), comparisons.Metric("val loss", log=True)
        ),
        comparisons.paired(
            "c",
            "s",
            comparisons.Arm("rope", b),
            comparisons.Arm("learned", w),
            comparisons.Metric("ppl at 4x L", log=True),
        ),
        comparisons.bound(
            "c", "s", comparisons.Arm("rope", b), 2.0, comparisons.Metric("ppl(4L) / ppl(L)"), below=True
        ),
        comparisons.equivalent(
            "c",
            "s",
            comparisons.Arm("none", b),
            comparisons.Arm("learned", w),
            comparisons.Metric("val loss"),
            within=0.1,
        ),
        comparisons.best_of("c", "s", {"rope": b, "alibi": w, "none": w}, ["rope"], comparisons.Metric("val loss")),
    ]
    premise = premises.all_of(
        premises.below_bigram({"rope": [2.5, 2.6]}, 2.4), premises.fits_length({"rope": [0.85, 0.97]}, 0.9)
    )
    records.append(with_premise(records[0], premise))
    texts = {r.criterion for r in records} | {r.measured for r in records} | {records[-1].details["reason"]}
    assert untranslated(texts) == []
    for text in texts:
        assert not re.search(r"[A-Za-z]+(?: [A-Za-z]+){3,}", translate(text) or ""), text


def test_the_training_experiments_criteria_have_chinese():
    """The criteria the extrapolation and attention-entropy experiments write (on results that lack every arm: the
    records then say what was not measured), and the metrics and criteria of the other training experiments."""
    records = extrapolation_claims({}, baseline=None) + entropy_claims({})
    texts = {r[k] for r in records for k in ("claim", "criterion", "measured")}
    texts |= {
        "val loss of none at most 0.05 higher than learned",
        "ppl at 4x L of PI fine-tuned at 4x L lower than the base model at L",
        "passkey accuracy at 4x L of the mean at most 0.05 below",
        "perplexity (non-overlapping) of none within ±0.0488 of base on ln, paired by seed (TOST)",
        "ratio of perplexity at 4x L (non-overlapping) of mean of the last 3 / plain fine-tune below 1.01",
    }
    assert untranslated(texts) == []
    assert translate("val loss of none at most 0.05 higher than learned") == "none 的验证损失比 learned 至多高 0.05"


def test_the_catalogue_keeps_the_lessons_quotes_as_written():
    """A claim's quotation stays as the lesson writes it; only its English gloss becomes Chinese."""
    claim = "减小 d_k 往往提升效果 — smaller heads (more of them) do better than one big head"
    assert translate(claim).startswith("减小 d_k 往往提升效果 — ")
    for english, chinese in EXACT.items():
        for quote in re.findall(r"「[^「」]*」", english):
            assert quote in chinese, english


# ------------------------------------------------------------------------------ the guide table
def test_a_section_of_two_lessons_gives_each_lesson_its_row(snapshot_dir):
    assert lesson_refs("seeds 000 and 002") == [("000", "—"), ("002", "—")]
    assert lesson_refs("seed 000 §2.1 (exp. 3), seed 001") == [("000", "§2.1 (exp. 3)"), ("001", "—")]
    with use_language("zh"):
        page = build_report(snapshot_dir, snapshot_dir / "guide.zh.html", lang="zh").read_text(encoding="utf-8")
    guide = page.split("<section id='guide'>")[1].split("</section>")[0]
    assert "and 002" not in guide
    assert guide.count("<a href='#corrections'>") == 2  # lessons 000 and 002 each list the corrections
