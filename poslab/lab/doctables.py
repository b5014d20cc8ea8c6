"""The docs' figures from a lab run: a compact snapshot of its results and the tables rendered from it.

``docs/results/lab-quick.json`` holds what a quick lab measured (every claim record as the report
decides it, and the per-step times). Marked blocks of docs/lab.md and docs/extrapolation.md::

    <!-- generated: lab-verdicts -->
    ...
    <!-- end -->

(and the reference values of the Chinese guides, docs/zh/, :mod:`poslab.lab.reference_values`)
are rendered from that one snapshot, so the docs cannot disagree; ``tests/test_doctables.py``
fails when a block differs from the rendering. After a new quick lab, one command refreshes both::

    python -m poslab.lab.doctables --results runs/lab --write

(``--check`` only compares, exit 1 on a difference.) The deterministic steps of :data:`RERUNNABLE` take
seconds and need no training: after a change to one of them, its part of the snapshot is rerun alone::

    python -m poslab.lab.doctables --rerun corrections --write
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from poslab.lab import premises, reference_values
from poslab.lab.experiments import descriptions, probes_tables, run_experiment
from poslab.lab.report.builder import KINDS, decided_share, kind, tally
from poslab.lab.report.claims import evaluate
from poslab.lab.report.i18n import STRINGS, name_lessons
from poslab.lab.report.reading import load_manifest, load_results
from poslab.lab.tables import Table
from poslab.lab.verdicts import ClaimRecord

SNAPSHOT = Path("docs/results/lab-quick.json")
DOCS = ("lab.md", "extrapolation.md", "experiments.md", *(f"zh/lesson_00{i}.md" for i in range(3)), "zh/README.md")
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)
#: what each kind of verdict is called in the docs (the report's English badges)
KIND_NAMES = {k: STRINGS[f"kind.{k}"]["en"] for k in KINDS}
#: lab steps that are deterministic and take seconds: their part of the snapshot can be rerun alone
RERUNNABLE = ("rope-relative", "permutation", "model-zoo", "corrections")
POSITION_TRAINING = "experiments/position-training"
TRAINED = (
    "experiments/heads",
    "experiments/position-training",
    "experiments/extrapolation",
    "experiments/attention-entropy",
    "experiments/context-extension",
    "experiments/probes",
)


def snapshot(lab_dir: Path | str) -> dict[str, Any]:
    """The compact record of a lab folder: its mode, per-step times and every claim record (no per-seed details).

    Args:
        lab_dir: a lab folder written by ``poslab lab`` (``lab.json`` and the results folders).
    """
    lab_dir = Path(lab_dir)
    if not (lab_dir / "lab.json").is_file():
        raise ValueError(f"--results {str(lab_dir)!r} has no lab.json; give the folder `poslab lab --out` wrote")
    manifest, results = load_manifest(lab_dir), load_results(lab_dir)
    claims = [_claim(v.experiment, v.record) for v in evaluate(results)]
    fields = ("name", "status", "seconds", "cpu_seconds")
    steps = [{k: s.get(k) for k in fields} for s in manifest.get("steps", []) if isinstance(s, dict)]
    return {
        "mode": manifest.get("mode"),
        "command": manifest.get("command"),
        "seconds": manifest.get("seconds"),
        "cores": (manifest.get("machine") or {}).get("cores"),
        "steps": steps,
        "claims": claims,
        "language_models": premises.language_models(training) if (training := results.get(POSITION_TRAINING)) else {},
        "probes": _probes(results.get("experiments/probes", {})),
    }


def _claim(experiment: str, r: ClaimRecord) -> dict[str, Any]:
    """One claim record as the snapshot keeps it."""
    return {
        "experiment": experiment,
        "claim": r.claim,
        "source": r.source,
        "measured": r.measured,
        "margin": r.margin,
        "noise": r.noise,
        "n_seeds": r.n_seeds,
        "verdict": r.verdict,
        "kind": kind(r),
        "reason": r.details.get("reason", "") if isinstance(r.details, dict) else "",
        **_plan_of(r),
    }


def _plan_of(r: ClaimRecord) -> dict[str, Any]:
    """A seeded record's design as the snapshot keeps it: test, family, p-value, and the seeds that would decide it."""
    if r.design is None or not isinstance(r.details, dict):
        return {}
    power = r.details.get("power") if isinstance(r.details.get("power"), dict) else {}
    return {
        "test": r.design.test.value + (" on ln" if r.design.log else ""),
        "family": r.design.family,
        "p_value": r.details.get("p_value"),
        "seeds_to_decide": power.get("seeds_to_decide"),
    }


def _decides(c: dict) -> str:
    """The test of a seeded claim, its p-value, and for an inconclusive one the seeds an arm that would decide it."""
    if not c.get("test"):
        return ""
    p = c.get("p_value")
    text = c["test"] + (f", p = {p:.2g}" if isinstance(p, (int, float)) else "")
    if c["kind"] == "inconclusive":
        n = c.get("seeds_to_decide")
        text += f"; {n} seeds would decide it" if isinstance(n, int) else "; more than 200 seeds at this noise"
    return text


def rerun(snap: dict[str, Any], name: str, out: Path) -> dict[str, Any]:
    """``snap`` with the claims of the deterministic step ``name`` (one of :data:`RERUNNABLE`) recomputed.

    The step runs into ``out`` and its records replace the old ones where they stood (the other steps'
    claims, times and figures are kept as the lab measured them).
    """
    if name not in RERUNNABLE:
        raise ValueError(f"--rerun {name!r}: only the deterministic steps can be rerun alone: {', '.join(RERUNNABLE)}")
    folder = f"experiments/{name}"
    results = run_experiment(name, out / name, quick=snap.get("mode") == "quick")
    fresh = [_claim(v.experiment, v.record) for v in evaluate({folder: results}) if v.experiment == folder]
    old = [i for i, c in enumerate(snap["claims"]) if c["experiment"] == folder]
    at = old[0] if old else len(snap["claims"])
    kept = [c for c in snap["claims"] if c["experiment"] != folder]
    return dict(snap, claims=kept[:at] + fresh + kept[at:])


def _probes(results: dict[str, Any]) -> dict[str, Any]:
    """The probes' accuracy table (task -> scheme -> factor -> per-seed accuracies) and the MQAR head counts."""
    table = probes_tables.accuracy_of(results) if results.get("accuracy") else {}
    return {"accuracy": table, "heads_mqar": results.get("heads_mqar") or {}}


def _duration(seconds: float | None) -> str:
    if not isinstance(seconds, (int, float)):
        return "—"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _counts(claims: Sequence[dict]) -> str:
    return ", ".join(f"{n} {KIND_NAMES[k]}" for k, n in tally(c["kind"] for c in claims))


def _table(claims: Sequence[dict], with_experiment: bool) -> str:
    planned = any(c.get("test") for c in claims)
    head = (["experiment"] if with_experiment else []) + ["claim", "source", "measured", "margin", "noise", "verdict"]
    head += ["test"] if planned else []
    rows = []
    for c in claims:
        verdict = KIND_NAMES[c["kind"]] + (
            f" ({c['reason']})" if c["kind"] in ("untestable", "withdrawn") and c["reason"] else ""
        )
        row = ([c["experiment"].split("/")[-1]] if with_experiment else []) + [
            name_lessons(c["claim"]),
            name_lessons(c["source"]),
            name_lessons(c["measured"]),
            c["margin"],
            c["noise"],
            verdict,
        ]
        row += [_decides(c)] if planned else []
        rows.append(tuple(row))
    return Table("", tuple(head), tuple(rows), align="l" * len(head), digits=3).to_markdown()


def _summary(snap: dict) -> str:
    steps = snap["steps"]
    decided, testable = decided_share((c["kind"], c.get("n_seeds", 0)) for c in snap["claims"])
    finished = sum(s["status"] in ("ok", "reused") for s in steps)
    rows = [(s["name"], s["status"], _duration(s["seconds"]), _duration(s.get("cpu_seconds"))) for s in steps]
    cpu = [s.get("cpu_seconds") for s in steps]
    if cpu and all(isinstance(c, (int, float)) for c in cpu):
        rows.append(("all", "", _duration(snap.get("seconds")), _duration(sum(cpu))))
    return (
        f"`{snap.get('command') or 'poslab lab'}` ({snap.get('mode')} mode, {snap.get('cores')} cores as recorded "
        f"in lab.json): {finished} of {len(steps)} steps finished in {_duration(snap.get('seconds'))} wall; "
        f"{len(snap['claims'])} claim records: {_counts(snap['claims'])}; of the {testable} seeded claims on models "
        f"that met their premises, {decided} decided ({100 * decided / max(testable, 1):.0f}%). "
        "Wall times as lab.json recorded them "
        "(the machine may have been shared with other work); CPU: the step's process and its children, "
        "which load on the machine does not inflate."
        + (f" {snap['timing_note']}" if snap.get("timing_note") else "")
        + "\n\n"
        + Table("", ("step", "status", "wall", "CPU"), tuple(rows), align="llrr").to_markdown()
    )


def with_timing(snap: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """``snap`` (its claims and figures) with the step times of ``timed``, an earlier snapshot of the same
    trainings whose wall times were measured on quiet cores; ``timing_note`` says where each part comes from."""
    if timed.get("mode") != snap.get("mode"):
        raise ValueError(
            f"--timing-from: a {timed.get('mode')!r} lab's times cannot stand for a {snap.get('mode')!r} lab"
        )
    own = _duration(snap["seconds"]) if isinstance(snap.get("seconds"), (int, float)) else "?"
    note = (
        f"The step times are those of an earlier quick lab of the same trainings on {timed.get('cores')} quiet "
        f"cores; the claims and figures are those of a later lab whose own wall time ({own}) was taken on cores "
        "shared with other work."
    )
    keys = ("command", "seconds", "cores", "steps")
    return {**snap, **{k: timed[k] for k in keys if k in timed}, "timing_note": note}


def _of(*folders: str) -> Callable[[dict], str]:
    def render(snap: dict) -> str:
        mine = [c for c in snap["claims"] if c["experiment"] in folders]
        return f"{len(mine)} records: {_counts(mine)}.\n\n" + _table(mine, with_experiment=len(folders) > 1)

    return render


def _lm_premises(snap: dict) -> str:
    """The quick language models against their premises (:mod:`poslab.lab.premises`)."""
    table = premises.premises_table(snap.get("language_models") or {})
    return table.to_markdown() if table is not None else "(no position-training results in this snapshot)\n"


def _probe_accuracy(snap: dict) -> str:
    """The probes' answer accuracy per task, scheme and test length (mean ± sd over seeds), and MQAR by heads."""
    probes = snap.get("probes") or {}
    tables = [
        *probes_tables.accuracy_tables(probes.get("accuracy") or {}),
        probes_tables.mqar_table(probes.get("heads_mqar") or {}),
    ]
    shown = [table.to_markdown() for table in tables if table is not None]
    return "\n".join(shown) if shown else "(no probes results in this snapshot)\n"


#: block name -> renderer of the snapshot
BLOCKS: dict[str, Callable[[dict], str]] = {
    "lab-summary": _summary,
    "lab-verdicts": _of(*TRAINED),
    "extrapolation-verdicts": _of("experiments/extrapolation"),
    "context-extension-verdicts": _of("experiments/context-extension"),
    "attention-entropy-verdicts": _of("experiments/attention-entropy"),
    "quick-lm-premises": _lm_premises,
    "probes-accuracy": _probe_accuracy,
    "probes-verdicts": _of("experiments/probes"),
    # the Chinese guides' reference values (poslab.lab.reference_values)
    "zh-way-in": lambda snap: reference_values.way_in(snap, [n for n, e in descriptions().items() if e.in_all]),
    "zh-position-training": reference_values.position_training,
    "zh-probes": reference_values.probes,
    "zh-heads": reference_values.claim_figures("experiments/heads"),
    "zh-extrapolation": reference_values.claim_figures("experiments/extrapolation"),
    "zh-attention-entropy": reference_values.claim_figures("experiments/attention-entropy"),
    "zh-context-extension": reference_values.claim_figures("experiments/context-extension"),
    "zh-head-analysis": reference_values.head_analysis,
}


def render(snap: dict, name: str) -> str:
    """Block ``name`` rendered from a snapshot (``ValueError`` naming an unknown block, or a block the snapshot
    lacks a field of and the field)."""
    if name not in BLOCKS:
        raise ValueError(f"unknown generated block {name!r}; known: {sorted(BLOCKS)}")
    try:
        return BLOCKS[name](snap)
    except KeyError as err:
        raise ValueError(f"block {name!r} cannot be rendered: the snapshot has no field {err.args[0]!r}") from err
    except (TypeError, AttributeError, IndexError) as err:
        raise ValueError(f"block {name!r} cannot be rendered: {type(err).__name__}: {err}") from err


def update(text: str, snap: dict) -> str:
    """``text`` with every marked block replaced by its rendering."""
    return BLOCK.sub(lambda m: m.group(1) + render(snap, m.group(2)) + m.group(4), text)


def differences(text: str, snap: dict) -> list[str]:
    """The names of the blocks of ``text`` whose content differs from the rendering."""
    return [m.group(2) for m in BLOCK.finditer(text) if m.group(3) != render(snap, m.group(2))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m poslab.lab.doctables", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="a lab folder: write its snapshot to --snapshot first")
    parser.add_argument(
        "--rerun", action="append", default=[], choices=RERUNNABLE, help="rerun a deterministic step into the snapshot"
    )
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT, help=f"the snapshot (default {SNAPSHOT})")
    parser.add_argument(
        "--timing-from",
        type=Path,
        help="with --results: keep the step times of this earlier snapshot of the same trainings (a lab whose own "
        "wall times were taken on shared cores); the summary says so",
    )
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the docs folder (default docs)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the generated blocks of the docs")
    action.add_argument("--check", action="store_true", help="exit 1 when a generated block differs")
    args = parser.parse_args(argv)
    try:
        if args.timing_from is not None and args.results is None:
            raise ValueError("--timing-from needs --results (the lab whose claims the snapshot takes)")
        if args.results is not None:
            snap = snapshot(args.results)
            if args.timing_from is not None:
                snap = with_timing(snap, json.loads(args.timing_from.read_text(encoding="utf-8")))
            args.snapshot.parent.mkdir(parents=True, exist_ok=True)
            args.snapshot.write_text(json.dumps(snap, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        snap = json.loads(args.snapshot.read_text(encoding="utf-8"))
        if args.rerun:
            with tempfile.TemporaryDirectory() as work:
                for name in args.rerun:
                    snap = rerun(snap, name, Path(work))
            args.snapshot.write_text(json.dumps(snap, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        stale = []
        for name in DOCS:
            path = args.docs / name
            text = path.read_text(encoding="utf-8")
            if args.write:
                path.write_text(update(text, snap), encoding="utf-8")
            else:
                stale += [f"{name}: {block}" for block in differences(text, snap)]
    except (OSError, ValueError) as err:
        print(f"doctables: error: {err}", file=sys.stderr)
        return 2
    for line in stale:
        print(f"differs from {args.snapshot}: {line}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
