"""``benchmarks/gpu_check.sh --dry-run``: the GPU check's CPU-safe parts run in the default suite so they cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures" / "gpu_check.json"
    # no GPU even where one exists: the dry run is the CPU path
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and report["env"]["device"] == "cpu"
    tests = report["cuda_tests"]
    # every CUDA test was collected (a broken test file would error here) and skipped without a GPU
    assert tests["ran"] and tests["errors"] == 0 and tests["failures"] == 0
    assert tests["tests"] > 50 and tests["skipped"] == tests["tests"]
    assert report["bf16_matmul_peak"]["best_flops"] > 0
    (gpt,) = report["gpt_rope"]
    assert "error" not in gpt, gpt
    assert gpt["finite"] and gpt["tokens_per_s"] > 0 and 0 < gpt["mfu"] < 1
    schemes = {row["scheme"]: row for row in report["bias_attention"]}
    assert set(schemes) == {"none", "alibi", "t5"}
    assert all("error" not in row and row["ms_median"] > 0 for row in schemes.values()), schemes
    assert schemes["none"]["vs_none"] == 1.0
    assert report["skipped_for_budget"] == []
    # step 3: a lab size of a training experiment through the lab's code (the smoke size on the CPU here)
    lab = json.loads((out.parent / "lab_gpu_size.json").read_text())["lab_gpu_size"]
    assert "error" not in lab, lab
    assert lab["experiment"] == "extrapolation" and lab["size"].startswith("gpu-check-cpu=smoke")
    assert [r["device"] for r in lab["runs"]] == ["cpu"] * 3 and all(r["tokens_per_s"] > 0 for r in lab["runs"])
    assert lab["verdicts"] and lab["full_size_train_s_from_measured_rate"] > 0
    # step 4: shakespeare-char-gpu against nanoGPT's GPU recipe through time_to_loss.py (2 steps each here)
    ttl = json.loads((out.parent / "time_to_loss_gpu.json").read_text())
    assert ttl["dry_run"] and ttl["recipe"] == "gpu" and ttl["preset"] == "shakespeare-char-gpu"
    assert ttl["target"] == 1.47 and ttl["nanogpt_recipe"]["d"] == 384
    assert [r["contender"] for r in ttl["rows"]] == ["nanoGPT", "poslab-gpu"]
    assert all(r["steps"] == 2 and r["final_val_loss"] > 0 for r in ttl["rows"])


def test_gpu_check_rejects_an_unknown_option(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--fast"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "unknown option '--fast'; allowed: --dry-run, --out FILE, --skip-time-to-loss" in proc.stderr


def test_gpu_check_without_cuda_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--out", str(tmp_path / "g.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no CUDA device visible to torch" in proc.stderr
