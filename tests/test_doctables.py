"""The docs' generated tables agree with the committed snapshot of the quick lab's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poslab.lab import doctables

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = json.loads((ROOT / doctables.SNAPSHOT).read_text(encoding="utf-8"))
EXPECTED = {
    "lab.md": {"lab-summary", "lab-verdicts"},
    "extrapolation.md": {"extrapolation-verdicts", "context-extension-verdicts", "attention-entropy-verdicts"},
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
    assert "| all | | 1 min 01 s | 2 min 05 s |" in summary
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in doctables.DOCS:
        (docs / name).write_text("x\n<!-- generated: lab-summary -->\nstale\n<!-- end -->\n", encoding="utf-8")
    args = ["--results", str(lab_dir), "--snapshot", str(tmp_path / "s.json"), "--docs", str(docs)]
    assert doctables.main([*args, "--check"]) == 1 and "lab-summary" in capsys.readouterr().out
    assert doctables.main([*args, "--write"]) == 0
    assert doctables.main(["--snapshot", str(tmp_path / "s.json"), "--docs", str(docs), "--check"]) == 0
    assert doctables.main(["--results", str(tmp_path), "--docs", str(docs), "--check"]) == 2
    assert "has no lab.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        doctables.update("<!-- generated: nope -->\n<!-- end -->", snap)
