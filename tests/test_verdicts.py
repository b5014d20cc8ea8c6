"""The one verdict rule (poslab/lab/verdicts.py): three values, margin against measured noise."""

from __future__ import annotations

import pytest

from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    Arm,
    ClaimRecord,
    Metric,
    best_of,
    bound,
    check_records,
    compare,
    deterministic,
    equivalent,
    missed_by,
    on_common_seeds,
    paired,
    tally,
)


def test_welch_halfwidth_by_hand():
    # variances 1 and 1, n 3 and 3: se = sqrt(2/3), df = 4, t_{0.975, 4} = 2.7764451 (tables: 2.776)
    r = compare("x beats y", "t", Arm("x", [1.0, 2.0, 3.0]), Arm("y", [2.0, 3.0, 4.0]), Metric("m"))
    assert r.noise == pytest.approx(2.7764451 * (2 / 3) ** 0.5, rel=1e-6)


def test_a_clear_win_holds_and_a_clear_loss_does_not():
    win = compare("x beats y", "test", Arm("x", [1.00, 1.01, 0.99]), Arm("y", [2.00, 2.02, 1.98]), Metric("loss"))
    assert win.verdict == HELD and win.margin == pytest.approx(1.0) and win.n_seeds == 3
    loss = compare("y beats x", "test", Arm("y", [2.00, 2.02, 1.98]), Arm("x", [1.00, 1.01, 0.99]), Metric("loss"))
    assert loss.verdict == DID_NOT_HOLD and loss.margin == pytest.approx(-1.0)


def test_inside_the_noise_is_inconclusive():
    r = compare("x beats y", "test", Arm("x", [1.0, 1.5, 0.5]), Arm("y", [1.1, 1.6, 0.6]), Metric("loss"))
    assert r.verdict == INCONCLUSIVE and abs(r.margin) < r.noise


def test_ties_and_single_seeds_are_inconclusive():
    tie = compare("x beats y", "t", Arm("x", [1.0, 1.0, 1.0]), Arm("y", [1.0, 1.0, 1.0]), Metric("m"))
    assert tie.verdict == INCONCLUSIVE
    one = compare("x beats y", "t", Arm("x", [1.0]), Arm("y", [5.0]), Metric("m"))
    assert one.verdict == INCONCLUSIVE and one.noise is None
    two = compare("x beats y", "t", Arm("x", [1.0, 1.01]), Arm("y", [5.0, 5.01]), Metric("m"))
    assert two.verdict == INCONCLUSIVE  # the noise is tiny, but 2 seeds never decide


def test_higher_is_better_direction():
    r = compare(
        "acc", "t", Arm("a", [0.9, 0.91, 0.92]), Arm("b", [0.5, 0.52, 0.51]), Metric("accuracy", lower_is_better=False)
    )
    assert r.verdict == HELD and r.margin > 0


def test_a_record_cannot_claim_more_than_its_noise():
    with pytest.raises(ValueError, match="within the noise"):
        ClaimRecord("c", "s", "crit", "m", margin=0.01, noise=0.02, n_seeds=3, verdict=HELD)
    with pytest.raises(ValueError, match="cannot decide"):
        ClaimRecord("c", "s", "crit", "m", margin=1.0, noise=0.02, n_seeds=1, verdict=HELD)
    with pytest.raises(ValueError, match="verdict must be one of"):
        ClaimRecord("c", "s", "crit", "m", margin=1.0, noise=0.02, n_seeds=3, verdict="held at this scale")


def test_check_records_flags_forged_dicts():
    good = compare("x", "t", Arm("a", [1, 1.1, 0.9]), Arm("b", [3, 3.1, 2.9]), Metric("m")).to_dict()
    forged = dict(good, margin=0.001)
    few = dict(good, n_seeds=2)
    assert check_records([good]) == []
    assert len(check_records([forged])) == 1
    assert len(check_records([few])) == 1
    assert check_records([{"claim": "no fields"}])


def test_deterministic_claims_use_a_tolerance():
    ok = deterministic("table", "seed 000", "max |diff| <= 1e-4", "3e-5", error=3e-5, tolerance=1e-4)
    bad = deterministic("table", "seed 000", "max |diff| <= 1e-4", "0.2", error=0.2, tolerance=1e-4)
    assert (ok.verdict, bad.verdict) == (HELD, DID_NOT_HOLD) and ok.n_seeds == 0 and ok.noise is None
    assert tally([ok, bad.to_dict()]) == {HELD: 1, DID_NOT_HOLD: 1, INCONCLUSIVE: 0}


def test_offset_turns_a_comparison_into_a_non_inferiority_claim():
    none, learned = [2.10, 2.11, 2.09], [2.00, 2.01, 1.99]
    # "none is at most 0.2 worse than learned": margin = -0.1 + 0.2 = 0.1, well outside the interval
    close = compare("close", "t", Arm("none", none), Arm("learned", learned), Metric("loss"), offset=-0.2)
    assert close.verdict == HELD and close.margin == pytest.approx(0.1)
    # "at most 0.05 worse": margin -0.05 against a half-width of 2.776 * sqrt(2 * 0.0001 / 3) = 0.0227
    far = compare("close", "t", Arm("none", none), Arm("learned", learned), Metric("loss"), offset=-0.05)
    assert far.verdict == DID_NOT_HOLD and far.margin == pytest.approx(-0.05)
    assert "at most 0.05" in far.criterion


def test_bound_uses_the_interval_of_the_mean():
    ratios = [1.00, 1.02, 1.04]  # mean 1.02, sd 0.02: half-width 4.303 * 0.02 / sqrt(3) = 0.0497
    record = bound("flat", "t", Arm("alibi", ratios), 1.10, Metric("ratio"), below=True)
    assert record.verdict == HELD and record.margin == pytest.approx(0.08)
    assert record.noise == pytest.approx(4.302653 * 0.02 / 3**0.5, rel=1e-6)
    near = bound("flat", "t", Arm("alibi", ratios), 1.05, Metric("ratio"), below=True)
    assert near.verdict == INCONCLUSIVE  # margin 0.03 < 0.0497
    assert bound("flat", "t", Arm("a", [1.0, 1.0]), 1.1, Metric("r"), below=True).verdict == INCONCLUSIVE  # 2 seeds


def test_paired_differences_cancel_the_shared_seed_noise():
    at_l = [2.0, 2.3, 2.6]  # large seed-to-seed spread, shared by both measurements
    past = [2.1, 2.4, 2.7]
    unpaired = compare("worse past L", "t", Arm("L", at_l), Arm("4L", past), Metric("loss"))
    record = paired("worse past L", "t", Arm("L", at_l), Arm("4L", past), Metric("loss"))
    assert unpaired.verdict == INCONCLUSIVE and record.verdict == HELD and record.margin == pytest.approx(0.1)
    with pytest.raises(ValueError, match="one value per seed"):
        paired("x", "t", Arm("a", [1.0, 2.0]), Arm("b", [1.0]), Metric("m"))


def test_arms_pair_on_the_seeds_they_share_in_the_first_arms_order():
    seeds, values = on_common_seeds(
        {"a": {3: 1.0, 1: 2.0, 2: 3.0}, "b": {1: 5.0, 3: 6.0}, "c": {2: 0.0, 1: 7.0, 3: 8.0}}
    )
    assert seeds == [3, 1]
    assert values == [[1.0, 2.0], [6.0, 5.0], [8.0, 7.0]]
    assert on_common_seeds({"a": {1: 1.0}, "b": {2: 2.0}}) == ([], [[], []])


def test_best_of_is_decided_pairwise():
    arms = {"1": [3.0, 3.01, 2.99], "2": [2.5, 2.51, 2.49], "4": [2.6, 2.61, 2.59], "8": [2.7, 2.71, 2.69]}
    assert best_of("best", "t", arms, ["2"], Metric("loss")).verdict == HELD
    lost = best_of("best", "t", arms, ["8"], Metric("loss"))
    assert lost.verdict == DID_NOT_HOLD and lost.margin < -lost.noise
    arms["4"] = [2.5, 2.52, 2.48]  # a tie with the predicted arm
    tie = best_of("best", "t", arms, ["2"], Metric("loss"))
    assert tie.verdict == INCONCLUSIVE and abs(tie.margin) <= tie.noise
    assert check_records([tie, lost]) == []
    with pytest.raises(ValueError, match="must be among"):
        best_of("best", "t", arms, ["3"], Metric("loss"))


def test_missed_by_says_margin_against_noise():
    tie = compare("tie", "t", Arm("a", [1.0, 1.1, 0.9]), Arm("b", [1.0, 1.05, 0.95]), Metric("m"))
    assert tie.verdict == INCONCLUSIVE and missed_by(tie).startswith("|margin| 0 ≤ noise")
    assert "deterministic" in missed_by(deterministic("c", "s", "e <= 1", "0", error=0.0, tolerance=1.0))


def test_an_unmet_premise_makes_the_claim_not_testable_and_a_decided_record_is_refused():
    from poslab.lab.verdicts import Premise, check_records, not_testable, with_premise

    record = compare("a beats b", "test", Arm("a", [1.0, 1.1, 0.9]), Arm("b", [3.0, 3.1, 2.9]), Metric("loss"))
    assert record.verdict == "held"
    gated = with_premise(record, Premise("accuracy at L >= 0.9", "a 0.40, b 0.35", met=False))
    assert gated.verdict == "inconclusive" and not_testable(gated)
    assert gated.details["reason"].startswith("premise not met: accuracy at L >= 0.9")
    assert gated.details["verdict_without_premise"] == "held"
    kept = with_premise(record, Premise("accuracy at L >= 0.9", "a 0.97, b 0.95", met=True))
    assert kept.verdict == "held" and not not_testable(kept)
    forged = {**record.to_dict(), "premise": {"text": "x", "measured": "y", "met": False}}
    assert check_records([forged]) and "unmet premise" in check_records([forged])[0]
    assert ClaimRecord.from_dict(gated.to_dict()) == gated


def test_t_p_values_by_hand():
    import math

    from poslab.lab.verdicts import one_sample_p, welch_p

    # [1, 2, 3] against 0: mean 2, sd 1, t = 2 sqrt(3), df 2; df = 2 has the closed form p = 1 - |t| / sqrt(2 + t^2)
    assert one_sample_p([1.0, 2.0, 3.0], 0.0) == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), abs=1e-12)
    # Welch with equal variances and sizes is Student's t: [1,2,3] vs [4,5,6]: t = -3 / sqrt(2/3), df 4; p by the
    # closed form of df = 4: p = 1 - (3/2) x^{1/2} + (1/2) x^{3/2} with x = t^2 / (4 + t^2), so 1 - that cdf part
    t = 3 / math.sqrt(2 / 3)
    x = t * t / (4 + t * t)
    assert welch_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(1 - (1.5 * x**0.5 - 0.5 * x**1.5), abs=1e-12)
    assert welch_p([1.0], [2.0, 3.0]) is None


def test_comparisons_carry_a_p_value_that_agrees_with_the_interval():
    clear = compare("a", "s", Arm("x", [1.0, 1.1, 0.9]), Arm("y", [3.0, 3.1, 2.9]), Metric("m"))
    close = compare("a", "s", Arm("x", [2.30, 2.35, 2.28]), Arm("y", [2.31, 2.33, 2.30]), Metric("m"))
    assert clear.verdict == HELD and clear.details["p_value"] < 0.05
    assert close.verdict == INCONCLUSIVE and close.details["p_value"] > 0.05
    # with an offset the test is against the shifted difference: "x at most 3 worse" holds only far from the edge
    shifted = compare("a", "s", Arm("x", [3.0, 3.1, 2.9]), Arm("y", [1.0, 1.1, 0.9]), Metric("m"), offset=-2.0)
    assert shifted.verdict == INCONCLUSIVE and shifted.details["p_value"] == pytest.approx(1.0)
    assert bound("b", "s", Arm("x", [1.01, 1.02, 1.03]), 1.10, Metric("r"), below=True).details["p_value"] < 0.05
    ranked = best_of("c", "s", {"1": [1.0, 1.1, 0.9], "2": [3.0, 3.1, 2.9], "3": [2.0, 2.1, 1.9]}, ["1"], Metric("m"))
    assert ranked.verdict == HELD
    worst = compare("c", "s", Arm("1", [1.0, 1.1, 0.9]), Arm("3", [2.0, 2.1, 1.9]), Metric("m"))
    assert ranked.details["p_value"] == pytest.approx(worst.details["p_value"])  # the weakest pair decides


def test_no_public_comparison_takes_more_than_eight_parameters():
    import inspect

    from poslab.lab import comparisons

    public = [
        f
        for name, f in vars(comparisons).items()
        if inspect.isfunction(f) and not name.startswith("_") and f.__module__ == comparisons.__name__
    ]
    assert {f.__name__ for f in public} >= {"compare", "paired", "bound", "equivalent", "best_of"}
    wide = {f.__name__: len(inspect.signature(f).parameters) for f in public}
    assert {name: n for name, n in wide.items() if n > 8} == {}


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Arm("rope", [1.0, 1.1, 1.2], [0, 1]), r"'rope': 3 values and 2 seeds \[0, 1\]: one seed per value"),
        (lambda: Arm("rope", [1.0, 1.1], [4, 4]), r"'rope': seeds \[4, 4\] repeat a seed"),
        (lambda: Arm("rope", []), r"'rope': needs at least one value"),
        (lambda: Arm("rope", [1.0, "fast"]), r"'rope': values hold 'fast', not a number"),
        (lambda: Arm("rope", [1.0, 1.1], ["a", "b"]), r"'rope': seeds hold 'a', not a number"),
        (lambda: Arm("rope", 2.0), r"'rope': values must be a sequence of numbers, one per seed, got 2.0"),
        (lambda: Arm("", [1.0]), r"arm label '': must be a non-empty string"),
        (lambda: Metric(""), r"metric name '': must be a non-empty string"),
        (lambda: Metric("val loss", digits=-1), r"'val loss': digits -1 must be an integer >= 0"),
    ],
)
def test_arms_and_metrics_refuse_what_a_test_cannot_read_in_one_line(make, says):
    with pytest.raises(ValueError, match=says) as error:
        make()
    assert "\n" not in str(error.value)


def test_paired_tests_refuse_arms_of_other_seeds():
    a, b = [1.0, 1.1, 0.9], [3.0, 3.1, 2.9]
    for test in (paired, lambda *arms: equivalent(*arms, within=0.1)):
        # seed i of one arm against seed i of the other: the same seeds in the same order, or neither arm's
        with pytest.raises(ValueError, match=r"'x' has seeds \[1, 2, 3\] and 'y' \[1, 3, 2\]"):
            test("c", "s", Arm("x", a, [1, 2, 3]), Arm("y", b, [1, 3, 2]), Metric("m"))
        with pytest.raises(ValueError, match=r"'x' has seeds \[1, 2, 3\] and 'y' None"):
            test("c", "s", Arm("x", a, [1, 2, 3]), Arm("y", b), Metric("m"))
    record = paired("c", "s", Arm("x", a, [1, 2, 3]), Arm("y", b, [1, 2, 3]), Metric("m"))
    assert record.verdict == HELD and record.details["seeds"] == [1, 2, 3]


def test_welch_refuses_one_arm_with_seeds_and_one_without():
    with pytest.raises(ValueError, match=r"'x' has seeds \[1, 2, 3\] and 'y' None: give both arms' seeds or neither"):
        compare("c", "s", Arm("x", [1.0, 1.1, 0.9], [1, 2, 3]), Arm("y", [3.0, 3.1, 2.9]), Metric("m"))


def test_a_ranking_refuses_a_log_metric():
    arms = {"a": [1.0, 1.1, 0.9], "b": [3.0, 3.1, 2.9]}
    with pytest.raises(ValueError, match="a ranking tests the values as given; metric 'ppl' has log=True"):
        best_of("c", "s", arms, ["a"], Metric("ppl", log=True))
