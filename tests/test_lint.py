"""The code style the project states is the code style CI enforces: ``ruff check`` (line length 120
included) and ``ruff format --check`` over the whole repository, as ``make lint`` runs them."""

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


@pytest.mark.parametrize(
    "entry",
    [
        "poslab.nn.attention.core:attend",
        "poslab.nn.attention.module:MultiHeadAttention.__init__",
        "poslab.nn.generate:sample_text",
        "poslab.training.loop:run_training",
        "poslab.lab.scale:train_config",
    ],
)
def test_entry_points_take_at_most_eight_parameters(entry: str) -> None:
    """The style rule ruff does not check (about 8 parameters), on the entry points a newcomer calls first
    (attention, sampling, the training loop, a lab model's config; the lab's seeded tests: test_verdicts.py)."""
    import importlib
    import inspect

    module, name = entry.split(":")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    params = [p for p in inspect.signature(target).parameters if p != "self"]
    assert len(params) <= 8, f"{name} takes {len(params)} parameters: {params}"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_is_clean(command):
    done = subprocess.run([*_ruff(), *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
