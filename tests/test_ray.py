"""Many trainings on Ray: a tiny sweep through a local Ray (2 CPUs) gives the local pool's summary.

One local Ray is started for the module (``ray.init(num_cpus=2)``, about 10 s). The slow test kills
one training by PID mid-run: Ray runs the task again, the training resumes from its last
checkpoint, and the final losses equal an uninterrupted sweep's bitwise.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray  # the extra poslab[ray]; `make test` installs it, so these tests run on every clone (no skip)

from poslab.cli.app import main
from poslab.jobs import runner
from poslab.jobs.ray_connect import RAY_TIMEOUT_ENV
from poslab.runs import read_metrics

SPEC = """\
name: ray-grid
preset: tiny
overrides:
  corpus: {corpus}
  max_steps: {steps}
  lr_decay_steps: {steps}
  warmup_steps: 2
  eval_interval: {eval_interval}
  eval_iters: 2
  log_interval: 1
  ckpt_interval: {ckpt}
  keep_checkpoints: 0
  batch_size: 4
  threads: 1
  model:
    n_layer: 1
grid:
  model.position: [learned, rope]
  seed: [1]
"""


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray with 2 CPUs for the module; the executors use it as it is (and leave it running)."""
    env = {"OMP_NUM_THREADS": "1"}
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def sweep_file(tmp_path: Path, corpus: str, steps: int = 6, ckpt: int = 3, eval_interval: int = 3) -> str:
    path = tmp_path / "grid.yaml"
    path.write_text(SPEC.format(corpus=corpus, steps=steps, ckpt=ckpt, eval_interval=eval_interval), encoding="utf-8")
    return str(path)


def summary_values(folder: Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    return {
        run["name"]: (run["status"], run["final_val_loss"], run["best_val_loss"], run["steps"])
        for run in summary["runs"]
    }


def test_train_many_on_ray_keeps_the_order_and_names_the_nodes(local_ray):
    executor = runner.RayExecutor()
    seen = []
    with runner.use_executor(executor):
        results = runner.train_many(
            [runner.Task(f"t{i}", pow, (i, 2)) for i in range(5)],
            on_done=lambda task, result: seen.append((task.label, result)),
        )
    assert results == [0, 1, 4, 9, 16]
    assert sorted(seen) == [(f"t{i}", i * i) for i in range(5)]
    assert len(executor.hosts) == 5 and all(executor.hosts)
    assert ray.is_initialized()  # a Ray the caller started is left running


def test_a_tiny_sweep_on_ray_equals_the_local_pool(local_ray, tmp_path, corpus, capsys):
    path = sweep_file(tmp_path, corpus)
    assert main(["sweep", path, "--workers", "2", "--out", str(tmp_path / "local")]) == 0
    assert main(["sweep", path, "--cluster", "ray", "--out", str(tmp_path / "ray")]) == 0
    out = capsys.readouterr().out
    assert "2 runs (0 finished before, 0 to resume, 2 new), on ray" in out
    local, on_ray = summary_values(tmp_path / "local"), summary_values(tmp_path / "ray")
    assert set(local) == {"position=learned,seed=1", "position=rope,seed=1"}
    assert on_ray == local  # same statuses, same final and best val losses (bitwise), same steps
    assert all(status == "completed" for status, *_ in local.values())


def test_a_result_not_where_it_was_written_is_refused(tmp_path, corpus, capsys, monkeypatch):
    """A run folder on a node-local disk: the driver cannot see the result, and says why (not a silent gap).

    The check runs in the driver whatever the executor; the local one runs this test's stand-in
    for a remote node (a Ray worker could not import a function of this test module).
    """
    from poslab.jobs import sweep

    real = sweep.train_point

    def elsewhere(sweep_dir, plan_name, run, threads):
        result = real(sweep_dir, plan_name, run, threads)
        results = Path(sweep_dir) / "runs" / run.name / "results.json"
        results.rename(results.with_name("results.elsewhere"))  # as if written on another node's disk
        return result

    monkeypatch.setattr(sweep, "train_point", elsewhere)
    path = sweep_file(tmp_path, corpus, steps=2, ckpt=2, eval_interval=2)
    assert main(["sweep", path, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "finished, but its results are not at" in err[0] and "every node sees" in err[0], err


def _steps_logged(run_dir: Path) -> int:
    try:
        return len(read_metrics(run_dir))
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_a_killed_training_is_retried_by_ray_and_resumes_bitwise(local_ray, tmp_path, corpus):
    """Two trainings on two Ray workers; one is killed (SIGKILL, by PID) after its step-10 checkpoint."""
    path = sweep_file(tmp_path, corpus, steps=30, ckpt=10, eval_interval=10)
    assert main(["sweep", path, "--workers", "2", "--out", str(tmp_path / "straight")]) == 0
    victim = tmp_path / "killed" / "runs" / "position=rope,seed=1"
    lock = victim.parent / f".{victim.name}.lock"
    killed: list[int] = []

    def kill_mid_run() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (victim / "checkpoints" / "step_0000010.json").exists() and _steps_logged(victim) >= 12:
                pid = int(lock.read_text().split()[1])  # "pid N on HOST": the training process
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_mid_run, daemon=True)
    killer.start()
    assert main(["sweep", path, "--cluster", "ray", "--out", str(tmp_path / "killed")]) == 0
    killer.join(timeout=10)
    assert killed, "the training finished before it could be killed"
    log = (tmp_path / "killed" / "logs" / f"{victim.name}.log").read_text()
    commands = [line for line in log.splitlines() if line.startswith("=== ")]
    assert len(commands) == 2 and "--resume" not in commands[0] and "--resume" in commands[1]  # Ray's retry resumed
    results = json.loads((victim / "results.json").read_text())
    assert results["resumed_from"] == 10
    assert summary_values(tmp_path / "killed") == summary_values(tmp_path / "straight")
    straight = read_metrics(tmp_path / "straight" / "runs" / victim.name)
    again = read_metrics(victim)
    assert [r["loss"] for r in again if r["step"] > 10] == [r["loss"] for r in straight if r["step"] > 10]


def test_the_lab_hands_its_ray_to_its_steps(local_ray, monkeypatch):
    """``poslab lab --cluster ray``: a step (a child ``poslab`` process) joins the lab's Ray and trains there."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(runner.CLUSTER_ENV, raising=False)
    step = (
        "from poslab.jobs import runner\n"
        "executor = runner.executor_for(None)\n"
        "with runner.use_executor(executor):\n"
        "    print(type(executor).__name__, runner.train_many([runner.Task('a', pow, (2, 5)), "
        "runner.Task('b', pow, (3, 2))]))\n"
    )
    with runner.for_child_steps(runner.executor_for("ray")):
        assert os.environ[runner.CLUSTER_ENV] == "ray" and os.environ["RAY_ADDRESS"]
        done = subprocess.run([sys.executable, "-c", step], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "RayExecutor [32, 9]"
    assert runner.CLUSTER_ENV not in os.environ and "RAY_ADDRESS" not in os.environ  # restored after the lab


# ------------------------------------------------------------------------------------------ addresses
def _lab_on_ray(tmp_path: Path, address: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """``poslab lab --only params --cluster ray --ray-address ADDRESS`` in a subprocess (bounded: 120 s)."""
    argv = ["lab", "--only", "params", "--cluster", "ray", "--ray-address", address, "--out", str(tmp_path / "lab")]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "poslab", *argv],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - start


def test_a_ray_address_where_nothing_listens_is_one_line(tmp_path):
    """A port nobody listens on (loopback): refused at once, not a Ray retrying for minutes."""
    done, _ = _lab_on_ray(tmp_path, "127.0.0.1:1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "poslab: error: --ray-address '127.0.0.1:1': no Ray cluster there (Connection refused)"
    ]


def test_a_ray_address_that_never_answers_is_refused_within_the_deadline(tmp_path):
    """A loopback port that accepts and says nothing: a one-line error once ``POSLAB_RAY_CONNECT_TIMEOUT`` is up."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        done, seconds = _lab_on_ray(tmp_path, address, **{RAY_TIMEOUT_ENV: "3"})
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"poslab: error: --ray-address {address!r}: no Ray cluster answered within 3 s "
        f"({RAY_TIMEOUT_ENV} sets the wait)"
    )
    assert seconds < 60  # the deadline, the imports and the interpreter's start; Ray alone would retry on and on


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_ray_address_is_refused_not_ignored(address):
    """``--ray-address ''`` names no cluster: a one-line error, not a local Ray started instead."""
    for cluster in ("ray", None):
        with pytest.raises(ValueError, match=f"--ray-address must name a Ray cluster .*, got {address!r}"):
            runner.executor_for(cluster, address)


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "soon"])
def test_a_bad_ray_deadline_is_refused_in_one_line(value, monkeypatch):
    monkeypatch.setenv(RAY_TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"{RAY_TIMEOUT_ENV} must be a positive number of seconds, got '{value}'"):
        runner.executor_for("ray", "127.0.0.1:1")
