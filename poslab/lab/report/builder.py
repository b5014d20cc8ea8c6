"""Build ``report.html``: one self-contained page from a lab folder's results.json files and PNGs.

Layout of a lab folder (written by ``poslab lab``; any subset works)::

    LAB/lab.json                      the lab's manifest: mode, steps, timings, machine and versions
    LAB/experiments/NAME/results.json + *.png
    LAB/heads/results.json + heads.png
    LAB/attention/results.json + attention.png

The page embeds every plot as a base64 PNG and the CJK font as a base64 subset, loads nothing from
the network and runs no script. Every number on it is read from those files at build time.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from poslab.display.fonts import FAMILY, font_face_css
from poslab.lab.report import claims as claims_mod
from poslab.lab.report.sections import KNOWN_FOLDERS, SECTIONS, Section
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, INCONCLUSIVE, MIN_SEEDS, ClaimRecord, pm, tally

MAX_TABLE_ROWS = 40
RULE = ("How a verdict is decided: training comparisons run every arm with at least 3 seeds; the margin is the "
        "difference of the means in the claim's direction and the noise the half-width of its 95% interval (Welch). "
        "held: margin > noise; did not hold: margin < -noise; inconclusive otherwise, or with fewer than 3 seeds. "
        "Deterministic claims (counts, tables, float identities) are decided against the tolerance in their criterion. "
        "docs/lab.md explains the rule.")
MAX_COLUMNS = 12


# ------------------------------------------------------------------------------------------ reading
def load_results(lab_dir: Path) -> dict[str, dict]:
    """Every ``results.json`` under ``lab_dir`` (up to two levels deep), keyed by folder (``experiments/params``)."""
    found: dict[str, dict] = {}
    lab_dir = Path(lab_dir)
    for path in sorted([*lab_dir.glob("*/results.json"), *lab_dir.glob("*/*/results.json")]):
        key = path.parent.relative_to(lab_dir).as_posix()
        if key.startswith("runs/"):
            continue  # training runs: their results are read by the experiments that made them
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            data = {"error": f"unreadable results.json: {err}"}
        found[key] = data if isinstance(data, dict) else {"value": data}
    return found


def load_manifest(lab_dir: Path) -> dict:
    """``lab.json`` or ``{}``."""
    path = Path(lab_dir) / "lab.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def paragraphs(text: str) -> str:
    return "".join(f"<p>{esc(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}"><figcaption>{esc(path.name)}</figcaption></figure>'


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def cell(value: Any) -> str:
    """One table cell: numbers formatted, short lists inline, long ones summarised."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if _is_scalar(value):
        return esc(claims_mod.num(value))
    if isinstance(value, list) and all(_is_scalar(v) for v in value):
        if len(value) <= 8:
            return esc(", ".join(claims_mod.num(v) for v in value))
        return esc(f"{len(value)} values: {claims_mod.num(value[0])}, {claims_mod.num(value[1])} … {claims_mod.num(value[-1])}")
    if isinstance(value, dict) and all(_is_scalar(v) for v in value.values()) and len(value) <= 6:
        return esc(", ".join(f"{k}={claims_mod.num(v)}" for k, v in value.items()))
    text = json.dumps(value, ensure_ascii=False)
    return esc(text if len(text) <= 80 else text[:77] + "…")


def records_table(rows: list[dict], caption: str) -> str:
    """A list of dicts as a table (scalar-ish columns only)."""
    columns: list[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in columns and (_is_scalar(value) or isinstance(value, (list, dict))):
                columns.append(key)
    columns = columns[:MAX_COLUMNS]
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell(row.get(c, ''))}</td>" for c in columns) + "</tr>" for row in rows[:MAX_TABLE_ROWS]
    )
    more = f"<p class='note'>… {len(rows) - MAX_TABLE_ROWS} more rows in results.json</p>" if len(rows) > MAX_TABLE_ROWS else ""
    return f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def matrix_table(data: dict[str, dict], caption: str) -> str:
    """A dict of dicts of scalars as a 2-D table (rows = outer keys)."""
    columns: list[str] = []
    for inner in data.values():
        columns += [k for k in inner if k not in columns]
    head = "<th></th>" + "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(
        f"<tr><th>{esc(k)}</th>" + "".join(f"<td>{cell(inner.get(c, ''))}</td>" for c in columns) + "</tr>"
        for k, inner in data.items()
    )
    return f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def numbers_html(results: dict, skip: tuple[str, ...] = ("claims",)) -> str:
    """Every number of a results.json as tables: scalars, dicts, dict-of-dicts, lists of records."""
    scalars: list[tuple[str, Any]] = []
    blocks: list[str] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if _is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value)):
            scalars.append((path, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            blocks.append(records_table(value, path))
        elif isinstance(value, dict) and value and all(isinstance(v, dict) and all(_is_scalar(x) for x in v.values()) for v in value.values()):
            blocks.append(matrix_table(value, path))
        elif isinstance(value, dict) and depth < 3:
            for key, inner in value.items():
                walk(inner, f"{path}.{key}" if path else str(key), depth + 1)
        else:
            scalars.append((path, value))

    for key, value in results.items():
        if key not in skip:
            walk(value, key, 1)
    table = ""
    if scalars:
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in scalars)
        table = f"<table class='kv'><tbody>{rows}</tbody></table>"
    return table + "".join(blocks)


_BADGE = {HELD: "held", DID_NOT_HOLD: "failed", INCONCLUSIVE: "unknown"}


def verdict_badge(verdict: str) -> str:
    return f"<span class='badge {_BADGE.get(verdict, 'unknown')}'>{esc(verdict)}</span>"


def margin_text(record: ClaimRecord) -> str:
    """Margin against noise in words; for an inconclusive verdict, by how much it missed."""
    if record.margin is None:
        return "not measurable"
    if record.noise is None:
        kind = "deterministic: no seeds" if record.n_seeds == 0 else "no measured noise"
        return f"margin {claims_mod.num(record.margin)} ({kind}; the tolerance is in the criterion)"
    text = f"margin {claims_mod.num(record.margin)} vs noise ±{claims_mod.num(record.noise)} (n={record.n_seeds})"
    if record.verdict == INCONCLUSIVE:
        if record.n_seeds < MIN_SEEDS:
            text += f"; fewer than {MIN_SEEDS} seeds"
        else:
            text += f"; missed by {claims_mod.num(record.noise - abs(record.margin))}"
    return text


def verdict_table(verdicts: list[claims_mod.Verdict], with_folder: bool = False) -> str:
    if not verdicts:
        return "<p class='note'>No claim of this section could be checked: its experiments did not run.</p>"
    colgroup = ("<colgroup><col style='width:11%'><col style='width:31%'><col style='width:28%'><col style='width:18%'>"
                "<col style='width:12%'></colgroup>")
    head = "<th>lesson</th><th>claim</th><th>measured here (mean ± sd)</th><th>margin vs noise</th><th>verdict</th>"
    rows = []
    for v in verdicts:
        r = v.record
        where = f"<div class='path'>{esc(v.experiment)}/results.json</div>" if with_folder else ""
        criterion = f"<div class='crit'>criterion: {esc(r.criterion)}</div>" if r.criterion else ""
        rows.append(f"<tr class='v-{_BADGE.get(r.verdict, 'unknown')}'><td class='src'>{esc(r.source)}{where}</td>"
                    f"<td>{esc(r.claim)}{criterion}</td><td>{esc(r.measured)}</td><td>{esc(margin_text(r))}</td>"
                    f"<td>{verdict_badge(r.verdict)}</td></tr>")
    return f"<table class='claims'>{colgroup}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def summary_counts(verdicts: list[claims_mod.Verdict]) -> str:
    counts = tally([v.record for v in verdicts])
    return (f"<span class='count held'>{counts[HELD]} held</span> "
            f"<span class='count failed'>{counts[DID_NOT_HOLD]} did not hold</span> "
            f"<span class='count unknown'>{counts[INCONCLUSIVE]} inconclusive</span>")


def _spread(values: Any, digits: int = 4) -> Any:
    """Per-seed values as ``mean ± sd (n)``; a scalar as itself."""
    if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
        return pm(values, digits)
    return values


# ------------------------------------------------------------------------------------------ key tables
def _table(headers: list[str], rows: list[list[Any]], caption: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table class='key'><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ppl(cell_value: Any, mode: str) -> Any:
    if not isinstance(cell_value, dict):
        return cell_value
    if "cannot" in cell_value:
        return "cannot"
    return cell_value.get(mode, {}).get("ppl")


def _ppl_spread(cell_value: Any, mode: str) -> Any:
    if not isinstance(cell_value, dict):
        return cell_value
    if "cannot" in cell_value:
        return "cannot"
    inner = cell_value.get(mode, {})
    seeds = inner.get("ppl_seeds") or inner.get("ppl_per_seed")  # extrapolation's cells / context-extension's
    if seeds:
        return pm(seeds, 3)
    return inner.get("ppl")


def _baseline_note(r: dict) -> str:
    value = r.get("unigram_entropy_nats")
    if not isinstance(value, (int, float)):
        return ""
    return (f"; unigram-entropy baseline of {r.get('corpus', 'the corpus')}: {claims_mod.num(value)} nats "
            f"(perplexity {claims_mod.num(math.exp(value))})")


def _key_extrapolation(r: dict) -> str:
    table, factors, length = r["perplexity"], r["factors"], r["train_length"]
    headers = ["scheme"] + [f"{f}×L = {f * length}" for f in factors]
    seeds = r.get("seeds")
    return "".join(
        _table(headers, [[scheme] + [_ppl_spread(cells.get(str(f)), mode) for f in factors] for scheme, cells in table.items()],
               f"validation perplexity, {label} (trained at L = {length}; mean ± sd over seeds {seeds}){_baseline_note(r)}")
        for mode, label in (("nonoverlapping", "non-overlapping chunks"), ("sliding", "sliding window"))
    )


def _key_context(r: dict) -> str:
    base = _ppl(r["base"]["L"], "nonoverlapping")
    rows = [[label, entry.get("rope_scaling"), _ppl(entry, "nonoverlapping"), _ppl(entry, "sliding")]
            for label, entry in r["inference"].items()]
    first = _table(["scaling at inference", "spec", f"ppl at {r['eval_length']}", "sliding"], rows,
                   f"RoPE model trained at L = {r['train_length']}; its perplexity at L: {claims_mod.num(base)}")
    rows = [[label, entry.get("rope_scaling"), _ppl(entry["4L"], "nonoverlapping"), _ppl(entry["L"], "nonoverlapping")]
            for label, entry in r["finetuned"].items()]
    tables = first + _table(["fine-tuned", "spec", f"ppl at {r['eval_length']}", f"ppl back at {r['train_length']}"], rows,
                            "after fine-tuning at 4×L")
    averaging = r.get("averaging")
    if not isinstance(averaging, dict) or not isinstance(averaging.get("variants"), dict):
        return tables  # results written before checkpoint averaging was measured
    factor = str(r.get("factor", 4))
    rows = [[label, _ppl_spread(v.get("L"), "nonoverlapping"), _ppl_spread(v.get("4L"), "nonoverlapping"),
             _spread([x for x in v.get("passkey", {}).get(factor, []) if x is not None]),
             _spread(v.get("weight_distance_to_fine_tuned") or [], 4)]
            for label, v in averaging["variants"].items()]
    tables += _table(["model", f"ppl at L = {r['train_length']} (forgetting)", f"ppl at {r['eval_length']}",
                      f"passkey at {factor}×L", "|w − w_ft| / |w_ft|"], rows,
                     f"checkpoint averaging of the {averaging.get('fine_tune')} fine-tune: last {averaging.get('last')} "
                     f"checkpoints, base ⊕ fine-tuned {averaging.get('base_weight')}/{1 - averaging.get('base_weight', 0.5):g} "
                     f"(mean ± sd over seeds {r.get('seeds')})")
    return tables + f"<p class='note'>{esc(averaging.get('note', ''))}</p>"


def _key_entropy(r: dict) -> str:
    factors = r["factors"]
    rows = []
    for label, entry in r["models"].items():
        cells = entry["entropy"]
        by_seed = entry.get("by_seed") or {}
        rises = [e["entropy"]["4"]["rise"] for e in by_seed.values() if "rise" in e.get("entropy", {}).get("4", {})]
        ratios = [e["ppl_ratio"] for e in by_seed.values() if e.get("ppl_ratio") is not None]
        rows.append([label] + [cells.get(str(f), {}).get("mean", "cannot") for f in factors]
                    + [pm(rises, 3) if rises else cells.get("4", {}).get("rise"),
                       pm(ratios, 3) if ratios else entry.get("ppl_ratio")])
    return _table(["model"] + [f"{f}×L" for f in factors] + ["entropy rise at 4×L", "ppl 4×L / L"], rows,
                  f"mean attention entropy (nats) by evaluation length (means over seeds {r.get('seeds')})")


def _key_training(r: dict, label: str) -> str:
    rows = []
    for name, runs in r["runs"].items():
        runs = runs if isinstance(runs, list) else [runs]
        values = [x.get("val_loss_all", x.get("final_val_loss")) for x in runs]
        rows.append([name, _spread(values), _spread([x.get("best_val_loss") for x in runs]), runs[0].get("n_params"),
                     _spread([x.get("tokens_per_s") for x in runs], 0), sum(values) / len(values)])
    rows.sort(key=lambda row: row[-1] if isinstance(row[-1], (int, float)) else float("inf"))
    return _table([label, "val loss, whole split (mean ± sd)", "best val loss (sampled)", "parameters", "tokens/s"],
                  [row[:-1] for row in rows],
                  f"{r.get('steps')} training steps each on {r.get('corpus', '?')}, seeds {r.get('seeds')}{_baseline_note(r)}")


def _key_heads(r: dict) -> str:
    rows = [[f"L{h['layer']}H{h['head']}", h["previous_token"], h["induction"], f"{h['positional_offset']:+d}",
             h["positional_confidence"], h.get("punctuation"), h["mask_loss_delta"], h["grad_importance"], ", ".join(h["labels"]) or "—"]
            for h in r["heads"]]
    table = _table(["head", "previous-token", "induction", "offset", "confidence", "punctuation", "Δloss masked", "|∂L/∂ξ|", "type"], rows,
                   f"every head (base loss {claims_mod.num(r['base_loss'])})")
    p30, p60 = r["pruned_30"], r["pruned_60"]
    return table + _table(["pruned", "heads masked", "loss", "increase"],
                          [["30%", p30["heads_masked"], p30["loss"], p30["loss_increase"]],
                           ["60%", p60["heads_masked"], p60["loss"], p60["loss_increase"]]],
                          "pruning the least important heads (by Δloss when masked alone)")


KEY_TABLES = {
    "experiments/extrapolation": _key_extrapolation,
    "experiments/context-extension": _key_context,
    "experiments/attention-entropy": _key_entropy,
    "experiments/heads": lambda r: _key_training(r, "run"),
    "experiments/position-training": lambda r: _key_training(r, "scheme"),
    "heads": _key_heads,
}


def key_tables(folder: str, results: dict) -> str:
    """The headline table of a folder's results (empty when its results.json has another shape)."""
    render = KEY_TABLES.get(folder)
    if render is None:
        return ""
    try:
        return render(results)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError):
        return ""


def run_baselines(lab_dir: Path) -> str:
    """The lab's own training runs (``LAB/runs/*``): final validation loss beside the corpus's unigram baseline."""
    from poslab.lab.experiments.common import unigram_entropy
    from poslab.runs import RunFileError, RunFolder

    rows = []
    for config_path in sorted(Path(lab_dir).glob("runs/*/config.json")):
        run = RunFolder(config_path.parent)
        try:
            config = run.config()
            results = run.results() or {}
            corpus = config["train"]["corpus"]
            baseline = unigram_entropy(corpus, config["train"].get("val_fraction", 0.1))
        except (OSError, ValueError, KeyError, TypeError, RunFileError):
            continue
        rows.append([config_path.parent.name, corpus, results.get("steps") or config["train"].get("max_steps"),
                     results.get("final_val_loss"), baseline])
    if not rows:
        return ""
    return _table(["run", "corpus", "steps", "final val loss (nats)", "unigram-entropy baseline (nats)"], rows,
                  "the model these heads belong to: how far below the character-frequency baseline it trained")


# ------------------------------------------------------------------------------------------ sections
def folder_html(lab_dir: Path, folder: str, results: dict | None, step: dict | None) -> str:
    """Plots and numbers of one results folder (or why it is missing)."""
    name = folder.split("/")[-1]
    parts = [f"<div class='folder'><h3>{esc(name)} <span class='path'>{esc(folder)}/</span></h3>"]
    if step and step.get("status") in ("failed", "interrupted", "skipped", "unavailable"):
        parts.append(f"<p class='warn'>This step {esc(step['status'])}: {esc(step.get('error', ''))}</p>")
    if results is None:
        parts.append("<p class='note'>Not run in this lab (no results.json).</p></div>")
        return "".join(parts)
    description = results.get("description") or results.get("DESCRIPTION")
    if isinstance(description, str):
        parts.append(f"<p>{esc(description)}</p>")
    pngs = sorted((lab_dir / folder).glob("*.png"))
    for png in pngs:
        parts.append(image_tag(png, f"{name}: {png.stem}"))
    key = key_tables(folder, results)
    parts.append(key)
    if folder == "heads":
        parts.append(run_baselines(lab_dir))
    numbers = numbers_html(results)
    opened = " open" if not pngs and not key and numbers.count("<tr") <= 60 else ""  # nothing else shows its numbers
    parts.append(f"<details{opened}><summary>All numbers of {esc(folder)}/results.json</summary>{numbers}</details></div>")
    return "".join(parts)


def section_html(section: Section, lab_dir: Path, results: dict[str, dict], verdicts: list[claims_mod.Verdict], steps: dict[str, dict]) -> str:
    mine = [v for v in verdicts if v.experiment in section.folders]
    folders = "".join(folder_html(lab_dir, f, results.get(f), steps.get(f)) for f in section.folders)
    return (
        f"<section id='{esc(section.key)}'><h2>{esc(section.title)}</h2>"
        f"<p class='lessons'>{esc(section.lessons)} · {summary_counts(mine)}</p>"
        f"<div class='claim'><h4>The lesson's claim</h4>{paragraphs(section.claim)}</div>"
        f"<div class='measured'><h4>What was measured</h4>{paragraphs(section.measured)}</div>"
        f"<h4>Verdicts</h4>{verdict_table(mine)}{folders}</section>"
    )


def machine_html(manifest: dict) -> str:
    machine = manifest.get("machine") or machine_info()
    origin = "recorded by the lab run" if manifest.get("machine") else "of the machine that built this report (no lab.json)"
    versions = machine.get("versions", {})
    rows = [("CPU", machine.get("cpu")), ("cores", machine.get("cores")), ("torch threads", machine.get("torch_threads")),
            ("CUDA", machine.get("cuda")), ("platform", machine.get("platform"))]
    rows += [(name, version) for name, version in versions.items()]
    for key in ("mode", "started", "finished", "seconds", "command"):
        if key in manifest:
            rows.append((f"lab {key}", manifest[key]))
    table = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in rows)
    steps = manifest.get("steps") or []
    step_table = records_table(
        [{k: s.get(k) for k in ("name", "kind", "status", "seconds", "cpu_seconds", "folder", "error") if k in s} for s in steps],
        "lab steps (seconds: wall time; cpu_seconds: CPU time of the step's process)"
    ) if steps else ""
    return (f"<section id='machine'><h2>Machine and versions</h2><p class='note'>{esc(origin)}; the machine may have "
            f"been shared with other work, so timings are noisy.</p><table class='kv'><tbody>{table}</tbody></table>{step_table}</section>")


CSS = """
:root { --ink:#1d2330; --muted:#5b6475; --line:#e3e6ec; --bg:#f6f7f9; --card:#fff; --accent:#3057d5;
  --held:#1e7d46; --held-bg:#e3f4ea; --failed:#a35200; --failed-bg:#fdf0e1; --unknown:#5b6475; --unknown-bg:#eceef2; }
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
section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:22px 28px; margin:0 0 24px; }
h2 { margin:0 0 4px; font-size:21px; } h3 { font-size:16px; margin:22px 0 8px; } h4 { margin:16px 0 6px; font-size:13px;
  text-transform:uppercase; letter-spacing:.05em; color:var(--muted); }
.lessons { color:var(--muted); margin:0 0 8px; font-size:13px; }
.claim { border-left:4px solid var(--accent); background:#f3f6fe; padding:4px 16px; border-radius:0 8px 8px 0; }
.measured { border-left:4px solid #9aa3b5; padding:4px 16px; }
.zh, .claim p { font-family: 'FAMILY', "DejaVu Sans", sans-serif; }
figure { margin:14px 0; } img { max-width:100%; height:auto; border:1px solid var(--line); border-radius:6px; background:#fff; }
figcaption { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; margin:10px 0; font-size:13px; width:auto; max-width:100%; display:block; overflow-x:auto; }
caption { text-align:left; font-weight:600; color:var(--muted); padding:4px 0; }
th, td { border-bottom:1px solid var(--line); padding:5px 10px; text-align:left; vertical-align:top; }
thead th { background:#f0f2f6; } table.kv th { color:var(--muted); font-weight:500; white-space:nowrap; }
table.claims { display:table; width:100%; table-layout:fixed; } table.claims td { overflow-wrap:anywhere; }
table.claims td.src { color:var(--muted); font-size:12px; } .crit { color:var(--muted); font-size:11px; margin-top:4px; } table.claims .path { font-size:11px; margin-top:4px; }
.badge { display:inline-block; padding:2px 8px; border-radius:6px; font-size:12px; font-weight:600; }
table.key { display:table; } table.key td { font-variant-numeric: tabular-nums; }
.badge.held, .count.held { background:var(--held-bg); color:var(--held); }
.badge.failed, .count.failed { background:var(--failed-bg); color:var(--failed); }
.badge.unknown, .count.unknown { background:var(--unknown-bg); color:var(--unknown); }
.count { padding:1px 8px; border-radius:999px; font-size:12px; font-weight:600; }
.path { color:var(--muted); font-weight:400; font-size:12px; } .note { color:var(--muted); font-size:13px; }
.warn { background:var(--failed-bg); color:var(--failed); padding:8px 12px; border-radius:6px; }
details { margin:8px 0 4px; } summary { cursor:pointer; color:var(--accent); font-size:13px; }
.folder { border-top:1px dashed var(--line); margin-top:18px; }
@media (max-width: 900px) { nav { display:none; } main { padding:12px; } }
""".replace("FAMILY", FAMILY)


def build_report(lab_dir: Path | str, out: Path | str | None = None) -> Path:
    """Write the self-contained HTML report of a lab folder.

    Args:
        lab_dir: the lab folder (``runs/lab``).
        out: the HTML file (default ``lab_dir/report.html``); written atomically.

    Returns:
        The path written.
    """
    from poslab.fileio import atomic_write_text

    lab_dir = Path(lab_dir)
    if not lab_dir.is_dir():
        raise ValueError(f"lab folder {str(lab_dir)!r} does not exist; run `poslab lab` first")
    out = Path(out) if out is not None else lab_dir / "report.html"
    results = load_results(lab_dir)
    manifest = load_manifest(lab_dir)
    steps = {s.get("folder"): s for s in manifest.get("steps", []) if isinstance(s, dict)}
    verdicts = claims_mod.evaluate(results)

    sections = [section_html(s, lab_dir, results, verdicts, steps) for s in SECTIONS]
    others = [k for k in results if k not in KNOWN_FOLDERS]
    if others:
        extra = Section("other", "Other results", "", "Results of experiments no lesson section lists.",
                        "See each experiment's description.", tuple(others))
        sections.append(section_html(extra, lab_dir, results, verdicts, steps))
    claims_section = (
        "<section id='claims'><h2>Claims checked</h2><p class='lessons'>Every quantitative claim of the lessons that "
        f"a machine can test, with the figure measured by this lab · {summary_counts(verdicts)}</p>"
        f"<p class='note'>{esc(RULE)}</p>"
        f"{verdict_table(verdicts, with_folder=True)}</section>"
    )
    nav_items = [(s.key, s.title) for s in SECTIONS] + ([("other", "Other results")] if others else [])
    nav = "".join(f"<a href='#{esc(k)}'>{esc(t)}</a>" for k, t in [("claims", "Claims checked"), *nav_items, ("machine", "Machine and versions")])
    mode = manifest.get("mode", "unknown mode")
    built = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    body = (
        f"<header><h1>poslab lab report</h1><p>Multi-head attention and position encodings: the three lessons' claims, "
        f"measured on this machine ({esc(mode)} run, report built {esc(built)}).</p>"
        f"<p>{summary_counts(verdicts)}</p></header>"
        f"<div class='layout'><nav>{nav}</nav><main>{claims_section}{''.join(sections)}{machine_html(manifest)}</main></div>"
    )
    font_css = font_face_css(body)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>poslab lab report</title><style>{font_css}{CSS}</style></head><body>{body}</body></html>"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    return out
