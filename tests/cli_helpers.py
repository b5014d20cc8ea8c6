"""Helpers of the command-line tests: the one error line, ``--resume`` and the refusal tallies.

The tallies feed docs/reliability.md's table: tests that use them name the ``hostile_figures`` or
``input_figures`` fixture of ``conftest.py``, which records the counts after each test.
"""

from __future__ import annotations

from pathlib import Path

from poslab.cli.app import main

#: ``poslab train`` of the tiny preset that checks and builds everything but trains nothing
DRY = ["train", "--preset", "tiny", "--dry-run"]
#: the ``hostile_inputs`` figures of the running test
HOSTILE: dict[str, int] = {}
#: the ``inputs`` figures of the running test
INPUTS: dict[str, int] = {}


def error_line(capsys) -> str:
    """The single ``poslab: error:`` line on stderr (fails on none or several)."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("poslab: error:")]
    assert len(err) == 1, err
    return err[0]


def resume(run: Path, *extra: str) -> int:
    """``poslab train --resume`` of the run folder ``run``."""
    return main(["train", "--resume", "--name", run.name, "--out_dir", str(run.parent), "--no-progress", *extra])


def resume_args(folder: Path) -> list[str]:
    return ["train", "--resume", "--name", folder.name, "--out_dir", str(folder.parent), "--no-progress"]


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Run ``poslab ARGV``: exit 2 with one ``poslab: error:`` line holding every needle."""
    assert main(argv) == 2
    line = error_line(capsys)
    for needle in needles:
        assert needle in line, line
    HOSTILE["cases"] += 1
    HOSTILE["refused_one_line"] += 1
    return line


def answered() -> None:
    HOSTILE["cases"] += 1
    HOSTILE["right_answer"] += 1


def tally(cases: int = 1, refused: int | None = None) -> None:
    """Count ``cases`` bad inputs of a test that passed its assertions (``refused`` of them refused)."""
    INPUTS["cases"] += cases
    INPUTS["refused_one_line"] += cases if refused is None else refused
