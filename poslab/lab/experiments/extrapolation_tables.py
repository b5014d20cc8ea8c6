"""The extrapolation experiment's key tables: validation perplexity per scheme and evaluation length, over seeds."""

from __future__ import annotations

from poslab.lab.experiments.training import baseline_note
from poslab.lab.report.i18n import t
from poslab.lab.tables import KeyTable, Table, ppl_spread

#: how perplexity is measured past the training length, each its own table
MODES = ("nonoverlapping", "sliding")


def perplexity_table(results: dict, mode: str) -> Table:
    """Scheme × evaluation length, mean ± sd of the perplexity over seeds (``cannot`` where a scheme cannot run)."""
    table, factors, length = results["perplexity"], results["factors"], results["train_length"]
    return Table(
        t(
            "key.extrapolation",
            label=t(f"key.{mode}"),
            length=length,
            seeds=results.get("seeds"),
            baseline=baseline_note(results),
        ),
        (t("key.scheme"), *(f"{f}×L = {f * length}" for f in factors)),
        tuple(
            (_label(results, scheme), *(ppl_spread(cells.get(str(f)), mode) for f in factors))
            for scheme, cells in table.items()
        ),
    )


def _label(results: dict, scheme: str) -> str:
    """The scheme's row label, with its seed count where the schemes trained different numbers of seeds."""
    by_scheme = results.get("seeds_by_scheme") or {}
    counts = {len(v) for v in by_scheme.values()}
    return f"{scheme} (n={len(by_scheme[scheme])})" if len(counts) > 1 and scheme in by_scheme else scheme


TABLES = tuple(KeyTable(f"perplexity ({mode})", lambda r, mode=mode: perplexity_table(r, mode)) for mode in MODES)
