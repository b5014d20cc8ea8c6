"""Sweeps as real processes: killing a sweep (SIGTERM, SIGHUP, SIGKILL) stops the trainings it started;
a rerun waits for a run that is still in use instead of failing it; a second collector of one sweep
is refused in one line, and a run another collector holds is waited for, never failed.

The figures go to ``test-artifacts/reliability.json`` under ``sweep_lab``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import _alive, _checkpoints, _env, _logged_steps, _record_sweep_lab, _wait_for

from poslab.cli.app import main

SWEEP = """preset: tiny
overrides: {{max_steps: {steps}, ckpt_interval: 100000, eval_interval: 100000, log_interval: 1}}
grid:
  seed: [1]
"""


def _start_sweep(tmp_path: Path, steps: int, **popen: object) -> tuple[subprocess.Popen, Path]:
    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(steps=steps))
    sweep_dir = tmp_path / "sweep"
    process = subprocess.Popen(
        [sys.executable, "-m", "poslab", "sweep", str(config), "--out", str(sweep_dir)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **popen,
    )
    return process, sweep_dir / "runs" / "seed=1"


def _kill_sweep(tmp_path: Path, sig: int, request) -> None:
    restore = {"preexec_fn": lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)} if sig == signal.SIGHUP else {}
    process, run_dir = _start_sweep(tmp_path, 100000, **restore)
    lock = run_dir.parent / f".{run_dir.name}.lock"
    trainer = None
    try:
        _wait_for(lambda: _logged_steps(run_dir) >= 3 or process.poll() is not None, "the sweep's training")
        assert process.poll() is None, process.stdout.read()
        trainer = int(lock.read_text().split()[1])  # "pid N on HOST"
        assert _alive(trainer)
        process.send_signal(sig)
        _wait_for(lambda: not _alive(trainer), "the training to stop with its sweep", timeout=120)  # not left running
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        if trainer is not None and _alive(trainer):  # an orphan (the failure under test): do not leave it running
            os.kill(trainer, signal.SIGKILL)
    assert _checkpoints(run_dir)  # it stopped by saving, not by being killed
    if sig != signal.SIGKILL:
        assert process.returncode == 130
    _record_sweep_lab(request, sweep_kills=1, trainings_stopped_with_sweep=1, final_checkpoints_saved=1)


def test_sigkill_of_a_sweep_stops_its_trainings(tmp_path, request):
    """The hardest kill: nothing of the sweep runs after it; the training gets SIGTERM from the kernel and saves.

    With ``ckpt_interval`` 100000 the only checkpoint is the one SIGTERM makes ``poslab train`` save,
    so this also checks SIGTERM to a training (the slow run checks it alone).
    """
    _kill_sweep(tmp_path, signal.SIGKILL, request)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_of_a_sweep_stops_its_trainings(tmp_path, sig, request):
    _kill_sweep(tmp_path, sig, request)


def test_the_sweep_runner_waits_while_a_run_is_locked(tmp_path, request):
    """Fast form of the rerun test below: ``sweep._wait_until_free`` returns once the lock is released."""
    import threading

    from poslab.jobs import runner, sweep
    from poslab.training.lock import RunLock

    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(steps=4))
    plan = sweep.load_plan(config, tmp_path / "sweep")
    messages: list[str] = []
    run_dir = plan.sweep_dir / "runs" / plan.runs[0].name
    held = RunLock(run_dir).acquire()
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(sweep._wait_until_free(plan.runs[0], run_dir, messages.append))
    )
    waiter.start()
    time.sleep(1.5)
    assert waiter.is_alive() and result == []  # still waiting
    assert len(messages) == 1 and "waiting for seed=1" in messages[0] and f"pid {os.getpid()}" in messages[0]
    held.release()
    waiter.join(timeout=30)
    assert result == [True]
    held = RunLock(run_dir).acquire()  # and a stopping sweep stops waiting
    runner.children.stopping.set()
    try:
        assert sweep._wait_until_free(plan.runs[0], run_dir, messages.append) is False
    finally:
        runner.children.stopping.clear()
    held.release()
    _record_sweep_lab(request, reruns_waited_for_run_in_use=1)


@pytest.mark.slow
def test_a_rerun_waits_for_a_run_still_in_use(tmp_path, request):
    """A training of a killed sweep still saving: the rerun waits for its lock instead of failing the run."""
    from poslab.training.lock import RunLock

    run_dir = tmp_path / "sweep" / "runs" / "seed=1"
    held = RunLock(run_dir).acquire()
    process, _ = _start_sweep(tmp_path, 4)
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "waiting for seed=1" in line or "seed=1" in line and "failed" in line:
                break
        held.release()
        rest, _ = process.communicate(timeout=180)
    finally:
        held.release()
        if process.poll() is None:
            process.kill()
    output = "".join(lines) + rest
    assert "waiting for seed=1" in output and "in use by another poslab process" in output, output
    assert process.returncode == 0, output  # waited, not "failed exit 2: run folder ... is in use"
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert summary["status"] == {"completed": 1}
    _record_sweep_lab(request, reruns_waited_for_run_in_use=1)


# ------------------------------------------------------------------------------ two collectors of one sweep
def test_a_second_collector_of_a_sweep_is_refused_in_one_line(tmp_path, capsys, request):
    """The collector holds the sweep's lock: a second ``poslab sweep`` of the same sweep is exit 2 naming the
    holder, and starts nothing."""
    from poslab.training.lock import RunLock

    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(steps=4))
    held = RunLock(tmp_path / "sweep").acquire()  # the first collector (this process)
    try:
        assert main(["sweep", str(config), "--out", str(tmp_path / "sweep")]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("poslab: error: sweep "), err
    assert f"is in use by another poslab sweep (pid {os.getpid()} on " in err
    assert not (tmp_path / "sweep" / "runs").exists()  # nothing started, nothing marked
    _record_sweep_lab(request, second_collectors_refused=1)


def _fake_launches(monkeypatch, outcomes: list) -> list[list[str]]:
    """Replace the sweep's training launcher: each call runs the next of ``outcomes`` (``(run_dir, log) -> code``)."""
    from poslab.jobs import runner

    calls: list[list[str]] = []

    def launch(cmd, stdout, **kwargs):
        calls.append(cmd)
        run_dir = Path(cmd[cmd.index("--out_dir") + 1]) / cmd[cmd.index("--name") + 1]
        return outcomes[len(calls) - 1](run_dir, stdout)

    monkeypatch.setattr(runner, "launch", launch)
    return calls


def _finish(run_dir: Path, steps: int) -> None:
    """What a completed training leaves (its config and a complete results.json)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text("{}")
    (run_dir / "results.json").write_text(json.dumps({"status": "completed", "steps": steps, "final_val_loss": 2.5}))


def _in_use(run_dir: Path, log) -> int:
    log.write(f"poslab: error: run folder {str(run_dir)!r} is in use by another poslab process (pid 1 on h)\n")
    return 2


@pytest.mark.parametrize("other_finishes_first", [True, False])
def test_a_run_another_collector_holds_is_waited_for_never_failed(tmp_path, monkeypatch, other_finishes_first, request):
    """A second collector's training that finds the run taken ('in use') waits for it and looks again: the
    run another process completed meanwhile is completed here, not ``failed ... in use``."""
    from poslab.jobs import sweep

    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(steps=4))
    plan = sweep.load_plan(config, tmp_path / "sweep")
    for folder in ("runs", "configs", "logs"):
        (plan.sweep_dir / folder).mkdir(parents=True)

    def taken_then_done(run_dir, log):  # the other collector's training completes the run meanwhile
        _finish(run_dir, 4)
        return _in_use(run_dir, log)

    def ours(run_dir, log):
        _finish(run_dir, 4)
        return 0

    outcomes = [taken_then_done] if other_finishes_first else [_in_use, ours]
    calls = _fake_launches(monkeypatch, outcomes)
    run = sweep.train_point(str(plan.sweep_dir), plan.name, plan.runs[0], 1)
    assert (run.status, run.error) == ("completed", None)
    assert run.results["final_val_loss"] == 2.5 and len(calls) == len(outcomes)
    _record_sweep_lab(request, runs_taken_by_another_collector_completed=1)


def test_a_run_that_fails_for_its_own_reason_is_failed_once(tmp_path, monkeypatch):
    from poslab.jobs import sweep

    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(steps=4))
    plan = sweep.load_plan(config, tmp_path / "sweep")
    for folder in ("runs", "configs", "logs"):
        (plan.sweep_dir / folder).mkdir(parents=True)

    def broken(run_dir, log):
        log.write("poslab: error: something of its own\n")
        return 1

    calls = _fake_launches(monkeypatch, [broken, broken])
    run = sweep.train_point(str(plan.sweep_dir), plan.name, plan.runs[0], 1)
    assert run.status == "failed" and run.error == "exit 1: something of its own" and len(calls) == 1


@pytest.mark.slow
def test_two_collectors_of_one_sweep_at_once(tmp_path, request):
    """``poslab sweep S.yaml & poslab sweep S.yaml``: one collects every run, the other is one line (exit 2)."""
    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.replace("seed: [1]", "seed: [1, 2, 3]").format(steps=40))
    cmd = [sys.executable, "-m", "poslab", "sweep", str(config), "--workers", "1", "--out", str(tmp_path / "sweep")]
    first, second = (
        subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    )
    outputs = [p.communicate(timeout=300) for p in (first, second)]
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 2], outputs
    refused = outputs[[first.returncode, second.returncode].index(2)][1]
    assert refused.count("\n") == 1 and "is in use by another poslab sweep (pid " in refused, refused
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert summary["status"] == {"completed": 3}, summary
    _record_sweep_lab(request, second_collectors_refused=1)
