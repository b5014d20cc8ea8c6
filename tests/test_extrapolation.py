"""The extrapolation and attention-entropy experiments (smoke size) and their pieces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.analysis.heads import attention_weights
from poslab.lab import plan, scale, verdicts
from poslab.lab.experiments import attention_entropy, attention_entropy_measure, extrapolation
from poslab.lab.experiments.cells import MODES, Evaluation, Score
from poslab.lab.experiments.declaration import load, to_json
from poslab.lab.experiments.extrapolation_verdicts import LEARNED_IN_LENGTH, TRAINED_AT_THIS_SIZE
from poslab.lab.records import ClaimRecord, not_testable
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, INCONCLUSIVE, check_records, missing_premises

# ------------------------------------------------------------------------------------ smoke runs
SMOKE_SCHEMES = ("learned", "sinusoidal", "rope", "alibi")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab folder where the smoke extrapolation ran, its models in the lab model store ``models`` (reused by the
    other two)."""
    root = tmp_path_factory.mktemp("lab")
    results = extrapolation.run(
        root / "extrapolation", size="smoke", schemes=SMOKE_SCHEMES, workers=1, models=root / "models"
    )
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
    # without the baseline guard the same tables give per-seed ratios, tested on the ln scale with their seeds
    claims = {c["claim"]: c for c in extrapolation.extrapolation_claims(load(extrapolation.Tables, by_seed))}
    flat = claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]
    ratios = [
        by_seed["alibi"][str(s)]["4"]["nonoverlapping"]["ppl"] / by_seed["alibi"][str(s)]["1"]["nonoverlapping"]["ppl"]
        for s in extrapolation.SEEDS
    ]
    assert flat["details"]["values"] == pytest.approx(ratios)
    assert flat["details"]["seeds"] == list(extrapolation.SEEDS)
    assert flat["design"]["test"] == plan.Test.ONE_SAMPLE.value and flat["design"]["log"] is True
    # the schemes share their seeds (the same batches): compared paired by seed, on ln perplexity
    alibi_rope = claims["at 8x L: ALiBi < RoPE"]
    assert alibi_rope["design"]["test"] == plan.Test.PAIRED.value and alibi_rope["design"]["log"] is True
    assert alibi_rope["details"]["seeds"] == list(extrapolation.SEEDS)
    assert check_records(list(claims.values())) == [] and check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    # schemes not trained in the smoke run: their claims are not testable at this size, not guessed
    xl = claims["Transformer-XL's relative encoding solves long-sequence generalization"]
    assert xl["verdict"] == INCONCLUSIVE and xl["margin"] is None and "not measured" in xl["measured"]
    assert xl["premise"]["text"] == TRAINED_AT_THIS_SIZE and not xl["premise"]["met"]


def test_models_are_reused_not_retrained(lab: Path, monkeypatch):
    from poslab.lab.experiments.declaration import Plan, ensure_runs
    from poslab.lab.experiments.lab_models import lab_model_arms

    def no_training(*args, **kwargs):
        raise AssertionError("a finished lab model of the store was trained again")

    size = scale.size_of(False, "smoke")
    run_dir = lab / "models" / "smoke" / "rope"
    before = (run_dir / "results.json").stat().st_mtime_ns
    monkeypatch.setattr("poslab.session.train", no_training)
    another = Plan(None, lab_model_arms(("rope",), size, (extrapolation.SEED,)), summarise=False)
    assert ensure_runs(another, workers=1, models=lab / "models").by_arm["rope"][extrapolation.SEED].path == run_dir
    assert (run_dir / "results.json").stat().st_mtime_ns == before
    assert not (lab / "extrapolation" / "models").exists()  # the experiment keeps no models of its own


def test_attention_entropy_smoke(lab: Path):
    results = attention_entropy.run(
        lab / "attention-entropy", size="smoke", schemes=("learned", "rope", "alibi"), workers=1, models=lab / "models"
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
    table = attention_entropy.EXPERIMENT.tables[0].build(json.loads(json.dumps(results)))
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
        row = next(row for row in table.rows if row[0] == label)  # the key table, built from results.json
        assert row[-3].mean == pytest.approx(sum(rises) / len(rises)) and row[-3].n == len(rises)
    seeds = [str(s) for s in extrapolation.SEEDS]
    yarn = [models["rope + YaRN x4"]["by_seed"][s]["entropy"]["4"]["rise"] for s in seeds]
    no_temperature = [models["rope + YaRN x4 no temperature"]["by_seed"][s]["entropy"]["4"]["rise"] for s in seeds]
    by_claim = {c["claim"][:30]: c for c in results["claims"]}
    record = by_claim["YaRN's temperature reduces the"]  # the same models read two ways: paired by seed
    assert record["details"]["better"] == pytest.approx(yarn)
    assert record["details"]["worse"] == pytest.approx(no_temperature)
    assert record["design"]["test"] == plan.Test.PAIRED.value
    assert record["details"]["seeds"] == list(extrapolation.SEEDS)
    # RoPE's loss of focus is tested on the normalised entropy; the raw rise is shown with it, not tested
    focus = results["claims"][0]
    rope = [models["rope"]["by_seed"][s]["entropy"]["4"] for s in seeds]
    assert focus["details"]["values"] == pytest.approx([c["rise_normalised"] for c in rope])
    assert focus["details"]["raw_rise"] == pytest.approx([c["rise"] for c in rope])
    one_sample = [
        c["details"]["metric"] for c in results["claims"] if c["design"]["test"] == plan.Test.ONE_SAMPLE.value
    ]
    assert one_sample == ["normalised entropy rise at 4x L", "Spearman correlation"]
    assert check_records(results["claims"]) == []
    assert check_records(plan.adjust(results["claims"], "attention-entropy")) == []
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
    blockwise = attention_entropy_measure.attention_entropy(model, idx, query_block=5)  # [n_layer, h, T]
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
    entropy = attention_entropy_measure.attention_entropy(model, torch.randint(0, 13, (1, 20)), query_block=7)
    expected = torch.log(torch.arange(1, 21, dtype=torch.float32)).expand_as(entropy)
    torch.testing.assert_close(entropy, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention_entropy_measure.normalised(entropy), torch.ones(2, 2, 19))


def test_summary_figures():
    entropy = torch.arange(32, dtype=torch.float32).repeat(2, 2, 1)  # [n_layer=2, h=2, T=32], value = position
    s = attention_entropy_measure.summarise(entropy, train_length=8, bin_width=4)
    assert s.in_window == pytest.approx((4 + 5 + 6 + 7) / 4)
    assert s.past_window == pytest.approx(sum(range(8, 32)) / 24)
    assert s.by_position[:2] == [1.5, 5.5] and s.bin_starts[:2] == [0, 4]


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


def _typed(tables: dict) -> extrapolation.Tables:
    """:func:`_tables`' cells as evaluation cells (each perplexity's loss its ln, over one target)."""

    def cell(c: dict) -> Evaluation:
        ppl = c["nonoverlapping"]["ppl"]
        return Evaluation(c["length"], Score(math.log(ppl), ppl, 1))

    return {s: {k: {f: cell(c) for f, c in t.items()} for k, t in by_seed.items()} for s, by_seed in tables.items()}


def _claims(tables: dict, **options) -> list[dict]:
    return extrapolation.extrapolation_claims(_typed(tables), **options)


def _entropy_results(rises: dict[str, list[float]], normalised: list[float], length: int = 64) -> dict:
    """Per-seed readings (:func:`attention_entropy_measure.measure_variant`'s type) for ``entropy_claims``: only the
    figures the claims read are set."""
    m = attention_entropy_measure

    def cell(rise: float, rise_normalised: float) -> m.EntropyCell:
        return m.EntropyCell(length, 0.0, [], [], [], [], 0.0, 0.0, rise=rise, rise_normalised=rise_normalised)

    return {
        variant: m.Variant(
            variant.split(" + ")[0],
            None,
            False,
            {
                str(seed): m.Reading({"4": cell(rise, normalised[k])}, {}, 1.0 + rise)
                for k, (seed, rise) in enumerate(zip(extrapolation.SEEDS, values))
            },
            {},
        )
        for variant, values in rises.items()
    }


def test_entropy_rise_of_the_key_count_alone_is_not_a_loss_of_focus():
    """A raw rise near ln 4 (what 4x more keys give uniform rows) with a flat normalised entropy: no claim holds
    on the raw rise; the loss-of-focus claim is decided on the normalised one."""
    uniform = attention_entropy.uniform_rise(16, 4)
    # a query at i reads i + 1 keys (entropy ln(i + 1) when uniform): the mean of ln 17..64 minus that of ln 9..16
    by_hand = (math.lgamma(65) - math.lgamma(17)) / 48 - (math.lgamma(17) - math.lgamma(9)) / 8
    assert uniform == pytest.approx(by_hand, rel=1e-12) and 1.0 < uniform < math.log(4)
    rises = {"rope": [uniform - 0.01, uniform, uniform + 0.01]}
    focus = attention_entropy.entropy_claims(_entropy_results(rises, [0.0, 0.001, -0.001]))[0]
    assert focus["details"]["metric"] == "normalised entropy rise at 4x L"
    assert focus["verdict"] == DID_NOT_HOLD and focus["details"]["raw_rise"] == rises["rope"]
    assert focus["details"]["uniform_rise"] == pytest.approx(uniform)
    lost = attention_entropy.entropy_claims(_entropy_results(rises, [0.05, 0.06, 0.055]))[0]
    # the normalised rise is tested against 0.01, the bound its criterion states
    assert lost["verdict"] == HELD and lost["design"]["threshold"] == 0.01 and ") > 0.01, per seed" in lost["criterion"]


def test_entropy_variants_are_paired_by_seed():
    """The seeds' rises differ a lot, the same model's two readings little: the pairing decides."""
    plain = [0.3, 0.9, 1.5]
    rises = {
        "rope": plain,
        "rope + YaRN x4": [r - 0.2 for r in plain],
        "rope + YaRN x4 no temperature": [r - 0.05 for r in plain],
        "rope + log-n": [r - 0.1 + 0.01 * k for k, r in enumerate(plain)],
    }
    claims = attention_entropy.entropy_claims(_entropy_results(rises, [0.05, 0.06, 0.055]))
    by_claim = {c["claim"][:30]: c for c in claims}
    for text in ("YaRN's temperature reduces the", "YaRN (with its temperature) ri", "log-n scaling reduces the entr"):
        record = by_claim[text]
        assert record["verdict"] == HELD, record
        assert record["design"]["test"] == plan.Test.PAIRED.value
        assert record["details"]["seeds"] == list(extrapolation.SEEDS)
    assert check_records(claims) == []
    # the same numbers as independent arms: the seeds' spread swamps a 0.15 nats difference
    unpaired = verdicts.compare(
        "x",
        "y",
        verdicts.Arm("a", rises["rope + YaRN x4"]),
        verdicts.Arm("b", rises["rope + YaRN x4 no temperature"]),
        verdicts.Metric("rise"),
    )
    assert unpaired.verdict == INCONCLUSIVE


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
    unigram = math.log(28.4)  # tinyshakespeare's unigram perplexity: the collapse level
    verdict = {c["claim"]: c["verdict"] for c in _claims(literature, baseline=unigram)}
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
    records = _claims(opposite, baseline=unigram)
    verdict = {c["claim"]: c["verdict"] for c in records}
    assert verdict["RoPE's perplexity 'jumps from 10 to 100+' past the training length"] == DID_NOT_HOLD  # 13 < 28.4
    assert verdict["ALiBi's perplexity at 4x L stays within 1.10x its value at L"] == DID_NOT_HOLD
    assert verdict["at 8x L: ALiBi < RoPE"] == DID_NOT_HOLD
    assert verdict["RoPE extrapolates better than the relative-bias schemes T5 and ALiBi"] == HELD
    assert verdict["Transformer-XL's relative encoding solves long-sequence generalization"] == HELD
    assert check_records(records) == []


JUMP = "RoPE's perplexity 'jumps from 10 to 100+' past the training length"


def test_rope_jump_is_judged_against_the_corpus_collapse_level():
    """A character model at ppl 5 in length that reaches 36 at 16x L (7.2x, never "100+") has collapsed: it is past
    the corpus's unigram perplexity (28.4), the level of a model that ignores its context."""
    tables = _tables({"rope": (1, 1.3, 2.0, 3.0, 7.2), "alibi": (1, 1, 1, 1, 1)})
    for by_seed in tables.values():
        for cells in by_seed.values():
            for cell in cells.values():
                cell["nonoverlapping"]["ppl"] /= 2  # ppl about 5 at L
    claims = {c["claim"]: c for c in _claims(tables, baseline=math.log(28.4))}
    jump = claims[JUMP]
    assert jump["verdict"] == HELD and jump["details"]["unigram_ppl"] == pytest.approx(28.4)
    assert extrapolation.JUMP_QUOTE in jump["criterion"] and "unigram" in jump["criterion"]
    assert jump["design"]["test"] == plan.Test.ONE_SAMPLE.value and jump["design"]["log"] is True
    assert jump["details"]["seeds"] == [0, 1, 2]
    # a corpus whose unigram perplexity is above 36: the same model has not collapsed
    assert {c["claim"]: c for c in _claims(tables, baseline=math.log(60))}[JUMP]["verdict"] == DID_NOT_HOLD
    # without the corpus's baseline the collapse level is unknown: not judged
    unknown = {c["claim"]: c for c in _claims(tables)}[JUMP]
    assert unknown["verdict"] == INCONCLUSIVE and "unigram perplexity" in unknown["measured"]


def test_ratios_are_tested_per_seed_on_the_ln_scale():
    """ppl(2L) / ppl(L) of 2.5, 2.7 and 2.9: every seed agrees the table collapses (above 1.5)."""
    tables = _tables({"learned": (1, 2.7, 6, 9, 12)}, jitter=0.0)
    for k, ratio in enumerate((2.5, 2.7, 2.9)):
        tables["learned"][str(k)]["2"]["nonoverlapping"]["ppl"] = 10 * ratio
    claims = {c["claim"]: c for c in _claims(tables)}
    learned = claims["a learned absolute table collapses past the training length (its rows past L were never trained)"]
    assert learned["verdict"] == HELD and learned["details"]["values"] == pytest.approx([2.5, 2.7, 2.9])
    assert learned["design"]["log"] is True
    assert learned["margin"] == pytest.approx(math.log(2.7) - math.log(1.5), abs=0.01)  # ln scale, not 2.7 - 1.5


def test_schemes_are_paired_only_when_they_share_their_seeds():
    """Seed i trains every scheme on the same batches: paired. Tables of different seeds are independent arms."""
    shared = _tables({"alibi": (1, 1, 1, 1.0, 1), "rope": (1, 1, 1, 1.05, 1)}, jitter=0.0)
    for k, level in enumerate((0.6, 1.0, 1.6)):  # a large seed-to-seed spread that both schemes of a seed share
        for scheme in shared:
            for cell in shared[scheme][str(k)].values():
                cell["nonoverlapping"]["ppl"] *= level
    record = {c["claim"]: c for c in _claims(shared)}["at 8x L: ALiBi < RoPE"]
    assert record["verdict"] == HELD and record["design"]["test"] == plan.Test.PAIRED.value
    assert record["details"]["seeds"] == [0, 1, 2]
    apart = {"alibi": shared["alibi"], "rope": {str(k + 10): v for k, v in enumerate(shared["rope"].values())}}
    records = _claims(apart)
    record = {c["claim"]: c for c in records}["at 8x L: ALiBi < RoPE"]
    assert record["design"]["test"] == plan.Test.WELCH.value and record["details"]["seeds"] == [[0, 1, 2], [10, 11, 12]]
    assert record["verdict"] == INCONCLUSIVE  # unpaired, the seeds' spread swamps the 5%
    assert check_records(records) == []


def test_seed_noise_makes_a_close_comparison_inconclusive():
    close = _tables({"alibi": (1, 1, 1, 1.0, 1), "rope": (1, 1, 1, 1.001, 1)})
    for k, wobble in enumerate((1.05, 0.95, 1.0)):  # seed-to-seed noise that differs between the two schemes
        close["rope"][str(k)]["8"]["nonoverlapping"]["ppl"] *= wobble
    record = {c["claim"]: c for c in _claims(close)}["at 8x L: ALiBi < RoPE"]
    assert record["verdict"] == INCONCLUSIVE and abs(record["margin"]) <= record["noise"]


def test_init_from_copies_the_weights(lab: Path, tmp_path: Path):
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training.config import TrainConfig

    size = scale.size_of(False, "smoke")
    base_dir = lab / "models" / "smoke" / "rope"
    changes = scale.Overrides(
        block_size=4 * size.train_length,
        position_config={"scaling": "linear", "factor": 4.0, "original_max_len": size.train_length},
        steps=1,
        lr=1e-12,
        warmup_steps=0,
        init_from=str(base_dir),
    )
    cfg = scale.train_config("rope", size, tmp_path, name="ft", changes=changes)
    train(cfg, progress=False)
    base, _, _ = load_run(base_dir)
    tuned, _, config = load_run(tmp_path / "ft")
    assert config["train"]["init_from"] == str(base_dir)
    for (name, a), (_, b) in zip(base.named_parameters(), tuned.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    bad = TrainConfig.from_dict({**cfg.to_dict(), "name": "ft2", "init_from": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError):
        train(bad, progress=False)


def test_a_model_that_did_not_train_makes_its_claims_not_testable():
    tables = _tables(
        {
            "alibi": (1, 1, 1.05, 1.06, 1.07),
            "rope": (1, 1.3, 2.0, 3.0, 12.0),
            "sinusoidal": (3, 3, 3, 3, 3),
            "t5": (1, 1, 1.02, 1.03, 1.04),
            "xl": (1, 1.5, 3, 5, 9),
        }
    )
    assert set(extrapolation.undertrained_seeded(_typed(tables))) == {"sinusoidal"}  # ppl 30 at L vs a median of 10
    claims = {c["claim"]: c for c in _claims(tables)}
    sinusoidal = claims["sinusoidal degrades past L: perplexity at 4x L at least 1.5x its value at L"]
    assert sinusoidal["verdict"] == INCONCLUSIVE and "did not train" in sinusoidal["measured"]
    assert sinusoidal["premise"] == {"text": LEARNED_IN_LENGTH, "measured": sinusoidal["measured"], "met": False}
    assert not_testable(ClaimRecord.from_dict(sinusoidal))
    assert claims["at 8x L: RoPE < sinusoidal"]["verdict"] == INCONCLUSIVE
    assert claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["verdict"] == HELD
    # a model not below the corpus's unigram baseline learned nothing either: ln(10 * 1.0) = 2.30 > 2.0
    claims = {c["claim"]: c for c in _claims(tables, baseline=2.0)}
    assert claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["verdict"] == INCONCLUSIVE
    assert "unigram baseline" in claims["ALiBi's perplexity at 4x L stays within 1.10x its value at L"]["measured"]


def test_a_claim_on_schemes_this_size_does_not_train_is_not_testable():
    tables = _tables({"alibi": (1, 1, 1.05, 1.06, 1.07), "rope": (1, 1.3, 2.0, 3.0, 12.0)})
    claims = {c["claim"]: c for c in _claims(tables)}
    t5 = claims["RoPE extrapolates better than the relative-bias schemes T5 and ALiBi"]
    assert t5["verdict"] == INCONCLUSIVE and t5["measured"].startswith("not measured at this size: needs rope, t5")
    assert t5["premise"] == {"text": TRAINED_AT_THIS_SIZE, "measured": t5["measured"], "met": False}
    assert not_testable(ClaimRecord.from_dict(t5))
    at_8l = ClaimRecord.from_dict(claims["at 8x L: ALiBi < RoPE"])  # both arms trained: testable
    assert at_8l.premise is None and at_8l.verdict != INCONCLUSIVE


# ------------------------------------------------------------------------------------ the real quick forms
#: the claims the quick lab must decide (either way) at 3 seeds
MUST_RESOLVE = (
    "RoPE reads past the training length better than a learned table",
    "ALiBi's perplexity at 4x L stays within 1.10x its value at L",
)


@pytest.mark.slow
def test_quick_extrapolation_resolves_its_claims(tmp_path: Path):
    """The real quick form (the plan's seeds per scheme): every verdict obeys the rule, and the issue's claims are
    decided."""
    from poslab.lab.experiments.training import planned_seeds
    from poslab.lab.scale import schemes_of, size_of

    results = extrapolation.run(tmp_path / "extrapolation", quick=True)
    planned = planned_seeds("extrapolation", schemes_of(size_of(True)), quick=True)
    assert results["seeds_by_scheme"] == {scheme: list(seeds) for scheme, seeds in planned.items()}
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    by_claim = {c["claim"]: c for c in results["claims"]}
    for text in MUST_RESOLVE:
        assert by_claim[text]["verdict"] != INCONCLUSIVE, by_claim[text]
    # every scheme learned structure: in-length loss well below the character-frequency baseline
    for scheme, cells in results["perplexity"].items():
        assert math.log(cells["1"]["nonoverlapping"]["ppl"]) < results["unigram_entropy_nats"] - 0.5, scheme


def test_arms_with_more_seeds_are_paired_on_the_seeds_both_trained():
    """The quick lab trains RoPE 5 seeds and ALiBi 3 (poslab.lab.plan.QUICK_SEEDS): ALiBi vs RoPE pairs the 3 seeds
    both trained, the RoPE-only claims use all 5."""
    tables = _tables({"rope": (1, 1.3, 2.0, 3.0, 7.2), "alibi": (1, 1, 1, 1, 1)})
    for k in (3, 4):  # two more RoPE seeds
        tables["rope"][str(k)] = {
            f: {"length": c["length"], "nonoverlapping": {"ppl": c["nonoverlapping"]["ppl"] * (1 + 0.001 * k)}}
            for f, c in tables["rope"]["0"].items()
        }
    claims = {c["claim"]: c for c in _claims(tables)}
    pair = claims["at 8x L: ALiBi < RoPE"]
    assert pair["n_seeds"] == 3 and pair["details"]["paired"] and pair["design"]["test"] == "paired t-test"
    assert pair["details"]["seeds"] == ["0", "1", "2"] or pair["details"]["seeds"] == [0, 1, 2]
    assert claims["plain RoPE degrades past L: perplexity at 4x L at least 1.5x its value at L"]["n_seeds"] == 5


def test_a_run_without_results_is_an_error_naming_it_not_a_missing_loss(tmp_path: Path):
    from poslab.lab.experiments.extrapolation import _final_val_loss
    from poslab.runs import RunFileError

    with pytest.raises(RunFileError, match="has no results.json"):
        _final_val_loss(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"final_val_loss": 1.5}))
    assert _final_val_loss(tmp_path) == 1.5


RECORDED = Path(__file__).parent / "data" / "extrapolation_results.json"


def test_a_recorded_results_json_reads_back_into_typed_cells_and_writes_the_same_file():
    """A smoke run's results.json as the lab wrote it (its claims left out): every cell typed, the same file back."""
    from poslab.lab.experiments.cells import MeanEvaluation

    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    result = load(extrapolation.ExtrapolationResult, data)
    cell = result.perplexity["rope"]["4"]
    assert isinstance(cell, MeanEvaluation) and cell.ppl("sliding") == data["perplexity"]["rope"]["4"]["sliding"]["ppl"]
    assert result.perplexity_by_seed["alibi"]["1338"]["2"].sliding.stride == 16
    written = json.dumps(to_json(result))
    assert written == json.dumps({k: v for k, v in data.items() if k not in ("experiment", "figure")})


def test_a_cell_missing_a_field_fails_its_table_naming_the_field():
    from poslab.lab.tables import TableFailure, build_tables

    data = json.loads(RECORDED.read_text(encoding="utf-8"))
    del data["perplexity"]["rope"]["4"]["nonoverlapping"]["ppl_seeds"]
    built = build_tables("experiments/extrapolation", extrapolation.EXPERIMENT.tables, data)
    assert built == [TableFailure("experiments/extrapolation", f"perplexity ({m})", field="ppl_seeds") for m in MODES]
