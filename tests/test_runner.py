"""``poslab.jobs.runner``: shards, the executor the command line installs, Ray's absence, the local pool's
ties to its parent; ``poslab sweep --shard``: N shards and a collecting call equal one unsharded sweep;
a SIGKILLed ``poslab lab`` takes its training step down with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from poslab.cli.app import main
from poslab.jobs import runner

SPEC = """\
name: shard-grid
preset: tiny
overrides:
  corpus: {corpus}
  max_steps: 4
  lr_decay_steps: 4
  warmup_steps: 1
  eval_interval: 2
  eval_iters: 2
  log_interval: 2
  ckpt_interval: 2
  keep_checkpoints: 0
  batch_size: 4
  threads: 1
  model:
    n_layer: 1
grid:
  model.position: [learned, rope]
  seed: [1]
"""


# ------------------------------------------------------------------------------------------ shards
def test_shards_are_disjoint_and_cover_everything():
    items = list(range(11))
    for count in (1, 2, 3, 4, 11, 12):
        parts = [runner.select_shard(items, (i, count)) for i in range(1, count + 1)]
        assert sorted(x for part in parts for x in part) == items  # every item once
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert runner.select_shard(items, None) == items
    assert runner.parse_shard("2/8") == (2, 8)


@pytest.mark.parametrize("text", ["0/4", "5/4", "1", "a/b", "1/0", "-1/3", "1/2/3"])
def test_bad_shards_are_refused_naming_the_value(text):
    with pytest.raises(ValueError, match=rf"--shard must be i/N with 1 <= i <= N .*got '{text}'"):
        runner.parse_shard(text)


def test_n_shards_then_a_collecting_call_equal_one_sweep(tmp_path, corpus, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text(SPEC.format(corpus=corpus), encoding="utf-8")
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    assert main(["sweep", str(path), "--workers", "2", "--out", str(whole)]) == 0
    for i in (1, 2):
        assert main(["sweep", str(path), "--shard", f"{i}/2", "--out", str(sharded)]) == 0
        assert not (sharded / "summary.json").exists()  # a shard writes no summary
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(sharded)]) == 0  # collects: nothing left to train
    assert "2 runs (2 finished before, 0 to resume, 0 new)" in capsys.readouterr().out
    a = json.loads((whole / "summary.json").read_text())
    b = json.loads((sharded / "summary.json").read_text())
    assert [c["final_val_loss"] for c in a["configs"]] == [c["final_val_loss"] for c in b["configs"]]
    assert [(r["name"], r["status"], r["final_val_loss"], r["steps"]) for r in a["runs"]] == [
        (r["name"], r["status"], r["final_val_loss"], r["steps"]) for r in b["runs"]
    ]
    assert b["status"] == {"completed": 2}


def test_dry_run_lists_only_the_shard(tmp_path, corpus, capsys):
    path = tmp_path / "grid.yaml"
    path.write_text(SPEC.format(corpus=corpus), encoding="utf-8")
    assert main(["sweep", str(path), "--shard", "2/2", "--dry-run", "--out", str(tmp_path / "s")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in lines[:-1]] == ["position=rope,seed=1"]
    assert main(["sweep", str(path), "--shard", "3/2", "--out", str(tmp_path / "s")]) == 2
    assert "--shard must be i/N with 1 <= i <= N (e.g. 1/4 ... 4/4), got '3/2'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ executors
def test_the_executor_the_command_line_installs(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(runner.CLUSTER_ENV, raising=False)
    assert runner.executor_for(None) is None and runner.executor_for("local") is None
    assert isinstance(runner.current_executor(), runner.LocalExecutor)
    with pytest.raises(ValueError, match="--cluster must be one of local, ray, got 'slurm'"):
        runner.executor_for("slurm")
    with pytest.raises(ValueError, match="--ray-address 'h:1' needs --cluster ray"):
        runner.executor_for("local", "h:1")
    marker = runner.LocalExecutor(1)
    with runner.use_executor(marker):
        assert runner.current_executor() is marker
        assert runner.train_many([runner.Task("a", pow, (3, 2))]) == [9]
    assert runner.current_executor() is not marker
    monkeypatch.setenv(runner.CLUSTER_ENV, "ray")  # what `poslab lab --cluster ray` passes to its steps
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    executor = runner.executor_for(None)
    assert isinstance(executor, runner.RayExecutor) and executor.address == "10.0.0.1:6379"


def test_without_ray_cluster_ray_is_one_line_naming_the_extra(monkeypatch, tmp_path, corpus, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    path = tmp_path / "grid.yaml"
    path.write_text(SPEC.format(corpus=corpus), encoding="utf-8")
    assert main(["sweep", str(path), "--cluster", "ray", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["poslab: error: --cluster ray needs Ray, which is not installed: pip install 'poslab[ray]'"]
    assert not (tmp_path / "s").exists()


def test_train_many_keeps_the_order_on_the_local_pool():
    tasks = [runner.Task(f"t{i}", pow, (i, 3)) for i in range(4)]
    done = []
    assert runner.train_many(tasks, workers=2, on_done=lambda t, r: done.append(t.label)) == [0, 1, 8, 27]
    assert sorted(done) == ["t0", "t1", "t2", "t3"]
    with pytest.raises(ValueError, match="workers must be a positive integer, got 0"):
        runner.train_many(tasks, workers=0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.slow  # 16 s of real lab and training processes; the fast sibling: test_a_pool_worker_dies_with_its_parent
def test_sigkill_of_the_lab_stops_its_training_step(tmp_path):
    """``poslab lab --only tang-heads``: its training gets SIGTERM from the kernel and stops.

    (Its output pipe led to the dead lab, so it cannot report; whether it saves on the way out is
    not asserted here: ``tests/test_stop.py`` checks the save where output goes to a log.)
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    lab = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "poslab",
            "lab",
            "--quick",
            "--only",
            "tang-heads",
            "--out",
            str(tmp_path / "lab"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = tmp_path / "lab" / "experiments" / "tang-heads" / "runs"
    lock, metrics = runs / ".tang-small-quick.lock", runs / "tang-small-quick" / "metrics.jsonl"
    trainer = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
            assert lab.poll() is None, "the lab ended before its training started"
            time.sleep(0.2)
        trainer = int(lock.read_text().split()[1])  # "pid N on HOST"
        assert _alive(trainer)
        lab.kill()
        lab.wait(timeout=30)
        deadline = time.monotonic() + 120
        while _alive(trainer) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(trainer), "the training outlived the lab (an orphan)"
    finally:
        if lab.poll() is None:
            lab.kill()
        if trainer is not None and _alive(trainer):
            os.kill(trainer, signal.SIGKILL)


def test_a_pool_worker_dies_with_its_parent(tmp_path):
    """:func:`runner.die_with_parent` in a grandchild: SIGKILL of its parent reaches it as SIGTERM."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'from poslab.jobs import runner; runner.die_with_parent(); "
        'import time; print("armed", flush=True); time.sleep(300)\'], stdout=subprocess.PIPE, text=True)\n'
        "child.stdout.readline()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n",
        encoding="utf-8",
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive
