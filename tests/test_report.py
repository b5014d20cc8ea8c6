"""The HTML report, the claims it checks, the pe-cache experiment and the lab runner."""

from __future__ import annotations

import json
import re
import sys
from html import unescape
from pathlib import Path

import pytest
from lab_helpers import PROMPT, TANG_HEADS, copy_lab, extrapolation_result, quiet, shared_lab

from poslab.cli.app import main
from poslab.display.fonts import FAMILY, covered_chars, font_face_css, font_path
from poslab.lab import experiments, lab
from poslab.lab.experiments import params, shapes
from poslab.lab.report import build_report, claims, load_results
from poslab.lab.report.sections import SECTIONS
from poslab.lab.verdicts import Arm, Metric, bound, check_records, compare, get, not_testable, num, tally

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def verdict_of(html: str, claim_start: str) -> str:
    """The verdict badge text of the first claims-table row whose claim starts with ``claim_start``."""
    within = r"(?:(?!</tr>).)*?"  # never across rows
    row = re.search(
        r"<tr class='v-\w+'><td class='src'>"
        + within
        + r"</td><td>(?:<span class='\w+'>)?"
        + re.escape(claim_start)
        + within
        + "</tr>",
        html,
    )
    assert row, claim_start
    return re.search(r"<span class='badge \w+'>([^<]+)</span>", row.group(0)).group(1)


# ------------------------------------------------------------------------------------ the report
def test_report_is_self_contained_and_has_every_section():
    lab_dir = shared_lab()
    html = build_report(lab_dir, lab_dir / "report.html").read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f"<section id='{section.key}'>" in html
    assert "<section id='claims'>" in html and "<section id='machine'>" in html
    # nothing is loaded from anywhere: every src/href/url() is a data URL or an in-page anchor
    for ref in re.findall(r"""(?:src|href)=['"]([^'"]+)['"]|url\(([^)]+)\)""", html):
        target = ref[0] or ref[1]
        assert target.startswith(("data:", "#")), target
    assert "<script" not in html
    assert len(re.findall(r"data:image/png;base64,", html)) == 2  # heads.png and attention.png
    assert f"font-family: '{FAMILY}'" in html and "data:font/otf;base64," in html
    assert "Not run in this lab" in html  # the training experiments were not run here


def test_report_shows_the_plots_of_each_folder(tmp_path):
    lab_dir = copy_lab(tmp_path / "lab")
    (lab_dir / "experiments" / "params" / "extra.png").write_bytes((lab_dir / TANG_HEADS / "heads.png").read_bytes())
    html = build_report(lab_dir).read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 3
    assert "<figcaption>extra.png</figcaption>" in html


def test_claims_held_on_real_results():
    html = build_report(shared_lab(), shared_lab() / "claims.html").read_text(encoding="utf-8")
    for start in (
        "多头不增加参数量",
        "单头 Linear(512,512)",
        "qkv 3168 个",
        "[batch, seq, d_model]",
        "&lt;R_m q, R_n k&gt; 只依赖",
        "打乱顺序后",
        "这就是为什么必须要有位置编码",
    ):
        assert verdict_of(html, start) == "held", start
    assert "1 层：没有位置嵌入" not in html  # causal-leak is not in this lab: its claims are decided when it runs
    records = [v.record for v in claims.evaluate(load_results(shared_lab()))]
    assert check_records(records) == []  # every deterministic record obeys the rule
    assert all(r.n_seeds == 0 and r.noise is None for r in records if r.verdict != "inconclusive")
    counts = tally(records)
    untestable = sum(not_testable(r) for r in records)
    assert (
        f"<span class='count held'>{counts['held']} held</span> <span class='count wrong'>{counts['did not hold']} "
        f"did not hold</span> <span class='count untestable'>{untestable} not testable</span> "
        f"<span class='count inconclusive'>{counts['inconclusive'] - untestable} inconclusive</span>"
    ) in html


def test_changing_a_results_file_changes_the_report(tmp_path):
    lab_dir = copy_lab(tmp_path / "lab")
    before = build_report(lab_dir).read_text(encoding="utf-8")
    assert verdict_of(before, "qkv 3168 个") == "held"
    assert "9,999" not in before
    path = lab_dir / "experiments" / "params" / "results.json"
    results = json.loads(path.read_text())
    results["seed001_qkv_params_by_heads"]["4"] = 9999
    results["seed000_one_linear_512"] = 123457
    results["claims"] = [c.to_dict() for c in params.claims(results)]  # the experiment decides its claims
    path.write_text(json.dumps(results))
    after = build_report(lab_dir).read_text(encoding="utf-8")
    assert "h=4: qkv 9,999, proj 1,056" in after
    assert verdict_of(after, "qkv 3168 个") == "did not hold"
    assert "one Linear 123,457" in after and verdict_of(after, "单头 Linear(512,512)") == "did not hold"
    # the head analysis numbers come from its results.json too
    heads_path = lab_dir / TANG_HEADS / "results.json"
    heads = json.loads(heads_path.read_text())
    heads["pruned_30"]["loss"] = 42.125
    heads_path.write_text(json.dumps(heads))
    assert "42.12" in build_report(lab_dir).read_text(encoding="utf-8")


def test_experiment_claim_lists_are_shown(tmp_path):
    lab_dir = copy_lab(tmp_path / "lab")
    folder = lab_dir / "experiments" / "extrapolation"
    folder.mkdir()
    flat = bound(
        "ALiBi flat past L", "Press et al. 2022", Arm("alibi", [1.01, 1.02, 1.03]), 1.10, Metric("ratio"), below=True
    )
    close = compare(
        "rope beats alibi",
        "seed 000 §4",
        Arm("rope", [2.30, 2.35, 2.28]),
        Arm("alibi", [2.31, 2.33, 2.30]),
        Metric("val loss"),
    )
    assert close.verdict == "inconclusive"
    (folder / "results.json").write_text(
        json.dumps({"claims": [flat.to_dict(), close.to_dict(), {"claim": "old shape", "held": True}]})
    )
    html = build_report(lab_dir).read_text(encoding="utf-8")
    assert verdict_of(html, "ALiBi flat past L") == "held"
    assert "ratio of alibi 1.020 ± 0.010 (n=3)" in html  # the measured cell: mean ± sd
    assert verdict_of(html, "rope beats alibi") == "inconclusive"
    missed = num(close.noise - abs(close.margin))
    assert f"missed by {missed}" in html  # an inconclusive verdict says by how much it missed
    assert verdict_of(html, "old shape") == "unusable" and "unusable claim entry" in html


def test_margin_text():
    from poslab.lab.report.builder import margin_text

    held = compare("a", "s", Arm("x", [1.0, 1.01, 0.99]), Arm("y", [2.0, 2.01, 1.99]), Metric("m"))
    assert margin_text(held) == f"margin 1 vs noise ±{num(held.noise)} (n=3)"
    few = compare("a", "s", Arm("x", [1.0, 1.01]), Arm("y", [2.0, 2.01]), Metric("m"))
    assert few.verdict == "inconclusive" and margin_text(few).endswith("fewer than 3 seeds")


def test_report_survives_broken_or_missing_inputs(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        build_report(tmp_path / "nothing")
    lab_dir = tmp_path / "lab"
    (lab_dir / "experiments" / "params").mkdir(parents=True)
    (lab_dir / "experiments" / "params" / "results.json").write_text("{not json")
    (lab_dir / "experiments" / "shapes").mkdir()
    (lab_dir / "experiments" / "shapes" / "results.json").write_text(
        json.dumps({"seed000_walk": "wrong type", "claims": "wrong type"})
    )
    with pytest.raises((TypeError, AttributeError)):
        shapes.claims({"seed000_walk": "wrong type"})  # the experiment refuses to decide on a broken walk
    html = build_report(lab_dir).read_text(encoding="utf-8")
    assert "unreadable experiments/params/results.json" in html
    assert verdict_of(html, "(claims of experiments/shapes)") == "unusable"
    assert load_results(lab_dir)["experiments/shapes"] == {"seed000_walk": "wrong type", "claims": "wrong type"}


def test_number_formatting():
    assert num(1050624) == "1,050,624"
    assert num(2.98394608) == "2.984"
    assert num(1.2e-06) == "1.2e-06"
    assert num(19869.17) == "19,869"
    assert num(True) == "True"
    assert get({"a": {"b": [1, {"c": 5}]}}, "a.b.1.c") == 5
    with pytest.raises(KeyError):
        get({"a": 1}, "a.b")


def test_font_subset_covers_the_corpora_and_embeds_small():
    from poslab.data import load_corpus

    assert font_path().stat().st_size < 3_000_000
    covered = covered_chars()
    poems = load_corpus("tang5").replace("\n", "")
    missing = [c for c in poems if c not in covered]
    # only rare CJK extension B+ characters (no font installed here has them) are missing: < 0.1% of the text
    assert len(missing) < 0.001 * len(poems) and all(
        ord(c) > 0x20000 or 0x3400 <= ord(c) < 0x4DC0 or ord(c) > 0x9FA5 for c in missing
    )
    assert set(PROMPT) <= covered
    css = font_face_css("白日依山尽 hello")
    assert css.startswith("@font-face") and len(css) < 20_000
    assert font_face_css("ascii only") == ""
    assert (font_path().parent / "OFL.txt").read_text().count("SIL OPEN FONT LICENSE") == 1


# ------------------------------------------------------------------------------------ pe-cache
def test_pe_cache_experiment(tmp_path):
    from poslab.lab.experiments import pe_cache, registry

    assert registry()["pe-cache"] is pe_cache and pe_cache.EXPERIMENT.in_all
    with quiet():
        results = pe_cache.run(tmp_path, quick=True)
    json.dumps(results, allow_nan=False)
    assert [r["seq_len"] for r in results["rows"]] == [128, 512]
    for row in results["rows"]:
        assert row["pe_lookup_us"] > 0 and row["pe_compute_us"] > 0
        assert row["pe_speedup"] == pytest.approx(row["pe_compute_us"] / row["pe_lookup_us"])
    speed, value_range, wavelengths = results["claims"]
    # the claim's floor as its criterion states it (20x), independent of the module's constant
    assert "at least 20x faster" in speed["criterion"]
    speedup = results["headline"]["embed_speedup"]
    assert speed["verdict"] == ("held" if speedup >= 20.0 else "did not hold")
    assert speed["margin"] == pytest.approx(speedup - 20.0)
    assert value_range["verdict"] == "held" and results["value_range"] == {"min": -1.0, "max": 1.0}
    assert wavelengths["verdict"] == "held" and results["wavelength_range"]["max_over_2pi"] == pytest.approx(
        10000 ** (510 / 512)
    )
    assert check_records(results["claims"]) == []


# ------------------------------------------------------------------------------------ the lab runner
def fake_step(name: str, folder: str, lab_dir: Path, fail: bool = False, needs: tuple[str, ...] = ()) -> lab.Step:
    """A step that runs a tiny Python process writing results.json (or failing) and counting its runs."""
    code = (
        "import json, pathlib, sys\n"
        f"out = pathlib.Path({str(lab_dir / folder)!r}); out.mkdir(parents=True, exist_ok=True)\n"
        f"counter = pathlib.Path({str(lab_dir / (folder.replace('/', '_') + '.count'))!r})\n"
        "counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))\n"
        "print('step 1/2', end='\\r', flush=True); print('working on', out.name)\n"
        + (
            "sys.exit('boom: the step broke')\n"
            if fail
            else "(out / 'results.json').write_text(json.dumps({'value': 3.25}))\n"
        )
    )
    return lab.Step(name, folder, [], needs=needs, command=[sys.executable, "-c", code])


def runs_of(lab_dir: Path, folder: str) -> int:
    path = lab_dir / (folder.replace("/", "_") + ".count")
    return int(path.read_text()) if path.exists() else 0


def test_lab_reuses_finished_steps_records_failures_and_builds_the_report(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    fail = {"flag": False}

    def fake_plan(lab_dir_arg: Path, mode: str) -> list[lab.Step]:
        return [
            fake_step("one", "experiments/one", lab_dir),
            fake_step("two", "experiments/two", lab_dir, fail=fail["flag"]),
            fake_step("three", "experiments/three", lab_dir, needs=("experiments/two",)),
        ]

    monkeypatch.setattr(lab, "plan", fake_plan)
    stream = __import__("io").StringIO()
    manifest = lab.run_lab(lab_dir, "quick", stream=stream)
    assert [s["status"] for s in manifest["steps"]] == ["ok", "ok", "ok"]
    assert (lab_dir / "report.html").is_file() and (lab_dir / "logs" / "experiments_one.log").read_text().count(
        "working on one"
    )
    progress = stream.getvalue()
    assert "lab [1/3] one" in progress and "ETA" in progress and "working on one" in progress

    manifest = lab.run_lab(lab_dir, "quick", stream=stream)  # everything reused
    assert [s["status"] for s in manifest["steps"]] == ["reused"] * 3
    assert runs_of(lab_dir, "experiments/one") == 1

    manifest = lab.run_lab(lab_dir, "full", stream=stream)  # another mode: rerun
    assert runs_of(lab_dir, "experiments/one") == 2 and manifest["mode"] == "full"

    fail["flag"] = True
    manifest = lab.run_lab(lab_dir, "full", fresh=True, stream=stream)
    statuses = {s["name"]: s for s in manifest["steps"]}
    assert statuses["one"]["status"] == "ok" and runs_of(lab_dir, "experiments/one") == 3
    assert statuses["two"]["status"] == "failed" and "boom: the step broke" in statuses["two"]["error"]
    assert statuses["three"]["status"] == "skipped" and "experiments/two" in statuses["three"]["error"]
    html = (lab_dir / "report.html").read_text(encoding="utf-8")
    assert "boom: the step broke" in html
    saved = json.loads((lab_dir / "lab.json").read_text())
    assert saved["machine"]["versions"]["torch"] and saved["records"]["experiments/two"]["status"] == "failed"


def test_lab_plan_covers_every_lesson_experiment(tmp_path):
    steps = lab.plan(tmp_path, "quick")
    names = [s.name for s in steps]
    for name, module in experiments.registry().items():
        if module.EXPERIMENT.in_all:
            assert name in names
    for name in experiments.descriptions("lab"):
        assert name in names
    assert all(s.argv[:2] == ["experiment", s.name] for s in steps)
    assert all("--quick" in s.argv for s in steps)
    assert not any("--quick" in s.argv for s in lab.plan(tmp_path, "full"))
    shown = {folder for section in SECTIONS for folder in section.folders}
    assert {s.folder for s in lab.plan(tmp_path, "full")} >= shown  # the full lab fills every section
    # the quick lab leaves out exactly the full-only experiments (their sections say "not run in this lab")
    full_only = {f"experiments/{n}" for n in experiments.descriptions("full")}
    assert shown - {s.folder for s in steps} == shown & full_only


def test_lab_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["lab", "--quick", "--full"])
    assert exit_info.value.code == 2 and "not allowed" in capsys.readouterr().err
    assert main(["lab", "--out", str(tmp_path / "x"), "--only", "nope"]) == 2
    assert "unknown lab step" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["lab", "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["lab", "--report-only", "--out", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_lab_quick_end_to_end(tmp_path):
    """The real ``poslab lab --quick``: every step finishes and the report lists every section."""
    manifest = lab.run_lab(tmp_path / "lab", "quick", stream=__import__("io").StringIO())
    assert all(s["status"] == "ok" for s in manifest["steps"]), [(s["name"], s.get("error")) for s in manifest["steps"]]
    html = (tmp_path / "lab" / "report.html").read_text(encoding="utf-8")
    # only the full-only experiments' sections may say so (test_lab_plan checks which those are)
    missing = re.findall(r"<span class='path'>([^<]*)/</span></h3><p class='note'>Not run in this lab", html)
    assert set(missing) <= {f"experiments/{n}" for n in experiments.descriptions("full")}, missing
    assert html.lower().count("not run in this lab") == len(missing)  # no claim record says it


def test_context_key_table_shows_checkpoint_averaging():
    from poslab.lab.report.builder import key_tables

    results = json.loads((Path(__file__).parent / "data" / "context_extension_results.json").read_text("utf-8"))
    averaging = results["averaging"]
    averaging["note"] = "Llama 3 averages in annealing"
    seeds = {"ppl": 10.25, "ppl_sd": 0.1768, "ppl_seeds": [10.125, 10.375]}
    averaging["variants"]["last-k average"].update(
        {"L": {"length": 16, "nonoverlapping": seeds}, "passkey": {"4": [0.5, None]}},
        weight_distance_to_fine_tuned=[0.01, 0.03],
    )
    html = key_tables("experiments/context-extension", results)
    assert "ppl at 64" in html and "checkpoint averaging of the YaRN fine-tune: last 3 checkpoints" in html
    assert (
        "10.250 ± 0.177 (n=2)" in html and "0.0200 ± 0.0141 (n=2)" in html and "Llama 3 averages in annealing" in html
    )


def test_a_renamed_result_field_fails_the_report_naming_the_table(tmp_path, capsys):
    lab_dir = copy_lab(tmp_path / "lab")
    heads = lab_dir / TANG_HEADS / "results.json"
    results = json.loads(heads.read_text(encoding="utf-8"))
    results["pruned_at_30"] = results.pop("pruned_30")
    heads.write_text(json.dumps(results), encoding="utf-8")
    extrapolation = lab_dir / "experiments" / "extrapolation" / "results.json"
    extrapolation.parent.mkdir(parents=True)
    cell = {"nonoverlapping": {"ppl": 9.5, "ppl_seeds": [9.0, 10.0]}, "sliding": {"ppl": 9.0, "ppl_seeds": [9.0]}}
    renamed = extrapolation_result({"rope": {"1": cell}})
    renamed["ppl_table"] = renamed.pop("perplexity")
    extrapolation.write_text(json.dumps(renamed), encoding="utf-8")

    assert main(["report", "--out", str(lab_dir)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "poslab report: error: experiments/extrapolation: table 'perplexity (nonoverlapping)' cannot be built: "
        "results.json has no field 'perplexity'",
        "poslab report: error: experiments/extrapolation: table 'perplexity (sliding)' cannot be built: "
        "results.json has no field 'perplexity'",
        *(
            f"poslab report: error: experiments/tang-heads: table '{table}' cannot be built: results.json has no "
            "field 'pruned_30'"
            for table in ("every head", "pruning", "training run")
        ),
    ]
    page = unescape((lab_dir / "report.html").read_text(encoding="utf-8"))
    assert "tang-heads: the table “pruning” cannot be built: results.json has no field “pruned_30”" in page
    assert "the table “perplexity (sliding)” cannot be built: results.json has no field “perplexity”" in page
    assert "every head (base loss" not in page  # results.json is read into the typed result as a whole
    html = (lab_dir / "report.html").read_text(encoding="utf-8")
    from poslab.lab.report.builder import kind
    from poslab.lab.report.i18n import t
    from poslab.lab.verdicts import ClaimRecord

    recorded = kind(ClaimRecord.from_dict(next(c for c in results["claims"] if c["claim"].startswith("头7/8充当"))))
    assert recorded != "unusable" and verdict_of(html, "头7/8充当") == t("kind." + recorded)  # as the record says
    assert main(["report", "--out", str(lab_dir), "--lang", "zh"]) == 1
    page = unescape((lab_dir / "report.zh.html").read_text(encoding="utf-8"))
    assert "tang-heads：无法生成表格“pruning”：results.json 中没有字段“pruned_30”" in page


def test_head_analysis_claims_need_a_model_below_its_texts_trigram_baseline():
    """A claim on what a model's heads learn is read only off a model clearly below the trigram count model: one
    between the bigram and the trigram baselines (where the lab's quick Tang model sits) is not testable."""
    from poslab.lab.experiments import tang_heads
    from poslab.lab.experiments.common import ngram_baselines
    from poslab.lab.experiments.declaration import load
    from poslab.lab.experiments.tang_heads_result import TangHeadsResult

    heads = json.loads((shared_lab() / TANG_HEADS / "results.json").read_text())
    assert heads["text"]["corpus"] and heads["text"]["tokenizer"] == "char"  # what head_results records
    base = ngram_baselines("shakespeare")
    texts = [text for _, text, _ in tang_heads.CLAIMS]

    def records(base_loss: float | None) -> dict[str, object]:
        data = dict(heads, base_loss=base_loss) if base_loss is not None else dict(heads)
        data["text"] = {
            "corpus": "shakespeare" if base_loss is not None else None,
            "tokenizer": "char",
            "val_fraction": 0.1,
        }
        return {record.claim: record for record in tang_heads.head_claims(load(TangHeadsResult, data))}

    assert base["bigram"] - 0.2 > base["trigram"] + 0.05  # a loss between the two exists on this corpus
    bare = records(None)  # no text named: the premise cannot be shown
    between = records(base["bigram"] - 0.2)  # below the bigram, above the trigram baseline
    below = records(base["trigram"] - 0.2)
    decided = 0
    for text in texts:
        assert not_testable(bare[text]) and "not measurable" in bare[text].premise.measured
        assert not_testable(between[text]) and between[text].verdict == "inconclusive"
        assert "trigram" in between[text].premise.text
        assert below[text].premise.met and not not_testable(below[text])
        if below[text].verdict != "inconclusive":
            decided += 1
            assert between[text].details["verdict_without_premise"] == below[text].verdict
    assert decided  # the test decided something on the model that meets the premise


# ------------------------------------------------------------------------------------ forged records and files
FORGED_RECORDS = [
    ({"margin": float("nan"), "noise": 0.1, "n_seeds": 3}, "margin nan is not a finite number"),
    ({"margin": 0.5, "noise": float("nan"), "n_seeds": 3}, "noise nan is not a finite number"),
    ({"margin": float("inf"), "noise": None, "n_seeds": 0}, "margin inf is not a finite number"),
    ({"margin": -5.0, "noise": 0.1, "n_seeds": 3}, "the rule needs margin > noise 0.1"),
    ({"margin": -5.0, "noise": None, "n_seeds": 0}, "the rule needs margin >= 0"),
    ({"margin": 0.5, "noise": 0.1, "n_seeds": -1}, "n_seeds -1 is not a non-negative integer"),
    ({"margin": 0.5, "noise": 0.1, "n_seeds": 3.5}, "n_seeds 3.5 is not a non-negative integer"),
    ({"margin": 0.5, "noise": None, "n_seeds": 3}, "without a measured noise"),
    ({"margin": 0.5, "noise": -1.0, "n_seeds": 3}, "noise -1.0 is not a finite number >= 0"),
    ({"margin": 0.5, "noise": 0.1, "n_seeds": 3, "details": {"p_value": "x"}}, "p_value 'x' is not a number"),
    ({"margin": 0.5, "noise": 0.1, "n_seeds": 3, "details": [1]}, "details is a list, not a mapping"),
]


def forged(i: int, fields: dict, verdict: str = "held") -> dict:
    seeded = isinstance(fields.get("n_seeds"), int) and fields["n_seeds"] > 0
    design = {"design": {"test": "paired t-test", "family": "forged"}} if seeded else {}
    return {
        "claim": f"forged {i}",
        "source": "s",
        "criterion": "c",
        "measured": "m",
        "verdict": verdict,
        **design,
        **fields,
    }


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_forged_claim_records_are_shown_unusable_never_held(tmp_path, lang):
    lab_dir = tmp_path / "lab"
    folder = lab_dir / "experiments" / "forged"
    folder.mkdir(parents=True)
    entries = [forged(i, f) for i, (f, _) in enumerate(FORGED_RECORDS)]
    entries.append(forged(90, {"margin": 5.0, "noise": 0.1, "n_seeds": 3}, verdict="did not hold"))
    entries.append(forged(91, {"margin": 0.5, "noise": 0.1, "n_seeds": 3}, verdict="surely"))
    entries.append(forged(92, {"margin": 0.5, "noise": 0.1, "n_seeds": 3}))  # a consistent record stays held
    bare = forged(93, {"margin": 0.5, "noise": 0.1, "n_seeds": 3})
    entries.append({k: v for k, v in bare.items() if k != "design"})  # a seeded record must say how it was tested
    (folder / "results.json").write_text(json.dumps({"claims": entries}))  # json writes NaN and Infinity
    html = build_report(lab_dir, lang=lang).read_text(encoding="utf-8")
    unusable = "unusable" if lang == "en" else "记录不可用"
    for i, (_, why) in enumerate(FORGED_RECORDS):
        assert verdict_of(html, f"forged {i}") == unusable, why
        assert why in unescape(html)
    assert verdict_of(html, "forged 90") == unusable and "the rule needs margin < -noise 0.1" in unescape(html)
    assert verdict_of(html, "forged 91") == unusable and "verdict must be one of" in html  # unknown verdict refused
    assert verdict_of(html, "forged 92") == ("held" if lang == "en" else "课文正确")
    assert verdict_of(html, "forged 93") == unusable and "without a recorded design" in unescape(html)
    counts = claims.evaluate(load_results(lab_dir))
    assert sum(v.record.verdict == "held" for v in counts) == 1


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_malformed_lab_files_give_a_page_naming_each_file(tmp_path, lang):
    lab_dir = tmp_path / "lab"
    for folder in ("experiments/params", "experiments/shapes", TANG_HEADS):
        (lab_dir / folder).mkdir(parents=True)
    (lab_dir / "experiments/params/results.json").write_text("[" * 200000)  # a RecursionError for json.loads
    (lab_dir / TANG_HEADS / "results.json").mkdir()  # a folder where the file should be
    (lab_dir / "experiments/shapes/results.json").write_text("{}")
    (lab_dir / "experiments/shapes/evil.png").mkdir()  # a folder named like a figure
    (lab_dir / "lab.json").write_text(json.dumps({"steps": [1, 2, None], "machine": "x"}))
    html = build_report(lab_dir, lang=lang).read_text(encoding="utf-8")
    assert "unreadable experiments/params/results.json: " in html and "nested more than 100 levels" in html
    assert f"unreadable {TANG_HEADS}/results.json: Is a directory" in html
    assert "experiments/shapes/evil.png is not a regular file; not shown" in html
    assert "lab.json: steps[2] is not a step record (None); not used" in html
    assert "lab.json: 'machine' is a str, not a mapping; not used" in unescape(html)
    assert experiments.read_results(lab_dir / "experiments/params") == {}  # what a later experiment reads: no crash
    (lab_dir / "lab.json").write_text("[" * 200000)
    assert main(["report", "--out", str(lab_dir), "--lang", lang]) == 0
    page = (lab_dir / ("report.html" if lang == "en" else "report.zh.html")).read_text(encoding="utf-8")
    assert "unreadable lab.json: " in page


# ------------------------------------------------------------------------------------ fuzzed records and files
FUZZ_EXAMPLES = {"records": 12, "files": 12}
SLOW_FUZZ_EXAMPLES = {"records": 150, "files": 150}


def _fuzz_numbers():
    from hypothesis import strategies as st

    return st.one_of(
        st.none(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**20), 10**20),
        st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e308, True, False, "1.0", "nan", [], {}]),
    )


def _fuzz_records():
    """Claim entries as a forger writes them: any margin, noise, seed count, verdict and p-value."""
    from hypothesis import strategies as st

    from poslab.lab.verdicts import VERDICTS

    record = st.fixed_dictionaries(
        {
            "margin": _fuzz_numbers(),
            "noise": _fuzz_numbers(),
            "n_seeds": st.one_of(st.integers(-3, 10), st.sampled_from([2.5, True, None, "3", 10**30])),
            "verdict": st.one_of(st.sampled_from(VERDICTS), st.text(max_size=8)),
            "details": st.one_of(st.fixed_dictionaries({"p_value": _fuzz_numbers()}), st.just([1]), st.just({})),
        }
    )
    return st.lists(record, min_size=1, max_size=8)


def _obeys_the_rule(entry: dict) -> bool:
    """Whether a decided verdict is what the rule gives for the entry's figures (written out here, apart from
    the code under test): finite numbers, a non-negative integer seed count of 0 or at least 3, and
    ``held``: margin > noise (margin >= 0 with no noise and no seeds); ``did not hold``: margin < -noise (< 0)."""
    import math

    def real(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    margin, noise, n = entry["margin"], entry["noise"], entry["n_seeds"]
    p = entry["details"].get("p_value") if isinstance(entry["details"], dict) else "not a mapping"
    if not real(margin) or not (noise is None or (real(noise) and noise >= 0)):
        return False
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or 0 < n < 3 or (noise is None and n > 0):
        return False
    if p is not None and not (real(p) and 0 <= p <= 1):
        return False
    if entry["verdict"] == "held":
        return margin > noise if noise is not None else margin >= 0
    return margin < -noise if noise is not None else margin < 0


def _badges(html: str, prefix: str) -> dict[str, str]:
    """Claim (starting with ``prefix``) -> the badge class of its row in the claims table."""
    rows = re.findall(
        r"<tr class='v-\w+'><td class='src'>(?:(?!</tr>).)*?<td><span class='d'>(" + prefix + r"\d+)</span>"
        r"(?:(?!</tr>).)*?<span class='badge (\w+)'>",
        html,
    )
    return dict(rows)


def _fuzz_forged_records(tmp_path_factory, slow: bool, request):
    from hypothesis import HealthCheck, given, settings

    counts = {"cases": 0, "records": 0, "decided_against_the_rule_shown": 0, "shown_unusable": 0, "tracebacks": 0}

    @settings(
        max_examples=(SLOW_FUZZ_EXAMPLES if slow else FUZZ_EXAMPLES)["records"],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(_fuzz_records())
    def check(entries):
        lab_dir = tmp_path_factory.mktemp("lab")
        (lab_dir / "experiments" / "forged").mkdir(parents=True)
        claims_ = [dict(e, claim=f"fz{i}", source="s", criterion="c", measured="m") for i, e in enumerate(entries)]
        (lab_dir / "experiments" / "forged" / "results.json").write_text(json.dumps({"claims": claims_}))
        counts["cases"] += 1
        try:
            html = build_report(lab_dir, lang="en").read_text(encoding="utf-8")
        except Exception:
            counts["tracebacks"] += 1
            raise
        shown = _badges(html, "fz")
        assert len(shown) == len(entries), (shown, entries)
        for i, entry in enumerate(entries):
            badge = shown[f"fz{i}"]
            counts["records"] += 1
            counts["shown_unusable"] += badge == "unusable"
            if badge in ("held", "wrong"):
                assert entry["verdict"] in ("held", "did not hold") and _obeys_the_rule(entry), (badge, entry)
            counts["decided_against_the_rule_shown"] += badge in ("held", "wrong") and not _obeys_the_rule(entry)

    check()
    from test_reliability_artifacts import mode, record

    record("report", mode(request), counts)


def test_fuzzed_claim_records_are_never_shown_decided_against_the_rule(tmp_path_factory, request):
    _fuzz_forged_records(tmp_path_factory, slow=False, request=request)


@pytest.mark.slow
def test_fuzzed_claim_records_at_length(tmp_path_factory, request):
    _fuzz_forged_records(tmp_path_factory, slow=True, request=request)


def _json_values():
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6))
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=12,
    )


def _lab_file_text():
    """What a lab file may hold: JSON of any shape (the keys the page reads included), text that is no JSON,
    nesting far past any parser's recursion limit, bytes that are no UTF-8."""
    from hypothesis import strategies as st

    page_keys = st.fixed_dictionaries(
        {},
        optional={
            "steps": _json_values(),
            "machine": _json_values(),
            "mode": _json_values(),
            "claims": _json_values(),
            "description": _json_values(),
            "heads": _json_values(),
            "counts": _json_values(),
        },
    )
    return st.one_of(
        (page_keys | _json_values()).map(json.dumps),
        st.integers(101, 300_000).map(lambda n: "[" * n),
        st.integers(101, 5_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
        st.text(max_size=20),
        st.just("\udcff").map(lambda _: b"\xff\xfe{"),
    )


def _fuzz_lab_files(tmp_path_factory, slow: bool, request):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    counts = {"cases": 0, "files_written": 0, "unreadable_named": 0, "tracebacks": 0}
    folders = ["experiments/params", "experiments/shapes", TANG_HEADS, "other"]

    @settings(
        max_examples=(SLOW_FUZZ_EXAMPLES if slow else FUZZ_EXAMPLES)["files"],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.dictionaries(st.sampled_from(["lab.json", *[f + "/results.json" for f in folders]]), _lab_file_text()),
        st.lists(st.tuples(st.sampled_from(folders), st.booleans()), max_size=3),
        st.sampled_from(["en", "zh"]),
    )
    def check(files, pngs, lang):
        lab_dir = tmp_path_factory.mktemp("lab")
        for name, text in files.items():
            path = lab_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        for i, (folder, as_folder) in enumerate(pngs):  # a folder named like a figure, or an empty "figure"
            path = lab_dir / folder / f"f{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir() if as_folder else path.write_bytes(b"")
        counts["cases"] += 1
        counts["files_written"] += len(files) + len(pngs)
        try:
            html = unescape(build_report(lab_dir, lang=lang).read_text(encoding="utf-8"))
        except Exception:
            counts["tracebacks"] += 1
            raise
        for name, text in files.items():
            if isinstance(text, bytes) or text.startswith("[" * 101) or text.startswith('{"a":' * 101):
                assert f"unreadable {name}: " in html, name  # the page names the file it could not read
                counts["unreadable_named"] += 1

    check()
    from test_reliability_artifacts import mode, record

    record("report", mode(request), counts)


def test_fuzzed_lab_files_give_a_page_naming_what_it_could_not_read(tmp_path_factory, request):
    _fuzz_lab_files(tmp_path_factory, slow=False, request=request)


@pytest.mark.slow
def test_fuzzed_lab_files_at_length(tmp_path_factory, request):
    _fuzz_lab_files(tmp_path_factory, slow=True, request=request)


def test_the_page_states_how_many_testable_seeded_claims_were_decided():
    """The share counts the lesson's seeded claims on premise-meeting models (held, did not hold, inconclusive):
    not the deterministic ones, not the untestable ones, not the source-decided ones."""
    from poslab.lab.report.builder import decided_share

    kinds = [("held", 3), ("wrong", 3), ("inconclusive", 5), ("untestable", 3), ("held", 0), ("cited-held", 0)]
    assert decided_share(kinds) == (2, 3)
    assert decided_share([]) == (0, 0)
