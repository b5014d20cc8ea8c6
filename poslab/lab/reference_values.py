"""Reference values for the Chinese guides (``docs/zh/``): what the snapshot's quick lab measured, and how far
a student's own run may land from it.

Each training item of a guide shows a generated block (:mod:`poslab.lab.doctables` renders them from
``docs/results/lab-quick.json``): the snapshot's per-seed values or its mean ± sd over seeds, and the
95% prediction interval of one more run with a new seed, ``mean ± t(0.975, n-1) · sd · √(1 + 1/n)``
(Student's t from :mod:`scipy.stats`). The interval assumes the same code on a similar machine; it is
wide for three seeds, which is the honest width. Values come from the snapshot's numbers (``language_models``,
``probes``, and the figures of the claims' ``measured`` texts), never from the verdicts, which a new lab
may decide differently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from scipy import stats

from poslab.lab.report.i18n import name_lessons
from poslab.lab.tables import Table
from poslab.lab.verdicts import mean_sd

#: a figure of a claim's measured text: "LABEL MEAN ± SD (n=N)"
FIGURE = re.compile(r"^(?P<label>.*?)\s*(?P<mean>-?\d+(?:\.\d+)?) ± (?P<sd>\d+(?:\.\d+)?) \(n=(?P<n>\d+)\)")
#: the separators between a measured text's figures
PIECES = re.compile(r";\s+|,\s+|\s+vs\s+")
#: a figure that may be negative (a difference, a correlation); the others (perplexities, ratios, accuracies,
#: losses) have their interval cut at 0
SIGNED = re.compile(r"difference|correlation| - ")


def interval(mean: float, sd: float, n: int) -> tuple[float, float] | None:
    """The 95% prediction interval of one new run, from ``n`` runs of mean ``mean`` and sample sd ``sd``
    (``None`` for fewer than two runs or no spread)."""
    if n < 2 or not sd > 0:
        return None
    half = stats.t.ppf(0.975, n - 1) * sd * math.sqrt(1 + 1 / n)
    return mean - half, mean + half


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _interval_text(mean: float, sd: float, n: int, digits: int, lo: float = -math.inf, hi: float = math.inf) -> str:
    bounds = interval(mean, sd, n)
    if bounds is None:
        return "—"
    return f"{max(lo, bounds[0]):.{digits}f} – {min(hi, bounds[1]):.{digits}f}"


def figures(measured: str) -> list[tuple[str, str, float, float, int]]:
    """(label, mean text, mean, sd, n) of every "LABEL MEAN ± SD (n=N)" in a claim's measured text."""
    out = []
    for piece in PIECES.split(measured):
        match = FIGURE.match(piece.strip())
        if match and not re.search(r"\bbound\b|\bchance\b", match["label"]):
            label = match["label"].strip().rstrip(":")
            out.append((label, match["mean"], float(match["mean"]), float(match["sd"]), int(match["n"])))
    return out


def claim_figures(*experiments: str) -> Callable[[dict], str]:
    """A block renderer: every seeded figure of the claims of ``experiments``, with its prediction interval."""

    def render(snap: dict) -> str:
        rows, seen, named = [], set(), ""
        for claim in snap["claims"]:
            if claim["experiment"] not in experiments:
                continue
            for label, text, mean, sd, n in figures(claim["measured"]):
                if (label, text, sd) in seen:  # a figure two claims share is shown once, under the first
                    continue
                seen.add((label, text, sd))
                digits = _decimals(text)
                floor = 0.0 if mean >= 0 and not SIGNED.search(label) else -math.inf
                spread, predicted = f"{text} ± {sd:.{digits}f}", _interval_text(mean, sd, n, digits, floor)
                claim_text = name_lessons(claim["claim"])
                rows.append(("" if claim_text == named else claim_text, label, spread, n, predicted))
                named = claim_text  # a claim's later figures leave its cell empty
        if not rows:
            return f"（快照中没有 {'、'.join(experiments)} 的带种子的数字）\n"
        headers = ("论断（报告原文）", "测得的量", "快照：均值 ± 标准差", "种子数", PREDICTED)
        return _noted(snap, headers, rows, "llrrr")

    return render


#: the last column of a table of seeded values
PREDICTED = "你的一次运行：95% 预测区间"
_NOTE = (
    "快照：`docs/results/lab-quick.json`（快速实验室，{cores} 核）。预测区间按 t 分布估计换一个种子再跑一次会落在哪里"
    "（同样的代码、相近的机器）；你的数字落在区间外，先检查代码版本和命令，再怀疑结论。\n"
)


def _noted(snap: dict, headers: tuple[str, ...], rows: Sequence[tuple], align: str) -> str:
    """A table of the snapshot's seeded values, then the note on the snapshot and the prediction intervals."""
    return Table("", headers, tuple(rows), align=align).to_markdown() + "\n" + _NOTE.format(cores=snap.get("cores"))


def _seeded_row(label: str, values: list[float], *bounds: float) -> tuple[str, str, str, str]:
    """``label``, each seed's value, mean ± sd and the prediction interval (within ``bounds``, if given)."""
    mean, sd = mean_sd(values)
    sd = 0.0 if sd is None else sd  # one seed: no spread
    shown = ", ".join(f"{v:.3f}" for v in values)
    return label, shown, f"{mean:.3f} ± {sd:.3f}", _interval_text(mean, sd, len(values), 3, *bounds)


def position_training(snap: dict) -> str:
    """The quick language models' validation loss per position scheme: per seed, mean ± sd, prediction interval."""
    lm = snap.get("language_models") or {}
    arms = lm.get("arms") or {}
    if not arms:
        return "（快照中没有 position-training 的结果）\n"
    rows = [_seeded_row(scheme, arm["loss"]) for scheme, arm in arms.items()]
    baselines = lm.get("baselines") or {}
    caption = (
        f"快速实验室 `position-training`，语料 {lm.get('corpus')}，整个验证集上的损失（nats，越低越好）；"
        f"二元（bigram）基线 {baselines.get('bigram', float('nan')):.3f}。\n\n"
    )
    return caption + _noted(snap, ("位置编码", "每个种子的验证损失", "均值 ± 标准差", PREDICTED), rows, "lrrr")


def probes(snap: dict) -> str:
    """MQAR accuracy by head count and reverse accuracy at the training length: per seed, mean ± sd, interval."""
    data = snap.get("probes") or {}
    rows = []
    for heads, values in sorted((data.get("heads_mqar") or {}).items(), key=lambda kv: int(kv[0])):
        rows.append((f"多查询联想回忆（MQAR），{heads} 个头", values))
    reverse = (data.get("accuracy") or {}).get("reverse") or {}
    for scheme in ("none", "rope"):
        if reverse.get(scheme, {}).get("1"):
            rows.append((f"倒序复述（reverse），{scheme}，训练长度上", reverse[scheme]["1"]))
    if not rows:
        return "（快照中没有 probes 的结果）\n"
    shown = [_seeded_row(label, values, 0.0, 1.0) for label, values in rows]
    return _noted(snap, ("任务", "每个种子的准确率", "均值 ± 标准差", PREDICTED), shown, "lrrr")


def head_analysis(snap: dict) -> str:
    """What the tang-heads experiment measured on the lab's Tang model (one model, no seeds): the claims' measured
    texts."""
    rows = [
        (name_lessons(c["claim"]), c["measured"]) for c in snap["claims"] if c["experiment"] == "experiments/tang-heads"
    ]
    if not rows:
        return "（快照中没有 tang-heads 的结果）\n"
    table = Table("", ("论断（报告原文）", "测得（报告原文）"), tuple(rows), align="ll")
    return (
        table.to_markdown()
        + "\n一个模型、一个种子：没有种子间的波动可比。你训练的模型（步数、机器不同）给出的头的分类和数字会不同。\n"
    )


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} 分 {rest:02d} 秒" if minutes else f"{rest} 秒"


def way_in(snap: dict, untrained: Sequence[str]) -> str:
    """The three first steps with the snapshot's times: ``experiment all``, a notebook, ``make demo``."""
    steps = {s["name"]: s for s in snap["steps"]}
    quick = [steps[n]["seconds"] for n in untrained if n in steps]
    if not quick or not isinstance(snap.get("seconds"), (int, float)):
        raise ValueError("the snapshot's steps lack the seconds of the untrained experiments or the lab's total")
    return (
        f"1. `poslab experiment all`：{len(quick)} 个不训练的实验（参数量、形状、RoPE 相对性质、置换、因果泄露、频率、"
        f"正余弦缓存、模型库、勘误）。在快照的快速实验室里它们各自作为一步运行，合计 {_duration(sum(quick))}"
        "（每一步含启动 Python 的时间）。\n"
        "2. 本课的笔记本（导读开头的链接）：`POSLAB_NOTEBOOK_SMALL=1 python notebooks/NAME.py` 用小设置运行，"
        "或转成 `.ipynb` 逐格运行。\n"
        f"3. `make demo`：建环境、跑快速实验室（快照记录的用时：{_duration(snap['seconds'])}，"
        f"{snap.get('cores')} 核），再训练并采样 `tang-demo` 的唐诗模型；报告在 `runs/lab/report.html`。\n"
    )
