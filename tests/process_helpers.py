"""Helpers of the tests that drive real ``python -m poslab`` processes (trainings, sweeps, the lab)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a training that runs until it is stopped, logging every step
LONG = ["--max_steps", "100000", "--ckpt_interval", "100000", "--eval_interval", "100000", "--log_interval", "1"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def _checkpoints(run_dir: Path) -> list[str]:
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".safetensors") if folder.is_dir() else []


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status and "\nState:\tX" not in status


def _record_sweep_lab(request, **figures: int) -> None:
    """Add a passing test's figures to ``test-artifacts/reliability.json`` (the reliability table)."""
    from test_reliability_artifacts import mode, record

    record("sweep_lab", mode(request), figures)
