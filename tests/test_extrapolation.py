"""The extrapolation, context-extension and attention-entropy experiments (smoke size) and their pieces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.analysis.heads import attention_weights
from poslab.data import CharTokenizer
from poslab.lab import verdicts
from poslab.lab.experiments import attention_entropy, context_extension, extrapolation
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, INCONCLUSIVE, VERDICTS, check_records, missing_premises

# ------------------------------------------------------------------------------------ smoke runs
SMOKE_SCHEMES = ("learned", "sinusoidal", "rope", "alibi")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab folder where the smoke extrapolation ran (its models are reused by the other two)."""
    root = tmp_path_factory.mktemp("lab")
    results = extrapolation.run(root / "extrapolation", size="smoke", schemes=SMOKE_SCHEMES, workers=1)
    (root / "extrapolation" / "results.json").write_text(json.dumps(results))
    return root


def test_extrapolation_smoke(lab: Path):
    results = json.loads((lab / "extrapolation" / "results.json").read_text())
    L = results["train_length"]
    assert results["lengths"] == [L, 2 * L, 4 * L, 8 * L, 16 * L]
    assert results["seeds"] == list(extrapolation.SEEDS) and len(results["seeds"]) >= 3
    table, by_seed = results["perplexity"], results["perplexity_by_seed"]
    assert set(table) == set(SMOKE_SCHEMES)
    for scheme in SMOKE_SCHEMES:
        assert set(results["run_dirs"][scheme]) == {str(s) for s in extrapolation.SEEDS}
        for seed, run_dir in results["run_dirs"][scheme].items():
            config = json.loads((Path(run_dir) / "config.json").read_text())
            assert config["train"]["seed"] == int(seed) and config["model"]["position"] == scheme
        for cell in table[scheme].values():
            for mode in ("nonoverlapping", "sliding"):
                seeds = [by_seed[scheme][str(s)][str(cell["length"] // L)][mode]["ppl"] for s in extrapolation.SEEDS]
                assert cell[mode]["ppl_seeds"] == seeds and cell[mode]["ppl"] == pytest.approx(sum(seeds) / len(seeds))
                assert all(math.isfinite(v) and v > 1 for v in seeds)
    # the learned table has rows past L (never trained), so it is read there rather than refused
    learned = json.loads((Path(results["run_dirs"]["learned"]["1337"]) / "config.json").read_text())
    assert learned["model"]["position_config"]["max_len"] == 16 * L
    assert (lab / "extrapolation" / "extrapolation.png").stat().st_size > 1000
    # 8 smoke steps learn nothing beyond character frequencies: every claim is inconclusive, saying why
    baseline = results["unigram_entropy_nats"]
    assert all(math.log(table[s]["1"]["nonoverlapping"]["ppl"]) >= baseline for s in SMOKE_SCHEMES)
    assert {c["verdict"] for c in results["claims"]} == {INCONCLUSIVE}
    claims = {c["claim"]: c for c in results["claims"]}
    assert "unigram baseline" in claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["measured"]
    assert all("sliding_window" in c["details"] for c in results["claims"])
    # without the baseline guard the same tables give per-seed ratios
    claims = {c["claim"]: c for c in extrapolation.extrapolation_claims(by_seed)}
    flat = claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]
    ratios = [
        by_seed["alibi"][str(s)]["4"]["nonoverlapping"]["ppl"] / by_seed["alibi"][str(s)]["1"]["nonoverlapping"]["ppl"]
        for s in extrapolation.SEEDS
    ]
    assert flat["details"]["values"] == pytest.approx(ratios)
    assert flat["margin"] == pytest.approx(1.10 - sum(ratios) / len(ratios))
    assert check_records(list(claims.values())) == [] and check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert all(c["verdict"] in VERDICTS for c in results["claims"])
    # schemes not trained in the smoke run: their claims are inconclusive, not guessed
    xl = claims["Transformer-XL's relative encoding solves long-sequence generalization"]
    assert xl["verdict"] == INCONCLUSIVE and xl["margin"] is None and "not measured" in xl["measured"]


def test_models_are_reused_not_retrained(lab: Path):
    size = extrapolation.size_of(False, "smoke")
    run_dir = lab / "extrapolation" / "models" / "smoke" / "rope"
    before = (run_dir / "results.json").stat().st_mtime_ns
    assert extrapolation.shared_model("rope", size, lab / "extrapolation") == run_dir
    assert extrapolation.shared_model("rope", size, lab / "context-extension") == run_dir  # the sibling's model
    assert (run_dir / "results.json").stat().st_mtime_ns == before


def test_context_extension_smoke(lab: Path):
    seed = extrapolation.SEED
    results = context_extension.run(lab / "context-extension", size="smoke", seeds=(seed,), workers=1)
    L = results["train_length"]
    assert results["eval_length"] == 4 * L
    assert results["seeds"] == [seed]
    assert results["base_runs"] == [str(lab / "extrapolation" / "models" / "smoke" / "rope")]  # the sibling's model
    assert list(results["inference"]) == ["none", "PI", "NTK", "dynamic NTK", "YaRN", "Llama3"]
    ppl = {k: v["nonoverlapping"]["ppl"] for k, v in results["inference"].items()}
    assert len(set(ppl.values())) > 1  # the scalings change the model's output
    for label, spec in context_extension.FINETUNE.items():
        (run_dir,) = [Path(p) for p in results["finetune_runs"][label]]
        config = json.loads((run_dir / "config.json").read_text())
        assert config["model"]["block_size"] == 4 * L
        assert config["train"]["init_from"] == results["base_run"]
        assert config["train"]["seed"] == seed
        assert config["model"]["position_config"].get("scaling") == (None if spec == "none" else spec.split(":")[0])
        assert set(results["finetuned"][label]) == {"rope_scaling", "4L", "L"}
    passkey = results["passkey"]
    assert passkey["factors"] == [1, 2, 4, 8]
    assert passkey["inference"]["PI"]["1"] == [None]  # smoke L=16: the needle and the question do not fit in 16 tokens
    for f in ("2", "4", "8"):
        (value,) = passkey["inference"]["PI"][f]
        assert 0.0 <= value <= 1.0
    claims = results["claims"]
    assert verdicts.check_records(claims) == []
    assert missing_premises(claims) == []  # every training claim carries its premise
    assert all(c["verdict"] == "inconclusive" for c in claims)  # one seed decides nothing
    pi = next(c for c in claims if c["claim"] == "without fine-tuning, PI reads 4x L better than no scaling")
    assert pi["details"]["better"] == [pytest.approx(ppl["PI"])] and pi["n_seeds"] == 1
    assert (lab / "context-extension" / "context_extension.png").is_file()
    # checkpoint averaging of the YaRN fine-tune: its last 3 checkpoints, base ⊕ fine-tuned, against plain and base
    averaging = results["averaging"]
    assert list(averaging["variants"]) == list(context_extension.AVERAGING) and averaging["last"] == 3
    assert averaging["steps"] == [[2, 3, 4]]  # smoke: 4 fine-tuning steps, a checkpoint every step, the last 3 kept
    (tuned,) = [Path(p) for p in results["finetune_runs"][context_extension.AVERAGED]]
    train_cfg = json.loads((tuned / "config.json").read_text())["train"]
    assert train_cfg["keep_checkpoints"] == 3 and train_cfg["ckpt_interval"] == 1
    (plain,) = [Path(p) for p in results["finetune_runs"]["PI"]]
    assert json.loads((plain / "config.json").read_text())["train"]["keep_checkpoints"] == 1  # the others unchanged
    for variant in averaging["variants"].values():
        for key in ("L", "4L"):
            (value,) = variant[key]["nonoverlapping"]["ppl_per_seed"]
            assert math.isfinite(value) and value > 1
        assert set(variant["passkey"]) == {"1", "2", "4", "8"}
    fine = averaging["variants"]["fine-tuned"]
    assert fine["4L"]["nonoverlapping"]["ppl"] == pytest.approx(
        results["finetuned"]["YaRN"]["4L"]["nonoverlapping"]["ppl"]
    )
    distance = {k: v["weight_distance_to_fine_tuned"][0] for k, v in averaging["variants"].items()}
    assert (
        distance["fine-tuned"] == 0.0
        and 0 < distance["last-k average"] < distance["base ⊕ fine-tuned"] < distance["base"]
    )
    assert distance["base ⊕ fine-tuned"] == pytest.approx(distance["base"] / 2, rel=1e-6)  # halfway, by construction
    # the averaged weights differ from both endpoints of the averaged checkpoints
    from poslab.runs import RunFolder, load_run

    run = RunFolder(tuned)
    mean, _ = run.averaged_model(3)
    first, last = load_run(run, step=2)[0].state_dict(), load_run(run, step=4)[0].state_dict()
    moved = [k for k in last if not torch.equal(first[k], last[k])]
    assert moved and all(
        not torch.equal(mean.state_dict()[k], last[k]) and not torch.equal(mean.state_dict()[k], first[k])
        for k in moved
    )
    ppl = {k: v["L"]["nonoverlapping"]["ppl"] for k, v in averaging["variants"].items()}
    assert len(set(ppl.values())) == 4  # four different models
    mine = [
        c
        for c in claims
        if c["source"].startswith(
            (context_extension.SOURCE_AVERAGING, "seed 000 Q4 (the recipe", context_extension.SOURCE_WISE)
        )
    ]
    assert len(mine) == 6 and all(c["n_seeds"] <= 1 and c["verdict"] == "inconclusive" for c in mine)
    assert "Llama 3" in averaging["note"] and "annealing" in averaging["note"]
    assert (lab / "context-extension" / "checkpoint_averaging.png").stat().st_size > 1000


def test_context_extension_seeds_come_from_extrapolation(tmp_path: Path):
    out = tmp_path / "context-extension"
    assert context_extension.seeds_of(out) == [extrapolation.SEED, extrapolation.SEED + 1, extrapolation.SEED + 2]
    (tmp_path / "extrapolation").mkdir()
    (tmp_path / "extrapolation" / "results.json").write_text(json.dumps({"seeds": [7, 8, 9, 10]}))
    assert context_extension.seeds_of(out) == [7, 8, 9, 10]
    (tmp_path / "extrapolation" / "results.json").write_text(json.dumps({"seed": 5}))
    assert context_extension.seeds_of(out) == [5, extrapolation.SEED, extrapolation.SEED + 1]  # topped up to 3


def test_passkey_prompts_hide_the_key_and_ask_for_it():
    tokenizer = CharTokenizer(sorted(set("abcdefghijky ABCDEFGHIJKLMNOPQRSTUVWXYZ.")))
    tokens = torch.tensor(tokenizer.encode("abc defg hij " * 40), dtype=torch.long)
    idx, targets, keys = context_extension.passkey_prompts(tokens, tokenizer, 48, 6, seed=0)
    assert idx.shape == targets.shape == (6, 48)
    k = context_extension.KEY_LETTERS
    assert ((targets >= 0).sum(1) == k).all() and (targets[:, :-k] == -1).all()
    for row, target, key in zip(idx, targets, keys):
        text = tokenizer.decode(row.tolist()) + tokenizer.decode(target[-1:].tolist())
        assert text.endswith(f" key {key}") and f" key {key}." in text  # the needle, then the question
        assert tokenizer.decode(target[-k:].tolist()) == key
    assert context_extension.passkey_prompts(tokens, tokenizer, 12, 2, seed=0) is None  # too short for the needle


def test_context_verdicts_follow_the_numbers():
    def seeds(x: float) -> list[float]:
        return [x - 0.1, x, x + 0.1]

    inference = {
        "none": seeds(50.0),
        "PI": seeds(20.0),
        "NTK": seeds(12.0),
        "dynamic NTK": seeds(60.0),
        "YaRN": seeds(11.0),
        "Llama3": seeds(15.0),
    }
    finetuned = {"none": seeds(14.0), "PI": seeds(10.9), "YaRN": seeds(10.5)}
    claims = context_extension.context_claims(inference, finetuned, base_L=seeds(10.0), steps=100)
    assert verdicts.check_records(claims) == []
    held = {c.claim: c.verdict for c in claims}
    assert held["without fine-tuning, PI reads 4x L better than no scaling"] == "held"
    assert held["without fine-tuning, dynamic NTK reads 4x L better than no scaling"] == "did not hold"
    assert (
        held['without fine-tuning, NTK reads 4x L better than PI ("YaRN or NTK-aware first, much better than PI")']
        == "held"
    )
    assert held["YaRN is the best inference-time scaling"] == "held"
    assert held["after 100 fine-tuning steps at 4x L, PI is close to the base model's in-length perplexity"] == "held"
    assert held["after fine-tuning, YaRN <= PI"] == "held"
    assert held["plain fine-tuning (no scaling) is the worst of the three"] == "held"
    assert held["continued training is the most reliable (beats every inference-only scaling)"] == "held"
    finetuned["PI"] = seeds(12.0)
    inference["YaRN"] = [11.0, 13.0, 12.0]  # overlaps NTK's seeds: no verdict either way
    held = {
        c.claim: c.verdict
        for c in context_extension.context_claims(inference, finetuned, base_L=seeds(10.0), steps=100)
    }
    assert (
        held["after 100 fine-tuning steps at 4x L, PI is close to the base model's in-length perplexity"]
        == "did not hold"
    )
    assert held["YaRN is the best inference-time scaling"] == "inconclusive"
    two = {k: v[:2] for k, v in inference.items()}
    claims = context_extension.context_claims(two, {k: v[:2] for k, v in finetuned.items()}, base_L=seeds(10.0)[:2])
    assert all(c.verdict == "inconclusive" for c in claims)  # two seeds are never conclusive


def test_passkey_claims_need_retrieval_in_length():
    chance = 1 / len(context_extension.KEY_ALPHABET)
    row = {str(f): [chance] * 3 for f in context_extension.PASSKEY_FACTORS}
    strong = {str(f): [0.9, 0.92, 0.88] for f in context_extension.PASSKEY_FACTORS}
    weak = {str(f): [0.1, 0.12, 0.11] for f in context_extension.PASSKEY_FACTORS}
    passkey = {
        "base": row,
        "inference": {"PI": weak, "none": weak, "YaRN": weak},
        "finetuned": {"PI": strong, "YaRN": strong},
    }
    claims = context_extension.passkey_claims(passkey)
    assert claims[0].verdict == "inconclusive"  # the base models sit at chance
    assert all(c.verdict == "inconclusive" for c in claims)
    passkey["base"] = strong
    verdict = {c.claim: c.verdict for c in context_extension.passkey_claims(passkey)}
    assert verdict["fine-tuning at 4x L makes PI retrieve the passkey at 4x L better than PI without it"] == "held"
    assert (
        verdict["without fine-tuning, PI retrieves the passkey at 4x L better than no scaling"] == "inconclusive"
    )  # a tie


def test_attention_entropy_smoke(lab: Path):
    results = attention_entropy.run(
        lab / "attention-entropy", size="smoke", schemes=("learned", "rope", "alibi"), workers=1
    )
    models = results["models"]
    assert list(models) == [
        "learned",
        "rope",
        "rope + YaRN x4",
        "rope + YaRN x4 no temperature",
        "rope + log-n",
        "alibi",
    ]
    L = results["train_length"]
    for label in ("rope", "alibi", "rope + log-n"):
        assert set(models[label]["by_seed"]) == {str(s) for s in extrapolation.SEEDS}
        for entry in models[label]["by_seed"].values():
            cells = entry["entropy"]
            assert list(cells) == ["1", "2", "4", "8", "16"]
            assert cells["16"]["length"] == 16 * L
            assert (
                len(cells["16"]["per_layer_head"]) == 1 and len(cells["16"]["per_layer_head"][0]) == 2
            )  # 1 layer, 2 heads
            assert cells["4"]["rise"] == pytest.approx(cells["4"]["past_window"] - cells["4"]["in_window"])
        rises = [e["entropy"]["4"]["rise"] for e in models[label]["by_seed"].values()]
        assert models[label]["entropy"]["4"]["rise"] == pytest.approx(sum(rises) / len(rises))
    seeds = [str(s) for s in extrapolation.SEEDS]
    yarn = [models["rope + YaRN x4"]["by_seed"][s]["entropy"]["4"]["rise"] for s in seeds]
    no_temperature = [models["rope + YaRN x4 no temperature"]["by_seed"][s]["entropy"]["4"]["rise"] for s in seeds]
    by_claim = {c["claim"][:30]: c for c in results["claims"]}
    record = by_claim["YaRN's temperature reduces the"]
    assert record["details"]["values"] == pytest.approx([n - y for n, y in zip(no_temperature, yarn)])
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert (lab / "attention-entropy" / "attention_entropy.png").is_file()


# ------------------------------------------------------------------------------------ pieces
def _tiny(position: str, **config) -> GPT:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=13, n_layer=2, n_head=2, n_embd=16, block_size=16, position=position, position_config=config
        )
    )
    with torch.no_grad():  # sharpen the attention so the entropies differ from uniform
        for block in model.blocks:
            block.attn.qkv.weight.mul_(20)
    return model.eval()


@pytest.mark.parametrize("position", ["rope", "alibi", "xl", "t5", "none"])
def test_blockwise_entropy_equals_full_attention_weights(position):
    model, idx = _tiny(position), torch.randint(0, 13, (2, 23))
    blockwise = attention_entropy.attention_entropy(model, idx, query_block=5)  # [n_layer, h, T]
    full = torch.stack(
        [torch.special.entr(w).sum(-1).mean(0) for w in attention_weights(model, idx)]
    )  # [n_layer, h, T]
    torch.testing.assert_close(blockwise, full, rtol=1e-5, atol=1e-5)
    assert blockwise[..., 0].abs().max() < 1e-6  # the first query has one key: entropy 0


def test_uniform_attention_has_entropy_ln_n():
    model = _tiny("none")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.zero_()  # q = k = 0: every row is uniform over its causal past
    entropy = attention_entropy.attention_entropy(model, torch.randint(0, 13, (1, 20)), query_block=7)
    expected = torch.log(torch.arange(1, 21, dtype=torch.float32)).expand_as(entropy)
    torch.testing.assert_close(entropy, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention_entropy.normalised(entropy), torch.ones(2, 2, 19))


def test_summary_figures():
    entropy = torch.arange(32, dtype=torch.float32).repeat(2, 2, 1)  # [n_layer=2, h=2, T=32], value = position
    s = attention_entropy.summarise(entropy, train_length=8, bin_width=4)
    assert s["in_window"] == pytest.approx((4 + 5 + 6 + 7) / 4)
    assert s["past_window"] == pytest.approx(sum(range(8, 32)) / 24)
    assert s["by_position"][:2] == [1.5, 5.5] and s["bin_starts"][:2] == [0, 4]


def test_spearman():
    assert attention_entropy.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert attention_entropy.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert attention_entropy.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)


def _tables(ratios: dict[str, tuple[float, ...]], jitter: float = 0.002) -> dict:
    """Fake per-seed perplexity tables: scheme -> seed -> factor -> cell, ppl 10 x ratio x (1 + jitter x k) for seed
    k."""
    tables = {}
    for scheme, values in ratios.items():
        tables[scheme] = {
            str(k): {
                str(f): {"length": f, "nonoverlapping": {"ppl": 10 * v * (1 + jitter * k) * (1 + jitter * k * (f > 1))}}
                for f, v in zip(extrapolation.FACTORS, values)
            }
            for k in range(3)
        }
    return tables


def test_extrapolation_verdicts_follow_the_numbers():
    literature = _tables(
        {
            "alibi": (1, 1, 1.05, 1.06, 1.07),
            "rope": (1, 1.3, 2.0, 3.0, 12.0),
            "learned": (1, 3, 6, 9, 12),
            "sinusoidal": (1, 2, 4, 8, 16),
            "t5": (1, 1, 1.02, 1.03, 1.04),
            "xl": (1, 1.5, 3, 5, 9),
        }
    )
    verdict = {c["claim"]: c["verdict"] for c in extrapolation.extrapolation_claims(literature)}
    assert verdict["ALiBi's perplexity at 4x L stays within 1.10x its value at L"] == HELD
    assert verdict["sinusoidal degrades past L: perplexity at 4x L at least 1.5x its value at L"] == HELD
    assert verdict["at 8x L: ALiBi < RoPE"] == HELD and verdict["at 8x L: RoPE < sinusoidal"] == HELD
    assert (
        verdict["a learned absolute table collapses past the training length (its rows past L were never trained)"]
        == HELD
    )
    assert verdict["RoPE reads past the training length better than a learned table"] == HELD
    assert verdict["RoPE extrapolates better than the relative-bias schemes T5 and ALiBi"] == DID_NOT_HOLD
    assert verdict["RoPE's perplexity 'jumps from 10 to 100+' past the training length"] == HELD
    assert verdict["Transformer-XL's relative encoding solves long-sequence generalization"] == DID_NOT_HOLD
    opposite = _tables(
        {
            "alibi": (1, 1.5, 2.0, 3.0, 4.0),
            "rope": (1, 1, 1.1, 1.2, 1.3),
            "sinusoidal": (1, 1, 1, 1, 1),
            "learned": (1, 1, 1, 1, 1),
            "t5": (1, 2, 3, 4, 5),
            "xl": (1, 1, 1, 1, 1),
        }
    )
    records = extrapolation.extrapolation_claims(opposite)
    verdict = {c["claim"]: c["verdict"] for c in records}
    assert verdict["ALiBi's perplexity at 4x L stays within 1.10x its value at L"] == DID_NOT_HOLD
    assert verdict["at 8x L: ALiBi < RoPE"] == DID_NOT_HOLD
    assert verdict["RoPE extrapolates better than the relative-bias schemes T5 and ALiBi"] == HELD
    assert verdict["Transformer-XL's relative encoding solves long-sequence generalization"] == HELD
    assert check_records(records) == []


def test_seed_noise_makes_a_close_comparison_inconclusive():
    close = _tables({"alibi": (1, 1, 1, 1.0, 1), "rope": (1, 1, 1, 1.001, 1)})
    for k, wobble in enumerate((1.05, 0.95, 1.0)):  # seed-to-seed noise that differs between the two schemes
        close["rope"][str(k)]["8"]["nonoverlapping"]["ppl"] *= wobble
    record = {c["claim"]: c for c in extrapolation.extrapolation_claims(close)}["at 8x L: ALiBi < RoPE"]
    assert record["verdict"] == INCONCLUSIVE and abs(record["margin"]) <= record["noise"]


def test_init_from_copies_the_weights(lab: Path, tmp_path: Path):
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training.config import TrainConfig

    size = extrapolation.size_of(False, "smoke")
    base_dir = lab / "extrapolation" / "models" / "smoke" / "rope"
    cfg = extrapolation.train_config(
        "rope",
        size,
        tmp_path,
        name="ft",
        block_size=4 * size.train_length,
        position_config={"scaling": "linear", "factor": 4.0, "original_max_len": size.train_length},
        steps=1,
        lr=1e-12,
        warmup_steps=0,
        init_from=str(base_dir),
    )
    train(cfg, progress=False)
    base, _, _ = load_run(base_dir)
    tuned, _, config = load_run(tmp_path / "ft")
    assert config["train"]["init_from"] == str(base_dir)
    for (name, a), (_, b) in zip(base.named_parameters(), tuned.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    bad = TrainConfig.from_dict({**cfg.to_dict(), "name": "ft2", "init_from": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError):
        train(bad, progress=False)


def test_a_model_that_did_not_train_makes_its_claims_inconclusive():
    tables = _tables(
        {
            "alibi": (1, 1, 1.05, 1.06, 1.07),
            "rope": (1, 1.3, 2.0, 3.0, 12.0),
            "sinusoidal": (3, 3, 3, 3, 3),
            "t5": (1, 1, 1.02, 1.03, 1.04),
            "xl": (1, 1.5, 3, 5, 9),
        }
    )
    assert set(extrapolation.undertrained_seeded(tables)) == {"sinusoidal"}  # ppl 30 at L vs a median of 10
    claims = {c["claim"]: c for c in extrapolation.extrapolation_claims(tables)}
    sinusoidal = claims["sinusoidal degrades past L: perplexity at 4x L at least 1.5x its value at L"]
    assert sinusoidal["verdict"] == INCONCLUSIVE and "did not train" in sinusoidal["measured"]
    assert claims["at 8x L: RoPE < sinusoidal"]["verdict"] == INCONCLUSIVE
    assert claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["verdict"] == HELD
    # a model not below the corpus's unigram baseline learned nothing either: ln(10 * 1.0) = 2.30 > 2.0
    claims = {c["claim"]: c for c in extrapolation.extrapolation_claims(tables, baseline=2.0)}
    assert claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["verdict"] == INCONCLUSIVE
    assert "unigram baseline" in claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["measured"]


# ------------------------------------------------------------------------------------ the real quick forms
#: the claims the quick lab must decide (either way) at 3 seeds
MUST_RESOLVE = (
    "RoPE reads past the training length better than a learned table",
    "ALiBi's perplexity at 4x L stays within 1.10x its value at L",
)


@pytest.mark.slow
def test_quick_extrapolation_resolves_its_claims(tmp_path: Path):
    """The real quick form (3 seeds per scheme): every verdict obeys the rule, and the issue's claims are decided."""
    results = extrapolation.run(tmp_path / "extrapolation", quick=True)
    assert results["seeds"] == list(extrapolation.SEEDS)
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    by_claim = {c["claim"]: c for c in results["claims"]}
    for text in MUST_RESOLVE:
        assert by_claim[text]["verdict"] != INCONCLUSIVE, by_claim[text]
    # every scheme learned structure: in-length loss well below the character-frequency baseline
    for scheme, cells in results["perplexity"].items():
        assert math.log(cells["1"]["nonoverlapping"]["ppl"]) < results["unigram_entropy_nats"] - 0.5, scheme


def test_averaging_verdicts_follow_the_numbers():
    def seeds(x: float) -> list[float]:
        return [x - 0.1, x, x + 0.1]

    def claims(ppl_L: dict, ppl_4L: dict, passkey: dict) -> dict[str, str]:
        records = context_extension.averaging_claims(ppl_L, ppl_4L, passkey, last=3)
        assert verdicts.check_records(records) == []
        return {c.claim.rsplit(" (", 1)[0]: c.verdict for c in records}

    ppl_L = {
        "base": seeds(10.0),
        "fine-tuned": seeds(10.5),
        "last-k average": [10.3, 10.4, 10.5],
        "base ⊕ fine-tuned": [10.1, 10.2, 10.3],
    }
    ppl_4L = {
        "base": seeds(14.0),
        "fine-tuned": seeds(10.5),
        "last-k average": [10.43, 10.53, 10.63],
        "base ⊕ fine-tuned": seeds(11.0),
    }
    passkey = {
        "base": [0.1] * 3,
        "fine-tuned": [0.8, 0.85, 0.9],
        "last-k average": [0.79, 0.84, 0.89],
        "base ⊕ fine-tuned": [0.5] * 3,
    }
    held = claims(ppl_L, ppl_4L, passkey)
    assert held["the plain YaRN fine-tune forgets"] == HELD
    assert held["averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting"] == HELD
    assert held["averaging the last 3 checkpoints does not hurt perplexity at 4x L"] == HELD  # +0.3% < 1%
    assert held["base ⊕ fine-tuned (0.5/0.5) reduces forgetting"] == HELD
    assert held["base ⊕ fine-tuned keeps the extension"] == HELD
    assert held["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"] == HELD  # 0.01 below, within 0.05
    ppl_4L["last-k average"] = [10.8, 10.9, 11.0]  # +3.8%: hurts
    ppl_L["base ⊕ fine-tuned"] = [10.7, 10.8, 10.9]  # more forgetting
    passkey["last-k average"] = [0.6, 0.65, 0.7]
    held = claims(ppl_L, ppl_4L, passkey)
    assert held["averaging the last 3 checkpoints does not hurt perplexity at 4x L"] == DID_NOT_HOLD
    assert held["base ⊕ fine-tuned (0.5/0.5) reduces forgetting"] == DID_NOT_HOLD
    assert held["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"] == DID_NOT_HOLD
    passkey["fine-tuned"] = [0.03, 0.04, 0.05]  # the fine-tune itself does not retrieve: not judged
    passkey["last-k average"] = [0.0, 0.0, 0.0]
    assert (
        claims(ppl_L, ppl_4L, passkey)["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"]
        == INCONCLUSIVE
    )
    passkey["fine-tuned"] = [None] * 3
    assert (
        claims(ppl_L, ppl_4L, passkey)["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"]
        == INCONCLUSIVE
    )
    ppl_L["last-k average"] = list(ppl_L["fine-tuned"])  # a tie
    assert (
        claims(ppl_L, ppl_4L, passkey)["averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting"]
        == INCONCLUSIVE
    )
    ppl_L["fine-tuned"] = seeds(9.0)  # the fine-tune improves at L: no forgetting to reduce
    assert claims(ppl_L, ppl_4L, passkey)["the plain YaRN fine-tune forgets"] == DID_NOT_HOLD


def test_context_extension_reuses_the_rope_models_of_position_training(lab: Path, tmp_path: Path):
    import shutil

    from poslab.lab.experiments.training import ensure_many

    size = extrapolation.size_of(False, "smoke")
    other = tmp_path / "lab"  # a lab where position-training trained the models and extrapolation kept none
    shutil.copytree(
        lab / "extrapolation" / "models" / "smoke" / "rope", other / "position-training" / "runs" / "rope-s1337"
    )
    out = other / "context-extension"
    cfg = context_extension.base_config(size, out, extrapolation.SEED)
    assert (other / "position-training" / "runs" / "rope-s1337") in context_extension.base_reuse(size, out)
    assert ensure_many([(cfg, context_extension.base_reuse(size, out))], workers=1) == [
        other / "position-training" / "runs" / "rope-s1337"
    ]
    assert not (out / "models").exists()  # nothing trained
