"""Whether sampled poems scan (poslab/analysis/poems.py), and the demo poem model (preset ``tang-demo``)."""

from __future__ import annotations

import pytest

from poslab.analysis.poems import scan_fraction, segment_lengths


def test_segment_lengths_by_hand():
    assert segment_lengths("白日依山尽，黄河入海流。\n欲穷千里目，更上一层楼。\n") == [5, 5, 5, 5]
    assert segment_lengths("白日依山尽，黄河入") == [5]  # the cut last line is not a segment
    assert segment_lengths("半句\n白日依山尽，") == [5]  # a new poem opens a line
    assert segment_lengths("，，白日依山尽？") == [0, 0, 5]  # an empty segment does not scan
    assert segment_lengths("白日依山尽黄河入海流") == []


def test_scan_fraction_counts_over_every_sample():
    # the quick-lab poem: 4 of its 6 complete segments have five characters
    poem = "白日依山尽，无北更饥到。青见圃簷能，鸣满身映莺霞。风来醉几归，妓从台终。…"
    assert scan_fraction([poem]) == (4, 6)
    assert scan_fraction([poem, "白日依山尽，黄河入海流。"]) == (6, 8)
    assert scan_fraction(["七个字的一行诗，"], length=7) == (1, 1)
    assert scan_fraction([]) == (0, 0)
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        scan_fraction([poem], length=0)


def test_the_corpus_itself_scans():
    from poslab.data import load_corpus

    scanning, total = scan_fraction([load_corpus("tang5")])
    assert total > 300_000 and scanning / total > 0.99


def _demo_config(out, **overrides):
    """The ``tang-demo`` preset as a ``TrainConfig`` writing to ``out`` (fp32, one thread unless overridden)."""
    from poslab.training import presets
    from poslab.training.config import TrainConfig

    values = presets.preset_config("tang-demo")
    values.update(out_dir=str(out), threads=1, ckpt_interval=0, keep_checkpoints=1, dtype="fp32")
    for key, value in overrides.items():
        if key.startswith("model."):
            values["model"][key[len("model.") :]] = value
        else:
            values[key] = value
    return TrainConfig.from_dict(values)


def _samples(cfg, prompt: str, tokens: int, seed: int = 0) -> list[str]:
    """20 samples of ``tokens`` characters continuing ``prompt``, as ``benchmarks/tang_demo.py`` draws them."""
    from poslab.nn.generate import sample_text
    from poslab.runs import load_run

    model, tokenizer, _ = load_run(cfg.run_dir)
    return sample_text(model, tokenizer, prompt, tokens, num_samples=20, seed=seed)


def _small_demo(out, corpus: str, position: str):
    """The tang-demo recipe (its block, optimiser and the shape of its schedule, scaled to 300 steps) on a
    2-layer, 64-wide model at batch 8, trained on ``corpus``: a few CPU seconds."""
    from poslab.training import presets

    config = presets.preset_config("tang-demo")
    steps = 300
    scale = steps / config["max_steps"]
    return _demo_config(
        out,
        name=f"small-{position}",
        corpus=corpus,
        batch_size=8,
        max_steps=steps,
        lr_decay_steps=steps,
        warmup_steps=max(1, round(config["warmup_steps"] * scale)),
        cooldown_steps=round(config["cooldown_steps"] * scale),
        eval_iters=2,
        eval_interval=steps,
        **{"model.n_layer": 2, "model.n_embd": 64, "model.n_head": 2},
        **{"model.position": position},
    )


@pytest.mark.parametrize(("position", "scans"), [("rope", True), ("learned", False)])
def test_a_small_demo_model_on_tang_poems_scans_with_rope(tmp_path, tang_corpus, position, scans):
    """The demo recipe at small settings on 30,000 characters of Tang poems, sampled as the benchmark
    samples (20 samples of 64 characters after 白日依山尽, the model's block) and counted by the benchmark's
    function: with the preset's RoPE most segments have five characters (measured 84-89% over three
    sampling seeds); with the lab's learned positions, at the same settings, about a fifth do (21-24%)."""
    from poslab.session import train

    cfg = _small_demo(tmp_path, tang_corpus, position)
    train(cfg, progress=False)
    scanning, total = scan_fraction(_samples(cfg, "白日依山尽", 64))
    assert total >= 150, (scanning, total)
    if scans:
        assert scanning / total >= 0.75, (scanning, total)
    else:
        assert scanning / total < 0.5, (scanning, total)


@pytest.mark.slow
def test_the_demo_model_as_shipped_scans_and_beats_the_bigram(tmp_path):
    """The preset as ``make demo`` trains it (its dtype, two threads; under 90 s of training on 2 quiet
    cores): 20 samples of 64 characters have at least 90% five-character segments, and its whole-split
    validation loss sits at least 0.1 nats below the corpus's bigram count model (the goal of
    ``benchmarks/tang_demo.py``)."""
    from poslab.lab.experiments.common import ngram_baselines
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training.data import prepare_data
    from poslab.training.evaluation import evaluate_loss

    cfg = _demo_config(tmp_path, name="tang-demo", threads=2, dtype="auto")
    train(cfg, progress=False)
    scanning, total = scan_fraction(_samples(cfg, "白日依山尽", 64))
    assert scanning / total >= 0.9, (scanning, total)
    model, _, _ = load_run(cfg.run_dir)
    val = evaluate_loss(model, prepare_data(cfg).val, cfg.model.block_size, 64, None)
    assert val <= ngram_baselines(cfg.corpus)["bigram"] - 0.1, val
