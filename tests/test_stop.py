"""Stopping the lab and the experiments: SIGTERM, SIGKILL of the parent, a diverged training.

Real ``python -m poslab`` processes on the extrapolation experiment at a tiny size (the smoke size
with more steps, so that a signal lands mid-training):

* SIGTERM to ``poslab experiment`` (its pool of trainings running) or to ``poslab lab``: exit 130
  within 10 s with one line saying how to resume, every training in flight checkpointed, no process
  left; in the slow run a rerun of the lab resumes and ends bitwise equal to an uninterrupted training;
* SIGKILL of ``poslab experiment``: its pool workers save and exit by themselves within seconds;
* a training that diverges inside an experiment: one line naming the experiment, the run and the
  step, exit 1 (as ``poslab train``), no traceback.

Also: SIGTERM to ``poslab train`` saves a final checkpoint, as Ctrl-C does; the lab continues an
interrupted training from its checkpoint instead of deleting it; ``poslab lab --only STEP`` exits 0
when that step succeeds and 1 when it fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import LONG, _alive, _checkpoints, _env, _logged_steps, _record_sweep_lab, _wait_for

from poslab.cli.app import main
from poslab.lab import lab

#: a size of the extrapolation experiment whose trainings take a while (the smoke geometry, 3000 steps)
STOP_SIZE = "stop=smoke,steps=3000"


#: what SIGTERM may take to stop a command with every training in flight saved
STOP_WITHIN_S = 10.0


def _record(request, **figures: int) -> None:
    """Add a passing test's figures to ``test-artifacts/reliability.json`` (the reliability table)."""
    from test_reliability_artifacts import mode, record

    record("stop", mode(request), figures)


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, their children, ...), from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _runs(models: Path) -> list[Path]:
    return sorted(p for p in models.iterdir() if p.is_dir()) if models.is_dir() else []


def _training(run_dir: Path) -> bool:
    """Under way: a logged step, no results yet."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and metrics.read_text().count("\n") >= 1 and not (run_dir / "results.json").exists()


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "poslab", *argv],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stop_and_check(process: subprocess.Popen, models: Path, sig: int = signal.SIGTERM) -> tuple[str, list[Path]]:
    """Once a training is under way in ``models``, send ``sig``; returns (stderr, the runs that were in flight).

    Checks: with SIGTERM the command exits 130 within :data:`STOP_WITHIN_S` with one line saying it was
    stopped and how to resume; every run in flight holds a checkpoint; no process it started is left
    (with SIGKILL, its workers exit by themselves within a few seconds).
    """
    left: set[int] = set()
    try:
        _wait_for(lambda: any(map(_training, _runs(models))) or process.poll() is not None, "a training under way")
        assert process.poll() is None, process.communicate()
        time.sleep(0.5)  # a second worker's training under way too, where there is one
        left = _descendants(process.pid)
        assert left, "no worker process to watch"
        in_flight = [r for r in _runs(models) if _training(r)]  # a run still setting up has nothing to save
        sent = time.monotonic()
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            process.wait(timeout=30)
            _wait_for(lambda: not any(map(_alive, left)), "the pool workers to exit after their parent", timeout=5)
            stderr = process.stderr.read()
        else:
            _, stderr = process.communicate(timeout=60)
            stopped = time.monotonic() - sent
            assert stopped < STOP_WITHIN_S, f"stopped {stopped:.1f}s after SIGTERM"
            assert process.returncode == 130, stderr
            last = stderr.strip().splitlines()[-1]
            assert last.startswith("poslab: interrupted by SIGTERM") and "run the same command again" in last, stderr
            assert "Traceback" not in stderr, stderr
            _wait_for(lambda: not any(map(_alive, left)), "no process left", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()
        for pid in left:
            if _alive(pid):  # an orphan: do not leave it running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert in_flight
    for run_dir in in_flight:
        if not (run_dir / "results.json").exists():  # stopped mid-training, not finished first
            assert _checkpoints(run_dir), f"{run_dir.name} stopped without a checkpoint"
    return stderr, in_flight


# ------------------------------------------------------------------------------------------ experiment
def test_sigterm_stops_an_experiment_and_its_pool_within_10s(tmp_path, request):
    """``kill PID`` (a scheduler, ``timeout``): the experiment stops its trainings, which checkpoint; nothing left."""
    out = tmp_path / "exp"
    process = _start(["experiment", "extrapolation", f"--size={STOP_SIZE}", "--workers", "2", "--out", str(out)])
    _, in_flight = _stop_and_check(process, out / "models" / "stop")
    _record(request, experiment_sigterms=1, trainings_checkpointed=len(in_flight), processes_left=0)


def test_sigkill_of_an_experiment_leaves_no_pool_worker(tmp_path, request):
    """The hardest kill: its workers notice their parent is gone, checkpoint their training and exit."""
    out = tmp_path / "exp"
    process = _start(["experiment", "extrapolation", f"--size={STOP_SIZE}", "--workers", "2", "--out", str(out)])
    _, in_flight = _stop_and_check(process, out / "models" / "stop", signal.SIGKILL)
    _record(request, experiment_sigkills=1, trainings_checkpointed=len(in_flight), processes_left=0)


# ------------------------------------------------------------------------------------------ the lab
def _lab(lab_dir: Path, size: str) -> list[str]:
    return ["lab", "--quick", "--only", "extrapolation", f"--size={size}", "--out", str(lab_dir)]


def _models(lab_dir: Path) -> Path:
    return lab_dir / "models" / "stop"  # the lab model store


@pytest.mark.slow  # the default run covers it: SIGTERM to an experiment (a lab step is one) and the lab's bookkeeping
def test_sigterm_stops_the_lab_within_10s(tmp_path, request):
    """A batch scheduler's SIGTERM to ``poslab lab``: the step's trainings checkpoint, the lab records the step
    interrupted and exits 130 within 10 s, no process left."""
    lab_dir = tmp_path / "lab"
    _, in_flight = _stop_and_check(_start(_lab(lab_dir, STOP_SIZE)), _models(lab_dir))
    record = json.loads((lab_dir / "lab.json").read_text())["records"]["experiments/extrapolation"]
    assert record["status"] == "interrupted", record
    _record(request, lab_sigterms=1, trainings_checkpointed=len(in_flight), processes_left=0)


@pytest.mark.slow
def test_sigterm_to_the_lab_then_a_rerun_ends_bitwise_equal(tmp_path, request):
    """The rerun keeps the stopped step's folder, resumes its trainings from their checkpoints, and each ends with
    the weights (and optimizer state) of the same training run without a stop."""
    import torch
    from safetensors.torch import load_file

    from poslab.lab.scale import define_size, train_config
    from poslab.session import train

    size = "stop=smoke,steps=150"
    lab_dir = tmp_path / "lab"
    _, in_flight = _stop_and_check(_start(_lab(lab_dir, size)), _models(lab_dir))
    stopped = {r.name: (r / "checkpoints" / "latest").read_text().strip() for r in in_flight if _checkpoints(r)}
    assert stopped
    rerun = subprocess.run(
        [sys.executable, "-m", "poslab", *_lab(lab_dir, size)], env=_env(), capture_output=True, text=True, timeout=900
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "continuing the interrupted step in experiments/extrapolation" in rerun.stderr
    lab_size = define_size(size)
    for name in stopped:
        run_dir = _models(lab_dir) / name
        results = json.loads((run_dir / "results.json").read_text())
        assert results["resumed_from"] is not None, name  # continued, not started again
        scheme, _, seed = name.partition("-s")
        cfg = train_config(scheme, lab_size, tmp_path / "reference", name=name, seed=int(seed or 1337))
        cfg = type(cfg).from_dict({**cfg.to_dict(), "threads": 1})
        train(cfg, progress=False)
        final = f"{_checkpoints(run_dir)[-1]}"
        resumed = load_file(run_dir / "checkpoints" / final)
        reference = load_file(tmp_path / "reference" / name / "checkpoints" / final)
        assert resumed.keys() == reference.keys()
        for key in reference:
            assert torch.equal(resumed[key], reference[key]), f"{name}: {key} differs"
    _record(request, lab_sigterms=1, lab_trainings_resumed_bitwise=len(stopped))


# ------------------------------------------------------------------------------------------ divergence
def test_a_diverged_training_in_an_experiment_is_one_line(tmp_path, monkeypatch, capsys, request):
    """The loss turns NaN at step 3 of a training inside ``poslab experiment``: one line naming the experiment, the
    run and the step; exit 1 as ``poslab train``; no traceback."""
    from poslab.training import loop

    micro_loss = loop._Trainer._micro_loss

    def diverging(self, micro):
        loss = micro_loss(self, micro)
        return loss * float("nan") if self.state.step >= 2 else loss

    monkeypatch.setattr(loop._Trainer, "_micro_loss", diverging)
    argv = ["experiment", "attention-entropy", "--workers", "1", "--size=diverge=smoke", "--out", str(tmp_path / "ae")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("poslab: error: experiment attention-entropy: run none: training diverged at step 3: ")
    _record(request, diverged_in_experiment_one_line=1)


# ------------------------------------------------------------------------------------------ resuming
def test_an_experiment_resumes_a_stopped_training_bitwise(tmp_path, request):
    """Fast form of the lab's rerun: a lab model stopped mid-training (Ctrl-C's path, which SIGTERM takes) continues
    from its checkpoint when the experiment asks for it again, and ends with an uninterrupted training's tensors."""
    import torch
    from safetensors.torch import load_file

    from poslab.lab.experiments.training import ensure_trained
    from poslab.lab.scale import define_size, train_config
    from poslab.session import train

    size = define_size("resume=smoke,steps=12")
    stopped = train_config("rope", size, tmp_path / "stopped", name="rope")
    straight = train_config("rope", size, tmp_path / "straight", name="rope")

    def stop_at_5(step: int, record: dict) -> None:
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(stopped, progress=False, callback=stop_at_5)
    assert _checkpoints(stopped.run_dir) == ["step_0000005.safetensors"]
    assert ensure_trained(stopped) == stopped.run_dir
    assert json.loads((stopped.run_dir / "results.json").read_text())["resumed_from"] == 5  # not started again
    train(straight, progress=False)
    final = "step_0000012.safetensors"
    mine, reference = (
        load_file(stopped.run_dir / "checkpoints" / final),
        load_file(straight.run_dir / "checkpoints" / final),
    )
    assert mine.keys() == reference.keys()
    assert all(torch.equal(mine[k], reference[k]) for k in reference)
    _record(request, experiment_trainings_resumed_bitwise=1)


def test_the_lab_keeps_a_stopped_step_to_continue_it(tmp_path, monkeypatch, request):
    """An experiment step that exits 130 (stopped) is recorded ``interrupted``; the next lab keeps its folder (its
    trainings continue there) instead of cleaning it; ``--fresh`` cleans it."""
    import io

    from poslab.lab import lab

    lab_dir = tmp_path / "lab"
    code = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True, exist_ok=True)\n"
        "if (p / 'checkpoint').exists(): (p / 'results.json').write_text('{}')\n"
        "else: (p / 'checkpoint').write_text('saved'); sys.exit(130)\n"
    )
    folder = lab_dir / "experiments" / "stoppable"
    step = lab.Step("stoppable", "experiments/stoppable", [], command=[sys.executable, "-c", code, str(folder)])
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [step])
    monkeypatch.setattr(lab, "_registered", lambda: {"stoppable"})
    first = lab.run_lab(lab_dir, "quick", stream=io.StringIO())
    assert first["steps"][0]["status"] == "interrupted"
    stream = io.StringIO()
    again = lab.run_lab(lab_dir, "quick", stream=stream)
    assert again["steps"][0]["status"] == "ok", again["steps"][0]
    assert "continuing the interrupted step in experiments/stoppable" in stream.getvalue()
    (folder / "results.json").unlink()
    lab.run_lab(lab_dir, "quick", stream=io.StringIO())  # not stopped last time: cleaned and run afresh (stops again)
    assert (folder / "checkpoint").read_text() == "saved" and not (folder / "results.json").exists()
    fresh = lab.run_lab(lab_dir, "quick", fresh=True, stream=io.StringIO())  # stopped, but --fresh: cleaned
    assert fresh["steps"][0]["status"] == "interrupted"
    _record(request, lab_stopped_steps_continued=1)


@pytest.mark.slow  # the default run covers it: SIGKILL of a sweep reaches its training as SIGTERM (below)
def test_sigterm_to_train_saves_a_final_checkpoint(tmp_path, request):
    """``timeout`` and schedulers send SIGTERM: the training saves its last step, as after Ctrl-C (not killed with
    nothing saved)."""
    run_dir = tmp_path / "runs" / "t"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "poslab",
            "train",
            "--preset",
            "tiny",
            "--name",
            "t",
            "--out_dir",
            str(tmp_path / "runs"),
            "--no-progress",
            *LONG,
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _logged_steps(run_dir) >= 3 or process.poll() is not None, "the training's first steps")
        assert process.poll() is None, process.stdout.read()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert _checkpoints(run_dir), output  # ckpt_interval 100000: only the interrupt's checkpoint
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "poslab",
            "train",
            "--preset",
            "tiny",
            "--name",
            "t",
            "--resume",
            "--out_dir",
            str(tmp_path / "runs"),
            "--no-progress",
            *LONG[:-4],
            "--eval_interval",
            "100000",
            "--max_steps",
            "1",
            "--dry-run",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    _record_sweep_lab(request, sigterm_to_train_saved=1)


# ------------------------------------------------------------------------------------------ the lab
def fake_training(lab_dir: Path, folder: str) -> lab.Step:
    """An experiment step that trains: a run that finds no checkpoint writes one and is interrupted (exit 130); a
    run that finds it continues from it and finishes.

    Every invocation appends ``start`` or ``resume`` to ``train.calls`` next to the lab folder.
    """
    out = lab_dir / folder
    calls = lab_dir.parent / "train.calls"
    code = (
        "import json, pathlib, sys\n"
        f"out = pathlib.Path({str(out)!r}); calls = pathlib.Path({str(calls)!r})\n"
        "ckpt = out / 'runs' / 'model' / 'checkpoints' / 'step_000010.json'\n"
        "resume = ckpt.is_file()\n"
        "calls.write_text((calls.read_text() if calls.exists() else '') + ('resume' if resume else 'start') + '\\n')\n"
        "if not resume:\n"
        "    ckpt.parent.mkdir(parents=True); ckpt.write_text('{\"step\": 10}')\n"
        "    print('training from step 0'); sys.exit(130)  # interrupted after its checkpoint\n"
        "assert ckpt.read_text() == '{\"step\": 10}', 'the checkpoint was lost'\n"
        "print('continuing from step 10')\n"
        "(out / 'results.json').write_text(json.dumps({'resumed_from': 10}))\n"
    )
    return lab.Step("fake", folder, [], command=[sys.executable, "-c", code])


def calls_of(lab_dir: Path) -> list[str]:
    path = lab_dir.parent / "train.calls"
    return path.read_text().split() if path.exists() else []


def test_lab_resumes_an_interrupted_training_instead_of_deleting_it(tmp_path, monkeypatch, request):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [fake_training(lab_dir, "experiments/fake")])
    manifest = lab.run_lab(lab_dir, "quick", stream=io.StringIO())
    assert manifest["steps"][0]["status"] == "interrupted" and manifest["steps"][0]["exit_code"] == 130
    assert (lab_dir / "experiments/fake/runs/model/checkpoints/step_000010.json").is_file()

    stream = io.StringIO()
    manifest = lab.run_lab(lab_dir, "quick", stream=stream)  # resumed, not deleted and started again
    assert manifest["steps"][0]["status"] == "ok", manifest["steps"][0]
    assert calls_of(lab_dir) == ["start", "resume"]
    assert json.loads((lab_dir / "experiments/fake/results.json").read_text())["resumed_from"] == 10
    assert "continuing the interrupted step in experiments/fake" in stream.getvalue()
    log = (lab_dir / "logs" / "experiments_fake.log").read_text()
    # the log keeps the interrupted run's part
    assert log.count("$ ") == 2 and "training from step 0" in log and "continuing from step 10" in log
    _record_sweep_lab(request, lab_trainings_resumed=1, checkpoints_deleted=0)


def test_lab_fresh_still_starts_the_training_again(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [fake_training(lab_dir, "experiments/fake")])
    lab.run_lab(lab_dir, "quick", stream=io.StringIO())
    manifest = lab.run_lab(lab_dir, "quick", fresh=True, stream=io.StringIO())
    assert calls_of(lab_dir) == ["start", "start"]  # cleaned and started again (and interrupted again)
    assert manifest["steps"][0]["status"] == "interrupted"


def test_lab_only_exits_0_when_the_step_succeeds(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    code = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True); "
        "(p / 'results.json').write_text('{}')"
    )

    def fake_plan(lab_dir_arg: Path, mode: str) -> list[lab.Step]:
        return [
            lab.Step(
                name,
                f"experiments/{name}",
                [],
                command=[sys.executable, "-c", code, str(lab_dir_arg / "experiments" / name)],
            )
            for name in ("one", "two")
        ]

    monkeypatch.setattr(lab, "plan", fake_plan)
    assert main(["lab", "--out", str(lab_dir), "--only", "two"]) == 0  # "one" not being run is no failure
    assert (lab_dir / "experiments/two/results.json").is_file() and not (lab_dir / "experiments/one").exists()
    assert main(["lab", "--out", str(lab_dir)]) == 0  # "one" runs, "two" is reused


def test_lab_only_exits_1_when_the_step_fails(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr(
        lab,
        "plan",
        lambda lab_dir_arg, mode: [
            lab.Step("bad", "experiments/bad", [], command=[sys.executable, "-c", "raise SystemExit(3)"]),
            lab.Step("other", "experiments/other", [], command=[sys.executable, "-c", "pass"]),
        ],
    )
    assert main(["lab", "--out", str(lab_dir), "--only", "bad"]) == 1
