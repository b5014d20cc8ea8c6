"""A run folder's life on disk (layer 3): its lock, creating, resuming or replacing it for a training.

``--overwrite`` moves the old run aside (``.NAME.replaced-PID``) and deletes it only once the new run
has written its config; :meth:`RunLifecycle.restore_displaced` gives back a copy a killed process left.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from poslab.runs.files import CONFIG, RunFiles
from poslab.training.lock import RunLock, interrupted_start


class RunLifecycle(RunFiles):
    """A run folder's lock and its preparation for a training (a base of :class:`poslab.runs.RunFolder`)."""

    def lock(self) -> RunLock:
        """The run's lock (on the resolved folder; see :mod:`poslab.training.lock`)."""
        return RunLock(self.path)

    def displaced_name(self) -> Path:
        return self.path.with_name(f".{self.path.name}.replaced-{os.getpid()}")

    def restore_displaced(self) -> list[str]:
        """Give back a run an earlier ``--overwrite`` moved aside and was killed before replacing.

        ``--overwrite`` moves the old run to ``.NAME.replaced-PID`` and deletes it once the new run
        has written its config. If that process died in between, the next start (holding the lock)
        finds the hidden copy: it is put back if the folder holds no run, else deleted.

        Returns:
            One line per copy handled (printed by the caller).
        """
        notes = []
        prefix = f".{self.path.name}.replaced-"
        siblings = sorted(self.path.parent.iterdir()) if self.path.parent.is_dir() else []
        for hidden in (p for p in siblings if p.name.startswith(prefix)):
            pid = hidden.name.rsplit("-", 1)[-1]
            if not hidden.is_dir() or (pid.isdecimal() and int(pid) == os.getpid()):
                continue
            if not self.is_run and (not self.path.exists() or interrupted_start(self.path)):
                if self.path.exists():
                    shutil.rmtree(self.path)
                os.replace(hidden, self.path)
                notes.append(
                    f"poslab: note: restored {str(self.path)!r} from {hidden.name}, left by an --overwrite "
                    "that was killed before the new run started"
                )
            else:
                shutil.rmtree(hidden, ignore_errors=True)
                notes.append(f"poslab: note: removed {hidden.name}, the old run an earlier --overwrite replaced")
        return notes

    def prepare(self, resume: bool, overwrite: bool) -> tuple[bool, Path | None]:
        """Create or validate the folder for ``train`` (call while holding :meth:`lock`).

        Returns:
            ``(resuming, displaced)``: whether an existing run is resumed, and (for ``overwrite``) where
            the old run was moved; it is deleted only once the new run has written its config.
        """
        if resume and overwrite:
            raise ValueError("choose one of resume and overwrite, not both")
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"{str(self.path)!r} exists and is not a folder")
        if overwrite and self.path.is_symlink():  # replacing the link would leave its lock on the old target
            raise FileExistsError(
                f"refusing to overwrite {str(self.path)!r}: it is a symbolic link to "
                f"{os.readlink(self.path)!r}; overwrite that folder by its own name"
            )
        for note in self.restore_displaced():
            print(note, file=sys.stderr)
        if interrupted_start(self.path):  # a start killed before its config.json (nothing to keep): start again
            shutil.rmtree(self.path)
            self.path.mkdir(parents=True)
            return False, None
        if not self.path.exists() or not any(self.path.iterdir()):
            if resume:
                raise FileNotFoundError(f"cannot resume: run folder {str(self.path)!r} does not exist or is empty")
            self.path.mkdir(parents=True, exist_ok=True)
            return False, None
        if resume:
            if not self.is_run:
                raise FileNotFoundError(f"cannot resume: {str(self.path)!r} has no {CONFIG} (not a poslab run)")
            return True, None
        if not overwrite:
            raise FileExistsError(
                f"run folder {str(self.path)!r} already exists; "
                "pass --resume to continue it or --overwrite to replace it"
            )
        if not self.is_run:
            raise FileExistsError(
                f"refusing to overwrite {str(self.path)!r}: it is not a poslab run folder (no {CONFIG})"
            )
        displaced = self.displaced_name()
        os.replace(self.path, displaced)
        self.path.mkdir(parents=True)
        return False, displaced
