"""The lessons' machine-testable claims, each checked against the numbers in a results.json.

A :class:`Claim` names the experiment whose ``results.json`` holds the evidence and a ``check``
function that reads it and returns ``(measured text, held)``. Experiments may also carry their own
list of checked claims under the key ``"claims"`` (``{"claim", "source", "measured", "held"}``);
:func:`evaluate` gathers both. Nothing here holds a measured figure: every number shown comes from
the results passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Claim:
    """A claim from a lesson and how to check it.

    Attributes:
        experiment: the results folder holding the evidence (``experiments/NAME`` or ``heads``).
        source: where the claim is made (``"seed 000 §1.3"``).
        text: the claim, quoted (Chinese) with an English gloss.
        check: ``results -> (measured, held)``; ``held`` is ``None`` when the results cannot decide.
    """

    experiment: str
    source: str
    text: str
    check: Callable[[dict], tuple[str, bool | None]]


@dataclass
class Verdict:
    """A claim's outcome as the report shows it."""

    experiment: str
    source: str
    claim: str
    measured: str
    held: bool | None

    @property
    def label(self) -> str:
        return {True: "held", False: "did not hold at this scale", None: "not measured"}[self.held]


def get(results: dict, path: str) -> Any:
    """``results["a"]["b"][0]`` for ``path="a.b.0"`` (``KeyError`` naming the missing key)."""
    value: Any = results
    for part in path.split("."):
        if isinstance(value, list) and part.lstrip("-").isdigit():
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(path)
    return value


def num(value: Any, digits: int = 4) -> str:
    """A number as the report prints it: thousands separators for ints, 4 significant digits, e-notation for tiny/huge."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) < 1e-3 or abs(value) >= 1e6:
            return f"{value:.{max(1, digits - 3)}e}"
        text = f"{value:.{digits}g}"
        if "e" in text:  # 4 significant digits of a number in [1e4, 1e6): print it whole
            return f"{value:,.0f}"
        return text
    return str(value)


# ------------------------------------------------------------------------------------------- checks
def _params_same_total(r: dict) -> tuple[str, bool]:
    rows = get(r, "multihead_attention_512")
    formula = get(r, "formula_4d2_plus_4d_512")
    small = get(r, "seed001_multihead_attention_32")
    measured = (
        "d_model 512: " + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in rows)
        + f" (4d²+4d = {num(formula)}); d_model 32: " + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in small)
    )
    held = all(x["total"] == formula for x in rows) and len({x["total"] for x in small}) == 1
    return measured, held


def _params_lesson_printout(r: dict) -> tuple[str, bool]:
    one, four, ratio = get(r, "seed000_one_linear_512"), get(r, "seed000_four_linear_512"), get(r, "seed000_ratio_four_over_one")
    return f"one Linear {num(one)}, four {num(four)}, ratio {ratio:.1f}x", (one, four) == (262_656, 1_050_624)


def _params_seed001(r: dict) -> tuple[str, bool]:
    qkv, proj = get(r, "seed001_qkv_params_by_heads"), get(r, "seed001_proj_params_by_heads")
    measured = "; ".join(f"h={h}: qkv {num(qkv[h])}, proj {num(proj[h])}" for h in qkv)
    return measured, set(qkv.values()) == {3168} and set(proj.values()) == {1056}


def _shapes(r: dict) -> tuple[str, bool]:
    walk = get(r, "seed000_walk")
    matched = sum(bool(step.get("matches_lesson")) for step in walk)
    return f"{matched} of {len(walk)} steps of the shape walk have the lesson's shape", bool(get(r, "seed000_all_steps_match_lesson"))


def _rope_offset_only(r: dict) -> tuple[str, bool]:
    table = get(r, "lesson_table")
    tolerance = get(r, "offset_only_tolerance")
    worst = max(row["spread_over_positions"] for row in table)
    values = ", ".join(f"Δ={row['offset']}: {row['first_three_4dp'][0]}" for row in table)
    measured = f"{values}; largest spread over positions {num(worst)} (tolerance {num(tolerance)})"
    return measured, worst < tolerance and bool(get(r, "all_match_lesson_4dp"))


def _rope_variants(r: dict) -> tuple[str, bool]:
    checks = get(r, "scheme_checks")
    relative = [c for c in checks if c["expected_offset_only"]]
    absolute = [c for c in checks if not c["expected_offset_only"]]
    measured = (f"{sum(c['offset_only'] for c in relative)} of {len(relative)} rotary variants offset-only; "
                f"{sum(not c['offset_only'] for c in absolute)} of {len(absolute)} others not")
    return measured, bool(get(r, "all_as_expected"))


def _permutation_equivariant(r: dict) -> tuple[str, bool]:
    diff = get(r, "lesson_raw_matrices.max_abs_diff_after_unpermuting")
    bound = get(r, "equivariant_below")
    return f"max |difference| after un-permuting: {num(diff)} (float noise is below {num(bound)})", diff < bound


def _permutation_broken(r: dict) -> tuple[str, bool]:
    schemes = get(r, "schemes")
    encoding = [s for s in schemes if s["encodes_position"]]
    weakest = min(encoding, key=lambda s: s["max_abs_diff_after_unpermuting"])
    measured = (f"{sum(s['verdict'] == 'broken' for s in encoding)} of {len(encoding)} position schemes change the output; "
                f"smallest change {num(weakest['max_abs_diff_after_unpermuting'])} ({weakest['scheme']})")
    return measured, bool(get(r, "all_as_expected"))


def _causal_one_layer(r: dict) -> tuple[str, bool]:
    diff, bound = get(r, "max_abs_diff_last_logits.1.none"), get(r, "noise_below")
    return f"1 layer, no positions: {num(diff)} (noise < {num(bound)}); with learned positions: {num(get(r, 'max_abs_diff_last_logits.1.learned'))}", diff < bound


def _causal_leak(r: dict) -> tuple[str, bool]:
    diffs = get(r, "max_abs_diff_last_logits")
    bound = get(r, "leak_above")
    deep = {layers: v["none"] for layers, v in diffs.items() if int(layers) >= 2}
    measured = ", ".join(f"{layers} layers: {num(v)}" for layers, v in deep.items()) + f" (leak if > {num(bound)})"
    return measured, bool(deep) and all(v > bound for v in deep.values())


def _frequencies(r: dict) -> tuple[str, bool]:
    table = get(r, "lesson_table_d8_base10000")
    periods = [row["period_positions"] for row in table]
    measured = "period per dimension: " + ", ".join(num(p, 3) for p in periods) + " positions"
    return measured, all(a < b for a, b in zip(periods, periods[1:]))


def _heads_previous_token(r: dict) -> tuple[str, bool | None]:
    counts = get(r, "counts")
    total = len(get(r, "heads"))
    best = max(get(r, "heads"), key=lambda h: h["previous_token"])
    measured = (f"{counts['previous-token']} previous-token, {counts['induction']} induction, {counts['positional']} positional "
                f"of {total} heads; strongest previous-token head L{best['layer']}H{best['head']} "
                f"({num(best['previous_token'], 3)} of its attention on the previous token)")
    return measured, counts["previous-token"] > 0


def _heads_punctuation(r: dict) -> tuple[str, bool | None]:
    heads = get(r, "heads")
    best = max(heads, key=lambda h: h["punctuation"])
    share = get(r, "punctuation_share_of_keys")
    measured = (f"{get(r, 'counts.punctuation')} of {len(heads)} heads put ≥ {num(get(r, 'thresholds.punctuation'))} of their "
                f"attention on punctuation; strongest L{best['layer']}H{best['head']} ({num(best['punctuation'], 3)}); "
                f"punctuation is {share:.0%} of the text")
    return measured, (get(r, "counts.punctuation") > 0) if get(r, "punctuation_ids") else None


def _heads_spare(r: dict) -> tuple[str, bool]:
    base, pruned = get(r, "base_loss"), get(r, "pruned_30")
    relative = pruned["loss_increase"] / base
    measured = (f"masking the {pruned['heads_masked']} least important heads (30%) moves the loss "
                f"{num(base)} → {num(pruned['loss'])} ({relative:+.1%}); 60%: {num(get(r, 'pruned_60.loss'))}")
    return measured, relative < SPARE_HEADS_MAX_INCREASE


SPARE_HEADS_MAX_INCREASE = 0.02  # "spare" heads: pruning 30% of heads costs < 2% of the loss
NOPE_MAX_GAP = 0.05  # "only a little worse": NoPE's validation loss within 5% of learned positions'


def _losses(r: dict, key: str = "final_val_loss") -> dict[str, float]:
    return {str(k): float(v) for k, v in get(r, key).items()}


def _optimal_heads(r: dict) -> tuple[str, bool]:
    claim = get(r, "claim_sqrt_d_over_16")
    finals = _losses(r)
    measured = ("val loss by heads: " + ", ".join(f"{h}: {num(v)}" for h, v in finals.items())
                + f"; √(d/16) = {num(claim['predicted'], 3)}, best {claim['best_heads']} heads"
                + f" (margin to second {num(claim['margin_to_second'])})")
    return measured, bool(claim["held"])


def _small_heads(r: dict) -> tuple[str, bool]:
    finals = {int(h): v for h, v in _losses(r).items()}
    d_model = get(r, "d_model")
    one, most = finals[min(finals)], finals[max(finals)]
    measured = (f"1 head (d_k {d_model}): {num(one)}; {max(finals)} heads (d_k {d_model // max(finals)}): {num(most)}")
    return measured, most < one


def _alibi_vs_rope(r: dict) -> tuple[str, bool]:
    finals = _losses(r)
    return f"final val loss: RoPE {num(finals['rope'])}, ALiBi {num(finals['alibi'])}", finals["alibi"] > finals["rope"]


def _nope_close(r: dict) -> tuple[str, bool]:
    finals = _losses(r)
    gap = (finals["none"] - finals["learned"]) / finals["learned"]
    return f"final val loss: none {num(finals['none'])}, learned {num(finals['learned'])} ({gap:+.1%})", gap <= NOPE_MAX_GAP


def _no_parameters(scheme: str) -> Callable[[dict], tuple[str, bool]]:
    def check(r: dict) -> tuple[str, bool]:
        runs = get(r, "runs")
        mine, none = runs[scheme]["n_params"], runs["none"]["n_params"]
        return f"model parameters: {scheme} {num(mine)}, no position encoding {num(none)}", mine == none

    return check


def _alibi_speed(r: dict) -> tuple[str, bool]:
    runs = get(r, "runs")
    alibi, none = runs["alibi"]["tokens_per_s"], runs["none"]["tokens_per_s"]
    ratio = alibi / none
    return (f"training tokens/s: ALiBi {num(alibi)}, none {num(none)} ({ratio:.2f}x; one run each, machine may be shared)",
            ratio >= ALIBI_MIN_SPEED)


ALIBI_MIN_SPEED = 0.9  # "no extra compute": ALiBi trains at >= 90% of the speed of no position encoding


def _rope_beats_absolute(r: dict) -> tuple[str, bool]:
    finals = _losses(r)
    measured = f"final val loss: RoPE {num(finals['rope'])}, learned {num(finals['learned'])}, sinusoidal {num(finals['sinusoidal'])}"
    return measured, finals["rope"] < min(finals["learned"], finals["sinusoidal"])


CLAIMS: tuple[Claim, ...] = (
    Claim("experiments/params", "seed 000 §1.2–1.3",
          "多头不增加参数量 — multi-head attention has exactly the parameters of single-head (4·d²+4·d)", _params_same_total),
    Claim("experiments/params", "seed 000 §1.3",
          "单头 Linear(512,512): 262,656；多头 4 个矩阵: 1,050,624；倍数 4.0x — the lesson's printout", _params_lesson_printout),
    Claim("experiments/params", "seed 001 §2",
          "qkv 3168 个，proj 1056 个，头数多少都不影响这个数 — at n_embd 32 the head count does not change qkv/proj", _params_seed001),
    Claim("experiments/shapes", "seed 000 §1.2",
          "[batch, seq, d_model] → [batch, h, seq, d_k] → … → [batch, seq, d_model] — the head split/merge shape walk", _shapes),
    Claim("experiments/rope-relative", "seed 000 §3.4",
          "<R_m q, R_n k> 只依赖相对距离，波动仅 1e-6 — RoPE inner products depend only on the offset", _rope_offset_only),
    Claim("experiments/rope-relative", "seed 000 §3.2",
          "RoPE 天然编码了相对位置 — every RoPE layout/scaling is offset-only; absolute codes are not", _rope_variants),
    Claim("experiments/permutation", "seed 000 §2.1, exp. 3",
          "打乱顺序后，输出（对齐后）的差异为 0 — attention without positions is permutation-equivariant", _permutation_equivariant),
    Claim("experiments/permutation", "seed 000 §2.1",
          "这就是为什么必须要有位置编码 — every position scheme breaks the equivariance", _permutation_broken),
    Claim("experiments/causal-leak", "seed 001",
          "1 层：没有位置嵌入 3.7e-08 — one layer without positions cannot tell 白日依山尽 from 山依日白尽", _causal_one_layer),
    Claim("experiments/causal-leak", "seed 001",
          "因果掩码本身就泄露了顺序 — from two layers on, the causal mask leaks order", _causal_leak),
    Claim("experiments/frequencies", "seed 000 exp. 4",
          "低维度频率高、周期短；高维度频率低、周期长 — RoPE periods grow geometrically with the dimension", _frequencies),
    Claim("experiments/heads", "seed 002 §3.2",
          "最优头数 ≈ √(d_model/16) — the best head count is the one nearest √(d_model/16)", _optimal_heads),
    Claim("experiments/heads", "seed 000 §1.4",
          "减小 d_k 往往提升效果 — smaller heads (more of them) do better than one big head", _small_heads),
    Claim("experiments/position-training", "seed 000 §4",
          "ALiBi 性能略低于 RoPE — ALiBi trains to a slightly worse loss than RoPE", _alibi_vs_rope),
    Claim("experiments/position-training", "seed 001",
          "不加位置编码的因果语言模型也能学到位置信息，效果只比加了位置编码的差一点 — no position encoding is at most "
          "a little worse (within 5% of the learned table's validation loss)", _nope_close),
    Claim("experiments/position-training", "seed 000 Q2",
          "RoPE 比「加位置向量」更好 — RoPE beats adding a learned or sinusoidal position vector", _rope_beats_absolute),
    Claim("experiments/position-training", "seed 000 §4",
          "ALiBi 极简：不需要任何参数 — ALiBi adds no parameters", _no_parameters("alibi")),
    Claim("experiments/position-training", "seed 000 Q2, seed 002 §4.2",
          "RoPE 不增加任何维度，无需显式存储位置编码 — RoPE adds no parameters", _no_parameters("rope")),
    Claim("experiments/position-training", "seed 000 §4",
          "ALiBi 不增加计算 — ALiBi trains at (nearly) the speed of no position encoding (≥ 90% of its tokens/s)",
          _alibi_speed),
    Claim("heads", "seed 000 Q1",
          "有些头专门做「前一个词」的关注 — some heads specialise in the previous token", _heads_previous_token),
    Claim("heads", "seed 000 Q1",
          "有些头做「句号」的关注 — some heads attend to punctuation (the full stop)", _heads_punctuation),
    Claim("heads", "seed 002 §6.1",
          "头7/8充当\"备用通道\" — some heads are spare: pruning the least important 30% costs < 2% of the loss", _heads_spare),
)


def normalize(entry: dict, experiment: str) -> Verdict:
    """An experiment's own claim entry as a :class:`Verdict` (tolerates a few key spellings)."""
    text = next((entry[k] for k in ("claim", "statement", "name", "text") if k in entry), "(unnamed claim)")
    source = next((entry[k] for k in ("source", "lesson", "from", "paper") if k in entry), "")
    measured: Any = next((entry[k] for k in ("measured", "figures", "values", "numbers", "evidence") if k in entry), "")
    if isinstance(measured, dict):
        measured = ", ".join(f"{k} {num(v) if not isinstance(v, (dict, list)) else v}" for k, v in measured.items())
    elif isinstance(measured, list):
        measured = ", ".join(num(v) for v in measured)
    if entry.get("criterion"):
        text = f"{text} (criterion: {entry['criterion']})"
    if entry.get("mode"):
        text = f"{text} [{entry['mode']}]"
    held = entry.get("held")
    if held is None and isinstance(entry.get("verdict"), str):
        held = {"held": True, "true": True, "did not hold": False, "false": False}.get(entry["verdict"].lower())
    if not isinstance(held, bool):
        held = None
    measured = num(measured) if not isinstance(measured, str) else measured
    if isinstance(entry.get("held_sliding_window"), bool):
        measured += f"; sliding window: {'held' if entry['held_sliding_window'] else 'did not hold'}"
    return Verdict(experiment, str(source), str(text), measured, held)


def evaluate(results: dict[str, dict]) -> list[Verdict]:
    """Check every claim in :data:`CLAIMS`, then add each experiment's own ``"claims"`` entries.

    Args:
        results: results folder (``"experiments/params"``, ``"heads"``, ...) -> its results.json.
    """
    verdicts = []
    for claim in CLAIMS:
        data = results.get(claim.experiment)
        if data is None:
            verdicts.append(Verdict(claim.experiment, claim.source, claim.text, "not run in this lab", None))
            continue
        try:
            measured, held = claim.check(data)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:  # schema changed
            measured, held = f"results.json has no usable {err}", None
        verdicts.append(Verdict(claim.experiment, claim.source, claim.text, measured, held))
    for experiment, data in results.items():
        for entry in data.get("claims", []) if isinstance(data, dict) else []:
            if isinstance(entry, dict):
                verdicts.append(normalize(entry, experiment))
    return verdicts
