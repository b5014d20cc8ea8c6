"""Disk full and read-only run folders: a clear error, nothing half-written, nothing lost.

Disk full is simulated in-process: every file opened for writing under the run folder draws on a
byte budget, and the write that exceeds it writes what fits and raises ``OSError(ENOSPC)`` (the
tensor file goes through the same budget). The budget is set from a metered run so that
the disk fills up half-way through a write of every kind of file a run writes (the slow run: through
every single write): the first files, metrics lines, tensor files, checkpoint JSON, ``latest``,
``results.json``. After each failure the run folder must hold no temporary file, no
torn metrics line and no JSON that does not parse, its ``latest`` checkpoint must verify, the
command line must say so in one line; with the space back, ``--resume`` must reproduce the
uninterrupted run bitwise.

A read-only run folder must be refused before any training, in one line, leaving the folder as it
was: simulated as a read-only file system (``EROFS`` from every write under the folder) and, when
not running as root (root ignores permissions), with ``chmod``.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from run_helpers import tiny_train_argv
from safetensors.torch import save as safetensors_bytes

import poslab.training.checkpoint as ckpt
from poslab.cli.app import main

REAL_OPEN = builtins.open
FIGURES = {"cases": 0, "clear_error": 0, "half_written_files": 0, "resumed_equal": 0}


class Disk:
    """A filling disk under ``root``: writes beyond ``budget`` bytes fail with ``errno_``.

    ``budget=None`` meters without a limit (to learn how much a run writes).
    """

    def __init__(self, root: Path, budget: int | None, errno_: int = errno.ENOSPC) -> None:
        self.root = str(root.resolve())
        self.left = budget
        self.errno = errno_
        self.written = 0
        self.events: list[tuple[str, int, int]] = []  # (file name, bytes written before, size)

    def mine(self, file) -> bool:
        return isinstance(file, (str, os.PathLike)) and str(Path(file).resolve()).startswith(self.root)

    def open(self, file, mode="r", *args, **kwargs):
        writing = self.mine(file) and any(c in mode for c in "wax+")
        if writing and self.errno == errno.EROFS:  # a read-only file system refuses the open itself
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        handle = REAL_OPEN(file, mode, *args, **kwargs)
        return _Metered(handle, self) if writing else handle

    def save_file(self, tensors, filename, metadata=None):  # safetensors' writer, through the budget
        data = safetensors_bytes(tensors, metadata=metadata)
        with builtins.open(filename, "wb") as handle:
            handle.write(data)


class _Metered:
    def __init__(self, handle, disk: Disk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data):
        size = len(data.encode("utf-8") if isinstance(data, str) else data)
        disk = self._disk
        if disk.left is not None and size > disk.left:
            if disk.left > 0:  # what fits is written: the file is now torn
                self._handle.write(data[: disk.left])
                self._handle.flush()
            disk.written += disk.left
            disk.left = 0
            raise OSError(disk.errno, os.strerror(disk.errno), getattr(self._handle, "name", None))
        if disk.left is not None:
            disk.left -= size
        disk.events.append((Path(getattr(self._handle, "name", "?")).name, disk.written, size))
        disk.written += size
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def curve(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("tokens_per_s", "time_s")} for line in lines]


def half_written(run: Path) -> list[str]:
    """Files of ``run`` that are partial: temporary files, JSON that does not parse, a torn metrics
    line, a ``latest`` or listed checkpoint that does not verify."""
    if not run.exists():
        return []
    bad = [str(p) for p in run.rglob("*") if ".tmp" in p.name]
    for path in run.rglob("*.json"):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            bad.append(str(path))
    metrics = run / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            try:
                json.loads(line)
            except ValueError:
                bad.append(f"{metrics}: torn line {line[:30]!r}")
    for step in ckpt.list_checkpoints(run):
        try:
            ckpt.load_checkpoint(run, step)
        except ckpt.CheckpointError as err:
            bad.append(str(err))
    return bad


def one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poslab: error: "), lines
    return lines[0]


def _kind(name: str) -> str:
    """``.step_0000004.safetensors.tmp123`` -> ``step_N.safetensors``: what a write is writing."""
    return re.sub(r"\d+", "N", re.sub(r"\.tmp\d+$", "", name).lstrip("."))


def _sweep(tmp_path: Path, corpus: str, capsys, monkeypatch, every_write: bool) -> dict:
    out = tmp_path / "runs"
    assert main(tiny_train_argv(corpus, out, "reference")) == 0
    reference = curve(out / "reference")
    # how much one run writes (metered, unlimited)
    meter = Disk(out / "metered", None)
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", meter.open)
        patch.setattr(ckpt, "save_file", meter.save_file)
        assert main(tiny_train_argv(corpus, out, "metered")) == 0
    # the disk fills up half-way through a write: of every kind of file (default) or every write (slow)
    events, seen = [], set()
    for index, (file_name, before, size) in enumerate(meter.events):
        kind = _kind(file_name) + (" (late)" if index > len(meter.events) // 2 and "metrics" in file_name else "")
        if every_write or kind not in seen:
            seen.add(kind)
            events.append((kind, before + size // 2))
    assert len(seen) >= 9, seen  # tokenizer, metrics (early, late), config, probe, peak, tensors, json, latest, results
    figures = dict.fromkeys(FIGURES, 0)
    for i, (kind, budget) in enumerate(events):
        name = f"full-{i}"
        run = out / name
        capsys.readouterr()
        disk = Disk(run, budget)
        with monkeypatch.context() as patch:
            patch.setattr(builtins, "open", disk.open)
            patch.setattr(ckpt, "save_file", disk.save_file)
            code = main(tiny_train_argv(corpus, out, name))
        figures["cases"] += 1
        assert code == 1, (kind, budget)
        line = one_line(capsys)
        assert "No space left on device" in line, (kind, line)
        figures["clear_error"] += 1
        bad = half_written(run)
        figures["half_written_files"] += len(bad)
        assert bad == [], (kind, bad)
        # space is back: continue (or start again if the run never got its config written)
        resume = ["--resume"] if (run / "config.json").exists() else []
        assert main([*tiny_train_argv(corpus, out, name), *resume]) == 0, capsys.readouterr().err
        assert curve(run) == reference
        figures["resumed_equal"] += 1
    return figures


def test_disk_full_at_every_stage_then_resume(tmp_path, corpus, capsys, monkeypatch, request):
    figures = _sweep(tmp_path, corpus, capsys, monkeypatch, every_write=False)
    _record(request, figures)


@pytest.mark.slow
def test_disk_full_at_many_more_points(tmp_path, corpus, capsys, monkeypatch, request):
    figures = _sweep(tmp_path, corpus, capsys, monkeypatch, every_write=True)
    _record(request, figures)


def _snapshot(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def test_read_only_file_system_is_refused_before_training(tmp_path, corpus, capsys, monkeypatch, request):
    out = tmp_path / "runs"
    assert main(tiny_train_argv(corpus, out, "ro")) == 0
    run = out / "ro"
    (run / ckpt.CHECKPOINT_DIR / ".step_0000004.safetensors.tmp99").write_bytes(b"stale")  # a killed writer's leftover
    before = _snapshot(run)
    disk = Disk(run, 0, errno.EROFS)

    def refuse(*paths):
        if any(disk.mine(p) for p in paths):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(paths[0]))

    real = {name: getattr(os, name) for name in ("replace", "rename", "unlink", "mkdir", "rmdir")}
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", disk.open)
        for name, function in real.items():
            patch.setattr(os, name, lambda *a, _f=function, **k: (refuse(*a[:2]), _f(*a, **k))[1])
        code = main([*tiny_train_argv(corpus, out, "ro"), "--max_steps", "12", "--resume"])
    assert code == 2
    line = one_line(capsys)
    assert "is not writable: Read-only file system" in line, line
    assert _snapshot(run) == before  # untouched
    _record(request, {"cases": 1, "clear_error": 1, "half_written_files": 0})


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions: the read-only file system case covers it")
def test_read_only_permissions_are_refused_before_training(tmp_path, corpus, capsys, request):
    out = tmp_path / "runs"
    assert main(tiny_train_argv(corpus, out, "perm")) == 0
    run = out / "perm"
    before = _snapshot(run)
    folders = [run, run / ckpt.CHECKPOINT_DIR]
    for folder in folders:
        folder.chmod(0o555)
    try:
        capsys.readouterr()
        assert main([*tiny_train_argv(corpus, out, "perm"), "--max_steps", "12", "--resume"]) == 2
        assert "is not writable: Permission denied" in one_line(capsys)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert _snapshot(run) == before
    _record(request, {"cases": 1, "clear_error": 1, "half_written_files": 0})


def test_disk_full_on_a_fresh_start_leaves_no_folder(tmp_path, corpus, capsys, monkeypatch, request):
    out = tmp_path / "runs"
    disk = Disk(out / "fresh", 200)  # fails on the first files, before config.json
    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", disk.open)
        assert main(tiny_train_argv(corpus, out, "fresh")) == 1
    assert "No space left on device" in one_line(capsys)
    assert not (out / "fresh").exists()
    _record(request, {"cases": 1, "clear_error": 1, "half_written_files": 0})


def _record(request, figures: dict) -> None:
    from test_reliability_artifacts import mode, record

    record("disk", mode(request), figures)
