"""The lessons' machine-testable claims, each checked against the numbers in a results.json.

Every claim on the page is one :class:`poslab.lab.verdicts.ClaimRecord` (claim, source, criterion,
measured, margin, noise, n_seeds, verdict). A :class:`Claim` here names the experiment whose
``results.json`` holds the evidence of a deterministic claim and a ``check`` function that reads it
and returns the record (via :func:`~poslab.lab.verdicts.deterministic` / :func:`~poslab.lab.verdicts.at_least`,
with the float tolerance in the criterion). Experiments carry their own records (the training
comparisons, decided over seeds) under the key ``"claims"``; :func:`evaluate` gathers both. Nothing
here holds a measured figure: every number shown comes from the results passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from poslab.lab.verdicts import INCONCLUSIVE, ClaimRecord, at_least, deterministic


@dataclass(frozen=True)
class Claim:
    """A deterministic claim from a lesson and how to check it.

    Attributes:
        experiment: the results folder holding the evidence (``experiments/NAME`` or ``heads``).
        source: where the claim is made (``"seed 000 §1.3"``).
        text: the claim, quoted (Chinese) with an English gloss.
        check: ``(results, text, source) -> ClaimRecord``.
    """

    experiment: str
    source: str
    text: str
    check: Callable[[dict, str, str], ClaimRecord]


@dataclass
class Verdict:
    """A claim record as the report shows it, with the results folder it came from."""

    experiment: str
    record: ClaimRecord

    @property
    def verdict(self) -> str:
        return self.record.verdict
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
def _params_same_total(r: dict, text: str, source: str) -> ClaimRecord:
    rows = get(r, "multihead_attention_512")
    formula = get(r, "formula_4d2_plus_4d_512")
    small = get(r, "seed001_multihead_attention_32")
    measured = (
        "d_model 512: " + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in rows)
        + f" (4d²+4d = {num(formula)}); d_model 32: " + ", ".join(f"h={x['n_heads']} → {num(x['total'])}" for x in small)
    )
    error = max([abs(x["total"] - formula) for x in rows] + [max(x["total"] for x in small) - min(x["total"] for x in small)])
    return deterministic(text, source, "every head count's parameter count equals 4d²+4d exactly (integer counts, tolerance 0)",
                         measured, error=float(error), tolerance=0.0)


def _params_lesson_printout(r: dict, text: str, source: str) -> ClaimRecord:
    one, four, ratio = get(r, "seed000_one_linear_512"), get(r, "seed000_four_linear_512"), get(r, "seed000_ratio_four_over_one")
    error = abs(one - 262_656) + abs(four - 1_050_624)
    return deterministic(text, source, "parameter counts equal the lesson's 262,656 and 1,050,624 exactly (tolerance 0)",
                         f"one Linear {num(one)}, four {num(four)}, ratio {ratio:.1f}x", error=float(error), tolerance=0.0)


def _params_seed001(r: dict, text: str, source: str) -> ClaimRecord:
    qkv, proj = get(r, "seed001_qkv_params_by_heads"), get(r, "seed001_proj_params_by_heads")
    measured = "; ".join(f"h={h}: qkv {num(qkv[h])}, proj {num(proj[h])}" for h in qkv)
    error = max(abs(v - 3168) for v in qkv.values()) + max(abs(v - 1056) for v in proj.values())
    return deterministic(text, source, "qkv = 3168 and proj = 1056 for every head count (tolerance 0)", measured,
                         error=float(error), tolerance=0.0)


def _shapes(r: dict, text: str, source: str) -> ClaimRecord:
    walk = get(r, "seed000_walk")
    matched = sum(bool(step.get("matches_lesson")) for step in walk)
    return deterministic(text, source, "every step of the shape walk has the lesson's shape (tolerance: 0 mismatches)",
                         f"{matched} of {len(walk)} steps of the shape walk have the lesson's shape",
                         error=float(len(walk) - matched), tolerance=0.0)


def _rope_offset_only(r: dict, text: str, source: str) -> ClaimRecord:
    table = get(r, "lesson_table")
    tolerance = get(r, "offset_only_tolerance")
    worst = max(row["spread_over_positions"] for row in table)
    values = ", ".join(f"Δ={row['offset']}: {row['first_three_4dp'][0]}" for row in table)
    measured = f"{values}; largest spread over positions {num(worst)}; lesson's digits matched: {bool(get(r, 'all_match_lesson_4dp'))}"
    error = worst if get(r, "all_match_lesson_4dp") else float("inf")
    if error == float("inf"):
        error = tolerance + 1.0
    return deterministic(text, source, f"spread of <R_m q, R_n k> over positions at a fixed offset ≤ {num(tolerance)} "
                                       "(fp32 float tolerance) and the lesson's 4 decimals reproduced",
                         measured, error=float(error), tolerance=float(tolerance))


def _rope_variants(r: dict, text: str, source: str) -> ClaimRecord:
    checks = get(r, "scheme_checks")
    relative = [c for c in checks if c["expected_offset_only"]]
    absolute = [c for c in checks if not c["expected_offset_only"]]
    measured = (f"{sum(c['offset_only'] for c in relative)} of {len(relative)} rotary variants offset-only; "
                f"{sum(not c['offset_only'] for c in absolute)} of {len(absolute)} others not")
    wrong = sum(c["offset_only"] != c["expected_offset_only"] for c in checks)
    return deterministic(text, source, f"every scheme offset-only exactly when expected (spread ≤ "
                                       f"{num(get(r, 'offset_only_tolerance'))}; tolerance: 0 schemes wrong)",
                         measured, error=float(wrong), tolerance=0.0)


def _permutation_equivariant(r: dict, text: str, source: str) -> ClaimRecord:
    diff = get(r, "lesson_raw_matrices.max_abs_diff_after_unpermuting")
    bound = get(r, "equivariant_below")
    return deterministic(text, source, f"max |difference| after un-permuting ≤ {num(bound)} (fp32 float tolerance)",
                         f"max |difference| after un-permuting: {num(diff)}", error=float(diff), tolerance=float(bound))


def _permutation_broken(r: dict, text: str, source: str) -> ClaimRecord:
    schemes = get(r, "schemes")
    encoding = [s for s in schemes if s["encodes_position"]]
    weakest = min(encoding, key=lambda s: s["max_abs_diff_after_unpermuting"])
    measured = (f"{sum(s['verdict'] == 'broken' for s in encoding)} of {len(encoding)} position schemes change the output; "
                f"smallest change {num(weakest['max_abs_diff_after_unpermuting'])} ({weakest['scheme']})")
    floor = get(r, "broken_above") if "broken_above" in r else get(r, "equivariant_below")
    return at_least(text, source, f"every position scheme changes the un-permuted output by ≥ {num(floor)} "
                                  "(far above the fp32 float noise)", measured,
                    value=float(weakest["max_abs_diff_after_unpermuting"]), floor=float(floor))


def _causal_one_layer(r: dict, text: str, source: str) -> ClaimRecord:
    diff, bound = get(r, "max_abs_diff_last_logits.1.none"), get(r, "noise_below")
    return deterministic(text, source, f"max |logit difference| of the two orders ≤ {num(bound)} (fp32 float tolerance)",
                         f"1 layer, no positions: {num(diff)}; with learned positions: "
                         f"{num(get(r, 'max_abs_diff_last_logits.1.learned'))}", error=float(diff), tolerance=float(bound))


def _causal_leak(r: dict, text: str, source: str) -> ClaimRecord:
    diffs = get(r, "max_abs_diff_last_logits")
    bound = get(r, "leak_above")
    deep = {layers: v["none"] for layers, v in diffs.items() if int(layers) >= 2}
    measured = ", ".join(f"{layers} layers: {num(v)}" for layers, v in deep.items())
    return at_least(text, source, f"from 2 layers on, the two orders' logits differ by ≥ {num(bound)} (far above float noise)",
                    measured, value=float(min(deep.values())), floor=float(bound))


def _frequencies(r: dict, text: str, source: str) -> ClaimRecord:
    table = get(r, "lesson_table_d8_base10000")
    periods = [row["period_positions"] for row in table]
    measured = "period per dimension: " + ", ".join(num(p, 3) for p in periods) + " positions"
    ratios = [b / a for a, b in zip(periods, periods[1:])]
    return at_least(text, source, "each dimension pair's period is longer than the previous one "
                                  "(smallest ratio of consecutive periods ≥ 1 + 1e-6)", measured,
                    value=float(min(ratios)), floor=1.0 + 1e-6)


def _one_model(text: str) -> str:
    return f"{text} (measured on the lab's one trained Tang model: a property of that model, not a seeded comparison)"


def _heads_previous_token(r: dict, text: str, source: str) -> ClaimRecord:
    counts = get(r, "counts")
    total = len(get(r, "heads"))
    best = max(get(r, "heads"), key=lambda h: h["previous_token"])
    threshold = get(r, "thresholds.previous_token") if "previous_token" in get(r, "thresholds") else None
    measured = (f"{counts['previous-token']} previous-token, {counts['induction']} induction, {counts['positional']} positional "
                f"of {total} heads; strongest previous-token head L{best['layer']}H{best['head']} "
                f"({num(best['previous_token'], 3)} of its attention on the previous token)")
    if threshold is None:
        return at_least(text, source, _one_model("at least one head classified previous-token"), measured,
                        value=float(counts["previous-token"]), floor=1.0)
    return at_least(text, source, _one_model(f"the strongest head's previous-token score ≥ {num(threshold)}"), measured,
                    value=float(best["previous_token"]), floor=float(threshold))


def _heads_punctuation(r: dict, text: str, source: str) -> ClaimRecord:
    heads = get(r, "heads")
    best = max(heads, key=lambda h: h["punctuation"])
    share = get(r, "punctuation_share_of_keys")
    threshold = get(r, "thresholds.punctuation")
    measured = (f"{get(r, 'counts.punctuation')} of {len(heads)} heads put ≥ {num(threshold)} of their "
                f"attention on punctuation; strongest L{best['layer']}H{best['head']} ({num(best['punctuation'], 3)}); "
                f"punctuation is {share:.0%} of the text")
    if not get(r, "punctuation_ids"):
        return ClaimRecord(text, source, "needs punctuation in the vocabulary", measured, None, None, 0, INCONCLUSIVE)
    return at_least(text, source, _one_model(f"the strongest head's share of attention on punctuation ≥ {num(threshold)}"),
                    measured, value=float(best["punctuation"]), floor=float(threshold))


def _heads_spare(r: dict, text: str, source: str) -> ClaimRecord:
    base, pruned = get(r, "base_loss"), get(r, "pruned_30")
    relative = pruned["loss_increase"] / base
    measured = (f"masking the {pruned['heads_masked']} least important heads (30%) moves the loss "
                f"{num(base)} → {num(pruned['loss'])} ({relative:+.1%}); 60%: {num(get(r, 'pruned_60.loss'))}")
    return deterministic(text, source, _one_model(f"relative loss increase after pruning 30% of heads ≤ {SPARE_HEADS_MAX_INCREASE:.0%}"),
                         measured, error=float(max(relative, 0.0)), tolerance=SPARE_HEADS_MAX_INCREASE)


SPARE_HEADS_MAX_INCREASE = 0.02  # "spare" heads: pruning 30% of heads costs < 2% of the loss


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
    Claim("heads", "seed 000 Q1",
          "有些头专门做「前一个词」的关注 — some heads specialise in the previous token", _heads_previous_token),
    Claim("heads", "seed 000 Q1",
          "有些头做「句号」的关注 — some heads attend to punctuation (the full stop)", _heads_punctuation),
    Claim("heads", "seed 002 §6.1",
          "头7/8充当\"备用通道\" — some heads are spare: pruning the least important 30% costs < 2% of the loss", _heads_spare),
)


def normalize(entry: Any, experiment: str) -> Verdict:
    """An experiment's own claim entry (a :class:`ClaimRecord` dict) as a :class:`Verdict`.

    An entry that is not a valid record is shown as an inconclusive record saying why.
    """
    try:
        record = entry if isinstance(entry, ClaimRecord) else ClaimRecord.from_dict(entry)
    except (ValueError, TypeError, AttributeError) as err:
        text = entry.get("claim", "(unnamed claim)") if isinstance(entry, dict) else "(unnamed claim)"
        record = ClaimRecord(str(text), str(entry.get("source", "")) if isinstance(entry, dict) else "",
                             "not a claim record", f"unusable claim entry: {err}"[:200], None, None, 0, INCONCLUSIVE)
    return Verdict(experiment, record)


def evaluate(results: dict[str, dict]) -> list[Verdict]:
    """Check every claim in :data:`CLAIMS`, then add each experiment's own ``"claims"`` records.

    Args:
        results: results folder (``"experiments/params"``, ``"heads"``, ...) -> its results.json.
    """
    verdicts = []
    for claim in CLAIMS:
        data = results.get(claim.experiment)
        if data is None:
            record = ClaimRecord(claim.text, claim.source, "", "not run in this lab", None, None, 0, INCONCLUSIVE)
        else:
            try:
                record = claim.check(data, claim.text, claim.source)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as err:  # schema changed
                record = ClaimRecord(claim.text, claim.source, "", f"results.json has no usable {err}", None, None, 0,
                                     INCONCLUSIVE)
        verdicts.append(Verdict(claim.experiment, record))
    for experiment, data in results.items():
        for entry in data.get("claims", []) if isinstance(data, dict) else []:
            verdicts.append(normalize(entry, experiment))
    return verdicts
