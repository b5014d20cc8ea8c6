"""``poslab.analysis.eval``: perplexity per length, sliding windows, RoPE overrides, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.analysis.eval import (
    apply_rope_scaling,
    evaluate,
    nonoverlapping_windows,
    parse_lengths,
    parse_rope_scaling,
    rotary_frequencies,
    score_windows,
    sliding_windows,
)
from poslab.nn.positions.rope import default_inv_freq


def tiny(position: str = "rope", block: int = 16, seed: int = 0, **position_config) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=11,
        n_layer=2,
        n_head=2,
        n_embd=16,
        block_size=block,
        position=position,
        position_config=position_config,
    )
    return GPT(cfg).eval()


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 11, (n,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------ correctness
def test_nonoverlapping_ppl_is_exp_of_mean_loss_by_hand():
    model, data = tiny(), tokens(100)
    length, n_targets = 8, 96
    cell = evaluate(model, data, [length], n_targets=n_targets)[0]["nonoverlapping"]
    # by hand: the model's own mean loss on each chunk, weighted by chunk size
    total = 0.0
    with torch.no_grad():
        for start in range(0, n_targets, length):
            chunk = data[start : start + length + 1]
            _, loss = model(chunk[None, :-1], chunk[None, 1:])
            total += float(loss) * length
    assert cell["n_tokens"] == n_targets
    assert cell["loss"] == pytest.approx(total / n_targets, rel=1e-6)
    assert cell["ppl"] == pytest.approx(math.exp(total / n_targets), rel=1e-6)


def test_partial_last_chunk_scores_the_same_targets():
    model, data = tiny(), tokens(60)
    cells = evaluate(model, data, [8, 5], n_targets=50)
    assert [c["nonoverlapping"]["n_tokens"] for c in cells] == [50, 50]
    assert [w.length for w in nonoverlapping_windows(50, 8)] == [8] * 6 + [2]


def test_stride_equal_to_length_is_nonoverlapping():
    model, data = tiny("alibi"), tokens(200)
    cell = evaluate(model, data, [16], stride=16, n_targets=192)[0]
    assert cell["sliding"]["loss"] == pytest.approx(cell["nonoverlapping"]["loss"], rel=1e-6)
    assert cell["sliding"]["n_tokens"] == cell["nonoverlapping"]["n_tokens"] == 192


@pytest.mark.parametrize(
    "n_targets,length,stride", [(100, 16, 4), (100, 16, 16), (64, 16, 5), (16, 16, 1), (97, 10, 3)]
)
def test_sliding_windows_score_each_token_exactly_once(n_targets, length, stride):
    scored: list[int] = []
    for w in sliding_windows(n_targets, length, stride):
        assert w.length == length and w.start >= 0 and 0 < w.n_scored <= length
        first = w.start + w.length - w.n_scored + 1  # target index of the first scored position
        targets = list(range(first, w.start + w.length + 1))
        if w.start > 0:  # every later window leaves at least length - stride tokens of context
            assert first - 1 - w.start >= length - stride
        scored += targets
    assert sorted(scored) == list(range(1, n_targets + 1))  # each target once


def test_sliding_window_loss_matches_per_token_brute_force():
    model, data = tiny("t5"), tokens(60)
    length, stride, n_targets = 12, 5, 50
    cell = evaluate(model, data, [length], stride=stride, n_targets=n_targets)[0]["sliding"]
    losses = []
    with torch.no_grad():
        for w in sliding_windows(n_targets, length, stride):
            for offset in range(length - w.n_scored, length):  # target tokens[w.start + offset + 1]
                context = data[w.start : w.start + offset + 1]
                logits = model(context[None])[0, -1]
                losses.append(float(torch.nn.functional.cross_entropy(logits[None], data[w.start + offset + 1][None])))
    assert len(losses) == n_targets
    assert cell["loss"] == pytest.approx(sum(losses) / n_targets, rel=1e-5)


def test_batching_does_not_change_the_result():
    model, data = tiny("fire"), tokens(200)
    windows = sliding_windows(180, 16, 6)
    one = score_windows(model, data, windows, batch_tokens=16)
    many = score_windows(model, data, windows, batch_tokens=16 * 7)
    assert one["loss"] == pytest.approx(many["loss"], rel=1e-6) and one["n_tokens"] == many["n_tokens"]


def test_learned_table_gets_a_cannot_cell_not_a_crash():
    model, data = tiny("learned", block=16), tokens(100)
    cells = evaluate(model, data, [16, 32], stride=8, n_targets=64)
    assert "nonoverlapping" in cells[0]
    assert cells[1] == {"length": 32, "cannot": "learned table has 16 rows"}
    json.dumps(cells)  # JSON-ready


# ------------------------------------------------------------------------------------ overrides
@pytest.mark.parametrize("spec,expected", [("linear:4", 1 / 4), ("ntk:4", None), ("yarn:4", None), ("llama3:4", None)])
def test_rope_scaling_override_changes_frequencies(spec, expected):
    model = tiny("rope", block=16)
    before, _ = rotary_frequencies(model)
    base = default_inv_freq(10000.0, 8)
    torch.testing.assert_close(before, base)
    data = tokens(80)
    loss_before = evaluate(model, data, [64], n_targets=64)[0]["nonoverlapping"]["loss"]
    config = apply_rope_scaling(model, parse_rope_scaling(spec))
    assert config["original_max_len"] == 16 and config["scaling"] == spec.split(":")[0]
    after, _ = rotary_frequencies(model)
    assert not torch.allclose(after, before)
    if expected is not None:
        torch.testing.assert_close(after, before * expected)
    assert evaluate(model, data, [64], n_targets=64)[0]["nonoverlapping"]["loss"] != loss_before
    apply_rope_scaling(model, parse_rope_scaling("none"))  # and back
    torch.testing.assert_close(rotary_frequencies(model)[0], before)
    assert evaluate(model, data, [64], n_targets=64)[0]["nonoverlapping"]["loss"] == pytest.approx(
        loss_before, rel=1e-6
    )


def test_dynamic_override_depends_on_length_and_yarn_sets_temperature():
    model = tiny("rope", block=16)
    apply_rope_scaling(model, parse_rope_scaling("dynamic:4"))
    inside, _ = rotary_frequencies(model, 16)
    torch.testing.assert_close(inside, default_inv_freq(10000.0, 8))
    assert not torch.allclose(rotary_frequencies(model, 64)[0], inside)
    apply_rope_scaling(model, parse_rope_scaling("yarn:4"))
    assert rotary_frequencies(model)[1] == pytest.approx(0.1 * math.log(4) + 1)


def test_logn_and_longrope_overrides():
    model = tiny("xpos", block=16)
    config = apply_rope_scaling(model, None, logn_scaling=True)
    assert config["logn_scaling"] is True and model.position.config.logn_scaling
    config = apply_rope_scaling(model, parse_rope_scaling("longrope:4:1,2,4,8"))
    assert model.position.config.long_factor == [1.0, 2.0, 4.0, 8.0]
    assert model.position.config.short_factor == [1.0] * 4  # the default: plain RoPE in the window


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "spec,bad",
    [("64,abc", "'abc'"), ("0,64", "'0'"), ("-8", "'-8'"), ("64,1.5", "'1.5'"), ("", "''"), ("64,64", "repeats")],
)
def test_bad_lengths(spec, bad):
    with pytest.raises(ValueError, match=bad):
        parse_lengths(spec)


@pytest.mark.parametrize(
    "spec,bad",
    [
        ("linear:0", "> 0"),
        ("yarn:-2", "> 0"),
        ("ntk:abc", "'abc'"),
        ("foo:4", "'foo'"),
        ("yarn", "needs a factor"),
        ("longrope:4", "per-frequency"),
        ("longrope:4:1,0", "> 0"),
        ("linear:4:2", "only a factor"),
    ],
)
def test_bad_rope_scaling(spec, bad):
    with pytest.raises(ValueError, match=bad):
        parse_rope_scaling(spec)


@pytest.mark.parametrize("position", ["alibi", "learned", "t5"])
def test_scaling_on_a_non_rope_model(position):
    model = tiny(position)
    with pytest.raises(ValueError, match=f"position='{position}'"):
        apply_rope_scaling(model, parse_rope_scaling("yarn:4"))
    with pytest.raises(ValueError, match="--logn-scaling"):
        apply_rope_scaling(model, None, logn_scaling=True)


def test_longrope_lists_of_the_wrong_length():
    model = tiny("rope")
    with pytest.raises(ValueError, match="rotary_dim/2=4"):
        apply_rope_scaling(model, parse_rope_scaling("longrope:4:1,2,3"))


@pytest.mark.parametrize(
    "stride,bad", [(0, "got 0"), (-3, "got -3"), (17, "stride 17 is larger than the evaluation length 16")]
)
def test_bad_stride(stride, bad):
    with pytest.raises(ValueError, match=bad):
        evaluate(tiny(), tokens(100), [16, 32], stride=stride)


def test_text_shorter_than_the_longest_length():
    with pytest.raises(ValueError, match="has 40 tokens, shorter than the longest length 64"):
        evaluate(tiny(), tokens(40), [16, 64])


# ------------------------------------------------------------------------------------ CLI on real runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two seconds-long trained runs (rope and learned, block 16) in a temporary folder."""
    from poslab.lab.scale import Overrides, size_of, train_config
    from poslab.session import train

    root = tmp_path_factory.mktemp("runs")
    out = {}
    for scheme in ("rope", "learned"):
        # the learned table exactly as long as training (16 rows): eval must refuse 32 (extrapolation's
        # own default gives tables room past L)
        table = {"max_len": 16} if scheme == "learned" else None
        changes = Overrides(steps=2, position_config=table)
        train(train_config(scheme, size_of(False, "smoke"), root, changes=changes), progress=False)
        out[scheme] = str(root / scheme)
    return out


def test_cli_eval_writes_results_and_cannot_cells(runs, tmp_path, capsys):
    from poslab.cli.app import main

    out = tmp_path / "res" / "eval.json"
    assert (
        main(["eval", runs["learned"], "--lengths", "16,32", "--stride", "8", "--tokens", "64", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "cannot (learned table has 16 rows)" in printed
    results = json.loads(out.read_text())
    assert results["scheme"] == "learned" and results["train_length"] == 16 and results["n_targets"] == 64
    assert results["lengths"][1] == {"length": 32, "cannot": "learned table has 16 rows"}
    cell = results["lengths"][0]
    assert cell["nonoverlapping"]["n_tokens"] == cell["sliding"]["n_tokens"] == 64 and cell["sliding"]["stride"] == 8


def test_cli_eval_rope_override_changes_the_numbers(runs, tmp_path):
    from poslab.cli.app import main

    plain, scaled = tmp_path / "plain.json", tmp_path / "yarn.json"
    assert main(["eval", runs["rope"], "--lengths", "64", "--tokens", "128", "--out", str(plain)]) == 0
    assert (
        main(
            [
                "eval",
                runs["rope"],
                "--lengths",
                "64",
                "--tokens",
                "128",
                "--rope-scaling",
                "yarn:4",
                "--logn-scaling",
                "--out",
                str(scaled),
            ]
        )
        == 0
    )
    a, b = json.loads(plain.read_text()), json.loads(scaled.read_text())
    assert b["position_config"]["scaling"] == "yarn" and b["position_config"]["original_max_len"] == 16
    assert b["position_config"]["logn_scaling"] is True
    assert a["lengths"][0]["nonoverlapping"]["loss"] != b["lengths"][0]["nonoverlapping"]["loss"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--lengths", "16,abc"], "evaluation length 'abc' is not a positive integer"),
        (["--lengths", "0"], "evaluation length '0' is not a positive integer"),
        (["--lengths", "16,32", "--stride", "20"], "stride 20 is larger than the evaluation length 16"),
        (["--lengths", "16", "--stride", "-1"], "stride must be a positive integer, got -1"),
        (["--lengths", "16", "--rope-scaling", "linear:0"], "RoPE scaling factor must be > 0, got '0'"),
        (["--lengths", "16", "--rope-scaling", "pi:4"], "unknown RoPE scaling 'pi'"),
        (["--lengths", "16,999999999"], "shorter than the longest length 999999999"),
    ],
)
def test_cli_eval_bad_input_is_one_line_exit_2(runs, capsys, args, message):
    from poslab.cli.app import main

    assert main(["eval", runs["rope"], *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("poslab: error:") and message in err


def test_cli_eval_scaling_on_a_non_rope_run(runs, capsys):
    from poslab.cli.app import main

    assert main(["eval", runs["learned"], "--lengths", "16", "--rope-scaling", "yarn:4"]) == 2
    from poslab.analysis.eval import rescalable_schemes

    family = ", ".join(rescalable_schemes())  # the registry's rescalable schemes (rope, xpos, prope, ...)
    assert "rope" in family and "learned" not in family
    assert f"needs a RoPE-family model ({family}); this run uses position='learned'" in capsys.readouterr().err
    assert main(["eval", runs["learned"], "--lengths", "16", "--logn-scaling"]) == 2
    assert "--logn-scaling needs a RoPE-family model" in capsys.readouterr().err


def test_eval_text_from_a_file_and_unknown_characters(runs, tmp_path, capsys):
    from poslab.cli.app import main

    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question. " * 4)
    assert main(["eval", runs["rope"], "--lengths", "16,32", "--split", str(text)]) == 0
    text.write_text("天地" * 40)
    assert main(["eval", runs["rope"], "--lengths", "16", "--split", str(text)]) == 2
    assert "not in the tokenizer's vocabulary" in capsys.readouterr().err


def test_longrope_from_a_json_file(tmp_path):
    good = tmp_path / "longrope.json"
    good.write_text(json.dumps({"factor": 4, "long_factor": [1, 2, 4, 8], "short_factor": [1, 1, 1, 1]}))
    assert parse_rope_scaling(f"longrope:{good}") == {
        "scaling": "longrope",
        "factor": 4.0,
        "long_factor": [1.0, 2.0, 4.0, 8.0],
        "short_factor": [1.0, 1.0, 1.0, 1.0],
    }
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_rope_scaling(f"longrope:{bad}")
    bad.write_text(json.dumps({"factor": 4, "long_factor": [1, 2], "typo": 1}))
    with pytest.raises(ValueError, match="unknown keys \\['typo'\\]"):
        parse_rope_scaling(f"longrope:{bad}")
    with pytest.raises(ValueError, match="does not exist"):
        parse_rope_scaling(f"longrope:{tmp_path / 'missing.json'}")


def test_loss_by_position_is_flat_for_a_model_without_context_and_drops_for_one_with_it():
    import torch

    from poslab.analysis.eval import loss_by_position
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=1, n_embd=16, block_size=16, position="none")).eval()
    stream = torch.randint(0, 11, (200,))
    curve = loss_by_position(model, stream, 16, max_windows=8)
    assert curve.shape == (16,) and curve.dtype == torch.float32
    # position t scores target t+1 of each window: the mean of the model's own token losses there
    idx, targets = stream[:128].view(8, 16), stream[1:129].view(8, 16)
    with torch.no_grad():
        logits = model(idx)
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(0)
    torch.testing.assert_close(curve, expected)
    with pytest.raises(ValueError, match="holds no window"):
        loss_by_position(model, stream[:10], 16)


def test_loss_by_position_over_the_whole_stream_does_not_depend_on_the_chunk():
    import torch

    from poslab.analysis.eval import loss_by_position
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=1, n_embd=16, block_size=8, position="rope")).eval()
    stream = torch.randint(0, 11, (203,))  # 25 whole windows of 8 and their targets
    idx, targets = stream[:200].view(25, 8), stream[1:201].view(25, 8)
    with torch.no_grad():
        logits = model(idx)
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(0)
    for chunk in (1, 7, 25, 256):
        torch.testing.assert_close(loss_by_position(model, stream, 8, max_windows=None, chunk=chunk), expected)
    with pytest.raises(ValueError, match="chunk must be a positive integer, got 0"):
        loss_by_position(model, stream, 8, chunk=0)
    with pytest.raises(ValueError, match="max_windows must be a positive integer, got 0"):
        loss_by_position(model, stream, 8, max_windows=0)
