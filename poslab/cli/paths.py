"""Checks of path and name arguments at the command line's edge: one line naming the argument, exit 2.

Without them the operating system answers later with a message about some other file
(``Is a directory: '.x.tmp123'``, ``File exists``, ``Not a directory: 'FILE/tokenizer.json'``).
"""

from __future__ import annotations

import os
import tempfile
import unicodedata
from pathlib import Path

from poslab.training.distributed import is_main_process


def output_file(path: str | Path | None, flag: str) -> None:
    """``path`` may be written as a file: not a folder, and its parent (if it exists) is a folder."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a folder; give the path of a file to write")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a folder")
            break


def output_folder(path: str | Path | None, flag: str) -> None:
    """``path`` may be used as an output folder: it is a folder or does not exist (nor does a file above it)."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a folder; give a folder (it is created if missing)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a folder")
            break


def writable_folder(path: str | Path, flag: str) -> None:
    """:func:`output_folder`, and files can be created there: a probe file is created and removed in ``path``
    or, when it does not exist yet, in its nearest existing parent (``/proc/self`` refuses, read-only mounts too).
    Only the writing process probes: ranks other than 0 of a distributed run write nothing.
    """
    output_folder(path, flag)
    if not is_main_process():
        return
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if existing is None:
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".poslab-probe-", dir=existing)
    except OSError as err:
        raise ValueError(
            f"{flag} {str(path)!r}: files cannot be created in {str(existing)!r} "
            f"({err.strerror or err}); give a writable folder"
        ) from None
    os.close(fd)
    os.unlink(probe)


def run_folder(path: str | Path | None, flag: str) -> None:
    """``path`` is an existing poslab run folder (a folder with ``config.json``)."""
    if path is None:
        return
    path = Path(path)
    if not path.is_dir():
        what = "a file" if path.exists() else "missing"
        raise ValueError(f"{flag} {str(path)!r} is {what}; give a poslab run folder (one with config.json)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{flag} {str(path)!r} is not a poslab run folder (no config.json)")


def run_name(name: str | None, flag: str = "--name") -> None:
    """A run name given explicitly: not empty, a plain folder name, no control characters (newlines)."""
    if name is None:
        return
    if not name.strip():
        raise ValueError(f"{flag} must not be empty (leave it out to use the preset's name), got {name!r}")
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise ValueError(f"{flag} must not contain control characters such as {bad!r}, got {name!r}")
    if any(c in name for c in "/\\") or name in (".", ".."):
        raise ValueError(f"{flag} must be a plain folder name (no '/', not '.' or '..'), got {name!r}")


__all__ = ["output_file", "output_folder", "run_folder", "run_name", "writable_folder"]
