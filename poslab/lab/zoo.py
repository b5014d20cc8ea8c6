"""The table of published model configs (``poslab/lab/data/model_zoo.json``), read and checked.

Package data, nothing is downloaded: for open models across families and sizes, the head geometry read
from each model's published ``config.json`` (the row's ``source``; ``verified_via`` names the copy the
values were read from; derived and missing fields are listed per row). The model-zoo experiment and the
corrections both read it through :func:`load_zoo`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from poslab.checks import positive_int

ZOO_PATH = Path(__file__).resolve().parent / "data" / "model_zoo.json"
#: fields every row carries
FIELDS = (
    "name",
    "family",
    "hf_repo",
    "source",
    "year",
    "architecture",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "layers",
    "position",
    "rope_theta",
    "rope_scaling",
    "context_length",
    "attention",
    "verified_via",
    "derived",
    "null_fields",
    "notes",
)
#: fields that must be positive integers unless listed in the row's ``null_fields``
INT_FIELDS = ("d_model", "n_heads", "n_kv_heads", "head_dim", "layers", "context_length", "year")


def load_zoo(path: Path = ZOO_PATH) -> list[dict[str, Any]]:
    """The table's rows, checked (a bad row is a ``ValueError`` naming the model and the field)."""
    rows = json.loads(Path(path).read_text())["models"]
    for row in rows:
        check_row(row)
    return rows


def check_row(row: dict[str, Any]) -> None:
    """Raise ``ValueError`` if a row misses a field, has a bad value, or a null without a reason."""
    name = row.get("name", "?")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise ValueError(f"zoo row {name!r} misses {missing}")
    for f in INT_FIELDS:
        value = row[f]
        if value is None:
            if f not in row["null_fields"]:
                raise ValueError(f"zoo row {name!r}: {f} is null without a reason in null_fields")
        else:
            positive_int(f"zoo row {name!r}: {f}", value)
    if row["rope_theta"] is None and "rope_theta" not in row["null_fields"]:
        raise ValueError(f"zoo row {name!r}: rope_theta is null without a reason in null_fields")
    if row["rope_theta"] is not None and not row["rope_theta"] > 0:
        raise ValueError(f"zoo row {name!r}: rope_theta must be > 0, got {row['rope_theta']!r}")
    if row["n_heads"] % row["n_kv_heads"]:
        raise ValueError(f"zoo row {name!r}: n_kv_heads {row['n_kv_heads']} does not divide n_heads {row['n_heads']}")
    if not row["source"].endswith("config.json") or row["hf_repo"] not in row["source"]:
        raise ValueError(f"zoo row {name!r}: source must cite the repo's config.json, got {row['source']!r}")
    if not row["verified_via"]:
        raise ValueError(f"zoo row {name!r}: verified_via is empty")
    if row["attention"] not in ("MHA", "GQA", "MQA", "MLA"):
        raise ValueError(f"zoo row {name!r}: attention must be MHA, GQA, MQA or MLA, got {row['attention']!r}")
