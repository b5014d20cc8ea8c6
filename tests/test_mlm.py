"""The masked-LM objective (``--objective mlm``): BERT's masking, the loss on selected positions only,
causal-only schemes refused, an MLM step for every scheme, and the ``bidirectional`` experiment."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from poslab.data import get_batch
from poslab.lab.experiments import bidirectional, bidirectional_leak
from poslab.lab.plan import Test as StatTest
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, ClaimRecord, check_records, missing_premises
from poslab.nn import positions
from poslab.nn.attention import AttentionConfig
from poslab.nn.model import GPT, GPTConfig
from poslab.nn.positions.nope import NoPE
from poslab.runs import load_run, read_metrics
from poslab.session import train
from poslab.training.config import TrainConfig, model_config
from poslab.training.data import (
    MLM_MASK,
    MLM_RANDOM,
    MLM_SELECT,
    mask_id_of,
    mask_tokens,
    model_vocab_size,
    objective_batch,
    prepare_data,
)
from poslab.training.evaluation import evaluate_loss

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def tiny_values(corpus, tmp_path, **extra):
    values = {
        "name": "mlm",
        "out_dir": str(tmp_path),
        "corpus": corpus,
        "objective": "mlm",
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "attention": {"causal": False}},
        "max_steps": 4,
        "batch_size": 4,
        "warmup_steps": 1,
        "eval_interval": 2,
        "eval_iters": 2,
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "threads": 1,
        "seed": 3,
    }
    values.update(extra)
    return values


# ------------------------------------------------------------------------------------ masking
def within(measured: float, p: float, n: int, z: float = 5.0) -> bool:
    """``measured`` (a fraction of ``n`` Bernoulli(p) draws) within ``z`` binomial sds of ``p``."""
    return abs(measured - p) <= z * math.sqrt(p * (1 - p) / n)


def test_masking_statistics_are_berts():
    vocab = 50
    mask_id = mask_id_of(model_vocab_size(vocab, "mlm"))
    assert mask_id == vocab
    ids = torch.randint(vocab, (1000, 1000), generator=torch.Generator().manual_seed(0))  # 1e6 positions
    inputs, targets = mask_tokens(ids, mask_id, torch.Generator().manual_seed(1))
    selected = targets != -1
    n, n_sel = ids.numel(), int(selected.sum())
    assert within(n_sel / n, MLM_SELECT, n)
    # targets: the original ids exactly where selected; inputs untouched elsewhere
    assert torch.equal(targets[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])
    assert not (inputs[~selected] == mask_id).any()
    sel_in, sel_orig = inputs[selected], ids[selected]
    masked = sel_in == mask_id
    changed = ~masked & (sel_in != sel_orig)  # a random token different from the original
    kept = sel_in == sel_orig
    # a random replacement draws the original id with probability 1/vocab: it then reads as kept
    p_changed = MLM_RANDOM * (vocab - 1) / vocab
    p_kept = 1 - MLM_MASK - MLM_RANDOM + MLM_RANDOM / vocab
    assert within(float(masked.float().mean()), MLM_MASK, n_sel)
    assert within(float(changed.float().mean()), p_changed, n_sel)
    assert within(float(kept.float().mean()), p_kept, n_sel)
    # random replacements are tokens (never the mask) spread over the whole vocabulary
    replaced = sel_in[changed]
    assert int(replaced.max()) < mask_id and int(replaced.min()) >= 0
    counts = torch.bincount(replaced, minlength=vocab).float()
    expected = replaced.numel() / vocab
    assert float(((counts - expected) ** 2 / expected).sum()) < vocab + 5 * math.sqrt(2 * vocab)  # chi-square


def test_masking_always_selects_something_and_rejects_bad_values():
    ids = torch.zeros(1, 1, dtype=torch.long)
    for seed in range(20):  # one position: selected with p = 0.15 unless forced
        _, targets = mask_tokens(ids, 5, torch.Generator().manual_seed(seed))
        assert (targets != -1).sum() == 1
    with pytest.raises(ValueError, match="select"):
        mask_tokens(ids, 5, select=0.0)
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(ids, 0)
    with pytest.raises(ValueError, match="objective"):
        objective_batch("xlm", ids, ids, 5)


def test_loss_is_only_on_selected_positions():
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=21, n_layer=1, n_head=2, n_embd=16, block_size=32, attention=AttentionConfig(causal=False))
    ).eval()
    x, y = get_batch(torch.randint(20, (500,)), 32, 8, torch.Generator().manual_seed(0))
    inputs, targets = objective_batch("mlm", x, y, mask_id_of(21), torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, loss = model(inputs, targets)
    selected = targets != -1
    assert 0 < int(selected.sum()) < selected.numel()
    by_hand = F.cross_entropy(logits[selected], x[selected])
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    everywhere = F.cross_entropy(logits.reshape(-1, 21), x.reshape(-1))
    assert abs(everywhere.item() - loss.item()) > 1e-4  # the unselected positions are not in it
    # and the clm objective is the plain next-token batch
    assert objective_batch("clm", x, y, None) == (x, y)


def test_training_and_evaluation_use_the_masked_objective(tmp_path, corpus):
    cfg = TrainConfig.from_dict(tiny_values(corpus, tmp_path))
    results = train(cfg, overwrite=True, progress=False)
    model, tokenizer, _ = load_run(cfg.run_dir)  # an MLM run loads like any run
    assert model.config.vocab_size == tokenizer.vocab_size + 1  # the [MASK] id is the extra one
    assert not model.config.attention.causal
    data = prepare_data(cfg, tokenizer)
    args = (model, data.val, 16, cfg.batch_size, cfg.eval_iters)
    mlm = evaluate_loss(*args, seed=cfg.seed + 1, objective="mlm")
    assert mlm == pytest.approx(results["final_val_loss"], rel=1e-6)
    assert evaluate_loss(*args, seed=cfg.seed + 1, objective="clm") != pytest.approx(mlm, rel=1e-3)
    saved = json.loads((cfg.run_dir / "config.json").read_text())
    assert saved["train"]["objective"] == "mlm"


def test_mlm_resume_after_ctrl_c_is_bitwise_identical(tmp_path, corpus):
    """The masks come from the run's data generator, which a checkpoint holds: a resume replays them."""
    reference = TrainConfig.from_dict(tiny_values(corpus, tmp_path, name="straight", max_steps=8))
    train(reference, progress=False)
    cfg = TrainConfig.from_dict(tiny_values(corpus, tmp_path, name="interrupted", max_steps=8))

    def interrupt(step, record):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, callback=interrupt)
    train(cfg, resume=True, progress=False)
    a, b = read_metrics(reference.run_dir), read_metrics(cfg.run_dir)
    assert [(r["step"], r["loss"], r.get("val_loss")) for r in a] == [
        (r["step"], r["loss"], r.get("val_loss")) for r in b
    ]


def test_config_without_objective_is_a_causal_run(tmp_path, corpus):
    values = tiny_values(corpus, tmp_path)
    del values["objective"]
    values["model"] = {**values["model"], "attention": {"causal": True}}
    cfg = TrainConfig.from_dict(values)  # a config saved before the field existed
    assert cfg.objective == "clm"
    assert model_config(cfg, model_vocab_size(65, cfg.objective)).vocab_size == 65


# ------------------------------------------------------------------------------------ refusals
class CausalOnly(NoPE):
    """A test scheme that refuses bidirectional attention in its own ``check_layer``."""

    name = "causal_only_test"

    def check_layer(self, n_heads: int, head_dim: int, causal: bool) -> None:
        super().check_layer(n_heads, head_dim, causal)
        if not causal:
            raise ValueError("this scheme needs the causal mask")


def test_causal_only_scheme_is_refused_naming_it(tmp_path, corpus, monkeypatch):
    monkeypatch.setitem(positions._REGISTRY, CausalOnly.name, CausalOnly)
    causal = tiny_values(
        corpus, tmp_path, model={"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "position": CausalOnly.name}
    )
    with pytest.raises(ValueError, match=r"'causal_only_test' is causal-only.*needs the causal mask"):
        TrainConfig.from_dict(causal)
    bidirectional_model = {**causal["model"], "attention": {"causal": False}}
    with pytest.raises(ValueError, match=r"objective 'mlm'.*'causal_only_test'"):
        TrainConfig.from_dict({**causal, "model": bidirectional_model})
    TrainConfig.from_dict({**causal, "objective": "clm"})  # the causal LM is fine


def test_mlm_with_the_causal_mask_and_unknown_objective_are_refused(tmp_path, corpus):
    values = tiny_values(corpus, tmp_path)
    with pytest.raises(ValueError, match=r"set model.attention.causal to false"):
        TrainConfig.from_dict({**values, "model": {**values["model"], "attention": {"causal": True}}})
    with pytest.raises(ValueError, match=r"objective='bert' is not allowed; choose one of \['clm', 'mlm'\]"):
        TrainConfig.from_dict({**values, "objective": "bert"})


@pytest.mark.parametrize("scheme", positions.names())
def test_an_mlm_step_runs_for_every_scheme_that_accepts_bidirectional(scheme, tmp_path, corpus):
    values = tiny_values(
        corpus,
        tmp_path,
        model={
            "n_layer": 2,
            "n_head": 2,
            "n_embd": 16,
            "block_size": 16,
            "position": scheme,
            "attention": {"causal": False},
        },
    )
    try:
        cfg = TrainConfig.from_dict(values)
    except ValueError as err:  # a causal-only scheme: the refusal names it
        assert repr(scheme) in str(err)
        return
    torch.manual_seed(0)
    model = GPT(model_config(cfg, model_vocab_size(30, "mlm")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = get_batch(torch.randint(30, (400,)), 16, 4, torch.Generator().manual_seed(0))
    inputs, targets = objective_batch(
        "mlm", x, y, mask_id_of(model.config.vocab_size), torch.Generator().manual_seed(1)
    )
    _, loss = model(inputs, targets)
    loss.backward()
    assert math.isfinite(loss.item())
    grad = model.tok_emb.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    optimizer.step()
    with torch.no_grad():
        assert model(inputs, targets)[1].item() != loss.item()  # the step changed the model


# ------------------------------------------------------------------------------------ experiment
def test_leak_without_the_mask_is_float_noise_and_with_it_is_not():
    for n in (1, 2):
        free = bidirectional_leak.leak_differences(n, causal=False)
        assert free["all"] <= bidirectional_leak.TOLERANCE and free["last"] <= bidirectional_leak.TOLERANCE
    assert bidirectional_leak.leak_differences(2, causal=True)["last"] > bidirectional_leak.LEAK_ABOVE
    # with positions the encoder does see the order
    assert (
        bidirectional_leak.leak_differences(1, causal=False, position="learned")["all"] > bidirectional_leak.LEAK_ABOVE
    )


#: the seeds of the claims' arms (every arm trains from each)
SEEDS = (3, 4, 5)


def test_haviv_claims_follow_the_numbers():
    losses = {
        "clm-none": [2.50, 2.51, 2.49],
        "clm-learned": [2.48, 2.49, 2.47],
        "mlm-none": [3.10, 3.11, 3.09],
        "mlm-learned": [2.60, 2.61, 2.59],
        "mlm-rope": [3.0, 3.01, 2.99],
    }
    close, learned, rope = bidirectional.haviv_claims(losses, SEEDS)
    assert close["verdict"] == HELD and learned["verdict"] == HELD
    assert rope["verdict"] == DID_NOT_HOLD  # 3.0 -> 3.1 is 3%, not more than 10%
    losses["clm-none"] = [3.0, 3.01, 2.99]  # 20% worse: not close
    losses["mlm-none"] = [2.61, 2.62, 2.60]  # NoPos MLM as good as learned: did not fail
    close, learned, _ = bidirectional.haviv_claims(losses, SEEDS)
    assert close["verdict"] == DID_NOT_HOLD and learned["verdict"] == DID_NOT_HOLD
    losses["clm-none"] = [2.0, 2.01, 1.99]  # 20% better than learned: not "close" either (an equivalence, two-sided)
    assert bidirectional.haviv_claims(losses, SEEDS)[0]["verdict"] == DID_NOT_HOLD


def test_haviv_claims_are_paired_by_seed_on_ln_loss():
    # each seed's runs share their batches: seed-to-seed spread is common to the arms and cancels in the pairs
    learned = [2.0, 2.6, 3.2]
    losses = {
        "clm-learned": learned,
        "clm-none": [v * 1.01 for v in learned],
        "mlm-learned": learned,
        "mlm-rope": learned,
        "mlm-none": [v * r for v, r in zip(learned, (1.20, 1.22, 1.21))],
    }
    close, far, _ = (ClaimRecord.from_dict(c) for c in bidirectional.haviv_claims(losses, SEEDS))
    assert close.design.test == StatTest.EQUIVALENCE and close.design.log
    assert close.design.threshold == pytest.approx(math.log(1 + bidirectional.CLOSE))
    assert far.design.test == StatTest.PAIRED and far.design.log
    assert far.design.threshold == pytest.approx(math.log(1 + bidirectional.FAR))
    assert close.details["seeds"] == far.details["seeds"] == list(SEEDS)
    assert close.verdict == far.verdict == HELD  # unpaired, the 0.6-nat seed spread would hide both
    assert check_records([close, far]) == []


def test_bidirectional_experiment_on_a_tiny_base(tmp_path, corpus):
    base = tiny_values(corpus, tmp_path)
    for key in ("name", "out_dir", "objective"):
        base.pop(key)
    base["model"].pop("attention")
    results = bidirectional.run(tmp_path, quick=True, base=base, workers=1, seeds=(3, 4, 5), leak_layers=(1, 2))
    assert set(results["val_loss_seeds"]) == set(bidirectional.ARMS)
    assert all(len(v) == 3 for v in results["val_loss_seeds"].values())
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    seeded = [ClaimRecord.from_dict(c) for c in results["claims"] if c["n_seeds"]]
    assert [r.design.test for r in seeded] == [StatTest.EQUIVALENCE, StatTest.PAIRED, StatTest.PAIRED]
    assert all(r.details["seeds"] == [3, 4, 5] for r in seeded)
    leak = [c for c in results["claims"] if c["claim"].startswith("encoder mode")]
    assert len(leak) == 2 and all(c["verdict"] == HELD for c in leak)
    for label, (objective, position) in bidirectional.ARMS.items():
        saved = json.loads((tmp_path / "runs" / f"{label}-s3" / "config.json").read_text())
        assert saved["train"]["objective"] == objective and saved["model"]["position"] == position
        assert saved["model"]["attention"]["causal"] == (objective == "clm")
    assert (tmp_path / "bidirectional_curves.png").stat().st_size > 1000
    json.dumps(results)


@pytest.mark.slow
def test_bidirectional_quick_form(tmp_path):
    from poslab.lab.experiments import run_experiment

    results = run_experiment("bidirectional", tmp_path, quick=True)
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert (tmp_path / "results.json").exists() and (tmp_path / "bidirectional_curves.png").exists()
