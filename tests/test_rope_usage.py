"""RoPE frequency usage (Barbero et al. 2024, https://arxiv.org/abs/2410.06205): norms per rotary pair."""

from __future__ import annotations

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.lab.experiments import registry
from poslab.lab.experiments import rope_frequency_usage as rfu
from poslab.lab.plan import Test as StatTest
from poslab.lab.scale import Scale
from poslab.lab.verdicts import HELD, ClaimRecord, check_records, missing_premises

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = Scale(
    name="tiny",
    train_length=16,
    n_layer=1,
    n_head=2,
    n_embd=16,
    steps=8,
    batch_size=4,
    lr=3e-3,
    warmup_steps=2,
    eval_interval=8,
    eval_iters=1,
    eval_windows=4,
)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_pair_norms_follow_the_layout(layout):
    x = torch.zeros(2, 1, 3, 8)  # [B, h, T, d_k]: 4 pairs
    a, b = (1, 5) if layout == "half" else (2, 3)  # coordinates of pair 1 in this layout
    x[..., a], x[..., b] = 3.0, 4.0
    norms = rfu.pair_norms(x, layout)
    torch.testing.assert_close(norms, torch.tensor([[0.0, 5.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="unknown RoPE layout"):
        rfu.pair_norms(x, "spiral")


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_frequency_norms_see_only_the_pair_the_weights_feed(layout):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=20,
            n_layer=1,
            n_head=2,
            n_embd=16,
            block_size=8,
            position="rope",
            position_config={"layout": layout},
        )
    ).eval()
    d_k = 8
    first, second = (0, d_k // 2) if layout == "half" else (0, 1)  # pair 0 of head 0
    with torch.no_grad():
        q_rows = model.blocks[0].attn.qkv.weight[: 2 * d_k]
        keep = q_rows[[first, second]].clone()
        q_rows.zero_()
        q_rows[[first, second]] = keep
        if model.blocks[0].attn.qkv.bias is not None:
            model.blocks[0].attn.qkv.bias[: 2 * d_k].zero_()
    rotate = model.position.rotate
    norms = rfu.frequency_norms(model, torch.randint(0, 20, (2, 8)))
    assert model.position.rotate == rotate  # the capture restored the method
    q = norms["q"]  # [L, h, r/2]
    assert q.shape == (1, 2, 4) and norms["k"].shape == (1, 2, 4)
    assert q[0, 0, 0] > 0.01
    assert float(q[0, 0, 1:].abs().max()) == 0.0 and float(q[0, 1].abs().max()) == 0.0
    assert float(norms["k"].min()) > 0.0  # keys untouched: every pair carries some norm


def test_quarter_means_and_non_rotary_models():
    norms = torch.tensor([[4.0, 3.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.5]])
    assert rfu.quarter_means(norms) == (3.5, 0.5)
    model = GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, block_size=8, position="alibi"))
    with pytest.raises(ValueError, match="does not rotate"):
        rfu.frequency_norms(model, torch.zeros(1, 4, dtype=torch.long))


def test_experiment_runs_small_and_writes_claims(tmp_path):
    assert registry()["rope-frequency-usage"] is rfu
    results = rfu.run(tmp_path, quick=True, seeds=(1, 2, 3), scale=TINY)
    assert (tmp_path / rfu.PLOT_FILE).exists()
    assert results["n_pairs"] == 4 and len(results["per_seed"]) == 3
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert check_records(results["claims"]) == []
    for claim in results["claims"]:
        record = ClaimRecord.from_dict(claim)
        assert record.n_seeds == 3 and record.details["seeds"] == [1, 2, 3]
        assert record.design.test == StatTest.PAIRED and record.design.log
    # the control is each seed's own initialisation, not one model shared by every seed
    assert len({r["untrained"]["low_over_high"] for r in results["per_seed"]}) == 3
    for r in results["per_seed"]:
        assert torch.tensor(r["trained"]["q"]).shape == (1, 2, 4)
        assert r["trained"]["low_over_high"] == pytest.approx(
            r["trained"]["low_quarter"] / r["trained"]["high_quarter"]
        )


def test_claims_are_paired_by_seed():
    # the seeds' models differ in scale 3x, yet at every seed low/high is 1.5 trained and 1.0 at initialisation
    def norms(low: float, high: float, ratio: float) -> rfu.Norms:
        return rfu.Norms([], [], high, low, ratio)

    per_seed = [
        rfu.SeedReading(seed, [], "text", 2.0, norms(1.5 * scale, scale, 1.5 + wiggle), norms(1.0, 1.0, 1.0 + wiggle))
        for seed, scale, wiggle in ((4, 0.5, 0.0), (5, 1.5, 0.3), (6, 1.0, -0.3))
    ]
    main, control = (ClaimRecord.from_dict(c) for c in rfu.seed_claims(per_seed))
    assert main.verdict == control.verdict == HELD  # unpaired, the seeds' spread would hide both
    assert main.details["seeds"] == control.details["seeds"] == [4, 5, 6]
