"""The statistical plan (poslab/lab/plan.py): tests by design, families by experiment, power, one adjustment."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from poslab.lab import plan
from poslab.lab.plan import Design, Test, adjust, detectable, holm_thresholds, own_family, seeds_to_decide
from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    Arm,
    ClaimRecord,
    Metric,
    Premise,
    bound,
    check_records,
    compare,
    design_problems,
    deterministic,
    equivalent,
    paired,
)


def test_the_paired_test_is_scipy_s_ttest_rel_on_the_seeds():
    better, worse = [1.60, 1.65, 1.62, 1.70], [3.1, 3.3, 3.2, 3.0]
    r = paired("a < b", "t", Arm("a", better, [1, 2, 3, 4]), Arm("b", worse, [1, 2, 3, 4]), Metric("loss"))
    assert r.design.test == Test.PAIRED and r.design.paired and r.details["seeds"] == [1, 2, 3, 4]
    assert r.details["p_value"] == pytest.approx(stats.ttest_rel(worse, better).pvalue, rel=1e-9)
    ci = stats.ttest_rel(worse, better).confidence_interval(0.95)
    assert r.noise == pytest.approx((ci.high - ci.low) / 2, rel=1e-9)
    assert r.verdict == HELD


def test_ln_perplexity_tests_the_ratio_per_seed():
    # ratios 2.0, 2.2, 1.8 per seed between arms whose raw perplexities vary 10x across seeds: the ln test sees the
    # consistent ratio (paired differences of ln), Welch on raw perplexity sees mostly the seed spread
    base = [5.0, 50.0, 12.0]
    scaled = [b * r for b, r in zip(base, (2.0, 2.2, 1.8))]
    ln = paired("ntk < none", "t", Arm("ntk", base), Arm("none", scaled), Metric("ppl", log=True))
    assert ln.design.log and ln.verdict == HELD
    diffs = [math.log(s) - math.log(b) for b, s in zip(base, scaled)]
    assert ln.details["p_value"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
    raw = compare("ntk < none", "t", Arm("ntk", base), Arm("none", scaled), Metric("ppl"))
    assert raw.verdict == INCONCLUSIVE


def test_welch_refuses_arms_that_share_their_seeds():
    with pytest.raises(ValueError, match="paired"):
        compare("a", "t", Arm("a", [1.0, 1.1, 1.2], [0, 1, 2]), Arm("b", [2.0, 2.1, 2.2], [2, 1, 0]), Metric("m"))
    ok = compare("a", "t", Arm("a", [1.0, 1.1, 1.2], [0, 1, 2]), Arm("b", [2.0, 2.1, 2.2], [3, 4, 5]), Metric("m"))
    assert ok.design.test == Test.WELCH and not design_problems(ok)
    assert ok.details["p_value"] == pytest.approx(
        stats.ttest_ind([1.0, 1.1, 1.2], [2.0, 2.1, 2.2], equal_var=False).pvalue, rel=1e-9
    )
    # a record that says Welch over shared seeds (an edited file) is flagged by the checks the report runs
    forged = {**ok.to_dict(), "details": {**ok.details, "seeds": [[0, 1, 2], [0, 1, 2]]}}
    assert any("paired" in p for p in check_records([forged]))


def test_a_seeded_record_without_a_design_is_a_problem():
    bare = ClaimRecord("c", "s", "crit", "m", 1.0, 0.5, 3, HELD, {"p_value": 0.01})
    assert any("design" in p for p in check_records([bare]))
    fixed = deterministic("d", "s", "c", "m", error=0.0, tolerance=0.1)
    assert check_records([fixed]) == []  # deterministic claims have no seeds and no design


def test_tost_three_outcomes():
    ref = [2.00, 2.10, 1.90, 2.05]
    inside = equivalent("close", "t", Arm("a", [2.01, 2.11, 1.91, 2.04]), Arm("b", ref), Metric("loss"), within=0.05)
    assert inside.verdict == HELD and inside.design.test == Test.EQUIVALENCE
    # TOST by hand: both one-sided tests of the differences against -0.05 and +0.05
    d = [0.01, 0.01, 0.01, -0.01]
    p_low = stats.ttest_1samp(d, -0.05, alternative="greater").pvalue
    p_high = stats.ttest_1samp(d, 0.05, alternative="less").pvalue
    assert inside.details["p_equivalent"] == pytest.approx(max(p_low, p_high), rel=1e-9)
    outside = equivalent("close", "t", Arm("a", [2.30, 2.41, 2.20, 2.36]), Arm("b", ref), Metric("loss"), within=0.05)
    assert outside.verdict == DID_NOT_HOLD and outside.margin < -outside.noise
    unsure = equivalent("close", "t", Arm("a", [2.0, 2.3, 1.8, 2.1]), Arm("b", ref), Metric("loss"), within=0.05)
    assert unsure.verdict == INCONCLUSIVE


def test_power_matches_the_textbook_sample_sizes():
    # d = 1, two-sided alpha 0.05, power 0.8: 10 pairs (paired t) and 17 per group (two-sample t): Cohen's tables
    assert seeds_to_decide(1.0, 1.0, Test.PAIRED, 0.05) == 10
    assert seeds_to_decide(1.0, 1.0, Test.WELCH, 0.05) == 17
    mde = detectable(1.0, 10, Test.PAIRED, 0.05)
    assert 0.95 < mde < 1.0  # 10 pairs detect slightly less than d = 1 at 80%
    assert detectable(1.0, 20, Test.PAIRED, 0.05) < mde  # more seeds, smaller effects
    assert seeds_to_decide(1.0, 1.0, Test.PAIRED, 0.005) > 10  # a stricter Holm step needs more seeds
    assert seeds_to_decide(1e-6, 1.0, Test.PAIRED, 0.05) is None  # past MAX_SEEDS


def test_holm_thresholds_step_down():
    steps = holm_thresholds([0.011, 0.04, 0.03, 0.5])
    # m = 4: 0.011 <= 0.05/4 survives; 0.03 > 0.05/3 fails, and everything after it too
    assert steps == [(1, 0.0125, True), (3, 0.025, False), (2, 0.05 / 3, False), (4, 0.05, False)]


def _seeded(name: str, p: float, verdict: str = HELD, premise: Premise | None = None) -> ClaimRecord:
    return ClaimRecord(
        name, "test", "c", "m", 1.0, 0.5, 3, verdict, {"p_value": p, "sd": 0.4}, premise, Design(Test.PAIRED)
    )


def test_adjust_corrects_within_each_family_and_keeps_the_order():
    fixed = deterministic("d", "test", "c", "m", error=0.0, tolerance=0.0)
    untestable = _seeded("u", 0.0001, INCONCLUSIVE, Premise("p", "q", met=False))
    timing = own_family(_seeded("t", 0.02), "timing")
    records = [_seeded("a", 0.011), _seeded("b", 0.04), fixed, _seeded("c", 0.03, DID_NOT_HOLD), untestable, timing]
    out = adjust(records, "exp")
    assert [r.claim for r in out] == ["a", "b", "d", "c", "u", "t"]
    by = {r.claim: r for r in out}
    assert by["a"].design.family == "exp" and by["a"].verdict == HELD
    assert by["a"].details["holm"] == {"family": "exp", "m": 3, "rank": 1, "threshold": 0.05 / 3, "survives": True}
    # m = 3 in "exp" (the deterministic, the untestable and the timing record are not in it): 0.03 > 0.05/2 fails
    assert by["c"].verdict == INCONCLUSIVE and by["c"].details["unadjusted_verdict"] == DID_NOT_HOLD
    assert "Holm" in by["c"].details["reason"] and "'exp'" in by["c"].details["reason"]
    assert by["b"].verdict == INCONCLUSIVE and by["b"].details["unadjusted_verdict"] == HELD
    assert by["t"].verdict == HELD and by["t"].details["holm"]["m"] == 1  # alone in its family
    assert by["d"] == fixed and by["u"].verdict == INCONCLUSIVE
    # every seeded record says what would decide it at its noise and Holm step
    power = by["c"].details["power"]  # rank 2 of 3: its Holm step is 0.05 / 2
    assert power["alpha"] == pytest.approx(0.05 / 2) and power["mde"] > 0
    assert power["seeds_to_decide"] == seeds_to_decide(1.0, 0.4, Test.PAIRED, 0.05 / 2)
    # a second family in the same list is corrected on its own
    two = adjust([_seeded("x", 0.02), own_family(_seeded("y", 0.02), "other")], "exp")
    assert [r.verdict for r in two] == [HELD, HELD]


def test_results_json_the_console_and_the_report_show_one_verdict(tmp_path, monkeypatch, capsys):
    """A fake experiment's seeded claims go through run_experiment: the file holds the adjusted verdicts, the
    console prints them, and the report shows the file's verdicts without a second correction."""
    import types

    from poslab.lab import experiments
    from poslab.lab.experiments.common import LAB, Experiment
    from poslab.lab.report import claims as report_claims

    def run(out, quick=False):
        records = [
            paired(
                "strong",
                "s",
                Arm("a", [1.0, 1.1, 1.0, 1.05], [0, 1, 2, 3]),
                Arm("b", [2.0, 2.1, 2.05, 2.0], [0, 1, 2, 3]),
                Metric("m"),
            ),
            *(
                paired(
                    name,
                    "s",
                    Arm("a", [1.0, 1.1, 1.0, 1.05], [0, 1, 2, 3]),
                    Arm("b", [1.2, 1.15, 1.15, 1.35], [0, 1, 2, 3]),
                    Metric("m"),
                )
                for name in ("weak", "weak too")  # p = 0.044 each
            ),
        ]
        return {"claims": [r.to_dict() for r in records]}

    module = types.SimpleNamespace(EXPERIMENT=Experiment(name="fake", description="d", tier=LAB, run=run))
    monkeypatch.setattr(experiments, "registry", lambda: {"fake": module})
    experiments.run_experiment("fake", tmp_path)
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "results.json").read_text())["claims"]
    raw = {r["claim"]: r["verdict"] for r in run(tmp_path)["claims"]}
    assert raw["weak"] == HELD  # alone at 5% it holds ...
    by = {r["claim"]: r for r in written}
    assert by["weak"]["verdict"] == INCONCLUSIVE  # ... but not within the family of three (Holm: 0.044 > 0.05/2)
    assert by["strong"]["verdict"] == HELD and by["strong"]["design"]["family"] == "fake"
    assert "inconclusive" in printed and "held" in printed
    page = report_claims.evaluate({"experiments/fake": {"claims": written}})
    shown = {v.record.claim: v.record.verdict for v in page if v.experiment == "experiments/fake"}
    assert shown == {c: by[c]["verdict"] for c in by}
    # a seeded record written without a design (an older lab) is shown unusable, loudly, not with a verdict
    old = {**written[0], "design": None}
    (shown_old,) = [v for v in report_claims.evaluate({"x": {"claims": [old]}}) if v.experiment == "x"]
    assert "design" in shown_old.record.details[report_claims.UNUSABLE]


def test_design_round_trips_through_json():
    r = bound("b", "s", Arm("x", [1.01, 1.02, 1.03]), 1.10, Metric("r", log=True), below=True)
    again = ClaimRecord.from_dict(json.loads(json.dumps(r.to_dict())))
    assert (
        again == r and again.design.test is Test.ONE_SAMPLE and again.design.threshold == pytest.approx(math.log(1.10))
    )
    with pytest.raises(ValueError):
        Design(Test.PAIRED, alpha=1.5)
    assert plan.ALPHA == 0.05


def _fake_lab(tmp_path, names: tuple[str, ...]) -> list[dict]:
    """A lab folder ``tmp_path/lab`` whose one experiment, ``fake``, holds a clear and an unclear paired claim (in
    the order of ``names``) under the plan; returns the written records."""
    worse = {"clear": [2.0, 2.1, 2.05], "unclear": [1.2, 1.0, 1.15]}
    records = [paired(n, "s", Arm("a", [1.0, 1.1, 1.0]), Arm("b", worse[n]), Metric("m")) for n in names]
    folder = tmp_path / "lab" / "experiments" / "fake"
    folder.mkdir(parents=True)
    written = [r.to_dict() for r in adjust(records, "fake")]
    (folder / "results.json").write_text(json.dumps({"claims": written}))
    return written


def test_the_page_states_each_seeded_claim_s_test_and_the_seeds_that_would_decide_it(tmp_path):
    from poslab.lab.report import build_report

    written = _fake_lab(tmp_path, ("clear", "unclear"))
    html = build_report(tmp_path / "lab").read_text(encoding="utf-8")
    assert "paired t-test, p = " in html and "Holm within fake (step 1 of 2" in html
    n = written[1]["details"]["power"]["seeds_to_decide"]
    assert isinstance(n, int) and n > 3 and f"{n} seeds an arm would detect the measured effect" in html


def test_the_pilot_script_tabulates_the_seeds_each_claim_needs(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    written = _fake_lab(tmp_path, ("unclear", "clear"))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "pilot_seeds.py"
    out = tmp_path / "pilot.json"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "lab"), "--seeds", "3", "100", "--json", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    table = json.loads(out.read_text())
    by = {r["claim"]: r for r in table}
    assert by["unclear"]["seeds_to_decide"] == written[0]["details"]["power"]["seeds_to_decide"]
    assert "fake: 2 testable seeded claims, 1 decided now; detectable with 3 seeds: 1, 100 seeds: 2" in done.stdout


# The arms each pilot claim enters, read from the claims' words by hand (independent of the code's table).
PILOT_ARMS = {
    "position-training": {
        "the learned table beats none": ("learned", "none"),
        "no position encoding is at most a little worse": ("none", "learned"),
        "ALiBi trains to a slightly worse loss than RoPE": ("rope", "alibi"),
        "RoPE beats adding a learned or sinusoidal": ("rope", "learned", "sinusoidal"),
        "ALiBi trains at (nearly) the speed": ("alibi", "none"),
    },
    "extrapolation": {
        "ALiBi's perplexity at 4x L": ("alibi",),
        "sinusoidal degrades past L": ("sinusoidal",),
        "plain RoPE degrades past L": ("rope",),
        "at 8x L: ALiBi < RoPE": ("alibi", "rope"),
        "at 8x L: RoPE < sinusoidal": ("rope", "sinusoidal"),
        "a learned absolute table collapses": ("learned",),
        "RoPE reads past the training length better than a learned table": ("rope", "learned"),
        "RoPE's perplexity 'jumps": ("rope",),
    },
    "probes": {
        "none generalises past the training length better than t5": ("none", "t5"),
        "t5 generalises past the training length better than alibi": ("t5", "alibi"),
        "alibi generalises past the training length better than rope": ("alibi", "rope"),
        "rope generalises past the training length better than sinusoidal": ("rope", "sinusoidal"),
        "rope beats NoPE in length": ("rope", "none"),
        "4 heads beat 1 on multi-query": ("heads",),
    },
}


def _pilot_arms(row):
    by_text = PILOT_ARMS.get(row["experiment"])
    if by_text is None:  # every claim of the experiment enters every arm (or its one arm, RoPE)
        return ("rope",) if row["experiment"] in ("context-extension", "attention-entropy") else ("*",)
    found = [arms for text, arms in by_text.items() if text in row["claim"]]
    assert len(found) == 1, f"the pilot claim {row['claim']!r} must map to one arm set"
    return found[0]


def test_the_quick_seeds_per_arm_follow_the_pilot_by_the_rule():
    from pathlib import Path

    from poslab.lab.plan import PILOT, QUICK_SEED_CAP, QUICK_SEEDS, SHARED_ARMS, arm_seeds, quick_seeds

    rows = json.loads((Path(__file__).resolve().parents[1] / PILOT).read_text())
    needs: dict[tuple[str, str], list] = {}
    for row in rows:
        if row["testable"]:
            for arm in _pilot_arms(row):
                needs.setdefault((row["experiment"], arm), []).append(row["seeds_to_decide"])
    assert {e for e, _ in needs} == set(QUICK_SEEDS), "every experiment of the pilot has its seeds in the plan"
    for (experiment, arm), counts in needs.items():
        shared = experiment == "extrapolation" and arm in SHARED_ARMS
        assert quick_seeds(experiment, arm) == arm_seeds(counts, shared), (experiment, arm, counts)
    for experiment, arms in PILOT_ARMS.items():  # an arm no testable claim needs: shared, or the full form only
        for arm in {a for found in arms.values() for a in found} - {a for e, a in needs if e == experiment}:
            shared = experiment == "extrapolation" and arm in SHARED_ARMS
            assert quick_seeds(experiment, arm) == (3 if shared else 0), (experiment, arm)
    assert quick_seeds("extrapolation", "none") == 3  # in no claim, trained anyway by position-training
    assert max(n for arms in QUICK_SEEDS.values() for n in arms.values()) <= QUICK_SEED_CAP


def test_arm_seeds_takes_the_most_within_the_cap():
    from poslab.lab.plan import arm_seeds

    assert arm_seeds([3, 5, 4]) == 5
    assert arm_seeds([2]) == 3  # never below the fewest seeds a verdict needs
    assert arm_seeds([4, 10, None], cap=6) == 4  # a claim past the cap does not raise the arm's seeds
    assert arm_seeds([10, None], cap=6) == 0  # no claim decides within the cap: the full form only
    assert arm_seeds([10], shared=True) == 3


def test_the_quick_form_trains_the_planned_arms_and_defers_the_rest(monkeypatch):
    from poslab.lab.experiments import probes
    from poslab.lab.experiments.training import planned_seeds

    assert planned_seeds("extrapolation", ("learned", "alibi"), quick=True) == {
        "learned": (1337, 1338, 1339, 1340, 1341),
        "alibi": (1337, 1338, 1339),
    }
    assert planned_seeds("position-training", ("none", "rope"), quick=True) == {
        "none": (1337, 1338, 1339, 1340, 1341, 1342),
        "rope": (1337, 1338, 1339),
    }
    assert planned_seeds("extrapolation", ("rope", "alibi"), quick=False)["rope"] == (1337, 1338, 1339)
    assert planned_seeds("heads", ("*",), quick=True, seeds=(1, 2, 3)) == {"*": (1, 2, 3)}
    form = probes.planned_form(probes.form_of(True))
    assert form.schemes == ("sinusoidal", "rope") and form.seeds == (0, 1, 2, 3, 4) and form.heads == ()
    cell = {
        "accuracy": {str(f): [1.0 / f] * 5 for f in form.factors},
        "cannot": {},
        "seeds": list(form.seeds),
        "chance": 0.1,
    }
    table = {"reverse": {s: cell for s in form.schemes}}
    records = probes.probe_claims(table, {}, form)
    deferred = [r for r in records if r.premise is not None and not r.premise.met]
    for start in (
        "none generalises past",
        "t5 generalises past",
        "alibi generalises past",
        "attention needs position",
        "more heads carry",
    ):
        assert any(r.claim.startswith(start) for r in deferred), start
    assert not any(r.claim.startswith("rope generalises past") for r in deferred)  # both arms trained: measured
    assert all("the full form only" in r.premise.measured and r.design is not None for r in deferred)


def test_the_pilot_script_keeps_an_earlier_pilot_s_rows_only_for_experiments_it_did_not_rerun(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    _fake_lab(tmp_path, ("unclear", "clear"))
    old = tmp_path / "old.json"
    row = {"test": "paired t-test", "n": 3, "effect": 0.1, "sd": 0.05, "p": 0.1, "alpha": 0.05, "mde": 0.2}
    stale = {**row, "experiment": "fake", "claim": "stale", "verdict": "held", "testable": True, "seeds_to_decide": 3}
    other = {**row, "experiment": "other", "claim": "kept", "verdict": "held", "testable": True, "seeds_to_decide": 5}
    old.write_text(json.dumps([stale, other]))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "pilot_seeds.py"
    out = tmp_path / "pilot.json"
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "lab"), "--keep", str(old), "--json", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    claims = [(r["experiment"], r["claim"]) for r in json.loads(out.read_text())]
    assert ("other", "kept") in claims and ("fake", "stale") not in claims
    assert {c for e, c in claims if e == "fake"} == {"clear", "unclear"}
