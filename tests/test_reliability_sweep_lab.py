"""Reliability of the long-running commands (issue 16 items 5-6): sweeps and the lab, interrupted and rerun.

* the lab continues an interrupted training from its checkpoint instead of deleting it;
* ``poslab lab --only STEP`` exits 0 when that step succeeds;
* killing a sweep (SIGTERM, SIGHUP, SIGKILL) stops the trainings it started, and a rerun waits for a
  run that is still in use instead of failing it;
* SIGTERM to ``poslab train`` saves a final checkpoint, as Ctrl-C does.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poslab.cli.app import main
from poslab.lab import lab

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ the lab
def fake_training(lab_dir: Path, folder: str) -> lab.Step:
    """A "train" step: the first run writes a checkpoint and is interrupted (exit 130); a resumed run finishes.

    Every invocation appends its arguments to ``FOLDER.calls`` next to the lab folder.
    """
    out = lab_dir / folder
    calls = lab_dir.parent / "train.calls"
    code = (
        "import json, pathlib, sys\n"
        f"out = pathlib.Path({str(out)!r}); calls = pathlib.Path({str(calls)!r})\n"
        "calls.write_text((calls.read_text() if calls.exists() else '') + json.dumps(sys.argv[1:]) + '\\n')\n"
        "ckpt = out / 'checkpoints' / 'step_000010.json'\n"
        "if '--resume' not in sys.argv:\n"
        "    out.mkdir(parents=True, exist_ok=True); (out / 'config.json').write_text('{}')\n"
        "    ckpt.parent.mkdir(exist_ok=True); ckpt.write_text('{\"step\": 10}')\n"
        "    sys.exit(130)  # interrupted after its checkpoint\n"
        "assert ckpt.read_text() == '{\"step\": 10}', 'the checkpoint was lost'\n"
        "(out / 'results.json').write_text(json.dumps({'status': 'completed', 'resumed_from': 10}))\n"
    )
    return lab.Step("train fake", "train", folder, [], command=[sys.executable, "-c", code], resume=["--resume"])


def calls_of(lab_dir: Path) -> list[list[str]]:
    path = lab_dir.parent / "train.calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_lab_resumes_an_interrupted_training_instead_of_deleting_it(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [fake_training(lab_dir, "runs/fake")])
    manifest = lab.run_lab(lab_dir, "quick", stream=io.StringIO())
    assert manifest["steps"][0]["status"] == "failed" and manifest["steps"][0]["exit_code"] == 130
    assert (lab_dir / "runs/fake/checkpoints/step_000010.json").is_file()

    stream = io.StringIO()
    manifest = lab.run_lab(lab_dir, "quick", stream=stream)  # old code: rmtree(runs/fake), start again
    assert manifest["steps"][0]["status"] == "ok", manifest["steps"][0]
    assert calls_of(lab_dir)[-1] == ["--resume"]
    assert json.loads((lab_dir / "runs/fake/results.json").read_text())["resumed_from"] == 10
    assert "continuing the interrupted run in runs/fake" in stream.getvalue()
    log = (lab_dir / "logs" / "runs_fake.log").read_text()
    assert log.count("$ ") == 2 and log.rstrip().endswith("--resume")  # the log keeps the interrupted run's part


def test_lab_fresh_still_starts_the_training_again(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [fake_training(lab_dir, "runs/fake")])
    lab.run_lab(lab_dir, "quick", stream=io.StringIO())
    manifest = lab.run_lab(lab_dir, "quick", fresh=True, stream=io.StringIO())
    assert calls_of(lab_dir) == [[], []]  # no --resume: cleaned and started again (and interrupted again)
    assert manifest["steps"][0]["status"] == "failed"


def test_lab_only_exits_0_when_the_step_succeeds(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    code = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True); (p / 'results.json').write_text('{}')"

    def fake_plan(lab_dir_arg: Path, mode: str) -> list[lab.Step]:
        return [lab.Step(name, "experiment", f"experiments/{name}", [],
                         command=[sys.executable, "-c", code, str(lab_dir_arg / "experiments" / name)])
                for name in ("one", "two")]

    monkeypatch.setattr(lab, "plan", fake_plan)
    assert main(["lab", "--out", str(lab_dir), "--only", "two"]) == 0  # old code: 1 ("one" was not run)
    assert (lab_dir / "experiments/two/results.json").is_file() and not (lab_dir / "experiments/one").exists()
    assert main(["lab", "--out", str(lab_dir)]) == 0  # "one" runs, "two" is reused


def test_lab_only_exits_1_when_the_step_fails(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [
        lab.Step("bad", "experiment", "experiments/bad", [], command=[sys.executable, "-c", "raise SystemExit(3)"]),
        lab.Step("other", "experiment", "experiments/other", [], command=[sys.executable, "-c", "pass"])])
    assert main(["lab", "--out", str(lab_dir), "--only", "bad"]) == 1
