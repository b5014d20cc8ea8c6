"""``poslab sweep``: validation (one-line errors, exit 2), a 2 x 2 grid run 2 at a time, the summary, resume."""

from __future__ import annotations

import json
import statistics

import pytest

from poslab.cli.app import main
from poslab.jobs.sweep import load_plan, run_name_of
from poslab.training import checkpoint as ckpt

SPEC = """\
name: tiny-grid
description: two schemes x two seeds
preset: tiny
overrides:
  corpus: {corpus}
  max_steps: 6
  lr_decay_steps: 6
  warmup_steps: 2
  eval_interval: 3
  eval_iters: 2
  log_interval: 3
  ckpt_interval: 3
  keep_checkpoints: 0
  batch_size: 4
  model:
    n_layer: 1
grid:
  model.position: [learned, rope]
  seed: [1, 2]
"""


def write(tmp_path, text: str, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("poslab: error: ")
    return err[0]


@pytest.mark.parametrize(
    "text, message",
    [
        ("grid: [1, 2\n", "is not valid YAML (line 2"),
        ("- a\n- b\n", "must hold a mapping with a 'grid', got list"),
        ("preset: tiny\ngird:\n  seed: [1]\n", "unknown key 'gird' (did you mean 'grid'?)"),
        ("preset: tiny\n", "needs a non-empty 'grid'"),
        (
            "preset: tiny\ngrid:\n  model.positon: [rope]\n",
            "unknown training key 'model.positon' (did you mean 'model.position'?)",
        ),
        ("preset: tiny\ngrid:\n  seed: []\n", "grid entry 'seed' must be a non-empty list"),
        ("preset: tiny\ngrid:\n  seed: 3\n", "grid entry 'seed' must be a non-empty list"),
        ("preset: tiny\ngrid:\n  name: [a, b]\n", "'name' cannot be set in a sweep"),
        ("preset: tiny\ngrid:\n  model.position: [rope, nope]\n", "run position=nope"),
        ("preset: tiny\ngrid:\n  lr: [-1.0]\n", "run lr=-1.0: need lr > 0"),
        ("preset: tiny\noverrides:\n  max_step: 3\ngrid:\n  seed: [1]\n", "(did you mean 'max_steps'?)"),
        (
            "preset: tiny\ngrid:\n  model.position_config.bse: [100]\n  model.position: [rope]\n",
            "unknown config key 'bse'",
        ),
        ("preset: nope\ngrid:\n  seed: [1]\n", "unknown preset 'nope'"),
    ],
)
def test_bad_sweep_files_are_one_line_errors(tmp_path, capsys, text, message):
    assert main(["sweep", write(tmp_path, text), "--out", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert message in line, line
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_missing_file_and_bad_workers(tmp_path, capsys, corpus):
    assert main(["sweep", str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in one_error_line(capsys)
    path = write(tmp_path, SPEC.format(corpus=corpus))
    assert main(["sweep", path, "--workers", "0"]) == 2
    assert "--workers must be a positive integer, got 0" in one_error_line(capsys)


def test_plan_names_and_configs(tmp_path, corpus):
    plan = load_plan(write(tmp_path, SPEC.format(corpus=corpus)), tmp_path / "out")
    assert [r.name for r in plan.runs] == [
        "position=learned,seed=1",
        "position=learned,seed=2",
        "position=rope,seed=1",
        "position=rope,seed=2",
    ]
    rope = plan.runs[2].config
    assert rope["model"]["position"] == "rope" and rope["model"]["position_config"] == {}  # the scheme's defaults
    assert rope["model"]["n_layer"] == 1 and rope["seed"] == 1 and rope["max_steps"] == 6 and rope["corpus"] == corpus
    assert plan.group_keys == ["model.position"]
    assert (
        run_name_of({"model.position_config.base": 500.0, "corpus": "a/b c.txt"})
        == "position_config.base=500.0,corpus=a_b_c.txt"
    )


def test_tiny_grid_runs_two_at_a_time_summarises_and_resumes(tmp_path, capsys, corpus):
    path = write(tmp_path, SPEC.format(corpus=corpus))
    out = tmp_path / "sweep"
    assert main(["sweep", path, "--workers", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 runs (0 finished before, 0 to resume, 4 new), 2 at a time" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == {"completed": 4} and summary["group_by"] == ["model.position"]
    runs = {r["name"]: r for r in summary["runs"]}
    for name, run in runs.items():
        results = json.loads((out / "runs" / name / "results.json").read_text())
        assert results["status"] == "completed" and results["steps"] == 6
        assert run["final_val_loss"] == results["final_val_loss"]
        assert (out / "configs" / f"{name}.yaml").is_file() and (out / "logs" / f"{name}.log").is_file()
    # the seeds are different runs (different data order and initialisation)
    assert runs["position=rope,seed=1"]["final_val_loss"] != runs["position=rope,seed=2"]["final_val_loss"]
    assert [c["label"] for c in summary["configs"]] == ["position=learned", "position=rope"]
    for config in summary["configs"]:
        scheme = config["label"].split("=")[1]
        values = [runs[f"position={scheme},seed={s}"]["final_val_loss"] for s in (1, 2)]
        assert config["completed"] == 2 and config["seeds"] == [1, 2]
        assert config["final_val_loss"]["values"] == values
        assert config["final_val_loss"]["mean"] == pytest.approx(statistics.mean(values), abs=1e-12)
        assert config["final_val_loss"]["std"] == pytest.approx(statistics.stdev(values), abs=1e-12)
        speeds = [runs[f"position={scheme},seed={s}"]["tokens_per_s"] for s in (1, 2)]
        assert config["tokens_per_s"]["mean"] == pytest.approx(statistics.mean(speeds))
        assert f"| {config['label']} | 2/2 | {config['final_val_loss']['mean']:.4f} ± " in printed
    markdown = (out / "summary.md").read_text()
    assert "| position=rope | 2/2 |" in markdown and "two schemes x two seeds" in markdown

    # again: everything is finished, nothing runs
    stamp = (out / "runs" / "position=rope,seed=1" / "results.json").stat().st_mtime_ns
    assert main(["sweep", path, "--workers", "2", "--out", str(out)]) == 0
    assert "4 runs (4 finished before, 0 to resume, 0 new)" in capsys.readouterr().out
    assert (out / "runs" / "position=rope,seed=1" / "results.json").stat().st_mtime_ns == stamp

    # a run killed after its step-3 checkpoint: the next sweep resumes it, and only it
    cut = out / "runs" / "position=learned,seed=2"
    before = json.loads((cut / "results.json").read_text())
    for suffix in (".json", ".safetensors"):
        (cut / "checkpoints" / f"step_0000006{suffix}").unlink()
    ckpt.atomic_write_text(cut / "checkpoints" / "latest", "step_0000003\n")
    (cut / "results.json").unlink()
    assert main(["sweep", path, "--workers", "2", "--out", str(out), "--dry-run"]) == 0
    assert "resume    position=learned,seed=2" in capsys.readouterr().out
    assert main(["sweep", path, "--workers", "2", "--out", str(out)]) == 0
    assert "4 runs (3 finished before, 1 to resume, 0 new)" in capsys.readouterr().out
    after = json.loads((cut / "results.json").read_text())
    assert after["resumed_from"] == 3 and after["steps"] == 6
    assert after["final_val_loss"] == before["final_val_loss"]  # the resume continues the same run exactly


@pytest.mark.slow
def test_ctrl_c_stops_the_runs_with_a_checkpoint_and_the_sweep_continues(tmp_path, corpus):
    import signal
    import subprocess
    import sys
    import time

    spec = (
        SPEC.format(corpus=corpus)
        .replace("max_steps: 6", "max_steps: 3000")
        .replace("lr_decay_steps: 6", "lr_decay_steps: 3000")
    )
    spec = spec.replace("ckpt_interval: 3", "ckpt_interval: 1000").replace("eval_interval: 3", "eval_interval: 1000")
    spec = spec.replace("  seed: [1, 2]\n", "  seed: [1]\n")
    path = write(tmp_path, spec)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "poslab", "sweep", path, "--workers", "2", "--out", str(out)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = [out / "runs" / name / "metrics.jsonl" for name in ("position=learned,seed=1", "position=rope,seed=1")]
    deadline = time.time() + 300
    while time.time() < deadline and not all(m.is_file() and m.stat().st_size > 0 for m in metrics):
        time.sleep(1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 130, output
    assert "sweep interrupted; run the same command again to continue" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == {"interrupted": 2}, summary["status"]
    for name in ("position=learned,seed=1", "position=rope,seed=1"):
        step = ckpt.latest_step(out / "runs" / name)
        assert step is not None and 0 < step < 3000  # each training saved the step it was on
    done = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.stdout.count("resume ") == 2
