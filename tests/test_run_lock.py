"""Two ``poslab train`` processes on one run folder: the second refuses, in one line naming the first.

The lock is an ``flock`` on ``OUT_DIR/.NAME.lock``, so a killed holder never leaves a stale lock:
after a SIGKILL the next ``--resume`` starts at once. A real ``python -m poslab train`` process holds
the run while this test (a second process) tries to train it (plain, ``--resume``, ``--overwrite``);
then the holder is killed and the run resumed and finished, its metrics holding each step once.

Also: a symlinked name shares its folder's lock, a planted lock path is refused, a deleted lock file
lets no second writer in (the holder also locks the folder itself).
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
from cli_helpers import error_line, resume, resume_args
from cli_helpers import refused as hostile_refused
from run_helpers import record, tiny

from poslab.cli.app import main
from poslab.data import load_corpus
from poslab.runs import RunFolder, read_metrics
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.lock import RunLock, RunLockedError, lock_path

FIGURES = {"cases": 0, "second_refused": 0, "interleaved_writes": 0}


def argv(corpus: Path, out: Path, max_steps: int) -> list[str]:
    return [
        "train",
        "--preset",
        "tiny",
        "--name",
        "shared",
        "--out_dir",
        str(out),
        "--corpus",
        str(corpus),
        "--model.block_size",
        "16",
        "--batch_size",
        "4",
        "--max_steps",
        str(max_steps),
        "--log_interval",
        "1",
        "--eval_interval",
        "50",
        "--eval_iters",
        "1",
        "--ckpt_interval",
        "5",
        "--threads",
        "1",
        "--no-progress",
    ]


def refused(extra: list[str], base: list[str], capsys) -> str:
    capsys.readouterr()
    assert main([*base, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poslab: error: "), lines
    return lines[0]


def test_a_second_process_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path, capsys, request):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(load_corpus("shakespeare")[:20_000], encoding="utf-8")
    out = tmp_path / "runs"
    run = out / "shared"
    holder = subprocess.Popen(
        [sys.executable, "-m", "poslab", *argv(corpus, out, 100_000)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "latest").exists():  # the holder is training
            assert holder.poll() is None, holder.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        base = argv(corpus, out, 20)
        for extra in ([], ["--resume"], ["--overwrite"]):
            line = refused(extra, base, capsys)
            assert f"is in use by another poslab process (pid {holder.pid} on " in line, line
            FIGURES["cases"] += 1
            FIGURES["second_refused"] += 1
        assert run.is_dir() and (run / "config.json").is_file()  # --overwrite moved nothing away
        assert holder.poll() is None  # the holder never noticed
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert lock_path(run).exists()  # the dead holder's file is still there ...
    end = ckpt.latest_step(run) + 5
    assert main([*argv(corpus, out, end), "--resume"]) == 0  # ... but its flock died with it
    records = read_metrics(run)
    raw = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(raw) == len(records)  # every line parses
    steps = [r["step"] for r in records]
    assert steps == list(range(1, end + 1))
    FIGURES["interleaved_writes"] += int(steps != sorted(set(steps)))
    assert not lock_path(run).exists()  # released and removed at the end
    assert json.loads((run / "results.json").read_text())["steps"] == end
    FIGURES["cases"] += 1
    _record(request)


def test_run_lock_semantics(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "x"
    first = RunLock(run).acquire()
    assert first.held and lock_path(run).read_text().startswith(f"pid {os.getpid()} on ")
    with pytest.raises(RunLockedError, match=rf"in use by another poslab process \(pid {os.getpid()} on "):
        RunLock(run).acquire()  # flock conflicts between two open files, even in one process
    first.release()
    first.release()  # idempotent
    assert not lock_path(run).exists()
    with RunLock(run) as second:
        assert second.held
    # a lock file left by a process that died without releasing: only the flock counts
    lock_path(run).write_text("pid 999999 on elsewhere\n")
    with RunLock(run) as third:
        assert third.held
    # the folder may be moved away (--overwrite) while locked: the lock is next to it, not in it
    with RunLock(run):
        run.mkdir(parents=True)
        run.rename(tmp_path / "moved")
        with pytest.raises(RunLockedError):
            RunLock(run).acquire()
    # under torchrun, ranks other than 0 do not write the folder and take no lock
    monkeypatch.setenv("RANK", "1")
    with RunLock(run) as other, RunLock(run) as again:
        assert not other.held and not again.held


def test_lock_in_a_read_only_parent_is_a_clear_error(tmp_path, monkeypatch):
    import errno

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(
        PermissionError, match="cannot create the run lock in .*Read-only file system; is the folder writable"
    ):
        RunLock(tmp_path / "runs" / "x").acquire()


def _record(request) -> None:
    from test_reliability_artifacts import mode, record

    record("lock", mode(request), FIGURES)


# ------------------------------------------------------------------------------------ symlinked writers
def test_a_symlinked_name_shares_the_lock_of_its_folder(run, capsys, request):
    alias = run.parent / "B"
    os.symlink(run.name, alias)
    assert lock_path(alias) == lock_path(run)
    before = read_metrics(run)
    with RunLock(run):  # the trainer of A
        assert resume(alias, "--max_steps", "6") == 2
        assert "is in use by another poslab process" in error_line(capsys)
    assert read_metrics(run) == before  # B never rewrote A's metrics
    record(request, symlinked_writers_refused=1)


def test_overwrite_through_a_symlinked_name_is_refused(run, tang_corpus, request):
    alias = run.parent / "B"
    os.symlink(run.name, alias)
    with pytest.raises(FileExistsError, match="is a symbolic link to 'A'; overwrite that folder by its own name"):
        train(tiny(run.parent, tang_corpus, name="B"), overwrite=True, progress=False)
    assert alias.is_symlink() and RunFolder(run).finished(4)
    record(request, symlinked_writers_refused=1)


@pytest.mark.parametrize("kind", ["symlink", "dangling", "directory"])
def test_a_planted_lock_path_is_refused_not_followed(run, tmp_path, kind, capsys, request):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = lock_path(run)
    if kind == "symlink":
        os.symlink(victim, planted)
    elif kind == "dangling":
        os.symlink(tmp_path / "nowhere", planted)
    else:
        planted.mkdir()
    with pytest.raises(
        OSError,
        match={
            "symlink": "is a symbolic link to",
            "dangling": "is a dangling symbolic link",
            "directory": "is a directory, not a lock file",
        }[kind],
    ):
        RunLock(run).acquire()
    assert resume(run) != 0 and str(planted) in error_line(capsys)
    changed = victim.read_text() != "precious\n"
    record(request, planted_lock_paths_refused=1, victim_files_changed=int(changed))
    assert not changed  # never truncated through the link


# ---------------------------------------------------------------------- the lock file deleted while a run trains
@pytest.mark.usefixtures("hostile_figures")
def test_a_deleted_lock_file_does_not_let_a_second_train_in(run, capsys):
    from poslab.runs import RunFolder
    from poslab.training.lock import RunLock, is_locked, lock_path

    metrics = (run / "metrics.jsonl").read_bytes()
    holder = RunLock(run).acquire()  # the training run A (flock is per open file: this process counts as another)
    try:
        lock_path(run).unlink()  # a user tidying up next to the folder
        assert is_locked(run) and RunFolder(run).state == "running"
        hostile_refused(
            capsys, [*resume_args(run), "--max_steps", "6"], "is in use by another poslab process", "was deleted"
        )
        assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing of A's rewritten
    finally:
        holder.release()
    assert not is_locked(run)
