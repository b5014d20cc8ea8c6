"""Which runs the lab made: a folder of lab runs replaces only those, never a run someone else put at a name it needs.

The lab trains every run into ``FOLDER/NAME`` (a lab model store's ``MODELS/SIZE``, an experiment's ``OUT/runs``)
and trains it again there when its recipe changes, which replaces the run. A run the lab did not make, with another
config than the one the lab needs under its name, is never replaced: :func:`check_replaceable` refuses it with one
line (:class:`NotLabRun`, a ``FileExistsError``: the CLI exits 2), before anything is trained.

The record is one small file per run, ``FOLDER/../.lab-runs/F/NAME.json`` (``F`` the folder's name: the folder
itself holds runs only), written by the process that trains the run: before it starts (the lab's claim on the name,
so a training killed on the way stays the lab's) and again once it stops (the ``train`` and ``model`` sections the
run saved, so a run someone puts at that name later is not taken for the lab's). One file per run because shards
train into one store at once but never train one run at once (:func:`poslab.lab.experiments.training.shard_key`):
no two processes write one record, where a store-wide list would be rewritten by every process. A marker at the
store's root alone cannot tell the lab's runs from a user's in one store, and a record inside the run would go
with the run folder a retraining replaces.

Lab runs without records: a folder without records whose ``models`` or ``runs`` folder lies in a
lab (``lab.json``, ``shards/``) or an experiment's output folder (its ``results.json`` naming the experiment,
``shards/``) is the lab's, every run in it. The first training there writes a record for each run the folder holds
and puts the records in place with one rename, so a process beside it sees no records or all of them. A folder
elsewhere without records (a user's ``--models DIR``) holds no lab run.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the folder of the lab's records, beside each folder the lab trains runs into
RECORDS = ".lab-runs"


class NotLabRun(FileExistsError):
    """A run the lab did not make holds the folder the lab needs for a run of another config."""


def _records_of(folder: Path) -> Path:
    """Where the records of the runs in ``folder`` are (module docstring)."""
    return folder.parent / RECORDS / folder.name


def _record_file(run_dir: Path) -> Path:
    return _records_of(run_dir.parent) / f"{run_dir.name}.json"


def _saved(run_dir: Path) -> dict[str, Any] | None:
    """The ``train`` and ``model`` sections of the run's config.json (``None``: no readable run there)."""
    from poslab.runs import RunFileError, RunFolder

    try:
        doc = RunFolder(run_dir).config()
    except (OSError, RunFileError):
        return None
    return {"train": doc["train"], "model": doc["model"]}


def _made_by_lab(folder: Path) -> bool:
    """Whether ``folder`` is a lab's or an experiment's output folder (what each writes there)."""
    from poslab.lab.experiments import read_results

    if (folder / "lab.json").is_file() or (folder / "shards").is_dir() or "experiment" in read_results(folder):
        return True
    return folder.parent.name == "experiments" and (folder.parent.parent / "lab.json").is_file()


def _lab_folder_without_records(folder: Path) -> bool:
    """Whether ``folder`` holds lab runs without records: it lies in a lab's or an experiment's output folder
    (module docstring)."""
    if _records_of(folder).exists():
        return False
    child = folder.absolute()
    for _ in range(3):
        if child.name in ("models", "runs") and _made_by_lab(child.parent):
            return True
        child = child.parent
    return False


def _write(path: Path, run_dir: Path, config: dict[str, Any] | None) -> None:
    from poslab.fileio import atomic_write_json

    atomic_write_json(path, {"run": run_dir.name, "config": config})


def is_lab_run(run_dir: Path) -> bool:
    """Whether the lab made the run in ``run_dir``: its record says so and names the config the run holds (a record
    from before the training saved one: the lab's training stopped on the way), or it is in a folder of lab runs
    without records (module docstring)."""
    from poslab.safe_load import load_json

    run_dir = Path(run_dir)
    if _lab_folder_without_records(run_dir.parent):
        return True
    path = _record_file(run_dir)
    try:
        record = load_json(path.read_text(encoding="utf-8"), repr(str(path)))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("config") in (None, _saved(run_dir))


def check_replaceable(run_dir: Path) -> None:
    """Nothing, when the lab may train afresh into ``run_dir``: it is empty or missing, or holds a lab run;
    :class:`NotLabRun` naming the folder, the rule and what to do otherwise."""
    run_dir = Path(run_dir)
    if not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())) or is_lab_run(run_dir):
        return
    raise NotLabRun(
        f"{str(run_dir)!r} holds a run the lab did not make, with another config than the one the lab trains there; "
        "the lab replaces only runs it made: move it away, or give the lab another folder (--models, --out)"
    )


def check_all(run_dirs: Sequence[Path]) -> None:
    """:func:`check_replaceable` of every folder, in order (the first refused stops it)."""
    for run_dir in run_dirs:
        check_replaceable(run_dir)


def _records(folder: Path) -> Path:
    """The records of ``folder``, made when missing: with a record of every run the folder holds when those are lab runs
    without records, put in place by one rename (a process beside this one may do the same)."""
    records = _records_of(folder)
    if records.is_dir():
        return records
    adopt = _lab_folder_without_records(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records.parent.mkdir(exist_ok=True)
    aside = records.parent / f".{folder.name}.{uuid.uuid4().hex}"  # this process's alone, on any machine
    aside.mkdir()
    if adopt:
        for run in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            _write(aside / f"{run.name}.json", run, _saved(run))
    try:
        os.rename(aside, records)
    except OSError:  # another process put its records in place first (the same runs)
        shutil.rmtree(aside, ignore_errors=True)
    return records


@contextmanager
def lab_training(run_dir: Path, resumes: bool) -> Iterator[None]:
    """Around the lab's training into ``run_dir``: a fresh one (not ``resumes``) is refused where
    :func:`check_replaceable` refuses it and recorded as the lab's before it starts; once it stops, a run the lab
    made has its record name the config it saved (a resumed run the lab did not make stays without one)."""
    run_dir = Path(run_dir)
    if not resumes:
        check_replaceable(run_dir)
        _write(_records(run_dir.parent) / f"{run_dir.name}.json", run_dir, None)
    try:
        yield
    finally:
        if _record_file(run_dir).is_file():
            _write(_record_file(run_dir), run_dir, _saved(run_dir))
