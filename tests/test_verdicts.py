"""The one verdict rule (poslab/lab/verdicts.py): three values, margin against measured noise."""

from __future__ import annotations

import pytest

from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    ClaimRecord,
    check_records,
    compare,
    deterministic,
    interval_halfwidth,
    t975,
    tally,
)


def test_t_quantiles_match_the_table_values():
    # textbook values of t_{0.975}: df=2 -> 4.303, df=4 -> 2.776, df=10 -> 2.228, df=120 -> 1.980
    assert t975(2) == pytest.approx(4.303)
    assert t975(4) == pytest.approx(2.776)
    assert t975(10) == pytest.approx(2.228)
    assert t975(120) == pytest.approx(1.980, abs=0.003)
    assert t975(2.5) == pytest.approx((4.303 + 3.182) / 2)


def test_welch_halfwidth_by_hand():
    a, b = [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]  # variances 1 and 1, n 3 and 3: se = sqrt(2/3), df = 4
    assert interval_halfwidth(a, b) == pytest.approx(2.776 * (2 / 3) ** 0.5)


def test_a_clear_win_holds_and_a_clear_loss_does_not():
    win = compare("x beats y", "test", [1.00, 1.01, 0.99], [2.00, 2.02, 1.98],
                  better_label="x", worse_label="y", metric="loss")
    assert win.verdict == HELD and win.margin == pytest.approx(1.0) and win.n_seeds == 3
    loss = compare("y beats x", "test", [2.00, 2.02, 1.98], [1.00, 1.01, 0.99],
                   better_label="y", worse_label="x", metric="loss")
    assert loss.verdict == DID_NOT_HOLD and loss.margin == pytest.approx(-1.0)


def test_inside_the_noise_is_inconclusive():
    r = compare("x beats y", "test", [1.0, 1.5, 0.5], [1.1, 1.6, 0.6], better_label="x", worse_label="y", metric="loss")
    assert r.verdict == INCONCLUSIVE and abs(r.margin) < r.noise


def test_ties_and_single_seeds_are_inconclusive():
    tie = compare("x beats y", "t", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], better_label="x", worse_label="y", metric="m")
    assert tie.verdict == INCONCLUSIVE
    one = compare("x beats y", "t", [1.0], [5.0], better_label="x", worse_label="y", metric="m")
    assert one.verdict == INCONCLUSIVE and one.noise is None
    two = compare("x beats y", "t", [1.0, 1.01], [5.0, 5.01], better_label="x", worse_label="y", metric="m")
    assert two.verdict == INCONCLUSIVE  # the noise is tiny, but 2 seeds never decide


def test_higher_is_better_direction():
    r = compare("acc", "t", [0.9, 0.91, 0.92], [0.5, 0.52, 0.51], better_label="a", worse_label="b",
                metric="accuracy", lower_is_better=False)
    assert r.verdict == HELD and r.margin > 0


def test_a_record_cannot_claim_more_than_its_noise():
    with pytest.raises(ValueError, match="within the noise"):
        ClaimRecord("c", "s", "crit", "m", margin=0.01, noise=0.02, n_seeds=3, verdict=HELD)
    with pytest.raises(ValueError, match="cannot decide"):
        ClaimRecord("c", "s", "crit", "m", margin=1.0, noise=0.02, n_seeds=1, verdict=HELD)
    with pytest.raises(ValueError, match="verdict must be one of"):
        ClaimRecord("c", "s", "crit", "m", margin=1.0, noise=0.02, n_seeds=3, verdict="held at this scale")


def test_check_records_flags_forged_dicts():
    good = compare("x", "t", [1, 1.1, 0.9], [3, 3.1, 2.9], better_label="a", worse_label="b", metric="m").to_dict()
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
