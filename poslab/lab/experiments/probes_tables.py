"""The probes experiment's key tables: answer accuracy per task, scheme and test length; MQAR accuracy by heads.

Built from the probes' results.json (the report, the console) or from the same numbers in the docs'
snapshot (:mod:`poslab.lab.doctables`).
"""

from __future__ import annotations

from poslab.lab.tables import Table, mean_sd_text, values_text


def accuracy_of(results: dict) -> dict[str, dict[str, dict[str, list]]]:
    """``task -> scheme -> test length factor -> per-seed accuracies`` of the probes' results.json."""
    return {
        task: {scheme: cell["accuracy"] for scheme, cell in schemes.items()}
        for task, schemes in results["accuracy"].items()
    }


def accuracy_table(task: str, schemes: dict[str, dict[str, list]]) -> Table:
    """One task's answer accuracy, scheme × test length (mean ± sd over seeds; ``cannot`` where none ran)."""
    factors = sorted({f for cell in schemes.values() for f in cell}, key=int)
    return Table(
        f"{task}: answer accuracy by test length (× the training length L), mean ± sd over seeds",
        (f"{task}: scheme", *(f"{f}L" for f in factors)),
        tuple((scheme, *(mean_sd_text(cell.get(f) or []) for f in factors)) for scheme, cell in schemes.items()),
    )


def accuracy_tables(table: dict[str, dict[str, dict[str, list]]]) -> tuple[Table, ...]:
    """:func:`accuracy_table` of every task of :func:`accuracy_of`'s table."""
    return tuple(accuracy_table(task, schemes) for task, schemes in table.items())


def mqar_table(heads: dict[str, list]) -> Table | None:
    """MQAR accuracy at L per number of heads, fewest first (``None`` where the heads sweep did not run)."""
    if not heads:
        return None
    ordered = sorted(heads.items(), key=lambda kv: int(kv[0]))
    return Table(
        "multi-query associative recall at L by number of heads",
        ("MQAR: heads", "accuracy at L per seed", "mean ± sd"),
        tuple((str(h), values_text(v), mean_sd_text(v)) for h, v in ordered),
        align="llr",
    )
