"""The docs' generated tables agree with the committed snapshot of the quick lab's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from poslab.lab import doctables
from poslab.lab.experiments import descriptions

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = json.loads((ROOT / doctables.SNAPSHOT).read_text(encoding="utf-8"))
EXPECTED = {
    "lab.md": {"lab-summary", "lab-verdicts"},
    "extrapolation.md": {"extrapolation-verdicts", "context-extension-verdicts", "attention-entropy-verdicts"},
    "experiments.md": {"quick-lm-premises", "probes-accuracy", "probes-verdicts"},
    "zh/lesson_000.md": {
        "zh-way-in",
        "zh-extrapolation",
        "zh-position-training",
        "zh-attention-entropy",
        "zh-context-extension",
        "zh-probes",
    },
    "zh/lesson_001.md": {"zh-way-in", "zh-heads", "zh-position-training"},
    "zh/lesson_002.md": {"zh-way-in", "zh-position-training", "zh-heads", "zh-head-analysis"},
    "zh/README.md": {"zh-way-in"},
}


@pytest.mark.parametrize("name", doctables.DOCS)
def test_doc_blocks_equal_the_rendering_of_the_snapshot(name):
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert {m.group(2) for m in doctables.BLOCK.finditer(text)} == EXPECTED[name]
    assert doctables.differences(text, SNAPSHOT) == [], (
        f"docs/{name} differs from {doctables.SNAPSHOT}: run `python -m poslab.lab.doctables --write`"
    )


def test_a_changed_verdict_is_caught_and_both_docs_share_it():
    changed = json.loads(json.dumps(SNAPSHOT))
    record = next(c for c in changed["claims"] if c["experiment"] == "experiments/extrapolation")
    record["kind"] = "held" if record["kind"] != "held" else "wrong"
    lab = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    extrapolation = (ROOT / "docs" / "extrapolation.md").read_text(encoding="utf-8")
    assert doctables.differences(lab, changed) == ["lab-summary", "lab-verdicts"]
    assert doctables.differences(extrapolation, changed) == ["extrapolation-verdicts"]
    assert doctables.differences(doctables.update(lab, changed), changed) == []


def test_snapshot_of_a_lab_folder_and_the_command(tmp_path, capsys):
    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    (lab_dir / "lab.json").write_text(
        json.dumps(
            {
                "mode": "quick",
                "command": "poslab lab --quick",
                "seconds": 61.0,
                "steps": [{"name": "params", "status": "ok", "seconds": 3.0, "cpu_seconds": 125.0}],
            }
        )
    )
    snap = doctables.snapshot(lab_dir)
    assert snap["steps"] == [{"name": "params", "status": "ok", "seconds": 3.0, "cpu_seconds": 125.0}]
    assert all(c["kind"] in doctables.KIND_NAMES for c in snap["claims"])
    summary = doctables.render(snap, "lab-summary")
    assert "1 min 01 s wall" in summary and "| params | ok | 3 s | 2 min 05 s |" in summary
    assert "| all |  | 1 min 01 s | 2 min 05 s |" in summary
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in doctables.DOCS:
        (docs / name).parent.mkdir(exist_ok=True)
        (docs / name).write_text("x\n<!-- generated: lab-summary -->\nstale\n<!-- end -->\n", encoding="utf-8")
    args = ["--results", str(lab_dir), "--snapshot", str(tmp_path / "s.json"), "--docs", str(docs)]
    assert doctables.main([*args, "--check"]) == 1 and "lab-summary" in capsys.readouterr().out
    assert doctables.main([*args, "--write"]) == 0
    assert doctables.main(["--snapshot", str(tmp_path / "s.json"), "--docs", str(docs), "--check"]) == 0
    assert doctables.main(["--results", str(tmp_path), "--docs", str(docs), "--check"]) == 2
    assert "has no lab.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        doctables.update("<!-- generated: nope -->\n<!-- end -->", snap)


def _lab_with_training(tmp_path: Path) -> Path:
    """A lab folder holding a position-training and a probes results.json of known numbers."""
    lab_dir = tmp_path / "lab"
    for folder, results in {
        "position-training": {
            "corpus": "shakespeare",
            "ngram_baselines": {"unigram": 3.3, "bigram": 2.5, "trigram": 2.0},
            "runs": {
                # 16-position curves: positions 1-4 at 3.0, the last quarter at 2.8 (gain 0.2) or 2.95 (gain 0.05)
                "rope": [{"val_loss_all": v, "loss_by_position": [3.5] + [3.0] * 11 + [2.8] * 4} for v in (1.7, 1.8)],
                "none": [{"val_loss_all": 2.46, "loss_by_position": [3.5] + [3.0] * 11 + [2.95] * 4}],
                "learned": [{"val_loss_all": 1.9, "loss_by_position": [3.0, 2.0, 2.0, 2.0]}],  # too short to judge
            },
        },
        "probes": {
            "accuracy": {"reverse": {"rope": {"accuracy": {"1": [1.0, 0.8], "2": [0.2, 0.4]}}}},
            "heads_mqar": {"4": [0.9, 1.0], "1": [0.5, 0.7]},
        },
    }.items():
        (lab_dir / "experiments" / folder).mkdir(parents=True)
        (lab_dir / "experiments" / folder / "results.json").write_text(json.dumps(results))
    (lab_dir / "lab.json").write_text(json.dumps({"mode": "quick", "seconds": 1.0, "steps": []}))
    return lab_dir


def test_language_model_premises_are_rendered_from_the_runs(tmp_path):
    snap = doctables.snapshot(_lab_with_training(tmp_path))
    text = doctables.render(snap, "quick-lm-premises")
    assert "bigram premise (≤ 2.450)" in text and "context premise (≥ 0.1)" in text
    assert "| rope | 1.700, 1.800 | 0.200, 0.200 | met | met |" in text
    # 2.46 is above bigram - 0.05 and a gain of 0.05 is below the margin
    assert "| none | 2.460 | 0.050 | not met | not met |" in text
    assert "| learned | 1.900 | — | met | not met |" in text
    assert "bigram 2.500, trigram 2.000" in text


def test_probe_tables_are_rendered_from_the_results(tmp_path):
    text = doctables.render(doctables.snapshot(_lab_with_training(tmp_path)), "probes-accuracy")
    assert "| reverse: scheme | 1L | 2L |" in text
    assert "| rope | 0.900 ± 0.141 | 0.300 ± 0.141 |" in text
    assert text.index("| 1 | 0.500, 0.700 | 0.600 ± 0.141 |") < text.index("| 4 | 0.900, 1.000 | 0.950 ± 0.071 |")


def test_a_snapshot_missing_a_field_fails_naming_the_block(tmp_path, capsys):
    snap = json.loads(json.dumps(SNAPSHOT))
    for step in snap["steps"]:
        step["state"] = step.pop("status")
    (tmp_path / "s.json").write_text(json.dumps(snap), encoding="utf-8")
    assert doctables.main(["--snapshot", str(tmp_path / "s.json"), "--docs", str(ROOT / "docs"), "--check"]) == 2
    assert capsys.readouterr().err == (
        "doctables: error: block 'lab-summary' cannot be rendered: the snapshot has no field 'status'\n"
    )


def test_a_deterministic_step_reruns_into_the_snapshot_in_place(tmp_path):
    stale = json.loads(json.dumps(SNAPSHOT))
    zoo = [i for i, c in enumerate(stale["claims"]) if c["experiment"] == "experiments/model-zoo"]
    stale["claims"][zoo[0]] = dict(stale["claims"][zoo[0]], verdict="did not hold", kind="wrong", claim="stale")
    fresh = doctables.rerun(stale, "model-zoo", tmp_path)
    assert fresh["claims"] == SNAPSHOT["claims"]  # the committed snapshot is what the step computes today
    assert (tmp_path / "model-zoo" / "results.json").is_file()
    assert fresh["steps"] == SNAPSHOT["steps"] and fresh["language_models"] == SNAPSHOT["language_models"]
    with pytest.raises(ValueError, match="only the deterministic steps"):
        doctables.rerun(stale, "position-training", tmp_path)


# ------------------------------------------------------------------ the Chinese guides' reference values
def test_reference_values_carry_the_snapshot_and_a_prediction_interval():
    lm = SNAPSHOT["language_models"]
    text = doctables.render(SNAPSHOT, "zh-position-training")
    for scheme, arm in lm["arms"].items():
        losses = arm["loss"]
        mean = sum(losses) / len(losses)
        sd = (sum((v - mean) ** 2 for v in losses) / (len(losses) - 1)) ** 0.5
        half = stats.t.ppf(0.975, len(losses) - 1) * sd * (1 + 1 / len(losses)) ** 0.5
        row = f"| {scheme} | {', '.join(f'{v:.3f}' for v in losses)} | {mean:.3f} ± {sd:.3f} "
        assert row + f"| {mean - half:.3f} – {mean + half:.3f} |" in text, scheme
    assert f"基线 {lm['baselines']['bigram']:.3f}" in text


def test_claim_figures_follow_the_measured_texts():
    changed = json.loads(json.dumps(SNAPSHOT))
    heads = [c for c in changed["claims"] if c["experiment"] == "experiments/heads"]
    assert heads, "the snapshot has heads claims"
    heads[0]["measured"] = (
        "1 heads: 2.500 ± 0.010 (n=3), 2 heads: 2.400 ± 0.000 (n=3); the 1.15 bound 1.150 ± 0.000 (n=3)"
    )
    text = doctables.render(changed, "zh-heads")
    half = stats.t.ppf(0.975, 2) * 0.010 * (4 / 3) ** 0.5
    assert f"| 1 heads | 2.500 ± 0.010 | 3 | {2.5 - half:.3f} – {2.5 + half:.3f} |" in text
    assert "| 2 heads | 2.400 ± 0.000 | 3 | — |" in text and "bound" not in text
    assert doctables.differences((ROOT / "docs/zh/lesson_001.md").read_text(encoding="utf-8"), changed) == ["zh-heads"]


def test_the_way_in_gives_the_snapshot_times():
    text = doctables.render(SNAPSHOT, "zh-way-in")
    untrained = [n for n, e in descriptions().items() if e.in_all]
    total = sum(s["seconds"] for s in SNAPSHOT["steps"] if s["name"] in untrained)
    minutes, seconds = divmod(round(SNAPSHOT["seconds"]), 60)
    assert f"合计 {round(total)} 秒" in text and f"{minutes} 分 {seconds:02d} 秒" in text
    assert text.index("poslab experiment all") < text.index("笔记本") < text.index("make demo")


def test_timing_from_an_earlier_snapshot_is_said_in_the_summary(tmp_path):
    from poslab.lab import doctables

    snap = json.loads(doctables.SNAPSHOT.read_text(encoding="utf-8"))
    later = {**snap, "seconds": 3858.3, "steps": [dict(s, seconds=s["seconds"] * 2) for s in snap["steps"]]}
    merged = doctables.with_timing(later, snap)
    assert merged["seconds"] == snap["seconds"] and merged["steps"] == snap["steps"]
    assert merged["claims"] == later["claims"]
    summary = doctables.render(merged, "lab-summary")
    assert "earlier quick lab of the same trainings" in summary and "64 min 18 s" in summary
    with pytest.raises(ValueError, match="cannot stand for"):
        doctables.with_timing(later, {**snap, "mode": "full"})
