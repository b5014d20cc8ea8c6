"""The context-extension experiment (smoke size) and its claims: the tests the design fixes, premises per seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from poslab.data import CharTokenizer
from poslab.lab import plan, scale, verdicts
from poslab.lab.experiments import context_extension, context_extension_tables, extrapolation
from poslab.lab.experiments import context_extension_claims as cc
from poslab.lab.experiments import context_extension_verdicts as cv
from poslab.lab.experiments.context_extension_result import Passkeys
from poslab.lab.experiments.declaration import load, to_json
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, INCONCLUSIVE, check_records, missing_premises
from poslab.lab.verdicts import Test as Kind

SEEDS = [1337, 1338, 1339]


def seeds(x: float, spread: float = 0.1) -> list[float]:
    return [x - spread, x, x + spread]


# ------------------------------------------------------------------------------------ smoke run
@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab folder where the smoke extrapolation trained its RoPE models into the lab model store ``models``
    (reused by context extension)."""
    root = tmp_path_factory.mktemp("lab")
    results = extrapolation.run(
        root / "extrapolation", size="smoke", schemes=("rope",), workers=1, models=root / "models"
    )
    (root / "extrapolation" / "results.json").write_text(json.dumps(results))
    return root


def test_context_extension_smoke(lab: Path):
    two = tuple(extrapolation.SEEDS[:2])
    results = context_extension.run(
        lab / "context-extension", size="smoke", seeds=two, workers=1, models=lab / "models"
    )
    L = results["train_length"]
    assert results["eval_length"] == 4 * L and results["seeds"] == list(two)
    assert results["base_run"] == str(lab / "models" / "smoke" / "rope")  # the store's model, trained by extrapolation
    assert not (lab / "context-extension" / "models").exists()  # its own runs only: fine-tunes and controls
    assert list(results["inference"]) == ["none", "PI", "NTK", "dynamic NTK", "YaRN", "Llama3"]
    ppl = {k: v["nonoverlapping"]["ppl"] for k, v in results["inference"].items()}
    assert len(set(ppl.values())) > 1  # the scalings change the model's output
    for label, spec in context_extension.FINETUNE.items():
        for seed, run_dir in zip(two, results["finetune_runs"][label]):
            config = json.loads((Path(run_dir) / "config.json").read_text())
            assert config["model"]["block_size"] == 4 * L and config["train"]["seed"] == seed
            assert config["model"]["position_config"].get("scaling") == (None if spec == "none" else spec.split(":")[0])
        assert set(results["finetuned"][label]) == {"rope_scaling", "4L", "L"}
    for seed, base, run_dir in zip(two, results["base_runs"], results["finetune_runs"]["control"]):
        train = json.loads((Path(run_dir) / "config.json").read_text())["train"]
        assert train["init_from"] == base and train["seed"] == seed  # the control: the seed's base, its seed
    # the inference-only arm at the fine-tune's budget: the control read at 4 L with each scaling
    budget = results["equal_budget"]["budget"]
    assert budget["finetune_tokens"] == budget["control_tokens"] == 4 * L  # smoke batch 4: 1 window of 4 L
    control = results["equal_budget"]["control_inference"]
    assert list(control) == list(cc.SCALINGS)
    assert control["PI"]["nonoverlapping"]["ppl_seeds"] != results["inference"]["PI"]["nonoverlapping"]["ppl_seeds"]
    passkey = results["passkey"]
    assert passkey["factors"] == [1, 2, 4, 8] and passkey["inference"]["PI"]["1"] == [None, None]  # 16 is too short
    claims = results["claims"]
    assert check_records(claims) == []  # designs recorded, no Welch over shared seeds
    assert missing_premises(claims) == []
    assert all(c["verdict"] == INCONCLUSIVE for c in claims)  # two seeds decide nothing
    records = [verdicts.ClaimRecord.from_dict(c) for c in claims]
    scalings = [r for r in records if r.claim.startswith("without fine-tuning,") and "passkey" not in r.claim]
    assert len(scalings) == 6 and all(r.design.test == Kind.PAIRED and r.design.log for r in scalings)
    assert all(r.details["seeds"] == list(two) for r in scalings)
    assert all(r.design.test != Kind.WELCH for r in records if r.n_seeds)  # every arm here shares its seeds
    rankings = [r for r in records if r.design is not None and r.design.test == Kind.RANKING]
    assert rankings and all(r.details["pairwise"] == Kind.PAIRED.value for r in rankings)
    pi = next(r for r in records if r.claim == "without fine-tuning, PI reads 4x L better than no scaling")
    assert pi.details["better"] == pytest.approx(results["inference"]["PI"]["nonoverlapping"]["ppl_seeds"])
    # checkpoint averaging of the YaRN fine-tune: its last 3 checkpoints, base ⊕ fine-tuned, against plain and base
    averaging = results["averaging"]
    assert list(averaging["variants"]) == list(context_extension.AVERAGING) and averaging["last"] == 3
    assert averaging["steps"] == [[2, 3, 4]] * 2  # smoke: 4 fine-tuning steps, a checkpoint every step
    distance = {k: v["weight_distance_to_fine_tuned"][0] for k, v in averaging["variants"].items()}
    assert distance["fine-tuned"] == 0.0 and 0 < distance["last-k average"] < distance["base ⊕ fine-tuned"]
    assert distance["base ⊕ fine-tuned"] == pytest.approx(distance["base"] / 2, rel=1e-6)  # halfway, by construction
    assert "Llama 3" in averaging["note"] and "annealing" in averaging["note"]
    assert (lab / "context-extension" / "checkpoint_averaging.png").stat().st_size > 1000
    assert (lab / "context-extension" / "context_extension.png").is_file()
    # the key table, built from the typed result read back from results.json, shows the equal-budget arms below
    # the fine-tunes
    typed = load(context_extension.ContextResult, json.loads(json.dumps(results, default=float)))
    rows = context_extension_tables.finetuned_table(typed).rows
    assert [r[0] for r in rows[: len(context_extension.FINETUNE)]] == list(context_extension.FINETUNE)
    assert len(rows) == len(context_extension.FINETUNE) + len(cc.SCALINGS)
    assert rows[-1][2] == pytest.approx(control["Llama3"]["nonoverlapping"]["ppl"])
    keys = context_extension_tables.passkey_table(typed)  # each scaling and fine-tune, per passkey length
    assert len(keys.rows) == len(context_extension.INFERENCE) + len(context_extension.FINETUNE) + 1  # + control
    assert len(keys.headers) == 1 + len(context_extension.PASSKEY_FACTORS)
    longest = passkey["inference"]["none"][str(context_extension.PASSKEY_FACTORS[-1])]
    assert keys.rows[0][0] == "none (inference only)" and keys.rows[0][1] == "cannot"  # 1x L: too short
    assert keys.rows[0][-1].mean == pytest.approx(sum(longest) / len(longest))


def test_context_extension_trains_extrapolation_s_rope_seeds_by_the_plan_not_by_its_results_file(tmp_path: Path):
    def seeds(plan) -> list[int]:
        return sorted(plan.arms[context_extension.BASE])

    out = tmp_path / "context-extension"
    (tmp_path / "extrapolation").mkdir()
    (tmp_path / "extrapolation" / "results.json").write_text(json.dumps({"seeds": [7, 8, 9, 10]}))  # not read
    rope = extrapolation.plan(tmp_path / "extrapolation", False, "smoke").arms["rope"]
    assert seeds(context_extension.plan(out, False, "smoke")) == sorted(rope) == list(scale.SEEDS)
    quick = extrapolation.plan(tmp_path / "extrapolation", True).arms["rope"]
    ctx = seeds(context_extension.plan(out, True))
    assert ctx[: len(quick)] == sorted(quick) and len(ctx) == plan.QUICK_SEEDS["context-extension"]["rope"]
    assert seeds(context_extension.plan(out, False, "smoke", seeds=(7, 8))) == [7, 8]
    with pytest.raises(ValueError, match="at least one seed"):
        context_extension.plan(out, False, "smoke", seeds=())


def test_the_quick_experiments_ask_for_one_rope_model_per_seed_in_the_store(tmp_path: Path):
    """Position-training's quick form, extrapolation, attention entropy and context extension ask for the quick RoPE
    model of a seed by scheme, size and seed: one folder of the store, whichever experiment trains it."""
    from poslab.lab.experiments import attention_entropy, position_training

    store = tmp_path / "models"
    planned = [
        position_training.plan(tmp_path / "position-training", True),
        extrapolation.plan(tmp_path / "extrapolation", True),
        attention_entropy.plan(tmp_path / "attention-entropy", True),
        context_extension.plan(tmp_path / "context-extension", True),
    ]
    folders = [{seed: arm.config(store).run_dir for seed, arm in p.arms["rope"].items()} for p in planned]
    for seed in set.intersection(*(set(f) for f in folders)):
        assert {f[seed] for f in folders} == {store / "quick" / ("rope" if seed == scale.SEED else f"rope-s{seed}")}
    assert extrapolation.SEED in set.intersection(*(set(f) for f in folders))
    recipes = [{seed: arm.config(store).to_dict() for seed, arm in p.arms["rope"].items()} for p in planned]
    for seed in set.intersection(*(set(r) for r in recipes)):  # one folder holds one recipe: every plan asks the same
        assert all(r[seed] == recipes[0][seed] for r in recipes)


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


# ------------------------------------------------------------------------------------ the claims
def inference_arms() -> dict[str, list[float]]:
    return {
        "none": seeds(50.0),
        "PI": seeds(20.0),
        "NTK": seeds(12.0),
        "dynamic NTK": seeds(60.0),
        "YaRN": seeds(11.0),
        "Llama3": seeds(15.0),
    }


def test_context_verdicts_follow_the_numbers():
    inference = inference_arms()
    finetuned = {"none": seeds(14.0), "PI": seeds(10.2), "YaRN": seeds(10.1)}
    claims = cc.context_claims(inference, finetuned, base_L=seeds(10.0), seeds=SEEDS, steps=100)
    assert check_records(claims) == []
    held = {c.claim.split(" (within")[0]: c.verdict for c in claims}
    assert held["without fine-tuning, PI reads 4x L better than no scaling"] == HELD
    assert held["without fine-tuning, dynamic NTK reads 4x L better than no scaling"] == DID_NOT_HOLD
    assert (
        held['without fine-tuning, NTK reads 4x L better than PI ("YaRN or NTK-aware first, much better than PI")']
        == HELD
    )
    assert held["YaRN is the best inference-time scaling"] == HELD
    close = "after 100 fine-tuning steps at 4x L, PI is close to the base model's in-length perplexity"
    assert held[close] == HELD
    assert held["after fine-tuning, YaRN <= PI"] == HELD
    assert held["plain fine-tuning (no scaling) is the worst of the three"] == HELD
    finetuned["PI"] = seeds(12.0)  # 20% above the base model: outside 5%
    inference["YaRN"] = [11.0, 13.0, 12.0]  # overlaps NTK's seeds: no verdict either way
    held = {
        c.claim.split(" (within")[0]: c.verdict
        for c in cc.context_claims(inference, finetuned, base_L=seeds(10.0), seeds=SEEDS, steps=100)
    }
    assert held[close] == DID_NOT_HOLD
    assert held["YaRN is the best inference-time scaling"] == INCONCLUSIVE
    two = {k: v[:2] for k, v in inference.items()}
    claims = cc.context_claims(two, {k: v[:2] for k, v in finetuned.items()}, seeds(10.0)[:2], SEEDS[:2])
    assert all(c.verdict == INCONCLUSIVE for c in claims)  # two seeds are never conclusive


def test_scalings_are_paired_by_seed_on_ln_perplexity():
    # the three base models differ a lot (seed to seed), and each reads 4x L 10% better with PI than without:
    # the same models read twice, so the seed's own level cancels (Welch would see only the spread)
    level = [10.0, 20.0, 40.0]
    inference = {k: list(level) for k in context_extension.INFERENCE}
    inference["PI"] = [0.9 * x for x in level]
    finetuned = {k: list(level) for k in context_extension.FINETUNE}
    claims = {c.claim: c for c in cc.context_claims(inference, finetuned, level, SEEDS)}
    pi = claims["without fine-tuning, PI reads 4x L better than no scaling"]
    assert pi.design.test == Kind.PAIRED and pi.design.log and pi.details["seeds"] == SEEDS
    assert pi.verdict == HELD and pi.margin == pytest.approx(-math.log(0.9))
    welch = verdicts.compare(
        "welch",
        "",
        verdicts.Arm("PI", inference["PI"]),
        verdicts.Arm("none", inference["none"]),
        verdicts.Metric("ppl"),
    )
    assert welch.verdict == INCONCLUSIVE  # what the unpaired test made of the same numbers


def test_close_to_is_an_equivalence_within_the_pi_papers_margin():
    assert cc.CLOSE_TO == pytest.approx(math.log(1.05))
    # PI 1000 steps: 6.95 at 8k vs 7.20 at 2k (inside); the direct fine-tune the paper rejects, 7.69 (outside)
    assert abs(math.log(6.95 / 7.20)) < cc.CLOSE_TO < math.log(7.69 / 7.20)
    inference = inference_arms()
    base = [10.0, 10.2, 9.9]
    finetuned = {"none": seeds(14.0), "PI": [10.3, 10.45, 10.2], "YaRN": [9.8, 10.1, 9.6]}  # +3%; -2% noisy
    claims = [c for c in cc.context_claims(inference, finetuned, base, SEEDS, steps=100) if "is close to" in c.claim]
    pi, yarn = claims
    assert pi.design.test == Kind.EQUIVALENCE and pi.design.threshold == pytest.approx(cc.CLOSE_TO)
    assert "up to 1000 steps, this run 100" in pi.claim and pi.details["paper_steps"] == 1000
    assert pi.verdict == HELD  # a one-sided bound at 1.15 says held too, but for ratios of 1.14 as well
    finetuned["PI"] = [11.4, 11.6, 11.3]  # +14%: within a one-sided 1.15 bound, not close
    pi = next(c for c in cc.context_claims(inference, finetuned, base, SEEDS) if "PI is close" in c.claim)
    assert pi.verdict == DID_NOT_HOLD


def test_continued_training_is_plain_fine_tuning_against_every_scaling_at_an_equal_budget():
    budget = cc.Budget(100, 1024, 1024)
    control = {
        "PI": seeds(20.0),
        "NTK": seeds(9.0),
        "dynamic NTK": seeds(8.0),
        "YaRN": seeds(9.5),
        "Llama3": seeds(9.0),
    }
    better, reliable = cc.continued_training_claims(seeds(7.0), control, SEEDS, budget)
    assert better.verdict == HELD and better.details["pairwise"] == Kind.PAIRED.value
    assert set(better.details["arms"]) == {"continued training"} | {
        f"{k} at inference (the same steps at L)" for k in control
    }
    assert "100 steps x 1024 tokens = 102,400 tokens each arm" in better.measured
    assert better.details["sd_per_arm"]["continued training"] == pytest.approx(0.1 / 7.0, rel=0.01)
    # a scaling that beats the plain fine-tune decides it the other way, whichever fine-tune is best
    control["dynamic NTK"] = seeds(5.0)
    better, _ = cc.continued_training_claims(seeds(7.0), control, SEEDS, budget)
    assert better.verdict == DID_NOT_HOLD
    assert "unequal" in cc.Budget(100, 1024, 1000).text()
    # reliability is a variance comparison: not testable at 3 seeds, saying why
    assert reliable.verdict == INCONCLUSIVE and verdicts.not_testable(reliable)
    assert f"at least {cc.VARIANCE_SEEDS} seeds" in reliable.premise.text and reliable.margin is None
    assert check_records([better, reliable]) == []


def test_reliability_is_decided_with_enough_seeds():
    assert cc.VARIANCE_SEEDS == 20  # Fisher z: 3 + ((1.96 + 0.84) / atanh(0.6))^2 = 19.3
    n = cc.VARIANCE_SEEDS
    steady = [7.0 + 0.01 * ((i % 5) - 2) for i in range(n)]
    noisy = [9.0 + 1.0 * ((i % 5) - 2) for i in range(n)]
    control = dict.fromkeys(cc.SCALINGS, noisy)
    _, reliable = cc.continued_training_claims(steady, control, list(range(n)), cc.Budget(10, 64, 64))
    assert reliable.premise.met and reliable.verdict == HELD
    _, reliable = cc.continued_training_claims(
        noisy, dict.fromkeys(cc.SCALINGS, steady), list(range(n)), cc.Budget(10, 64, 64)
    )
    assert reliable.verdict == DID_NOT_HOLD


def test_passkey_claims_are_paired():
    chance = 1 / len(context_extension.KEY_ALPHABET)
    strong = {f: [0.9, 0.92, 0.88] for f in context_extension.PASSKEY_FACTORS}
    weak = {f: [0.1, 0.12, 0.11] for f in context_extension.PASSKEY_FACTORS}
    passkey = Passkeys(strong, {"PI": weak, "none": weak, "YaRN": weak}, {"PI": strong, "YaRN": strong})
    verdict = {c.claim: c for c in cv.passkey_claims(passkey, SEEDS)}
    fine = verdict["fine-tuning at 4x L makes PI retrieve the passkey at 4x L better than PI without it"]
    assert fine.verdict == HELD and fine.design.test == Kind.PAIRED and fine.details["seeds"] == SEEDS
    assert (
        verdict["without fine-tuning, PI retrieves the passkey at 4x L better than no scaling"].verdict == INCONCLUSIVE
    )
    assert cv.passkey_premise({f: [chance] * 3 for f in context_extension.PASSKEY_FACTORS}, SEEDS).met is False


def test_premises_are_per_seed():
    # the passkey: two base models retrieve, one does not; their mean (0.69) is above the halfway bound (0.52)
    passkey = {f: [0.95, 0.95, 0.18] for f in context_extension.PASSKEY_FACTORS}
    premise = cv.passkey_premise(passkey, SEEDS)
    assert not premise.met and "seed 1339" in premise.measured
    assert cv.passkey_premise({k: [0.95, 0.95, 0.9] for k in passkey}, SEEDS).met
    # the language models: one seed above the bigram baseline breaks it
    curve = [3.0] * 4 + [2.0] * 12
    assert cv.language_premise([2.0, 2.1, 2.2], [curve] * 3, bigram=2.48).met
    assert not cv.language_premise([2.0, 2.1, 2.47], [curve] * 3, bigram=2.48).met


def averaging_numbers() -> tuple[dict, dict, dict]:
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
    return ppl_L, ppl_4L, passkey


def averaging(ppl_L: dict, ppl_4L: dict, passkey: dict) -> dict[str, verdicts.ClaimRecord]:
    records = cv.averaging_claims(ppl_L, ppl_4L, passkey, last=3, seeds=SEEDS)
    assert check_records(records) == []
    return {c.claim.rsplit(" (", 1)[0]: c for c in records}


def test_averaging_verdicts_follow_the_numbers():
    ppl_L, ppl_4L, passkey = averaging_numbers()
    held = {k: c.verdict for k, c in averaging(ppl_L, ppl_4L, passkey).items()}
    assert held["the plain YaRN fine-tune forgets"] == HELD
    assert held["averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting"] == HELD
    assert held["averaging the last 3 checkpoints does not hurt perplexity at 4x L"] == HELD  # +0.3% < 1%
    assert held["base ⊕ fine-tuned (0.5/0.5) reduces forgetting"] == HELD
    assert held["base ⊕ fine-tuned keeps the extension"] == HELD
    assert held["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"] == HELD  # 0.01 below, within 0.05
    ppl_4L["last-k average"] = [10.8, 10.9, 11.0]  # +3.8%: hurts
    ppl_L["base ⊕ fine-tuned"] = [10.7, 10.8, 10.9]  # more forgetting
    passkey["last-k average"] = [0.6, 0.65, 0.7]
    held = {k: c.verdict for k, c in averaging(ppl_L, ppl_4L, passkey).items()}
    assert held["averaging the last 3 checkpoints does not hurt perplexity at 4x L"] == DID_NOT_HOLD
    assert held["base ⊕ fine-tuned (0.5/0.5) reduces forgetting"] == DID_NOT_HOLD
    assert held["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"] == DID_NOT_HOLD
    passkey["fine-tuned"] = [0.9, 0.9, 0.05]  # one seed's fine-tune does not retrieve: not testable
    passkey["last-k average"] = [0.0, 0.0, 0.0]
    record = averaging(ppl_L, ppl_4L, passkey)["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"]
    assert record.verdict == INCONCLUSIVE and verdicts.not_testable(record)
    passkey["fine-tuned"] = [None] * 3
    record = averaging(ppl_L, ppl_4L, passkey)["averaging the last 3 checkpoints keeps passkey retrieval at 4x L"]
    assert record.verdict == INCONCLUSIVE and record.n_seeds == 0


def test_averaging_claims_about_forgetting_need_forgetting():
    ppl_L, ppl_4L, passkey = averaging_numbers()
    ppl_L["fine-tuned"] = [10.0, 10.4, 10.1]  # no clear forgetting, yet both averages sit below the fine-tune
    ppl_L["last-k average"] = [9.7, 10.1, 9.8]
    ppl_L["base ⊕ fine-tuned"] = [9.8, 10.2, 9.9]
    claims = averaging(ppl_L, ppl_4L, passkey)
    assert claims["the plain YaRN fine-tune forgets"].verdict == INCONCLUSIVE
    for text in (
        "averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting",
        "base ⊕ fine-tuned (0.5/0.5) reduces forgetting",
    ):
        record = claims[text]
        assert record.verdict == INCONCLUSIVE and verdicts.not_testable(record)
        assert record.details["verdict_without_premise"] == HELD and "forgets" in record.premise.text
        assert "forgetting inconclusive" in record.premise.measured
    # the claims that do not presuppose forgetting are tested
    assert claims["base ⊕ fine-tuned keeps the extension"].verdict == HELD
    assert claims["averaging the last 3 checkpoints does not hurt perplexity at 4x L"].premise is None


def test_a_gate_joins_the_experiments_premise():
    ppl_L, ppl_4L, passkey = averaging_numbers()
    ppl_L["fine-tuned"] = [10.0, 10.4, 10.1]
    ppl_L["last-k average"] = [9.7, 10.1, 9.8]
    records = cv.averaging_claims(ppl_L, ppl_4L, passkey, last=3, seeds=SEEDS)
    met = verdicts.Premise("language models", "fine", True)
    attached = {c["claim"].rsplit(" (", 1)[0]: c for c in cv.attach_premises(records, lambda r: met)}
    gated = attached["averaging the last 3 checkpoints of the YaRN fine-tune reduces forgetting"]
    assert gated["verdict"] == INCONCLUSIVE and gated["details"]["verdict_without_premise"] == HELD
    assert "forgets" in gated["premise"]["text"] and "language models" in gated["premise"]["text"]
    unmet = verdicts.Premise("language models", "at bigram level", False)
    attached = {c["claim"].rsplit(" (", 1)[0]: c for c in cv.attach_premises(records, lambda r: unmet)}
    assert attached["base ⊕ fine-tuned keeps the extension"]["verdict"] == INCONCLUSIVE
    assert check_records(list(attached.values())) == []


RECORDED = Path(__file__).parent / "data" / "context_extension_results.json"


def test_a_recorded_results_json_reads_back_into_typed_readings_and_writes_the_same_file():
    """A smoke run's results.json as the lab wrote it (its claims left out): every reading typed, the same file back,
    the same claims as the per-seed readings' dicts gave."""
    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    result = load(context_extension.ContextResult, data)
    seed = result.per_seed[1]
    assert seed.finetuned["YaRN"].at_4L.ppl() == data["per_seed"][1]["finetuned"]["YaRN"]["4L"]["nonoverlapping"]["ppl"]
    assert (
        seed.averaging.variants()["base ⊕ fine-tuned"].passkey[4]
        == data["per_seed"][1]["averaging"]["base ⊕ fine-tuned"]["passkey"]["4"]
    )
    assert result.passkey.seeds.inference["PI"][1] == [None, None] and result.equal_budget.budget.steps == 4
    written = json.dumps(to_json(result))
    assert written == json.dumps(
        {k: v for k, v in data.items() if k not in ("experiment", "figure", "averaging_figure")}
    )


def test_a_reading_missing_a_field_fails_the_tables_naming_the_field():
    from poslab.lab.tables import TableFailure, build_tables

    tables = context_extension.EXPERIMENT.tables
    for where, key in ((("averaging", "variants", "last-k average"), "4L"), (("per_seed", 0, "passkey"), "base")):
        data = json.loads(RECORDED.read_text(encoding="utf-8"))
        inner = data
        for step in where:
            inner = inner[step]
        del inner[key]
        built = build_tables("experiments/context-extension", tables, data)
        assert built == [TableFailure("experiments/context-extension", t.name, field=key) for t in tables]


def test_the_averaging_block_comes_back_from_the_per_seed_readings_and_a_missing_distance_is_an_error():
    """The recorded per-seed readings give the recorded averaging block; the fine-tune's distance to itself is 0, and
    any other model's distance a seed lacks is a ``KeyError`` naming it, never a distance of 0."""
    from types import SimpleNamespace

    from poslab.lab.experiments.context_extension_measure import averaging_summary

    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    result = load(context_extension.ContextResult, data)
    lab = SimpleNamespace(finetune_steps=data["averaging"]["ckpt_interval"] * 10)
    summary = to_json(averaging_summary(result.per_seed, lab, data["averaging"]["last"]))
    assert json.dumps(summary) == json.dumps(data["averaging"])
    del data["per_seed"][1]["averaging"]["weight_distance_to_fine_tuned"]["last-k average"]
    with pytest.raises(KeyError, match="last-k average"):
        averaging_summary(load(context_extension.ContextResult, data).per_seed, lab, data["averaging"]["last"])
