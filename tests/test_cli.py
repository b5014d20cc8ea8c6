"""The ``poslab`` command line as a user runs it: ``python -m poslab`` and the console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _console_script() -> str:
    """The ``poslab`` script installed next to this interpreter (the venv's ``bin``), else on PATH."""
    beside = Path(sys.executable).parent / "poslab"
    if beside.is_file():
        return str(beside)
    found = shutil.which("poslab")
    if found is None:
        pytest.fail("the `poslab` console script is not installed (pip install -e .)")
    return found


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, encoding="utf-8", env=env, timeout=300)


def test_python_m_poslab_experiment_params_writes_results(tmp_path):
    out = tmp_path / "params-out"
    proc = _run([sys.executable, "-m", "poslab", "experiment", "params", "--out", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "262,656" in proc.stdout and "1,050,624" in proc.stdout and "3168" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["seed000_one_linear_512"] == 262_656
    assert results["seed001_qkv_params_by_heads"]["8"] == 3168
    assert f"results in {out / 'results.json'}" in proc.stdout


def test_console_script_list(tmp_path):
    proc = _run([_console_script(), "experiment", "list"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    lesson = ["params", "shapes", "rope-relative", "permutation", "causal-leak", "frequencies"]
    assert [name for name in listed if name in lesson] == lesson
    assert listed[-1] == "all"
    assert not list(tmp_path.iterdir())  # listing writes nothing


def test_console_script_default_out_folder(tmp_path):
    proc = _run([_console_script(), "experiment", "shapes"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "runs" / "experiments" / "shapes" / "results.json").read_text())
    assert results["seed001_walk"]["scores"] == [1, 4, 5, 5]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["experiment", "nope"], "poslab: error: unknown experiment 'nope'; known: params, shapes"),
        (["experiment"], "poslab: error: the following arguments are required: name"),
    ],
)
def test_bad_experiment_is_one_line_exit_2(tmp_path, argv, message):
    proc = _run([_console_script(), *argv], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr + proc.stdout


def test_out_that_is_a_file_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "results-file"
    blocker.write_text("a user's file\n")
    proc = _run([sys.executable, "-m", "poslab", "experiment", "params", "--out", str(blocker)], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("poslab: error:")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert blocker.read_text() == "a user's file\n"  # nothing the user made is lost
