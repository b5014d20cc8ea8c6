"""The seeds each seeded claim of a lab needs: the pilot the lab's seed counts are chosen from.

Reads the claim records of a lab folder (``poslab lab --out DIR``; each experiment's results.json, as the
plan left them: :func:`poslab.lab.plan.adjust` records ``details["power"]``) and prints, per seeded claim,
its test, seeds, the measured effect (``|margin|``) and noise of one seed (``sd``), its p-value and Holm
step, the smallest effect its seeds detect with 80% power, and the seeds an arm that would detect the
measured effect at that noise. Then per experiment: how many claims the current seeds decide, and how
many a given seed count would (``--seeds``)::

    python benchmarks/pilot_seeds.py runs/lab --seeds 3 6 10 --json benchmarks/results/pilot_seeds.json

``--keep OLD.json`` keeps the rows of an earlier pilot for the experiments this lab folder holds no records of
(a pilot of the experiments whose recipe changed, ``poslab lab --only``, the others' rows unchanged).

Seeds past :data:`poslab.lab.plan.MAX_SEEDS` are shown as ``>200``. A claim whose premise was not met is
listed apart: more seeds do not make a model that cannot do the task testable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from poslab.lab.plan import MAX_SEEDS
from poslab.lab.report.reading import load_results
from poslab.lab.verdicts import INCONCLUSIVE, ClaimRecord, not_testable


def rows(lab_dir: Path) -> list[dict]:
    """One row per seeded claim record of the lab folder with a design."""
    out = []
    for folder, results in load_results(lab_dir).items():
        for entry in results.get("claims", []) if isinstance(results, dict) else []:
            try:
                r = ClaimRecord.from_dict(entry)
            except (TypeError, ValueError):
                continue
            if r.n_seeds == 0 or r.design is None:
                continue
            power = r.details.get("power") or {}
            holm = r.details.get("holm") or {}
            out.append(
                {
                    "experiment": folder.split("/")[-1],
                    "claim": r.claim,
                    "test": r.design.test.value + (" on ln" if r.design.log else ""),
                    "n": r.n_seeds,
                    "effect": None if r.margin is None else abs(r.margin),
                    "sd": power.get("sd"),
                    "p": r.details.get("p_value"),
                    "alpha": power.get("alpha", holm.get("threshold")),
                    "mde": power.get("mde"),
                    "seeds_to_decide": power.get("seeds_to_decide"),
                    "verdict": r.verdict,
                    "testable": not not_testable(r),
                }
            )
    return out


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lab", type=Path, help="a lab folder written by `poslab lab`")
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 6, 10], help="seed counts to tabulate")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--keep", type=Path, help="an earlier pilot's rows, kept for the experiments the lab lacks")
    args = parser.parse_args()
    table = rows(args.lab)
    if args.keep is not None:
        here = {r["experiment"] for r in table}
        kept = [r for r in json.loads(args.keep.read_text(encoding="utf-8")) if r["experiment"] not in here]
        table += kept
    if not table:
        raise SystemExit(f"no seeded claim records with a design under {args.lab}: run `poslab lab` first")
    head = ("experiment", "claim", "test", "n", "|margin|", "sd", "p", "Holm step", "mde", "seeds to decide")
    print(" | ".join(head))
    for r in table:
        decide = r["seeds_to_decide"] if r["seeds_to_decide"] is not None else f">{MAX_SEEDS}"
        if not r["testable"]:
            decide = "premise not met"
        cells = (r["experiment"], r["claim"][:70], r["test"], r["n"], r["effect"], r["sd"], r["p"], r["alpha"])
        print(" | ".join(_fmt(c) for c in (*cells, r["mde"], decide)))
    print()
    for experiment in dict.fromkeys(r["experiment"] for r in table):
        mine = [r for r in table if r["experiment"] == experiment and r["testable"]]
        decided = sum(r["verdict"] != INCONCLUSIVE for r in mine)
        within = {
            n: sum(isinstance(r["seeds_to_decide"], int) and r["seeds_to_decide"] <= n for r in mine)
            for n in args.seeds
        }
        counts = ", ".join(f"{k} seeds: {v}" for k, v in within.items())
        print(f"{experiment}: {len(mine)} testable seeded claims, {decided} decided now; detectable with {counts}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
