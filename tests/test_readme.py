"""The README's examples run as written, and its links and commands point at what exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from poslab.lab.experiments import registry

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_python_example_runs() -> None:
    blocks = _blocks("python")
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102


def test_the_two_commands_are_there() -> None:
    """CI and newcomers rely on these two lines."""
    assert re.search(r"^make demo\b", README, flags=re.M)
    assert re.search(r"^make test\b", README, flags=re.M)


def test_every_experiment_named_exists() -> None:
    names = re.findall(r"poslab experiment ([a-z][a-z0-9-]*)", README)
    assert names
    known = set(registry()) | {"all", "list"}
    assert set(names) <= known, set(names) - known


def test_lab_command_options_exist() -> None:
    """The lab example's options are the CLI's (``poslab lab --help`` lists them)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "poslab", "lab", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    for line in (b for block in _blocks("bash") for b in block.splitlines() if b.startswith("poslab lab")):
        for option in re.findall(r"(--[a-z-]+)", line.split("#")[0]):
            assert option in help_text, (line, option)


def test_every_local_link_exists() -> None:
    links = [target for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) if "://" not in target]
    assert links
    missing = [target for target in links if not (ROOT / target).exists()]
    assert not missing, missing


def test_reliability_bad_input_scaling_are_one_link_each() -> None:
    for doc in ("docs/reliability.md", "docs/bad_input.md", "docs/scaling.md", "docs/positions.md"):
        assert f"]({doc})" in README, doc
