"""Run-folder lock: one ``poslab train`` process per run folder at a time.

The lock of run folder ``OUT_DIR/NAME`` is the file ``OUT_DIR/.NAME.lock``, next to the folder
rather than inside it; the folder is resolved first (its real path), so ``runs/B`` symlinked to
``runs/A`` takes the lock of ``runs/A`` and two trainers can never write one folder through two
names. The lock file is opened with ``O_NOFOLLOW``: a symbolic link planted at the lock path is
refused, never followed (it would make poslab truncate the file it points to) (so it survives
``--overwrite`` moving the old folder away and never makes a fresh run folder look non-empty). It is
held with ``fcntl.flock``: the kernel drops the lock when the holding process ends, however it ends
(SIGKILL and power loss included), so a crash never leaves a stale lock behind. The file records the
holder's pid and host for the refusal message and is removed on release.

A user can delete the lock file while its run trains (it looks like litter next to the folder); a
second ``train`` would then create a new one and lock that. So the holder also takes an ``flock`` on the run
folder itself (:meth:`RunLock.hold_folder`, an ``O_DIRECTORY`` descriptor: a folder is not deleted
by accident while it trains, and deleting it loses the run anyway), and acquiring checks both: the
second ``train`` is refused even when the lock file was removed.

While the lock is held no other poslab process writes the folder, so any temporary file left in it
(``.NAME.tmpPID`` from an atomic write cut short by a kill, ``.tmpXXXXXX`` from safetensors' own) is
stale: :func:`remove_stale_temp_files` deletes them on start.

Under ``torchrun`` only rank 0 writes the run folder, so only rank 0 takes the lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path
from types import TracebackType

from poslab.fileio import TEMP_RE

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, no lock
    fcntl = None  # type: ignore[assignment]

#: temporary names: :mod:`poslab.fileio`'s atomic writes (``.NAME.tmpPID``) and safetensors' own
#: (``.tmpXXXXXX``, written next to the target and renamed)
_TEMP_RE = TEMP_RE


class RunLockedError(FileExistsError):
    """Another live process is training the same run folder."""


def folder_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the folder at ``path`` (``None``: nothing there)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def lock_path(run_dir: str | Path) -> Path:
    """``REAL_OUT_DIR/.NAME.lock`` for the run folder ``OUT_DIR/NAME`` resolved to its real path.

    Every name of one folder (a symlink to it, a path through a symlinked parent, ``..``) gets the
    same lock; the folder need not exist yet.
    """
    real = Path(os.path.realpath(run_dir))
    return real.parent / f".{real.name}.lock"


class RunLock:
    """An exclusive, non-blocking ``flock`` on a run folder's lock file.

    Use as ``with RunLock(run_dir): ...`` or ``lock = RunLock(run_dir).acquire()`` ...
    ``lock.release()``. Acquiring raises :class:`RunLockedError` naming the holder when another
    live process holds it; a lock file left by a dead process is simply taken over.

    Args:
        run_dir: the run folder (it need not exist yet; its parent is created).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = lock_path(self.run_dir)
        self._fd: int | None = None
        self._folder_fd: int | None = None
        self._folder_id: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` (never waits)."""
        if self._fd is not None or fcntl is None or os.environ.get("RANK", "0") != "0":
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _unwritable(self.path.parent, err) from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as err:
                raise _bad_lock_path(self.path, err) or _unwritable(self.path.parent, err) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLockedError(
                    f"run folder {str(self.run_dir)!r} is in use by another poslab process ({holder}); "
                    f"wait for it to finish or stop it (its lock {str(self.path)!r} is released when it exits)"
                ) from None
            # the previous holder may have removed the file between our open and flock: only the
            # file that is at the path now counts
            try:
                current = os.stat(self.path)
                opened = os.fstat(fd)
                same = (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        try:
            self.hold_folder()
        except BaseException:
            self.release()
            raise
        with contextlib.suppress(OSError):  # informative only: a full disk must not stop the lock
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        return self

    def hold_folder(self) -> None:
        """Also ``flock`` the run folder itself (once it exists; again after it was replaced).

        Call after creating or replacing the folder while holding the lock (``train`` does after
        preparing it). A no-op before the folder exists or when its current inode is already held.

        Raises:
            RunLockedError: another live process holds the folder (its lock file was deleted).
        """
        if self._fd is None or fcntl is None:
            return
        real = os.path.realpath(self.run_dir)
        try:
            fd = os.open(real, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return  # not a folder yet (a fresh run): held once it is made
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) == self._folder_id:
            os.close(fd)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"run folder {str(self.run_dir)!r} is in use by another poslab process (its lock file "
                f"{str(self.path)!r} was deleted, the folder itself is locked); wait for it to finish or stop it"
            ) from None
        if self._folder_fd is not None:
            os.close(self._folder_fd)  # the folder was replaced (--overwrite): the old one is not ours to hold
        self._folder_fd, self._folder_id = fd, (stat.st_dev, stat.st_ino)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # waiters that opened the old file see the inode change and retry
        if self._folder_fd is not None:
            os.close(self._folder_fd)  # drops the folder's flock
            self._folder_fd = self._folder_id = None
        os.close(self._fd)  # drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def is_locked(run_dir: str | Path) -> bool:
    """Whether a live process holds the lock of ``run_dir`` (its lock file or its folder) now, probed without taking
    it."""
    if fcntl is None:
        return False
    return _probe(lock_path(run_dir), 0) or _probe(Path(os.path.realpath(run_dir)), getattr(os, "O_DIRECTORY", 0))


def _probe(path: Path, flags: int) -> bool:
    """Whether someone holds an exclusive ``flock`` on ``path`` (a shared probe lock, dropped at once)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | flags)
    except OSError:
        return False  # no lock file or folder (or not a usable one): nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops our shared probe lock
    return False


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = os.pread(fd, 200, 0).decode("utf-8").strip()
        if text:
            return text
    return "pid unknown"


def _bad_lock_path(path: Path, err: OSError) -> OSError | None:
    """A one-line error when the lock path is a symlink (dangling or not) or a directory, else ``None``."""
    if path.is_symlink():
        what = "a dangling symbolic link" if not path.exists() else f"a symbolic link to {os.readlink(path)!r}"
        return _error(err.errno, f"run lock {str(path)!r} is {what}; poslab never follows a link there: remove it")
    if path.is_dir():
        return _error(err.errno, f"run lock {str(path)!r} is a directory, not a lock file: remove it")
    return None


def _unwritable(folder: Path, err: OSError) -> OSError:
    """A one-line error for a folder where the lock file cannot be created."""
    reason = os.strerror(err.errno) if err.errno else str(err)
    return _error(err.errno, f"cannot create the run lock in {str(folder)!r}: {reason}; is the folder writable?")


def _error(code: int | None, message: str) -> OSError:
    """``PermissionError`` (read-only) or ``OSError`` whose ``str`` is just ``message``, ``errno`` kept."""
    kind = PermissionError if code in (errno.EACCES, errno.EPERM, errno.EROFS) else OSError
    error = kind(message)
    error.errno = code
    return error


def remove_stale_temp_files(run_dir: str | Path) -> list[Path]:
    """Delete temporary files left in ``run_dir`` and ``run_dir/checkpoints`` by a killed writer.

    Call only while holding the run's :class:`RunLock` (then no live writer owns them).

    Returns:
        The removed paths.
    """
    removed = []
    run_dir = Path(run_dir)
    for folder in (run_dir, run_dir / "checkpoints"):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if _TEMP_RE.match(path.name) and path.is_file():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path)
    return removed


#: what a fresh ``train`` writes before ``config.json`` (``metrics.jsonl`` still empty then)
_BEFORE_CONFIG = ("tokenizer.json", "metrics.jsonl")


def interrupted_start(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds only what a fresh run writes before its ``config.json``.

    Such a folder is left by a ``train`` killed in its first moments: it holds nothing of value
    (``tokenizer.json``, an empty ``metrics.jsonl``, temporary files) and can be started afresh.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or (run_dir / "config.json").exists():
        return False
    for path in run_dir.iterdir():
        if not path.is_file():
            return False
        if path.name == "metrics.jsonl" and path.stat().st_size > 0:
            return False
        if path.name not in _BEFORE_CONFIG and not _TEMP_RE.match(path.name):
            return False
    return True


def ensure_writable(folder: str | Path) -> None:
    """Fail now, not at the first checkpoint an hour later, if ``folder`` cannot take new files.

    Creates and removes a probe file ``.write-probe.tmpPID``.

    Raises:
        PermissionError: the folder is read-only (permissions or a read-only file system).
        OSError: another write error (e.g. ``ENOSPC``), with the folder named.
    """
    folder = Path(folder)
    probe = folder / f".write-probe.tmp{os.getpid()}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"probe")
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise _error(err.errno, f"run folder {str(folder)!r} is not writable: {reason}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


__all__ = [
    "RunLock",
    "RunLockedError",
    "ensure_writable",
    "folder_id",
    "interrupted_start",
    "is_locked",
    "lock_path",
    "remove_stale_temp_files",
]
