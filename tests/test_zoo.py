"""The model zoo table (poslab/lab/data/model_zoo.json) and ``poslab experiment model-zoo``.

The statistics are recomputed here straight from the JSON file, independently of the experiment's
code, and compared with its results.json.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from poslab.cli.app import main
from poslab.lab import evidence, zoo
from poslab.lab.experiments import model_zoo
from poslab.lab.verdicts import ClaimRecord, check_records

ZOO = Path(model_zoo.__file__).resolve().parent.parent / "data" / "model_zoo.json"
RAW = json.loads(ZOO.read_text())["models"]
REQUIRED_FAMILIES = {
    "GPT-2",
    "Llama 1",
    "Llama 2",
    "Llama 3",
    "Llama 3.1",
    "Mistral",
    "Qwen2.5",
    "Qwen3",
    "Gemma",
    "Gemma 2",
    "Gemma 3",
    "Phi-3",
    "OLMo 2",
    "Falcon",
    "BLOOM",
    "MPT",
    "DeepSeek",
    "T5",
    "BERT",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["experiment", "model-zoo", "--quick", "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text()), buffer.getvalue(), out


def test_zoo_covers_the_issue_families_and_sizes():
    assert len(RAW) >= 25
    assert REQUIRED_FAMILIES <= {r["family"] for r in RAW}
    assert {"GPT-2 small", "GPT-2 medium", "GPT-2 large", "GPT-2 XL"} <= {r["name"] for r in RAW}
    assert len({r["hf_repo"] for r in RAW}) == len(RAW)  # no model twice


@pytest.mark.parametrize("row", RAW, ids=[r["name"] for r in RAW])
def test_every_row_obeys_the_schema(row):
    assert set(zoo.FIELDS) <= set(row)
    for field in ("d_model", "n_heads", "n_kv_heads", "head_dim", "layers", "context_length", "year"):
        value = row[field]
        if value is None:
            assert row["null_fields"].get(field), f"{field} null without a reason"
        else:
            assert isinstance(value, int) and not isinstance(value, bool) and value > 0, field
    assert row["rope_theta"] is not None or row["null_fields"].get("rope_theta")
    assert row["source"] == f"{row['hf_repo']} config.json"
    assert row["verified_via"].strip()
    assert row["n_heads"] % row["n_kv_heads"] == 0
    assert 2017 <= row["year"] <= 2026
    assert set(row["derived"]) <= {"n_kv_heads", "head_dim"}
    if "head_dim" in row["derived"] and row["attention"] != "MLA":
        assert row["head_dim"] * row["n_heads"] == row["d_model"]  # derived as d_model / n_heads
    if row["attention"] == "MHA":
        assert row["n_kv_heads"] == row["n_heads"]
    if row["attention"] == "MQA":
        assert row["n_kv_heads"] == 1
    if row["attention"] == "MLA":
        assert row["head_dim"] == row["qk_nope_head_dim"] + row["qk_rope_head_dim"]
    if row["position"] in ("learned", "alibi") or row["position"].startswith("relative"):
        assert row["rope_theta"] is None and row["rope_scaling"] is None


def test_check_row_rejects_bad_rows():
    good = copy.deepcopy(RAW[0])
    zoo.check_row(good)
    for field, value, words in (
        ("head_dim", 0, "positive integer"),
        ("n_kv_heads", 5, "does not divide"),
        ("layers", None, "without a reason"),
        ("source", "somewhere", "config.json"),
        ("attention", "dense", "MHA, GQA"),
    ):
        bad = dict(copy.deepcopy(good), **{field: value})
        with pytest.raises(ValueError, match=words):
            zoo.check_row(bad)
    with pytest.raises(ValueError, match="misses"):
        zoo.check_row({k: v for k, v in good.items() if k != "layers"})


def test_dk_statistics_recomputed_from_the_json(results):
    r = results[0]
    in_common = sum(1 for row in RAW if row["head_dim"] in (64, 128))
    share = in_common / len(RAW)
    assert r["dk"]["share_64_128"] == pytest.approx(share)
    assert sorted(name for name, _ in r["dk"]["counter_examples"]) == sorted(
        row["name"] for row in RAW if row["head_dim"] not in (64, 128)
    )
    assert "Gemma 7B" in [name for name, _ in r["dk"]["counter_examples"]]  # head_dim 256, the issue's example
    claim = next(c for c in r["claims"] if c["source"].startswith("seed 000 §1.4 and Q3"))
    # the lesson's point: d_k does not grow with d_model (MLA rows count their 128 content dimensions)
    content = [row["head_dim"] - 64 if row["attention"] == "MLA" else row["head_dim"] for row in RAW]
    fit = np.polyfit(np.log([row["d_model"] for row in RAW]), np.log(content), 1)
    assert claim["details"]["slope"] == pytest.approx(fit[0])
    assert 0 < fit[0] < 0.4 and claim["verdict"] == "held"


def test_head_rule_and_width_recomputed(results):
    r = results[0]
    ratios = [row["n_heads"] / math.sqrt(row["d_model"] / 16) for row in RAW]
    within = sum(1 for x in ratios if 2**-0.5 <= x <= 2**0.5) / len(RAW)
    assert r["head_rule"]["share_within_factor"] == pytest.approx(within)
    claim = next(c for c in r["claims"] if c["source"] == "seed 002 §3.2")
    assert claim["verdict"] == ("held" if within >= 0.5 else "did not hold")
    mismatched = {row["name"] for row in RAW if row["n_heads"] * row["head_dim"] != row["d_model"]}
    assert {m[0] for m in r["width_mismatches"]} == mismatched
    assert {"Gemma 7B", "Qwen3 4B"} <= mismatched


def test_parameter_counts_follow_the_projection_widths(results):
    by_name = {p["name"]: p for p in results[0]["parameters"]}
    llama3 = by_name["Llama 3 8B"]  # 4096 wide, 32 heads, 8 kv heads of 128
    assert llama3["built"] == 2 * 4096 * 4096 + 2 * 4096 * 1024 + (4096 + 2 * 1024 + 4096)
    assert llama3["small_built"] == llama3["small_formula"]
    gpt2 = by_name["GPT-2 small"]
    assert gpt2["built"] == 4 * 768 * 768 + 4 * 768
    assert by_name["Gemma 7B"]["built"] is None  # 16 x 256 != 3072: poslab's MHA cannot express it


def test_claim_records_and_outputs(results):
    r, stdout, out = results
    assert not check_records(r["claims"])
    assert len(r["claims"]) == 5
    assert {c["verdict"] for c in r["claims"]} <= {"held", "did not hold", "inconclusive"}
    assert (out / "model_zoo.png").stat().st_size > 10_000
    assert "claims" in stdout and "Llama 3 8B" in stdout


def test_dk_is_judged_here_quoted_with_its_evidence(results):
    (c,) = [c for c in results[0]["claims"] if "不管模型多大" in c["details"].get("sentence", "")]
    assert c["verdict"] == "held" and "DeepSeek-V3 192" in c["measured"] and "Gemma 7B" in c["measured"]
    assert "model-zoo" in c["details"]["evidence"] and evidence.evidence_problems(c) == []
    assert c["details"]["sentence"] in c["details"]["quote"]
    rows = zoo.load_zoo()
    content = {r["name"]: r["head_dim"] - (64 if r["attention"] == "MLA" else 0) for r in rows}
    assert content["DeepSeek-V3"] == 128 and max(r["d_model"] for r in rows) / min(r["d_model"] for r in rows) > 20


def test_the_grouped_query_count_is_a_poslab_note_out_of_the_lessons_tally(results):
    """The lessons make no claim on grouped-query attention: the zoo's check of 4·d² on GQA rows is a poslab note,
    shown with its own badge and in no count of the lessons' claims."""
    from poslab.lab.doctables import _counts
    from poslab.lab.report import claims as claims_mod
    from poslab.lab.report.builder import kind, summary_counts

    (gqa,) = [c for c in results[0]["claims"] if "grouped-query" in c["claim"]]
    record = ClaimRecord.from_dict(gqa)
    assert gqa["verdict"] == "did not hold" and not evidence.lesson_claim(record.details)
    assert kind(record) == "note"
    lessons = [ClaimRecord.from_dict(c) for c in results[0]["claims"] if c is not gqa]
    assert all(evidence.lesson_claim(r.details) and kind(r) != "note" for r in lessons)
    wrong = sum(kind(r) == "wrong" for r in lessons)
    shown = summary_counts([claims_mod.Verdict("experiments/model-zoo", r) for r in [*lessons, record]])
    assert f"{wrong} did not hold" in shown and "note" not in shown
    snapshot = [{"kind": kind(r)} for r in [*lessons, record]]
    assert f"{wrong} did not hold" in _counts(snapshot) and "note" not in _counts(snapshot)
