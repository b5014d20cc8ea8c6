"""A real full disk: a small tmpfs fills up under ``poslab train``, ``eval``, ``experiment``, ``sample`` and the lab
report.

``tests/test_disk.py`` fakes disk-full inside Python's ``open``; the tensor files are
written by safetensors' Rust writer, which a Python fake never reaches (it ended in a
``SafetensorError`` traceback). Here the file system is real: a tmpfs mounted for the test (root
only; skipped with the reason where mounting is not permitted, e.g. a container without
``CAP_SYS_ADMIN``), sized in pages from a reference run so that the disk fills up at the first files
(before ``config.json``), half-way through the first tensor file, right after it (the checkpoint
JSON), half-way through the second and the third tensor file (default run: two of these sizes; slow
run: all five). After each failure: exit 1 and one line ``poslab: error: No space left on device:
'<file>'`` naming a file of the run (not a temporary name), no temporary file left, every listed
checkpoint verifies and holds exactly the reference run's tensors of that step, no tensor file
without its JSON, ``metrics.jsonl`` is the reference's first lines; then the tmpfs is grown
(``mount -o remount,size=``) and ``--resume`` must reproduce the uninterrupted run bitwise.

A finished run resumed for more steps on a nearly full disk keeps every earlier file byte-identical
(sha256; ``metrics.jsonl`` only appended to, ``config.json`` only its new ``max_steps``), then
continues once there is space. ``eval --out``, ``experiment --out``, ``lab --report-only`` and
``sample`` printing to a file on a full disk exit 1 with one line naming their output file, and
leave every earlier file (the previous report included) as it was; ``sample`` reads a run on a full
disk. The slow run adds ``poslab sample RUN > FULL/out.txt`` as a real process, buffered (unless poslab
flushes first, Python's flush at exit prints ``Exception ignored ... OSError``, exit 120) and unbuffered.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import tiny_train_argv

import poslab.training.checkpoint as ckpt
from poslab.cli.app import main
from poslab.data import load_corpus

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: the sizes of the disk, as (name, what fills it): tensor files a fresh run fits before the disk is full
SIZES = {
    "first files": None,  # 2 pages: the lock file and tokenizer.json, not config.json
    "half tensor file 1": 0.5,  # half-way through the first checkpoint's tensors
    "checkpoint json 1": 1.0,  # the first tensor file fits exactly: its JSON does not
    "half tensor file 2": 1.5,
    "half tensor file 3": 2.5,  # keep 2: the third is written before the oldest is pruned
}
FAST = ("half tensor file 1", "half tensor file 2")


def _mount_error(where: Path) -> str | None:
    """Why a tmpfs cannot be mounted here (``None``: it can)."""
    if not sys.platform.startswith("linux"):
        return f"tmpfs mounts need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CAP_SYS_ADMIN)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount command"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={PAGE * 4}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[0]
        return f"mount -t tmpfs is not permitted here: {reason}"
    subprocess.run(["umount", str(where)], check=True)
    return None


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``path`` (unmounted by the fixture)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)

    def resize(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def used(self) -> int:
        stat = os.statvfs(self.path)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    def fill(self, leave_pages: int = 0) -> None:
        """Fill the disk with a file (``filler``) but ``leave_pages`` pages."""
        with open(self.path / "filler", "ab", buffering=0) as handle, contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * PAGE)
        filler = self.path / "filler"
        os.truncate(filler, max(0, filler.stat().st_size - leave_pages * PAGE))
        assert os.statvfs(self.path).f_bavail == leave_pages

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


@pytest.fixture
def disks(tmp_path):
    """``disks(size) -> SmallDisk``; skips when no tmpfs can be mounted here."""
    reason = _mount_error(tmp_path / "probe")
    if reason is not None:
        pytest.skip(reason)
    mounted: list[SmallDisk] = []

    def make(size: int) -> SmallDisk:
        disk = SmallDisk(tmp_path / f"disk{len(mounted)}", size)
        mounted.append(disk)
        return disk

    yield make
    for disk in mounted:
        disk.unmount()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A corpus and the uninterrupted run (on an ordinary disk): its curve, sizes, checkpoints' tensors."""
    root = tmp_path_factory.mktemp("realdisk")
    corpus = root / "corpus.txt"
    corpus.write_text(load_corpus("shakespeare")[:20_000], encoding="utf-8")
    out = root / "runs"
    assert main(tiny_train_argv(str(corpus), out, "run")) == 0
    run = out / "run"
    tensors = {step: ckpt.load_checkpoint(run, step)[0] for step in ckpt.list_checkpoints(run)}
    size = (run / ckpt.CHECKPOINT_DIR / f"{ckpt.checkpoint_name(8)}.safetensors").stat().st_size
    return {
        "corpus": str(corpus),
        "run": run,
        "curve": curve(run),
        "tensors": tensors,
        "tensor_pages": -(-size // PAGE),
    }


def curve(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("tokens_per_s", "time_s")} for line in lines]


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_disk_full(capsys, disk: SmallDisk) -> Path:
    """The one error line of a full disk; returns the file it names (inside ``disk``, not temporary)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    # a write that failed, or the write probe before training (the run folder named)
    match = re.fullmatch(r"poslab: error: No space left on device: '(.+)'", lines[0]) or re.fullmatch(
        r"poslab: error: run folder '(.+)' is not writable: No space left on device", lines[0]
    )
    assert match, lines[0]
    named = Path(match.group(1))
    assert named.is_relative_to(disk.path) and ".tmp" not in str(named), lines[0]
    return named


def temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if ".tmp" in p.name]


def check_run_after_failure(run: Path, ref: dict) -> int:
    """Every listed checkpoint verifies and equals the reference's; metrics are its first lines.

    Returns:
        The number of checkpoints checked.
    """
    if not run.exists():
        return 0
    steps = ckpt.list_checkpoints(run)
    for step in steps:
        tensors, _ = ckpt.load_checkpoint(run, step)  # sha256 of the tensor file and of the JSON verified
        expected = ref["tensors"].get(step)
        if expected is not None:  # steps the reference pruned (keep 2) are not compared
            assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in tensors), (
                step
            )
    if steps:
        assert ckpt.latest_step(run) == steps[-1]
        ckpt.load_checkpoint(run)
    if (run / "metrics.jsonl").exists():
        got = curve(run)
        shared = min(len(got), len(ref["curve"]))
        assert got[:shared] == ref["curve"][:shared]
    folder = run / ckpt.CHECKPOINT_DIR
    tensor_files = sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []
    assert tensor_files == [f"{ckpt.checkpoint_name(s)}.safetensors" for s in steps], tensor_files  # none orphaned
    return len(steps)


def _train_until_full(name: str, ref: dict, disks, capsys, figures: dict) -> None:
    fraction = SIZES[name]
    pages = 2 if fraction is None else start_pages(disks, ref) + int(ref["tensor_pages"] * fraction)
    disk = disks(pages * PAGE)
    out = disk.path / "runs"
    capsys.readouterr()
    code = main(tiny_train_argv(ref["corpus"], out, "r"))
    figures["cases"] += 1
    assert code == 1, name
    named = one_line_disk_full(capsys, disk)
    figures["clear_error"] += 1
    if name.startswith("half tensor file"):
        assert named.name.endswith(".safetensors"), (name, named)
    elif name.startswith("checkpoint json"):
        assert named.name == f"{ckpt.checkpoint_name(2)}.json", (name, named)
    bad = temporaries(disk.path)
    figures["half_written_files"] += len(bad)
    assert bad == [], bad
    run = out / "r"
    figures["checkpoints_verified"] += check_run_after_failure(run, ref)
    if fraction is None:
        assert named.name == "config.json" and not run.exists()  # failed before config.json: no folder left
    # the disk grows: continue (or start again if the run never got its config written)
    disk.resize(pages * PAGE + 4 * ref["tensor_pages"] * PAGE)
    resume = ["--resume"] if (run / "config.json").exists() else []
    assert main([*tiny_train_argv(ref["corpus"], out, "r"), *resume]) == 0, capsys.readouterr().err
    assert curve(run) == ref["curve"]
    final, _ = ckpt.load_checkpoint(run)
    assert all(torch.equal(final[k], ref["tensors"][8][k]) for k in final)
    figures["resumed_equal"] += 1


_START: dict[str, int] = {}


def start_pages(disks, ref: dict) -> int:
    """Pages a fresh run holds when it writes its first checkpoint (config, tokenizer, metrics, peak):
    measured once on a tmpfs with room for them and half a tensor file (the run fails in the tensors)."""
    if "pages" not in _START:
        disk = disks(PAGE * 16 + ref["tensor_pages"] * PAGE // 2)
        out = disk.path / "runs"
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
            assert main(tiny_train_argv(ref["corpus"], out, "probe")) == 1
        assert (out / "probe" / "config.json").exists() and not temporaries(disk.path)
        lock_pages = 0 if (out / ".probe.lock").exists() else 1  # the lock file (pid, host) is removed at exit
        _START["pages"] = disk.used() // PAGE + lock_pages
    return _START["pages"]


def _figures() -> dict:
    return dict.fromkeys(
        (
            "cases",
            "clear_error",
            "half_written_files",
            "checkpoints_verified",
            "resumed_equal",
            "earlier_files_changed",
        ),
        0,
    )


@pytest.mark.parametrize("name", FAST)
def test_training_fills_a_real_disk_then_resumes(name, disks, reference, capsys, request):
    figures = _figures()
    _train_until_full(name, reference, disks, capsys, figures)
    _record(request, {**figures, "sizes": 1})


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIZES))  # all five: `pytest -m slow` runs the slow tests only
def test_training_fills_a_real_disk_at_every_size(name, disks, reference, capsys, request):
    figures = _figures()
    _train_until_full(name, reference, disks, capsys, figures)
    _record(request, {**figures, "sizes": 1})


def test_resume_on_a_full_disk_keeps_every_earlier_file(disks, reference, capsys, request):
    """A finished run (every checkpoint kept) resumed for 8 more steps on a full disk: nothing earlier changes."""
    disk = disks(PAGE * 16 + 10 * reference["tensor_pages"] * PAGE)  # 8 checkpoints of 16 steps fit
    out = disk.path / "runs"
    assert main(tiny_train_argv(reference["corpus"], out, "r", keep=0)) == 0
    run = out / "r"
    before = snapshot(run)
    metrics_before = (run / "metrics.jsonl").read_bytes()
    config_before = json.loads((run / "config.json").read_text(encoding="utf-8"))
    disk.fill(leave_pages=8)  # room for the start of the resume; the first new checkpoint does not fit
    capsys.readouterr()
    assert main([*tiny_train_argv(reference["corpus"], out, "r", steps=16, keep=0), "--resume"]) == 1
    one_line_disk_full(capsys, disk)
    after = snapshot(run)
    # appended to: metrics.jsonl; rewritten by the resume: config.json, with the new max_steps only
    changed = [
        name
        for name, digest in before.items()
        if name not in ("metrics.jsonl", "config.json") and after.get(name) != digest
    ]
    config_after = json.loads((run / "config.json").read_text(encoding="utf-8"))
    config_after["train"]["max_steps"] = config_before["train"]["max_steps"]
    if config_after != config_before:
        changed.append("config.json")
    assert changed == [], changed
    assert (run / "metrics.jsonl").read_bytes().startswith(metrics_before)
    assert temporaries(disk.path) == []
    verified = check_run_after_failure(run, reference)
    (disk.path / "filler").unlink()  # space again: the run continues to step 16
    assert main([*tiny_train_argv(reference["corpus"], out, "r", steps=16, keep=0), "--resume"]) == 0
    assert curve(run)[: len(reference["curve"])] == reference["curve"]
    _record(
        request,
        {
            "cases": 1,
            "clear_error": 1,
            "half_written_files": 0,
            "checkpoints_verified": verified,
            "resumed_equal": 1,
            "earlier_files_changed": len(changed),
        },
    )


def test_outputs_on_a_full_disk_are_one_line_and_keep_the_old_file(disks, reference, capsys, request):
    """``eval --out``, ``experiment --out``, ``lab --report-only``, ``sample > FILE`` on a full disk; ``sample`` reads
    from it."""
    disk = disks(PAGE * 64 + 2 * reference["tensor_pages"] * PAGE)
    run = disk.path / "r"
    shutil.copytree(reference["run"], run)
    lab = disk.path / "lab"
    assert main(["experiment", "params", "--out", str(lab / "params")]) == 0
    assert main(["lab", "--report-only", "--out", str(lab)]) == 0  # the previous report, kept below
    eval_out = disk.path / "eval.json"
    assert main(["eval", str(run), "--lengths", "16", "--out", str(eval_out)]) == 0
    before = snapshot(disk.path)
    disk.fill()
    cases = {
        "eval": (["eval", str(run), "--lengths", "16", "--out", str(eval_out)], eval_out),
        "experiment": (["experiment", "params", "--out", str(disk.path / "exp")], disk.path / "exp" / "results.json"),
        "lab report": (["lab", "--report-only", "--out", str(lab)], lab / "report.html"),
    }
    figures = {"cases": 0, "clear_error": 0, "half_written_files": 0, "earlier_files_changed": 0}
    for what, (args, target) in cases.items():
        capsys.readouterr()
        assert main(args) == 1, what
        figures["cases"] += 1
        assert one_line_disk_full(capsys, disk) == target, what
        figures["clear_error"] += 1
        assert temporaries(disk.path) == [], what
    # `poslab sample RUN > FULL/sample.txt`, in-process: stdout is a buffered file on the full disk
    printed = disk.path / "sample.txt"
    with open(printed, "w", encoding="utf-8") as stdout, contextlib.redirect_stdout(stdout):
        code = main(["sample", str(run), "--tokens", "8", "--seed", "1"])
    assert code == 1
    figures["cases"] += 1
    assert one_line_disk_full(capsys, disk) == printed
    figures["clear_error"] += 1
    after = snapshot(disk.path)
    changed = [name for name, digest in before.items() if after.get(name) != digest]
    figures["earlier_files_changed"] += len(changed)
    assert changed == [], changed
    assert not (disk.path / "exp" / "results.json").exists()
    capsys.readouterr()
    assert main(["sample", str(run), "--tokens", "8", "--seed", "1"]) == 0  # reading needs no space
    assert capsys.readouterr().out.strip()
    figures["reads_ok"] = 1
    _record(request, figures)


@pytest.mark.slow
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_sample_printing_to_a_full_disk_is_one_line(buffered, disks, reference, request):
    """``poslab sample RUN > FULL_DISK/out.txt``: a real process whose stdout is a file on the full disk.

    Buffered (Python's default) the write fails in Python's flush at exit unless poslab flushes first
    (``Exception ignored ... OSError`` and exit code 120); unbuffered, in ``print``.
    """
    disk = disks(PAGE * 8)
    disk.fill()
    target = disk.path / "out.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    with open(target, "wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "poslab", "sample", str(reference["run"]), "--tokens", "64"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=300,
            env=env,
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and lines == [f"poslab: error: No space left on device: {str(target)!r}"], (
        done.returncode,
        lines,
    )
    _record(request, {"cases": 1, "clear_error": 1, "half_written_files": 0})


# ------------------------------------------------------------------------ without a mount (run everywhere)
def test_a_library_error_wrapping_an_os_error_becomes_an_oserror_naming_the_target(tmp_path):
    from safetensors import SafetensorError

    from poslab.fileio import atomic_write, write_error

    target = tmp_path / "model.safetensors"
    target.write_bytes(b"previous")

    def rust_writer(tmp: Path) -> None:  # what safetensors raises on a full disk, after writing part of the file
        tmp.write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError) as caught:
        atomic_write(target, rust_writer)
    assert (caught.value.errno, caught.value.strerror, caught.value.filename) == (28, os.strerror(28), str(target))
    assert isinstance(caught.value.__cause__, SafetensorError)
    assert target.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    # Python's errors: a temporary name or no name becomes the target; another file's name is kept; bugs pass
    assert write_error(OSError(28, "x", str(tmp_path / ".a.json.tmp12")), tmp_path / "a.json").filename == str(
        tmp_path / "a.json"
    )
    assert write_error(OSError(5, "x"), tmp_path / "a.json").filename == str(tmp_path / "a.json")
    other = OSError(28, "x", "/elsewhere/file")
    assert write_error(other, tmp_path / "a.json") is other
    assert write_error(ValueError("a bug"), tmp_path / "a.json") is None
    assert write_error(SafetensorError("header too large"), tmp_path / "a.json") is None


def test_a_checkpoint_whose_json_cannot_be_written_leaves_no_tensor_file(tmp_path, monkeypatch):
    tensors = {"model.w": torch.ones(3)}
    ckpt.save_checkpoint(tmp_path, 2, tensors, {"config": {}})
    folder = tmp_path / ckpt.CHECKPOINT_DIR
    before = snapshot(folder)

    def full(path, obj, **kwargs):
        raise OSError(28, os.strerror(28), str(path))

    monkeypatch.setattr(ckpt, "atomic_write_json", full)
    with pytest.raises(OSError, match="No space left on device"):
        ckpt.save_checkpoint(tmp_path, 4, tensors, {"config": {}})
    assert snapshot(folder) == before and ckpt.latest_step(tmp_path) == 2  # step 4's tensor file deleted


class _FullFile(io.RawIOBase):
    """A file on a full disk: every write fails with ``ENOSPC`` until ``full`` is cleared."""

    def __init__(self, fd: int) -> None:
        self.fd, self.full = fd, True

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def fileno(self) -> int:
        return self.fd


def test_stdout_on_a_full_disk_is_one_line_naming_its_file(tmp_path, capsys):
    target = tmp_path / "listing.txt"
    with open(target, "wb") as real:
        raw = _FullFile(real.fileno())
        stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
        capsys.readouterr()
        with contextlib.redirect_stdout(stdout):
            code = main(["presets"])  # prints a table, buffered: the error comes at the flush poslab adds
        raw.full = False
        stdout.flush()
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and lines == [f"poslab: error: No space left on device: {str(target)!r}"], (code, lines)


def _record(request, figures: dict) -> None:
    from test_reliability_artifacts import mode, record

    record("realdisk", mode(request), figures)
