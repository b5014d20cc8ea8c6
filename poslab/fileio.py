"""The one atomic-write helper set: every file poslab writes goes through here (layer 0).

A file is written to a temporary name in its own folder (``.NAME.tmpPID``), flushed, fsynced and
renamed over the target, so a reader (or a process killed mid-write) sees the old file or the new
one, never a torn one. :func:`atomic_write` takes a writer callback for libraries that write a path
themselves (safetensors, matplotlib, fonttools); the others are built on it. A leftover temporary
name is recognised by :data:`TEMP_RE` (``poslab.training.lock.remove_stale_temp_files``).

A write that fails for a reason of the machine (disk full, quota, read-only file system, I/O error)
raises ``OSError`` naming the target file, whatever raised it: Python's own writes, or a library whose
writer wraps the OS error in its own exception (safetensors' ``SafetensorError: Error while
serializing: I/O error: No space left on device (os error 28)``), see :func:`write_error`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: temporary names left by a killed writer: ours (``.NAME.tmpPID``) and safetensors' own (``.tmpXXXXXX``)
TEMP_RE = re.compile(r"^\.(.+\.tmp\d+|tmp[A-Za-z0-9_]{6,})$")
#: how Rust libraries (safetensors) quote the OS error they wrap: ``... (os error 28)``
_WRAPPED_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_error(err: BaseException, path: str | Path) -> OSError | None:
    """The ``OSError`` that a failed write of ``path`` stands for, naming ``path``; ``None`` if it is not one.

    Args:
        err: what the write raised: an ``OSError`` (Python's writes: its file name may be a temporary
            name, or missing for a buffered write that failed at close), or a library's exception
            whose message quotes an OS error (``... (os error 28)``: safetensors).
        path: the file (or folder) being written, named in the returned error.

    Returns:
        ``err`` itself when it already names a file other than a temporary one; a new ``OSError`` with
        ``err``'s errno and ``path`` otherwise (``OSError`` picks the subclass of the errno, e.g.
        ``PermissionError`` for ``EACCES``); ``None`` for any other exception (a bug: not hidden).
    """
    if isinstance(err, OSError):
        if err.errno is None or (err.filename is not None and not _temporary(err.filename)):
            return err
        code, reason = err.errno, err.strerror or os.strerror(err.errno)
    else:
        quoted = _WRAPPED_OS_ERROR.search(str(err))
        if quoted is None:
            return None
        code = int(quoted.group(1))
        reason = os.strerror(code)
    return OSError(code, reason, str(path))


def _temporary(name: Any) -> bool:
    """Whether a file name is (inside) a temporary name of ours: ``.NAME.tmpPID``, ``.NAME.tmpXXXXXXXX/...``."""
    return any(
        TEMP_RE.match(part) or (part.startswith(".") and ".tmp" in part) for part in Path(os.fsdecode(name)).parts
    )


def temp_path(path: str | Path) -> Path:
    """The temporary name :func:`atomic_write` uses for ``path``: ``.NAME.tmpPID`` in the same folder."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to fill a temporary file, fsync it and rename it to ``path``.

    Args:
        path: the target file.
        write: writes the complete content to the path it is given (e.g. ``safetensors.torch.save_file``).

    Returns:
        ``path``.

    Raises:
        OSError: from the writer (or a library error wrapping an OS error, see :func:`write_error`),
            the fsync or the rename, naming ``path``; the temporary file is removed and the previous
            ``path`` (if any) is untouched.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except Exception as err:
        failure = write_error(err, path)
        if failure is None or failure is err:
            raise
        raise failure from err
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_folder(path: str | Path, fill: Callable[[Path], None]) -> Path:
    """Create the folder ``path`` atomically: ``fill(tmp)`` writes a temporary sibling folder, renamed at the end.

    ``path`` must not exist or be an empty folder (it is replaced by the filled one). On any error the
    temporary folder is removed and ``path`` is left as it was; a write that fails for a reason of the
    machine raises ``OSError`` naming ``path`` (:func:`write_error`).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp", dir=path.parent))
    except OSError as err:  # the temporary folder cannot be made: the error names the target, not the temporary name
        failure = write_error(err, path)
        if failure is None or failure is err:
            raise
        raise failure from err
    try:
        fill(tmp)
        if path.exists():
            path.rmdir()  # empty (the caller checked); a non-empty folder raises OSError here
        os.replace(tmp, path)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = write_error(err, path) if isinstance(err, Exception) else None
        if failure is None or failure is err:
            raise
        raise failure from err
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file + fsync + rename)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()

    return atomic_write(path, write)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """Atomically write ``obj`` as indented UTF-8 JSON (non-ASCII kept readable); ``dumps`` go to ``json.dumps``.

    Raises:
        ValueError: with ``allow_nan=False``, ``obj`` holds NaN or an infinity (which JSON has no number
            for), naming ``path``; nothing is written.
    """
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, **dumps)
    except ValueError as err:
        if dumps.get("allow_nan", True):
            raise
        raise ValueError(f"{str(path)!r} is not written: it would hold a non-finite number ({err})") from None
    return atomic_write_text(path, text + "\n")


@contextlib.contextmanager
def stdout_errors() -> Iterator[None]:
    """A command's body whose standard output may go to a full disk (``poslab sample RUN > out.txt``).

    Standard output is flushed at the end of the block, so a write error surfaces here rather than in
    Python's own flush at exit (a two-line ``Exception ignored`` message and exit code 120). An
    ``OSError`` naming no file is checked against standard output: if stdout cannot be flushed either
    (or, unbuffered, it is a file on a file system with no space left and the error is ``ENOSPC``),
    the error is raised again naming the file stdout goes to, and what could not be written is
    dropped (stdout is pointed at ``/dev/null``) so that the exit does not fail a second time. Any
    other error passes unchanged.

    Raises:
        OSError: standard output could not be written, naming where it goes (a file path, or ``<stdout>``).
    """
    try:
        yield
        sys.stdout.flush()
    except OSError as err:
        if err.filename is not None or err.errno is None or (_stdout_flushes() and not _stdout_disk_full(err)):
            raise
        where = _stdout_target()
        with contextlib.suppress(OSError, ValueError):  # drop the pending output: it cannot be written
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
            sys.stdout.flush()
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), where) from err


def _stdout_flushes() -> bool:
    try:
        sys.stdout.flush()
    except OSError:
        return False
    return True


def _stdout_disk_full(err: OSError) -> bool:
    """An unbuffered stdout (``PYTHONUNBUFFERED``) keeps nothing to flush again: ``ENOSPC`` while the
    file system of stdout (a regular file) has no space left is taken as stdout's."""
    if err.errno != errno.ENOSPC:
        return False
    try:
        fd = sys.stdout.fileno()
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.fstatvfs(fd).f_bavail == 0
    except (OSError, ValueError, AttributeError):
        return False


def _stdout_target() -> str:
    """The file standard output is written to (``/proc/self/fd/1``), else ``<stdout>`` (a pipe, a socket)."""
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, AttributeError):
        return "<stdout>"
    return target if target.startswith("/") else "<stdout>"  # not 'pipe:[1234]'


def append_line(handle: Any, line: str) -> None:
    """Append ``line`` + newline to an unbuffered binary file; a failed write (e.g. disk full) is cut
    back off the file before the error propagates, so no torn line is left."""
    data = (line + "\n").encode("utf-8")
    start = os.fstat(handle.fileno()).st_size
    try:
        written = handle.write(data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)", handle.name)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.ftruncate(handle.fileno(), start)
        failure = write_error(err, handle.name)  # a raw write's error names no file: name metrics.jsonl
        if failure is err:
            raise
        raise failure from err


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of the file at ``path`` (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = [
    "TEMP_RE",
    "append_line",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_folder",
    "atomic_write_json",
    "atomic_write_text",
    "sha256_bytes",
    "sha256_file",
    "stdout_errors",
    "temp_path",
    "write_error",
]
