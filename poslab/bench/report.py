"""The bench's targets, report, plot and the ``poslab bench`` run."""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from poslab.bench.cases import WINDOW, Case
from poslab.bench.measure import run_attention, run_decode


def _lookup(rows: list[dict], case: str, key: str, **where: Any) -> float | None:
    for row in rows:
        if row["case"] == case and all(row.get(k) == v for k, v in where.items()):
            return row.get(key)
    return None


def check_targets(attention: dict | None, decode: dict | None) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the measured numbers (``None`` where not measured)."""
    checks: list[dict[str, Any]] = []

    def add(target: str, value: float | None, ok: Callable[[float], bool | None], fmt: str = "{:.2f}x") -> None:
        met = None if value is None else ok(value)
        checks.append(
            {
                "target": target,
                "measured": None if value is None else fmt.format(value),
                "met": None if met is None else bool(met),
            }
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    if attention is not None:
        rows = attention["rows"]

        def ms(case: str, T: int) -> float | None:
            return _lookup(rows, case, "ms", T=T)

        add(
            "causal fwd+bwd vs nn.MultiheadAttention (mask), T=1024: >= 1.3x",
            ratio(ms("torch-mha", 1024), ms("poslab:none", 1024)),
            lambda v: v >= 1.3,
        )
        add(
            "(info) causal fwd+bwd vs nn.MultiheadAttention with the is_causal hint (same SDPA kernel), T=1024",
            ratio(ms("torch-mha-is_causal", 1024), ms("poslab:none", 1024)),
            lambda v: None,
        )
        add(
            "causal fwd+bwd vs naive, T=1024: >= 5x",
            ratio(ms("naive", 1024), ms("poslab:none", 1024)),
            lambda v: v >= 5,
        )
        add(
            "causal fwd+bwd vs naive, T=4096: >= 10x",
            ratio(ms("naive", 4096), ms("poslab:none", 4096)),
            lambda v: v >= 10,
        )
        add(
            "RoPE over no position, T=1024: <= +10%",
            ratio(ms("poslab:rope", 1024), ms("poslab:none", 1024)),
            lambda v: v <= 1.10,
        )
        for scheme in ("alibi", "t5"):
            add(
                f"{scheme} / no-bias causal, T=1024: <= 1.6x",
                ratio(ms(f"poslab:{scheme}", 1024), ms("poslab:none", 1024)),
                lambda v: v <= 1.6,
            )
        add(
            f"window {WINDOW} vs full causal, T=8192: >= 4x",
            ratio(ms("poslab:none", 8192), ms(f"poslab:none-window{WINDOW}", 8192)),
            lambda v: v >= 4,
        )
        add(
            "poslab RoPE vs transformers Llama attention, T=1024: > 1x",
            ratio(ms("hf-llama-rope", 1024), ms("poslab:rope", 1024)),
            lambda v: v > 1,
        )
        add(
            "poslab ALiBi vs transformers Bloom attention, T=1024: > 1x",
            ratio(ms("hf-bloom-alibi", 1024), ms("poslab:alibi", 1024)),
            lambda v: v > 1,
        )
        for case in sorted({r["case"] for r in rows}, key=lambda c: (not c.startswith("poslab:"), c)):
            measured = sorted((r["T"], r["peak_mib"]) for r in rows if r["case"] == case and r.get("peak_mib"))
            if len(measured) < 2:
                continue
            (lo, m_lo), (hi, m_hi) = measured[0], measured[-1]
            growth = math.log(m_hi / m_lo) / math.log(hi / lo)
            if case.startswith("poslab:"):
                add(
                    f"{case} peak memory ~ T^k, T={lo}..{hi}: k <= 1.2 (linear)", growth, lambda v: v <= 1.2, "k={:.2f}"
                )
            else:
                add(f"(info) {case} peak memory ~ T^k, T={lo}..{hi}", growth, lambda v: None, "k={:.2f}")
    if decode is not None:
        rows = decode["rows"]
        contexts = sorted({r["context"] for r in rows})
        lo, hi = contexts[0], contexts[-1]

        def lat(case: str, c: int) -> float | None:
            return _lookup(rows, case, "ms_per_token", context=c)

        add(
            f"KV-cache decode latency at {hi} / at {lo}: <= 2x",
            ratio(lat("kv-cache:rope", hi), lat("kv-cache:rope", lo)),
            lambda v: v <= 2,
        )
        add(
            f"KV-cache vs full recompute at context {hi}: >= 10x",
            ratio(lat("recompute:rope", hi), lat("kv-cache:rope", hi)),
            lambda v: v >= 10,
        )
    return checks


def format_report(attention: dict | None, decode: dict | None, checks: list[dict], command: str) -> str:
    """Markdown: the attention table, the decode table and the targets."""
    lines = [f"Command: `{command}`", ""]
    if attention is not None:
        peak = attention["roofline_gflops"]
        g = attention["geometry"]
        lines += [
            f"Attention forward+backward, B={g['batch']}, h={g['heads']}, d_k={g['head_dim']}, causal, fp32, "
            f"{attention['threads']} thread(s), {attention['clock']} clock; "
            f"roofline = measured fp32 matmul {peak:.0f} GFLOP/s. "
            "Median of alternating runs; peak = resident-memory high-water mark of one run in a fresh process.",
            "",
            "| T | case | fwd+bwd ms | peak MiB | GFLOP/s | % roofline | vs naive |",
            "|---:|:---|---:|---:|---:|---:|---:|",
        ]
        for row in attention["rows"]:
            naive = _lookup(attention["rows"], "naive", "ms", T=row["T"])
            if row["ms"] is None:
                lines.append(f"| {row['T']} | {row['case']} | skipped | (memory) | | | |")
                continue
            mem = f"{row['peak_mib']:.0f}" if row.get("peak_mib") is not None else "-"
            vs = f"{naive / row['ms']:.1f}x" if naive else "-"
            lines.append(
                f"| {row['T']} | {row['case']} | {row['ms']:.1f} | {mem} | {row['gflops']:.1f} "
                f"| {100 * row['roofline']:.1f}% | {vs} |"
            )
        lines.append("")
    if decode is not None:
        m = decode["model"]
        lines += [
            f"Decoding: GPT {m['n_layer']} layers, d={m['n_embd']}, {m['n_head']} heads, batch {m['batch']}, "
            f"{decode['threads']} thread(s), {decode['clock']} clock; median of "
            f"{decode['steps']} decode steps per round (cache) or one full forward per round (recompute).",
            "",
            "| context | case | ms/token | tokens/s |",
            "|---:|:---|---:|---:|",
        ]
        for row in decode["rows"]:
            lines.append(
                f"| {row['context']} | {row['case']} | {row['ms_per_token']:.2f} | {row['tokens_per_s']:.1f} |"
            )
        lines.append("")
    if checks:
        lines += ["| target | measured | met |", "|:---|---:|:---:|"]
        for c in checks:
            met = "n/a" if c["met"] is None else ("yes" if c["met"] else "**no**")
            lines.append(f"| {c['target']} | {c['measured'] or '-'} | {met} |")
        lines.append("")
    return "\n".join(lines)


def plot(attention: dict | None, decode: dict | None) -> bytes:
    """PNG: time and peak memory against T, decode latency against context (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = (2 if attention else 0) + (1 if decode else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 5), squeeze=False)
    ax_iter = iter(axes[0])
    if attention is not None:
        rows = attention["rows"]
        cases = list(dict.fromkeys(r["case"] for r in rows))
        sizes = sorted({r["T"] for r in rows})
        colors = plt.cm.tab20(range(len(cases)))
        for key, label in (("ms", "forward+backward (ms)"), ("peak_mib", "peak memory (MiB)")):
            ax = next(ax_iter)
            for case, color in zip(cases, colors):
                pts = [(r["T"], r[key]) for r in rows if r["case"] == case and r.get(key)]
                if pts:
                    style = "-" if case.startswith("poslab") else "--"
                    ax.plot(*zip(*pts), style, marker="o", markersize=3, label=case, color=color)
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label, title=f"attention {label}")
            ax.set_xticks(sizes, [str(t) for t in sizes], minor=False)
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    if decode is not None:
        ax = next(ax_iter)
        rows = decode["rows"]
        for case in dict.fromkeys(r["case"] for r in rows):
            pts = [(r["context"], r["ms_per_token"]) for r in rows if r["case"] == case]
            ax.plot(*zip(*pts), marker="o", label=case)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms per generated token", title="decoding")
        contexts = sorted({r["context"] for r in rows})
        ax.set_xticks(contexts, [str(c) for c in contexts], minor=False)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


# ========================================================================================= entry
def rerender(path: Path, out: Path) -> int:
    """Rebuild the report, targets and plot of a finished run from its ``results.json`` (no measuring)."""
    from poslab.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

    if not path.is_file():
        raise FileNotFoundError(f"--from-results: no such file {str(path)!r}")
    try:
        results = json.loads(path.read_text())
        attention, decode, command = results["attention"], results["decode"], results["command"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"--from-results: {str(path)!r} is not a poslab bench results.json ({err})") from err
    results["targets"] = check_targets(attention, decode)
    report = format_report(attention, decode, results["targets"], command)
    print(report)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report + "\n")
    atomic_write_bytes(out / "bench.png", plot(attention, decode))
    print(f"re-rendered into {out}/ (results.json, report.md, bench.png)")
    return 0


def run_bench(
    out: Path,
    sizes: Sequence[int],
    contexts: Sequence[int],
    repeats: int,
    cases: Sequence[Case] | None = None,
    only: str | None = None,
    memory: bool = True,
    command: str = "",
) -> dict[str, Any]:
    """Measure, print the report and write ``out/results.json``, ``report.md``, ``bench.png``.

    Args:
        out: output folder (created).
        sizes: attention lengths ``T``.
        contexts: decode contexts.
        repeats: alternating rounds per size (positive).
        cases: the attention cases (default :func:`attention_cases`).
        only: ``"attention"`` or ``"decode"`` to run one half.
        memory: measure each case's peak memory in a subprocess.
        command: the command line recorded in the report.

    Returns:
        The results written to ``results.json``.
    """
    from poslab.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

    if repeats <= 0:
        raise ValueError(f"--repeats must be a positive integer, got {repeats}")
    if only not in (None, "attention", "decode"):
        raise ValueError(f"only must be None, 'attention' or 'decode', got {only!r}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    attention = decode = None
    if only in (None, "attention"):
        print("== attention forward+backward")
        attention = run_attention(sizes, repeats, memory=memory, cases=cases)
    if only in (None, "decode"):
        print("== decoding: KV cache vs full recompute")
        decode = run_decode(contexts, repeats)
    checks = check_targets(attention, decode)
    report = format_report(attention, decode, checks, command)
    print()
    print(report)
    results = {
        "command": command,
        "seconds": time.time() - started,
        "torch": torch.__version__,
        "attention": attention,
        "decode": decode,
        "targets": checks,
    }
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report + "\n")
    atomic_write_bytes(out / "bench.png", plot(attention, decode))
    print(f"results in {out}/ (results.json, report.md, bench.png)")
    return results
