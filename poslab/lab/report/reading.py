"""Every file the report reads, through the guarded reader: a malformed file is an entry naming it, never a crash.

A lab folder may be edited, copied or damaged by anyone, so each file is read with
:func:`poslab.safe_load.load_json` (bounded nesting) and checked for the shape the page uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.safe_load import load_json

#: the key of a results folder whose results.json could not be read (the one-line reason)
UNREADABLE = "unreadable"
#: the key of a manifest's problems (one line each, naming lab.json)
MANIFEST_ERRORS = "problems"


def read_json(path: Path, name: str) -> Any:
    """The JSON value of ``path``; ``ValueError`` naming ``name`` for a file that cannot be read or parsed."""
    try:
        return load_json(path.read_text(encoding="utf-8"), repr(name))
    except (OSError, ValueError, RecursionError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ValueError(f"unreadable {name}: {reason}".replace("\n", " ")[:400]) from None


def load_results(lab_dir: Path) -> dict[str, dict]:
    """Every ``results.json`` under ``lab_dir`` (up to two levels deep), keyed by folder (``experiments/params``).

    A file that cannot be read is ``{UNREADABLE: "unreadable FOLDER/results.json: why"}``; a JSON value
    other than an object is ``{"value": value}``.
    """
    found: dict[str, dict] = {}
    lab_dir = Path(lab_dir)
    for path in sorted([*lab_dir.glob("*/results.json"), *lab_dir.glob("*/*/results.json")]):
        key = path.parent.relative_to(lab_dir).as_posix()
        if key.startswith("runs/"):
            continue  # training runs: their results are read by the experiments that made them
        try:
            data = read_json(path, f"{key}/results.json")
        except ValueError as err:
            data = {UNREADABLE: str(err)}
        found[key] = data if isinstance(data, dict) else {"value": data}
    return found


def load_manifest(lab_dir: Path) -> dict:
    """``lab.json`` (``{}`` when there is none), with only the parts of the shape the page uses.

    ``steps`` keeps the mappings whose ``folder`` is a text or absent, ``machine`` and its ``versions``
    must be mappings; each thing dropped (or the whole file, unreadable) is one line under
    ``MANIFEST_ERRORS``.
    """
    path = Path(lab_dir) / "lab.json"
    if not path.exists():
        return {}
    try:
        data = read_json(path, "lab.json")
    except ValueError as err:
        return {MANIFEST_ERRORS: [str(err)]}
    if not isinstance(data, dict):
        return {MANIFEST_ERRORS: [f"lab.json holds a {type(data).__name__}, not a mapping; not used"]}
    problems = []
    steps = data.get("steps", [])
    if not isinstance(steps, list):
        problems.append(f"lab.json: 'steps' is a {type(steps).__name__}, not a list; not used")
        steps = []
    kept = []
    for i, step in enumerate(steps):
        if isinstance(step, dict) and isinstance(step.get("folder", ""), str):
            kept.append(step)
        else:
            problems.append(f"lab.json: steps[{i}] is not a step record ({str(step)[:60]}); not used")
    data["steps"] = kept
    machine = data.get("machine")
    if machine is not None and not isinstance(machine, dict):
        problems.append(f"lab.json: 'machine' is a {type(machine).__name__}, not a mapping; not used")
        del data["machine"]
    elif isinstance(machine, dict) and not isinstance(machine.get("versions", {}), dict):
        problems.append("lab.json: 'machine.versions' is not a mapping; not used")
        machine["versions"] = {}
    if problems:
        data[MANIFEST_ERRORS] = problems
    return data


def png_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The regular ``*.png`` files of ``folder``, sorted, and one line for each other entry so named (a folder)."""
    pngs, skipped = [], []
    for path in sorted(Path(folder).glob("*.png")):
        if path.is_file():
            pngs.append(path)
        else:
            skipped.append(f"{path.name} is not a regular file; not shown")
    return pngs, skipped


__all__ = ["MANIFEST_ERRORS", "UNREADABLE", "load_manifest", "load_results", "png_files", "read_json"]
