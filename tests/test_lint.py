"""The code style the project states is the code style CI enforces: ``ruff check`` (line length 120 and
at most 8 parameters per function, PLR0913, included) and ``ruff format --check`` over the whole
repository, as ``make lint`` runs them; and the module sizes ruff does not check (the developers' guide's 700
lines for any module, docs/architecture.md's 400 for an experiment's)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it is in the test extra (pip install -e '.[test]')")
    return [found]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_is_clean(command):
    done = subprocess.run([*_ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def _too_long(folder: Path, limit: int) -> list[str]:
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(folder.rglob("*.py"))}
    return [f"{p.relative_to(ROOT)}: {n} lines" for p, n in sizes.items() if n > limit]


def test_no_module_is_over_700_lines_and_no_experiment_module_over_400():
    assert _too_long(ROOT / "poslab", 700) == []
    assert _too_long(ROOT / "poslab" / "lab" / "experiments", 400) == []
    assert len(list((ROOT / "poslab" / "lab" / "experiments").rglob("*.py"))) > 40  # the walk reads the modules
