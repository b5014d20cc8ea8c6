"""Head analysis (poslab.analysis.heads) and the attention grid (poslab.analysis.attention_map)."""

from __future__ import annotations

import json

import pytest
import torch
from lab_helpers import PROMPT, quiet, tiny_run

from poslab import GPT, GPTConfig
from poslab.analysis import heads
from poslab.analysis.attention_map import plot_grid, prompt_attention, prompt_ids, summary
from poslab.cli.app import main
from poslab.data import CharTokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def causal_uniform(T: int) -> torch.Tensor:
    w = torch.tril(torch.ones(T, T))
    return w / w.sum(-1, keepdim=True)  # [T, T]


def shifted(T: int, offset: int) -> torch.Tensor:
    """Each query attends to ``i - offset`` (or to 0 when that is before the start)."""
    w = torch.zeros(T, T)
    for i in range(T):
        w[i, max(i - offset, 0)] = 1.0
    return w


def small_model(position: str = "rope", seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=40, n_layer=2, n_head=3, n_embd=24, block_size=16, position=position)
    cfg.update(overrides)
    return GPT(GPTConfig(**cfg)).eval()


# ------------------------------------------------------------------------------------ scores
def test_previous_token_scores_on_known_patterns():
    T = 10
    w = torch.stack([shifted(T, 1), causal_uniform(T), shifted(T, 0)])[None]  # [1, 3, T, T]
    scores = heads.previous_token_scores([w, w])
    assert scores.shape == (2, 3)
    torch.testing.assert_close(scores[0, 0], torch.tensor(1.0))
    expected_uniform = torch.tensor([1 / (i + 1) for i in range(1, T)]).mean()
    torch.testing.assert_close(scores[0, 1], expected_uniform)
    assert scores[0, 2] == 0.0


def test_induction_scores_reward_prefix_matching_only():
    half = 6
    T = 2 * half
    induction = torch.zeros(T, T)
    for i in range(T):
        induction[i, i - half + 1 if i >= half else max(i - 1, 0)] = 1.0  # key j+1 for query half+j
    w = torch.stack([induction, shifted(T, 1), shifted(T, half)])[None]  # [1, 3, T, T]
    scores = heads.induction_scores([w], half)
    torch.testing.assert_close(scores[0], torch.tensor([1.0, 0.0, 0.0]))


def test_positional_scores_find_the_fixed_offset():
    T = 12
    w = torch.stack([shifted(T, 2), causal_uniform(T)])[None]  # [1, 2, T, T]
    offset, confidence = heads.positional_scores([w])
    assert offset[0, 0] == 2 and confidence[0, 0] == 1.0
    # a uniform row's argmax is its first key: offset i, different for every query, so no offset wins
    assert confidence[0, 1] == pytest.approx(1 / (T - 4))
    with pytest.raises(ValueError, match="longer than min_query"):
        heads.positional_scores([w[..., :3, :3]])


def test_head_labels_follow_the_thresholds():
    assert heads.head_labels(0.9, 0.0, 1, 0.95) == ["previous-token"]
    assert heads.head_labels(0.1, 0.5, 3, 0.2) == ["induction"]
    assert heads.head_labels(0.1, 0.0, 4, 0.95) == ["positional (offset 4)"]
    assert heads.head_labels(0.1, 0.1, 4, 0.5) == []
    assert heads.head_labels(0.1, 0.1, 4, 0.5, 0.7) == ["punctuation"]


def test_punctuation_scores_measure_attention_on_marks():
    tokenizer = CharTokenizer.from_text(PROMPT)
    marks = heads.punctuation_ids(tokenizer)
    assert sorted(tokenizer.decode([m]) for m in marks) == ["。", "，"]
    idx = torch.tensor([tokenizer.encode(PROMPT)])  # the comma is token 5
    T = idx.shape[1]
    to_comma = torch.zeros(T, T)
    for i in range(T):
        to_comma[i, 5 if i >= 5 else i] = 1.0  # from the comma on, everything attends to it
    w = torch.stack([to_comma, shifted(T, 1)])[None]  # [1, 2, T, T]
    scores = heads.punctuation_scores([w], idx, marks)
    assert scores[0, 0] == 1.0  # queries 5..11 see a mark; all their attention is on the comma
    torch.testing.assert_close(scores[0, 1], torch.tensor(1 / 7))  # previous-token head: only query 6 lands on a mark
    assert heads.punctuation_scores([w], idx, []).abs().sum() == 0


def test_repeated_random_tokens_repeat_without_duplicates():
    tokens = heads.repeated_random_tokens(50, 7, 3, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 14)
    assert torch.equal(tokens[:, :7], tokens[:, 7:])
    assert all(len(set(row[:7].tolist())) == 7 for row in tokens)
    with pytest.raises(ValueError, match="distinct tokens"):
        heads.repeated_random_tokens(5, 7, 1, torch.Generator())


def test_attention_weights_are_the_models_softmax():
    model = small_model("alibi")
    idx = torch.randint(0, 40, (2, 9))
    weights = heads.attention_weights(model, idx)
    assert len(weights) == 2 and weights[0].shape == (2, 3, 9, 9)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(2, 3, 9))
    assert torch.all(weights[0].triu(1) == 0)  # causal
    # the first layer's weights recomputed by hand from the model's own modules
    block = model.blocks[0]
    x = block.norm1(model.position.embed(model.tok_emb(idx), torch.arange(9)))
    _, expected = block.attn.forward_with_weights(x, torch.arange(9))  # the scheme the model lent it
    torch.testing.assert_close(weights[0], expected.float())


# ------------------------------------------------------------------------------------ masks and importance
def test_head_mask_equals_zeroing_that_heads_slice_of_the_output_projection():
    model = small_model("rope")
    idx = torch.randint(0, 40, (2, 12))
    mask = torch.ones(2, 3)
    mask[1, 2] = 0.0
    with torch.no_grad(), heads.masked_heads(model, mask):
        masked = model(idx)
    dk = 24 // 3
    with torch.no_grad():
        model.blocks[1].attn.proj.weight[:, 2 * dk : 3 * dk] = 0.0
        zeroed = model(idx)
    torch.testing.assert_close(masked, zeroed)
    with pytest.raises(ValueError, match=r"shape \[2, 3\]"):
        with heads.masked_heads(model, torch.ones(3)):
            pass


def test_importance_of_a_dead_head_is_zero_and_gradient_matches_finite_differences():
    model = small_model("learned")
    dk = 8
    with torch.no_grad():
        model.blocks[0].attn.proj.weight[:, dk : 2 * dk] = 0.0  # head (0, 1) contributes nothing
    batches = heads.text_batches(torch.randint(0, 40, (400,)), 16, 2, 4, torch.Generator().manual_seed(0))
    base, delta = heads.masking_importance(model, batches)
    assert delta[0, 1] == 0.0
    assert delta.abs().sum() > 0
    grad = heads.gradient_importance(model, batches)
    assert grad[0, 1] == 0.0
    # the loss is computed in fp32, whose rounding quantises a loss difference at eps=1e-2 in steps of ~1%
    # of this gradient; at 1e-1 the central difference's own error (O(eps^2) curvature) stays below 0.1%
    eps = 1e-1
    for layer, head in [(0, 0), (1, 2)]:
        per_batch = []
        for batch in batches:
            up, down = torch.ones(2, 3), torch.ones(2, 3)
            up[layer, head], down[layer, head] = 1 + eps, 1 - eps
            per_batch.append(
                abs(heads.mean_loss(model, [batch], up) - heads.mean_loss(model, [batch], down)) / (2 * eps)
            )
        assert grad[layer, head].item() == pytest.approx(sum(per_batch) / len(per_batch), rel=2e-2, abs=1e-5)


def test_pruning_curve_ends_at_the_base_loss_and_at_everything_masked():
    model = small_model("none")
    batches = heads.text_batches(torch.randint(0, 40, (300,)), 16, 1, 4, torch.Generator().manual_seed(1))
    order = [(layer, head) for layer in range(2) for head in range(3)]
    curve = heads.pruning_curve(model, batches, order, fractions=(0.0, 0.5, 1.0))
    assert curve[0] == pytest.approx(heads.mean_loss(model, batches))
    assert curve[2] == pytest.approx(heads.mean_loss(model, batches, torch.zeros(2, 3)))


def test_analyze_on_a_trained_run_writes_results_and_plot(tmp_path):
    from poslab.runs import load_run

    run = tiny_run("rope")
    from poslab.runs import RunFolder

    model, tokenizer, config = load_run(run)
    tokens = RunFolder(run).split_tokens("val", tokenizer)
    results = heads.analyze(model, tokens, n_batches=1, batch_size=4)
    json.dumps(results, allow_nan=False)
    assert len(results["heads"]) == 4 and results["eval"]["induction_periods"] == [16, 12, 8]
    for row in results["heads"]:
        assert 0.0 <= row["previous_token"] <= 1.0 and 0.0 <= row["induction"] <= 1.0
        assert row["labels"] == heads.head_labels(
            row["previous_token"],
            row["induction"],
            row["positional_offset"],
            row["positional_confidence"],
            row["punctuation"],
        )
    assert results["pruning"]["loss_by_importance"][0] == pytest.approx(results["base_loss"])
    assert results["pruned_30"]["heads_masked"] == 1 and results["pruned_60"]["heads_masked"] == 2
    png = heads.plot(results, tmp_path / "heads.png")
    assert png.stat().st_size > 10_000


def test_heads_cli_and_errors(tmp_path, capsys):
    run = tiny_run("rope")
    with quiet():
        assert main(["heads", str(run), "--out", str(tmp_path / "h"), "--quick"]) == 0
    assert (tmp_path / "h" / "results.json").is_file() and (tmp_path / "h" / "heads.png").is_file()
    assert main(["heads", str(tmp_path / "missing")]) == 2
    assert "not a poslab run folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ attention grid
def test_prompt_attention_validates_the_prompt():
    tokenizer = CharTokenizer.from_text(PROMPT + "春眠不觉晓")
    model = small_model("t5", vocab_size=tokenizer.vocab_size)
    tokens, weights = prompt_attention(model, tokenizer, PROMPT)
    assert tokens == list(PROMPT) and weights.shape == (2, 3, 12, 12)
    for bad, message in [("", "empty"), ("   ", "empty"), ("白日xyz", "'xyz'"), ("白" * 17, "at most 16")]:
        with pytest.raises(ValueError, match=message):
            prompt_ids(model, tokenizer, bad)
    with pytest.raises(TypeError):
        prompt_ids(model, tokenizer, None)
    numbers = summary(weights, tokens)
    assert len(numbers["heads"]) == 6 and all(0 <= h["self_weight"] <= 1 for h in numbers["heads"])


def test_attention_grid_png_has_cjk_glyphs_not_boxes(tmp_path):
    """The tick labels use the shipped font: two different characters render differently."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from poslab.display.fonts import use_in_matplotlib

    def render(char: str) -> bytes:
        with matplotlib.rc_context(use_in_matplotlib()):
            fig = Figure(figsize=(0.6, 0.6), dpi=50)
            FigureCanvasAgg(fig)
            fig.text(0.5, 0.5, char, fontsize=20, ha="center", va="center")
            fig.canvas.draw()
            return bytes(fig.canvas.buffer_rgba())

    blank = render(" ")
    white, yellow = render("白"), render("黄")
    assert white != blank and yellow != blank and white != yellow
    weights = torch.softmax(torch.randn(2, 2, 5, 5), -1)
    assert plot_grid(weights, list("白日依山尽"), tmp_path / "grid.png", title="t").stat().st_size > 5_000
    with pytest.raises(ValueError, match="token labels"):
        plot_grid(weights, list("白日"), tmp_path / "x.png")


def test_attention_cli(tmp_path, capsys):
    run = tiny_run("rope")
    code = main(
        [
            "attention",
            str(run),
            "--prompt",
            PROMPT,
            "--out",
            str(tmp_path / "a.png"),
            "--json",
            str(tmp_path / "a.json"),
        ]
    )
    assert code == 0 and (tmp_path / "a.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["tokens"] == list(PROMPT) and data["n_layer"] == 2 and len(data["heads"]) == 4
    capsys.readouterr()
    assert main(["attention", str(run), "--prompt", "", "--out", str(tmp_path / "b.png")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["attention", str(run), "--prompt", "xyz€", "--out", str(tmp_path / "b.png")]) == 2
    assert "vocabulary" in capsys.readouterr().err
    assert main(["attention", str(run), "--out", str(tmp_path / "b.jpg")]) == 2
    assert ".png" in capsys.readouterr().err
