"""The lesson notebooks (``notebooks/*.py``, jupytext py:percent) execute from top to bottom.

Each notebook is converted to ``.ipynb`` in memory and run cell by cell in a fresh kernel by
``nbclient``, as ``jupyter nbconvert --execute`` would; a cell that raises fails the test with the
cell's traceback. The default run sets ``POSLAB_NOTEBOOK_SMALL=1`` (trainings of a few steps); the
slow run executes the notebooks at the settings a reader gets. The committed notebooks carry no
outputs: a notebook never shows a result it did not compute.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("lesson_*.py"))


def _execute(path: Path, tmp_path: Path, small: bool) -> object:
    """Run the notebook at ``path`` in a fresh kernel (cwd ``tmp_path``); the executed notebook."""
    notebook = jupytext.read(path)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        OMP_NUM_THREADS="1",
        POSLAB_NOTEBOOK_OUT=str(tmp_path / "out"),
        # the kernel's IPython history (a SQLite file under HOME by default) is this test's own:
        # pytest-xdist workers run notebooks at the same time
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    if small:
        env["POSLAB_NOTEBOOK_SMALL"] = "1"
    else:
        env.pop("POSLAB_NOTEBOOK_SMALL", None)
    client = nbclient.NotebookClient(
        notebook,
        timeout=1800 if not small else 300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)  # the kernel is started with this environment
    return notebook


def test_there_is_one_notebook_per_lesson() -> None:
    assert [p.name[:10] for p in NOTEBOOKS] == ["lesson_000", "lesson_001", "lesson_002"]


def test_no_ipynb_is_committed() -> None:
    """Only the jupytext sources are committed (``notebooks/*.ipynb`` is git-ignored): no stored outputs."""
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "notebooks"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert not [f for f in tracked.split() if f.endswith(".ipynb")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_source_has_no_outputs(path: Path) -> None:
    notebook = jupytext.read(path)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


def _check_ran(notebook: object) -> None:
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count for cell in code)  # every cell ran
    images = [out for cell in code for out in cell.outputs if "image/png" in out.get("data", {})]
    assert images, "the notebook drew no plot inline"
    errors = [out for cell in code for out in cell.outputs if out.get("output_type") == "error"]
    assert not errors


#: figures a guide attributes to its notebook ("笔记本 N 节") that do not depend on training: the notebook must print
#: each, and the guide must quote it
GUIDE_FIGURES = {
    "lesson_002_deep_dive": (
        "d_model=100 is not divisible by n_heads=3 (d_model must equal n_heads * d_k)",
        "[-1.000, 1.000]",
        "6.28",
        "47117",
        "62832",
        "51 of 64",
        "1,798,016",
        "1,781,632",
        "16,384 = 0.91%",
        "17,088,000",
        "16,563,712",
        "524,288 = 3.07%",
        "8.06",
        "0.808",
        "1.01",
        "0.111",
        "22.39",
        "0.99",
        "6.8e-02",
        "6.8e-07",
        "-4.2207",
        "10.14",
        "4.24",
    ),
}


def _printed(notebook: object) -> str:
    """Everything the notebook's cells printed."""
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    return "".join(out.get("text", "") for cell in code for out in cell.outputs if out.get("output_type") == "stream")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_small_settings(path: Path, tmp_path: Path) -> None:
    notebook = _execute(path, tmp_path, small=True)
    _check_ran(notebook)
    figures = GUIDE_FIGURES.get(path.stem, ())
    if figures:
        guide = (ROOT / "docs" / "zh" / f"{path.stem[:10]}.md").read_text(encoding="utf-8")
        printed = _printed(notebook)
        assert [f for f in figures if f not in printed] == []
        assert [f for f in figures if f not in guide] == []


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_reader_settings(path: Path, tmp_path: Path) -> None:
    _check_ran(_execute(path, tmp_path, small=False))
