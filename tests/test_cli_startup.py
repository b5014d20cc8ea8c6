"""The command line's start-up: a command imports its own module, not every command's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: modules the lab and the explorer import (scipy.stats alone is most of a second) that ``poslab train`` does not use
LAB_ONLY = ("poslab.lab.experiments", "poslab.explore.server", "scipy.stats")


def _imported_after(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {LAB_ONLY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(proc.stdout.split())


def test_train_parser_imports_no_lab_module() -> None:
    assert _imported_after("from poslab.cli.app import build_parser\nbuild_parser('train')") == set()


def test_the_whole_parser_still_has_every_command() -> None:
    from poslab.cli.app import COMMANDS, build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert sorted(sub.choices) == sorted(m.rpartition(".")[2] for m in COMMANDS)
    (train_only,) = [a for a in build_parser("train")._actions if a.dest == "command"]
    assert list(train_only.choices) == ["train"]
    (unknown,) = [a for a in build_parser("trian")._actions if a.dest == "command"]
    assert len(unknown.choices) == len(COMMANDS)  # a misspelt command gets the whole list in its error
