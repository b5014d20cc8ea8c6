"""Build ``report.html``: one self-contained page from a lab folder's results.json files and PNGs.

Layout of a lab folder (written by ``poslab lab``; any subset works)::

    LAB/lab.json                      the lab's manifest: mode, steps, timings, machine and versions
    LAB/experiments/NAME/results.json + *.png

The page embeds every plot as a base64 PNG and the CJK font as a base64 subset, loads nothing from
the network and runs no script. Every number on it is read from those files at build time.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import platform
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from poslab.display.fonts import FAMILY, font_face_css
from poslab.lab.evidence import REFERENCE_KEY, SOURCE, WITHDRAWN, evidence_kind, lesson_claim
from poslab.lab.plan import MAX_SEEDS
from poslab.lab.report import claims as claims_mod
from poslab.lab.report.i18n import LESSONS, language, name_lessons, t, use_language
from poslab.lab.report.reading import MANIFEST_ERRORS, UNREADABLE, load_manifest, load_results, png_files
from poslab.lab.report.sections import KNOWN_FOLDERS, SECTIONS, Section
from poslab.lab.report.zh_text import localized, parentheticals
from poslab.lab.tables import KeyTable, TableFailure, build_tables, cell_text, esc, is_scalar
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, MIN_SEEDS, ClaimRecord, not_testable, num

MAX_TABLE_ROWS = 40
MAX_COLUMNS = 12

#: the kinds of verdict a reader tells apart, in the order the page lists them (unusable: a record the rule refutes;
#: cited-held / cited-wrong: decided by a source, not a measurement; withdrawn: a correction the lab takes back)
KINDS = ("held", "wrong", "cited-held", "cited-wrong", "untestable", "inconclusive", "withdrawn", "unusable", "note")
#: the kinds that are not verdicts on a lesson (a poslab note: :func:`poslab.lab.evidence.lesson_claim`), left
#: out of every count line
NOT_TALLIED = ("note",)
#: the kinds every count line names, even at 0 (the others only when some record has them)
ALWAYS_COUNTED = ("held", "wrong", "untestable", "inconclusive")


# ------------------------------------------------------------------------------------------ reading
def machine_info() -> dict[str, Any]:
    """The machine and the versions of the software doing the work (recorded by the lab when it runs)."""
    import torch

    from poslab.version import __version__

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"poslab": __version__, "python": platform.python_version(), "torch": torch.__version__}
    for name in ("numpy", "matplotlib", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "versions": versions,
        "python_executable": sys.executable,
    }


# ------------------------------------------------------------------------------------------ HTML bits
def warning(text: str) -> str:
    """One line naming a file the page could not use (its text is data: shown as written)."""
    return f"<p class='warn'>{show(text)}</p>"


def paragraphs(text: str) -> str:
    return "".join(f"<p>{esc(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def image_tag(path: Path, alt: str) -> str:
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError as err:
        return warning(f"unreadable {path.name}: {err.strerror or err}")
    return (
        f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{esc(path.name)}</figcaption></figure>"
    )


def cell(value: Any) -> str:
    """One table cell (a value from the results, marked as data): :func:`poslab.lab.tables.cell_text`, escaped."""
    return f"<span class='d'>{esc(cell_text(value))}</span>"


def grid(caption: str, headers: list[str], rows: list[tuple[str | None, list[Any]]]) -> str:
    """A captioned table: one ``(row header or None, cells)`` pair per row, each cell by :func:`cell`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + ("" if k is None else f"<th>{esc(k)}</th>") + "".join(f"<td>{cell(v)}</td>" for v in cells) + "</tr>"
        for k, cells in rows
    )
    return f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    """Names and values, one per row."""
    return (
        "<table class='kv'><tbody>"
        + "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in rows)
        + "</tbody></table>"
    )


def records_table(rows: list[dict], caption: str) -> str:
    """A list of dicts as a table: the first :data:`MAX_COLUMNS` keys, the first :data:`MAX_TABLE_ROWS` rows."""
    columns = list(dict.fromkeys(k for row in rows for k in row))[:MAX_COLUMNS]
    more = len(rows) - MAX_TABLE_ROWS
    note = f"<p class='note'>{esc(t('folder.more', n=more))}</p>" if more > 0 else ""
    return grid(caption, columns, [(None, [row.get(c, "") for c in columns]) for row in rows[:MAX_TABLE_ROWS]]) + note


def matrix_table(data: dict[str, dict], caption: str) -> str:
    """A dict of dicts of scalars as a 2-D table (rows = outer keys)."""
    columns = list(dict.fromkeys(k for inner in data.values() for k in inner))
    return grid(caption, ["", *columns], [(k, [inner.get(c, "") for c in columns]) for k, inner in data.items()])


def numbers_html(results: dict, skip: tuple[str, ...] = ("claims",)) -> str:
    """Every number of a results.json as tables: scalars, dicts, dict-of-dicts, lists of records."""
    scalars: list[tuple[str, Any]] = []
    blocks: list[str] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if is_scalar(value) or (isinstance(value, list) and all(is_scalar(v) for v in value)):
            scalars.append((path, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            blocks.append(records_table(value, path))
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, dict) and all(is_scalar(x) for x in v.values()) for v in value.values())
        ):
            blocks.append(matrix_table(value, path))
        elif isinstance(value, dict) and depth < 3:
            for key, inner in value.items():
                walk(inner, f"{path}.{key}" if path else str(key), depth + 1)
        else:
            scalars.append((path, value))

    for key, value in results.items():
        if key not in skip:
            walk(value, key, 1)
    return (kv_table(scalars) if scalars else "") + "".join(blocks)


def kind(record: ClaimRecord) -> str:
    """Which of :data:`KINDS` a record is: the lesson right or wrong (by a measurement, or by a source), not testable
    here, inside the noise, withdrawn, or not usable."""
    if isinstance(record.details, dict) and record.details.get(claims_mod.UNUSABLE):
        return "unusable"
    if not lesson_claim(record.details):
        return "note"
    evidence = evidence_kind(record.details)
    if evidence == WITHDRAWN:
        return "withdrawn"
    if not_testable(record):
        return "untestable"
    cited = "cited-" if evidence == SOURCE else ""
    if record.verdict == HELD:
        return cited + "held"
    if record.verdict == DID_NOT_HOLD:
        return cited + "wrong"
    return "inconclusive"


def verdict_badge(record: ClaimRecord) -> str:
    """The badge of a record's kind (its own colour; the text in the page's language)."""
    k = kind(record)
    return f"<span class='badge {k}'>{esc(t('kind.' + k))}</span>"


def show(text: Any) -> str:
    """Text an experiment wrote (a claim, a criterion, a figure), escaped, in the page's language
    (:func:`~poslab.lab.report.zh_text.localized`), with the lessons named by their titles."""
    return f"<span class='d'>{esc(name_lessons(localized(str(text))))}</span>"


def source_text(source: str) -> str:
    """Where a claim is made, with the lessons named by their titles (in Chinese, with its glosses in Chinese)."""
    if language() != "zh":
        return name_lessons(source)
    return name_lessons(parentheticals(source)).replace(" and ", "、")


def show_source(source: str) -> str:
    """:func:`source_text`, marked as data (an experiment wrote it)."""
    return f"<span class='d'>{esc(source_text(source))}</span>"


def claim_text(record: ClaimRecord) -> str:
    """The claim as the page shows it: a correction's Chinese quotation in the Chinese page, else the claim."""
    quote = record.details.get("quote") if isinstance(record.details, dict) else None
    if language() == "zh" and isinstance(quote, str) and quote:
        return f"<span class='zh'>{esc(quote)}</span>"
    return show(record.claim)


def margin_text(record: ClaimRecord) -> str:
    """Margin against noise in words; for an inconclusive verdict, by how much it missed."""
    if record.margin is None:
        return t("margin.unmeasurable")
    margin = num(record.margin)
    if record.noise is None:
        return t("margin.deterministic" if record.n_seeds == 0 else "margin.nonoise", margin=margin)
    text = t("margin.seeded", margin=margin, noise=num(record.noise), n=record.n_seeds)
    if kind(record) == "inconclusive":
        if record.n_seeds < MIN_SEEDS:
            text += t("margin.fewseeds", n=MIN_SEEDS)
        else:
            text += t("margin.missed", by=num(record.noise - abs(record.margin)))
    return text + design_text(record)


def design_text(record: ClaimRecord) -> str:
    """A seeded record's test, p-value and Holm step; for an inconclusive one, the seeds that would decide it."""
    details = record.details if isinstance(record.details, dict) else {}
    holm, power, p = details.get("holm"), details.get("power"), details.get("p_value")
    if record.design is None or not isinstance(holm, dict) or not isinstance(p, (int, float)):
        return ""
    test = t("test." + record.design.test.value) + (t("test.ln") if record.design.log else "")
    text = t(
        "margin.design",
        test=test,
        p=f"{p:.2g}",
        family=holm.get("family", ""),
        step=holm.get("rank", "?"),
        m=holm.get("m", "?"),
        threshold=f"{holm.get('threshold', 0):.2g}",
    )
    if kind(record) == "inconclusive" and isinstance(power, dict):
        n = power.get("seeds_to_decide")
        text += t("margin.decide", n=n) if isinstance(n, int) else t("margin.undecidable", n=MAX_SEEDS)
    return text


def verdict_table(verdicts: list[claims_mod.Verdict], with_folder: bool = False) -> str:
    """The claims table: lesson, claim (with its criterion and evidence), measured, margin vs noise, badge."""
    if not verdicts:
        return f"<p class='note'>{esc(t('table.none'))}</p>"
    colgroup = (
        "<colgroup><col style='width:11%'><col style='width:31%'><col style='width:28%'><col style='width:18%'>"
        "<col style='width:12%'></colgroup>"
    )
    rows = []
    for v in verdicts:
        r = v.record
        where = results_path(v) if with_folder else ""
        criterion = f"<div class='crit'>{esc(t('table.criterion'))} {show(r.criterion)}</div>" if r.criterion else ""
        evidence = r.details.get("evidence") if isinstance(r.details, dict) else None
        if kind(r) == "unusable":
            criterion += f"<div class='crit'>{esc(t('table.unusable'))} {show(r.details[claims_mod.UNUSABLE])}</div>"
        if evidence and kind(r) in ("wrong", "cited-wrong", "cited-held"):
            criterion += f"<div class='crit'>{esc(t('table.evidence'))} {show(evidence)}</div>"
        if kind(r) in ("cited-wrong", "cited-held") and r.details.get(REFERENCE_KEY):
            criterion += f"<div class='crit'>{esc(t('table.reference'))} {show(r.details[REFERENCE_KEY])}</div>"
        if kind(r) == "withdrawn":
            criterion += f"<div class='crit'>{esc(t('table.withdrawn'))} {show(r.details.get('reason', ''))}</div>"
        rows.append(
            f"<tr class='v-{kind(r)}'><td class='src'>{show_source(r.source)}{where}</td>"
            f"<td>{claim_text(r)}{criterion}</td><td>{show(r.measured)}</td><td>{esc(margin_text(r))}</td>"
            f"<td>{verdict_badge(r)}</td></tr>"
        )
    return claims_table(("table.measured", "table.margin"), rows, colgroup)


def untestable_table(verdicts: list[claims_mod.Verdict]) -> str:
    """The claims not testable at this scale, each with what was missing (its ``details["reason"]``)."""
    rows = []
    for v in verdicts:
        r = v.record
        reason = r.details.get("reason") or (r.premise.text if r.premise else "")
        rows.append(
            f"<tr class='v-untestable'><td class='src'>{show_source(r.source)}{results_path(v)}</td>"
            f"<td>{claim_text(r)}</td><td>{show(reason)}</td>"
            f"<td>{show(r.details.get('verdict_without_premise', ''))}</td><td>{verdict_badge(r)}</td></tr>"
        )
    return claims_table(("table.reason", "table.without"), rows)


def claims_table(columns: tuple[str, ...], rows: list[str], colgroup: str = "") -> str:
    """A table of claims: lesson, claim, the message ids of ``columns``, verdict; ``rows`` as HTML."""
    head = "".join(f"<th>{esc(t(k))}</th>" for k in ("table.lesson", "table.claim", *columns, "table.verdict"))
    return f"<table class='claims'>{colgroup}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def results_path(v: claims_mod.Verdict) -> str:
    """The results file a verdict comes from, under its lesson."""
    return f"<div class='path'>{show(v.experiment + '/results.json')}</div>"


def decided_share(kinds: Iterable[tuple[str, int]]) -> tuple[int, int]:
    """``(decided, testable)`` over ``(kind, n_seeds)`` pairs: of the lesson's seeded claims on models that met their
    premises (kind held, wrong or inconclusive, with seeds), how many a measurement decided (held or wrong)."""
    testable = [k for k, n in kinds if n > 0 and k in ("held", "wrong", "inconclusive")]
    return sum(k in ("held", "wrong") for k in testable), len(testable)


def tally(kinds: Iterable[str]) -> list[tuple[str, int]]:
    """``(kind, count)`` of each kind a count line names, in the order of :data:`KINDS`."""
    counts = Counter(kinds)
    return [(k, counts[k]) for k in KINDS if (counts[k] or k in ALWAYS_COUNTED) and k not in NOT_TALLIED]


def summary_counts(verdicts: list[claims_mod.Verdict], share: bool = False) -> str:
    """The count of each kind; with ``share``, also how many of the testable seeded claims were decided."""
    out = " ".join(
        f"<span class='count {k}'>{esc(t('count', n=n, name=t('kind.' + k)))}</span>"
        for k, n in tally(kind(v.record) for v in verdicts)
    )
    decided, testable = decided_share((kind(v.record), v.record.n_seeds) for v in verdicts)
    if share and testable:
        text = t("share", decided=decided, testable=testable, percent=f"{100 * decided / testable:.0f}")
        out += f" <span class='count share'>{esc(text)}</span>"
    return out


def legend() -> str:
    """The badges, each with its one-line meaning."""
    items = "".join(
        f"<li><span class='badge {k}'>{esc(t('kind.' + k))}</span> {esc(t('kind.' + k + '.meaning'))}</li>"
        for k in KINDS
    )
    return f"<div class='legend'><strong>{esc(t('legend.title'))}</strong><ul>{items}</ul></div>"


# ------------------------------------------------------------------------------------------ key tables
def declared_tables(folder: str, results: dict) -> tuple[KeyTable, ...]:
    """The key tables the owner of a results folder declares (none for a folder no experiment owns, or whose
    results.json could not be read: the page names that file instead)."""
    from poslab.lab.experiments import descriptions

    if UNREADABLE in results:
        return ()
    owner = descriptions().get(folder.removeprefix("experiments/")) if folder.startswith("experiments/") else None
    return owner.tables if owner is not None else ()


def failure_line(failure: TableFailure) -> str:
    """A table that could not be built, in the page's language: the experiment, the table, the missing field."""
    if failure.field is not None:
        return t("key.missing", experiment=failure.experiment, table=failure.table, field=failure.field)
    return t("key.failed", experiment=failure.experiment, table=failure.table, problem=failure.error)


def key_tables(folder: str, results: dict) -> str:
    """The headline tables of a folder's results as HTML; a table its results.json cannot build is a warning
    naming the folder, the table and what is missing, in the table's place."""
    return "".join(
        warning(failure_line(table)) if isinstance(table, TableFailure) else table.to_html()
        for table in build_tables(folder, declared_tables(folder, results), results)
    )


def table_failures(lab_dir: Path | str) -> list[TableFailure]:
    """Every key table of a lab folder that its results cannot build (what ``poslab report`` reports as errors)."""
    return [
        table
        for folder, results in load_results(Path(lab_dir)).items()
        for table in build_tables(folder, declared_tables(folder, results), results)
        if isinstance(table, TableFailure)
    ]


# ------------------------------------------------------------------------------------------ sections
def folder_html(lab_dir: Path, folder: str, results: dict | None, step: dict | None) -> str:
    """Plots and numbers of one results folder (or why it is missing)."""
    name = folder.split("/")[-1]
    parts = [f"<div class='folder'><h3>{show(name)} <span class='path'>{show(folder + '/')}</span></h3>"]
    if step and step.get("status") in ("failed", "interrupted", "skipped", "unavailable"):
        status = t("status." + step["status"])
        parts.append(f"<p class='warn'>{esc(t('folder.step', status=status))}{show(step.get('error', ''))}</p>")
    if results is None:
        parts.append(f"<p class='note'>{esc(t('folder.notrun'))}</p></div>")
        return "".join(parts)
    if isinstance(results.get(UNREADABLE), str):
        parts.append(warning(results[UNREADABLE]))
    description = results.get("description") or results.get("DESCRIPTION")
    if isinstance(description, str):
        parts.append(f"<p>{show(description)}</p>")
    pngs, skipped = png_files(lab_dir / folder)
    parts += [warning(f"{folder}/{line}") for line in skipped]
    for png in pngs:
        parts.append(image_tag(png, f"{name}: {png.stem}"))
    key = key_tables(folder, results)
    parts.append(key)
    numbers = numbers_html(results)
    opened = " open" if not pngs and not key and numbers.count("<tr") <= 60 else ""  # nothing else shows its numbers
    parts.append(
        f"<details{opened}><summary>{esc(t('folder.numbers', path=folder + '/results.json'))}</summary>"
        f"{numbers}</details></div>"
    )
    return "".join(parts)


def section_html(
    section: Section,
    lab_dir: Path,
    results: dict[str, dict],
    verdicts: list[claims_mod.Verdict],
    steps: dict[str, dict],
) -> str:
    mine = [v for v in verdicts if v.experiment in section.folders]
    folders = "".join(folder_html(lab_dir, f, results.get(f), steps.get(f)) for f in section.folders)
    title, claim, measured = (section_text(section, f) for f in ("title", "claim", "measured"))
    return (
        f"<section id='{esc(section.key)}'><h2>{esc(title)}</h2>"
        f"<p class='lessons'>{esc(source_text(section.lessons))} · {summary_counts(mine)}</p>"
        f"<div class='claim'><h4>{esc(t('section.claimhead'))}</h4>{paragraphs(claim)}</div>"
        f"<div class='measured'><h4>{esc(t('section.measuredhead'))}</h4>{paragraphs(measured)}</div>"
        f"<h4>{esc(t('section.verdicts'))}</h4>{verdict_table(mine)}{folders}</section>"
    )


def section_text(section: Section, field: str) -> str:
    """A section's title, claim or measured text in the page's language (from the string table when listed there)."""
    key = f"section.{section.key}.{field}"
    try:
        return name_lessons(t(key))
    except KeyError:  # a section built here (the "other" one) carries its own text
        return getattr(section, field)


def machine_html(manifest: dict) -> str:
    machine = manifest.get("machine") or machine_info()
    origin = t("machine.recorded") if manifest.get("machine") else t("machine.here")
    rows = [
        (t("machine.cpu"), machine.get("cpu")),
        (t("machine.cores"), machine.get("cores")),
        (t("machine.threads"), machine.get("torch_threads")),
        (t("machine.cuda"), machine.get("cuda")),
        (t("machine.platform"), machine.get("platform")),
        *machine.get("versions", {}).items(),
    ]
    for key in ("mode", "started", "finished", "seconds", "command"):
        if key in manifest:
            rows.append((t("machine.lab", key=key), manifest[key]))
    steps = manifest.get("steps") or []
    fields = ("name", "kind", "status", "seconds", "cpu_seconds", "folder", "error")
    step_table = (
        records_table([{k: s[k] for k in fields if k in s} for s in steps], t("machine.steps")) if steps else ""
    )
    return (
        f"<section id='machine'><h2>{esc(t('nav.machine'))}</h2>"
        f"<p class='note'>{esc(t('machine.shared', origin=origin))}"
        f"</p>{kv_table(rows)}{step_table}</section>"
    )


CSS = """
:root { --ink:#1d2330; --muted:#5b6475; --line:#e3e6ec; --bg:#f6f7f9; --card:#fff; --accent:#3057d5;
  --held:#1e7d46; --held-bg:#e3f4ea; --wrong:#b3261e; --wrong-bg:#fde7e5; --untestable:#5b3fa8; --untestable-bg:#ece6fa;
  --inconclusive:#5b6475; --inconclusive-bg:#eceef2; --warn:#a35200; --warn-bg:#fdf0e1; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); line-height:1.55;
  font-family: "DejaVu Sans", "Segoe UI", "Helvetica Neue", Arial, 'FAMILY', sans-serif; font-size:15px; }
header { background:#111827; color:#f3f4f6; padding:28px 40px; }
header h1 { margin:0 0 6px; font-size:26px; } header p { margin:4px 0; color:#cbd1dc; }
.layout { display:flex; align-items:flex-start; }
nav { position:sticky; top:0; width:250px; flex:none; padding:20px 16px; max-height:100vh; overflow:auto; }
nav a { display:block; color:var(--ink); text-decoration:none; padding:5px 8px; border-radius:6px; font-size:14px; }
nav a:hover { background:#e8ecf6; }
main { flex:1; min-width:0; padding:20px 40px 60px 8px; max-width:1200px; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:22px 28px; \
margin:0 0 24px; }
h2 { margin:0 0 4px; font-size:21px; } h3 { font-size:16px; margin:22px 0 8px; } h4 { margin:16px 0 6px; font-size:13px;
  text-transform:uppercase; letter-spacing:.05em; color:var(--muted); }
.lessons { color:var(--muted); margin:0 0 8px; font-size:13px; }
.claim { border-left:4px solid var(--accent); background:#f3f6fe; padding:4px 16px; border-radius:0 8px 8px 0; }
.measured { border-left:4px solid #9aa3b5; padding:4px 16px; }
.zh, .claim p, html[lang='zh-Hans'] body { font-family: 'FAMILY', "DejaVu Sans", sans-serif; }
figure { margin:14px 0; } \
img { max-width:100%; height:auto; border:1px solid var(--line); border-radius:6px; background:#fff; }
figcaption { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; margin:10px 0; font-size:13px; width:auto; max-width:100%; display:block; \
overflow-x:auto; }
caption { text-align:left; font-weight:600; color:var(--muted); padding:4px 0; }
th, td { border-bottom:1px solid var(--line); padding:5px 10px; text-align:left; vertical-align:top; }
thead th { background:#f0f2f6; } table.kv th { color:var(--muted); font-weight:500; white-space:nowrap; }
table.claims { display:table; width:100%; table-layout:fixed; } table.claims td { overflow-wrap:anywhere; }
table.claims td.src { color:var(--muted); font-size:12px; } \
.crit { color:var(--muted); font-size:11px; margin-top:4px; } \
table.claims .path { font-size:11px; margin-top:4px; }
.badge { display:inline-block; padding:2px 8px; border-radius:6px; font-size:12px; font-weight:600; }
table.key { display:table; } table.key td { font-variant-numeric: tabular-nums; }
.badge.held, .count.held { background:var(--held-bg); color:var(--held); }
.badge.wrong, .count.wrong { background:var(--wrong-bg); color:var(--wrong); }
.badge.untestable, .count.untestable { background:var(--untestable-bg); color:var(--untestable); }
.badge.inconclusive, .count.inconclusive { background:var(--inconclusive-bg); color:var(--inconclusive); }
.badge.cited-held, .count.cited-held { background:var(--held-bg); color:var(--held); border:1px dashed var(--held); }
.badge.cited-wrong, .count.cited-wrong { background:var(--wrong-bg); color:var(--wrong);
  border:1px dashed var(--wrong); }
.badge.withdrawn, .count.withdrawn { background:var(--inconclusive-bg); color:var(--inconclusive);
  text-decoration:line-through; }
.badge.unusable, .count.unusable { background:var(--warn-bg); color:var(--warn); }
.badge.note { background:var(--inconclusive-bg); color:var(--inconclusive); font-style:italic; }
.legend { margin-top:10px; font-size:13px; } .legend ul { list-style:none; margin:4px 0 0; padding:0; }
.legend li { margin:3px 0; color:#cbd1dc; } header .badge { margin-right:6px; }
table.guide { display:table; width:100%; }
.count { padding:1px 8px; border-radius:999px; font-size:12px; font-weight:600; }
.path { color:var(--muted); font-weight:400; font-size:12px; } .note { color:var(--muted); font-size:13px; }
.warn { background:var(--warn-bg); color:var(--warn); padding:8px 12px; border-radius:6px; }
details { margin:8px 0 4px; } summary { cursor:pointer; color:var(--accent); font-size:13px; }
.folder { border-top:1px dashed var(--line); margin-top:18px; }
@media (max-width: 900px) { nav { display:none; } main { padding:12px; } }
""".replace("FAMILY", FAMILY)


def lesson_refs(lessons: str) -> list[tuple[str, str]]:
    """``(lesson id, section)`` pairs of a section's ``lessons`` text ("seed 000 §2.2 and §4, seed 001 exercise 3")."""
    refs, current = [], None
    for piece in re.split(r"[,;]", lessons):
        piece = piece.strip()
        match = re.match(r"seeds? (\d{3}(?: and \d{3})*)(.*)", piece)
        if match:  # "seeds 000 and 002": each lesson its own row
            *others, current = re.findall(r"\d{3}", match.group(1))
            refs += [(other, "—") for other in others]
            rest = match.group(2).strip()
        elif current and re.match(r"(§|Q\d|exercise|exp\.|\()", piece):
            rest = piece
        else:
            current = None if not piece.startswith(("§", "Q")) else current
            continue
        rest = rest.strip()
        refs.append((current, (rest[1:-1] if rest[:1] + rest[-1:] == "()" else rest) or "—"))
    return refs


def guide_html(lab_dir: Path, verdicts: list[claims_mod.Verdict]) -> str:
    """From each lesson section to the part of the page that measures it, its figures and its verdicts."""
    rows: dict[str, list[str]] = {lesson: [] for lesson in LESSONS}
    for section in SECTIONS:
        pngs = [p.name for f in section.folders for p in png_files(lab_dir / f)[0]]
        mine = [v for v in verdicts if v.experiment in section.folders]
        figures = show(", ".join(pngs)) if pngs else esc(t("guide.nofigure"))
        for lesson, ref in lesson_refs(section.lessons):
            if lesson in rows:
                rows[lesson].append(
                    f"<tr><td>{show_source(ref)}</td><td><a href='#{esc(section.key)}'>"
                    f"{esc(section_text(section, 'title'))}</a></td><td>{figures}</td>"
                    f"<td>{summary_counts(mine)}</td></tr>"
                )
    head = "".join(f"<th>{esc(t(k))}</th>" for k in ("guide.section", "guide.where", "guide.figures", "guide.verdicts"))
    tables = "".join(
        f"<h3 class='zh'>{esc(LESSONS[lesson])}</h3><table class='guide'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
        for lesson, body in rows.items()
        if body
    )
    return (
        f"<section id='guide'><h2>{esc(t('nav.guide'))}</h2><p class='note'>{esc(t('guide.intro'))}</p>"
        f"{tables}</section>"
    )


def build_report(lab_dir: Path | str, out: Path | str | None = None, lang: str = "en") -> Path:
    """Write the self-contained HTML report of a lab folder.

    Args:
        lab_dir: the lab folder (``runs/lab``).
        out: the HTML file (default ``lab_dir/report.html``, or ``report.zh.html`` for ``lang="zh"``); written
            atomically.
        lang: the page's language, ``"en"`` or ``"zh"`` (:mod:`poslab.lab.report.i18n`).

    Returns:
        The path written.
    """
    from poslab.fileio import atomic_write_text

    lab_dir = Path(lab_dir)
    if not lab_dir.is_dir():
        raise ValueError(f"lab folder {str(lab_dir)!r} does not exist; run `poslab lab` first")
    with use_language(lang):
        out = Path(out) if out is not None else lab_dir / ("report.html" if lang == "en" else f"report.{lang}.html")
        page = _page(lab_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    return out


def _page(lab_dir: Path) -> str:
    results = load_results(lab_dir)
    manifest = load_manifest(lab_dir)
    steps = {s.get("folder"): s for s in manifest.get("steps", []) if isinstance(s, dict)}
    verdicts = claims_mod.evaluate(results)

    sections = [section_html(s, lab_dir, results, verdicts, steps) for s in SECTIONS]
    others = [k for k in results if k not in KNOWN_FOLDERS]
    if others:
        extra = Section("other", t("nav.other"), "", t("other.claim"), t("other.measured"), tuple(others))
        sections.append(section_html(extra, lab_dir, results, verdicts, steps))
    untestable = [v for v in verdicts if kind(v.record) == "untestable"]
    apart = (
        (
            f"<h3 id='untestable'>{esc(t('claims.untestable'))}</h3>"
            f"<p class='note'>{esc(t('claims.untestable.intro'))}</p>"
            f"{untestable_table(untestable)}"
        )
        if untestable
        else ""
    )
    claims_section = (
        f"<section id='claims'><h2>{esc(t('nav.claims'))}</h2><p class='lessons'>{esc(t('claims.intro'))} · "
        f"{summary_counts(verdicts, share=True)}</p><p class='note'>{esc(t('rule'))}</p>"
        f"{verdict_table([v for v in verdicts if kind(v.record) != 'untestable'], with_folder=True)}{apart}</section>"
    )
    nav_items = [(s.key, section_text(s, "title")) for s in SECTIONS] + ([("other", t("nav.other"))] if others else [])
    nav = "".join(
        f"<a href='#{esc(k)}'>{esc(v)}</a>"
        for k, v in [("claims", t("nav.claims")), ("guide", t("nav.guide")), *nav_items, ("machine", t("nav.machine"))]
    )
    mode = manifest.get("mode", "unknown")
    mode_text = t(f"mode.{mode}") if mode in ("quick", "full", "unknown") else mode
    built = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    body = (
        f"<header><h1>{esc(t('page.title'))}</h1><p>{esc(t('page.intro', mode=mode_text, built=built))}</p>"
        f"<p>{summary_counts(verdicts, share=True)}</p>{legend()}"
        f"{''.join(warning(x) for x in manifest.get(MANIFEST_ERRORS, []))}"
        "</header>"
        f"<div class='layout'><nav>{nav}</nav><main>{claims_section}{guide_html(lab_dir, verdicts)}{''.join(sections)}"
        f"{machine_html(manifest)}</main></div>"
    )
    font_css = font_face_css(body)
    html_lang = "zh-Hans" if language() == "zh" else "en"
    return (
        f"<!DOCTYPE html><html lang='{html_lang}'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(t('page.title'))}</title><style>{font_css}{CSS}</style></head><body>{body}</body></html>"
    )
