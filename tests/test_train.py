"""The training loop end to end: a tiny run learns and writes its folder; the corpus and config it refuses; the
schedule, gradient accumulation, bf16 autocast, evaluation and a BPE tokenizer (fast: tiny models on a short corpus).

Checkpoints and resume: test_checkpoints.py; the run folder: test_run_folder.py; NaN/inf: test_nonfinite.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TRAINING, tiny_config

from poslab.runs import load_run, read_metrics
from poslab.session import train
from poslab.training.config import TrainConfig
from poslab.training.evaluation import evaluate_loss
from poslab.training.optim import lr_at, make_optimizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def test_tiny_run_learns_and_writes_the_run_folder(make_config, corpus):
    cfg = make_config(TRAINING, max_steps=60, model=dict(dropout=0.0), eval_interval=30, log_interval=10)
    results = train(cfg, progress=False)
    run = cfg.run_dir
    for name in ("config.json", "tokenizer.json", "metrics.jsonl", "results.json", "peak.json", "checkpoints/latest"):
        assert (run / name).is_file(), name
    metrics = read_metrics(run)
    assert [r["step"] for r in metrics] == [10, 20, 30, 40, 50, 60]
    assert all({"step", "loss", "lr", "tokens_per_s"} <= set(r) for r in metrics)
    assert [r["step"] for r in metrics if "val_loss" in r] == [30, 60]
    first_loss = metrics[0]["loss"]
    assert first_loss > results["final_val_loss"] + 0.4, (first_loss, results["final_val_loss"])
    assert results["final_val_loss"] < math.log(results["vocab_size"]) - 0.5
    config = json.loads((run / "config.json").read_text())
    assert set(config) >= {"model", "train"} and config["model"]["vocab_size"] == results["vocab_size"]
    corpus_chars = len(Path(corpus).read_text(encoding="utf-8"))
    assert results["train_tokens"] + results["val_tokens"] == corpus_chars  # char-level: one token per character
    assert results["val_tokens"] == corpus_chars // 10  # a 10% validation split
    assert results["status"] == "completed" and results["steps"] == 60
    assert results["tokens_per_s"] > 0 and 0 < results["mfu"] < 1
    model, tokenizer, loaded_config = load_run(run)
    assert not model.training and loaded_config == config
    assert tokenizer.decode(tokenizer.encode("ROMEO")) == "ROMEO"


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"\x00\x01\x02binary", "binary"),
        (b"caf\xe9 au lait " * 10, "UTF-8"),
        (b"short text\n", "too short"),
    ],
    ids=["empty", "binary", "latin1", "short"],
)
def test_bad_corpus_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    cfg = tiny_config(tmp_path / "runs", str(path), TRAINING)
    with pytest.raises(ValueError, match=message):
        train(cfg, progress=False)
    assert not cfg.run_dir.exists()  # nothing half-made left behind


def test_block_size_past_the_learned_table_is_an_error(make_config):
    cfg = make_config(TRAINING, model=dict(position_config={"max_len": 8}))
    with pytest.raises(ValueError, match=r"block_size 16 is larger than the 'learned' position table \(8"):
        train(cfg, progress=False)


def test_config_rejects_typos_and_bad_types():
    with pytest.raises(ValueError, match="did you mean 'max_steps'"):
        TrainConfig.from_dict({"name": "x", "max_step": 3})
    with pytest.raises(ValueError, match=r"did you mean 'model\.n_head'"):
        TrainConfig(name="x", model={"n_heads": 2})
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        TrainConfig(name="x", batch_size=2.5)
    with pytest.raises(ValueError, match="dtype"):
        TrainConfig(name="x", dtype="fp16")
    with pytest.raises(ValueError, match="name"):
        TrainConfig(name="../escape")
    with pytest.raises(ValueError, match="vocab_size"):
        TrainConfig(name="x", model={"vocab_size": 10})
    assert TrainConfig(name="x", lr=1).lr == 1.0


def test_lr_schedule_and_weight_decay_groups():
    cfg = TrainConfig(name="x", lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(1e-3 / 11)
    assert lr_at(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert lr_at(110, cfg) == pytest.approx(1e-4)
    assert lr_at(500, cfg) == 1e-4
    wsd = TrainConfig(name="x", lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110, cooldown_steps=40)
    assert lr_at(9, wsd) == lr_at(9, cfg)  # the same warmup
    assert lr_at(10, wsd) == lr_at(70, wsd) == pytest.approx(1e-3)  # stable until 40 steps before the end
    assert lr_at(90, wsd) == pytest.approx(0.5 * (1e-3 + 1e-4))  # then linear to min_lr
    assert lr_at(110, wsd) == pytest.approx(1e-4) and lr_at(500, wsd) == 1e-4
    with pytest.raises(ValueError, match="cooldown_steps 101 must fit between warmup_steps 10 and lr_decay_steps 110"):
        TrainConfig(name="x", warmup_steps=10, max_steps=110, cooldown_steps=101)
    from poslab import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8))
    decay, no_decay = make_optimizer(model, cfg).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "blocks.0.attn.qkv.weight" in decayed and "tok_emb.weight" in decayed
    assert not any(n.endswith(".bias") or "norm" in n for n in decayed)
    assert {names[id(p)] for p in no_decay["params"]} >= {"blocks.0.attn.qkv.bias", "norm_f.weight"}


def test_grad_accumulation_matches_one_big_batch(make_config):
    big = make_config(TRAINING, name="big", max_steps=3, batch_size=8, model=dict(dropout=0.0), eval_interval=3)
    accum = make_config(
        TRAINING, name="accum", max_steps=3, batch_size=4, grad_accum=2, model=dict(dropout=0.0), eval_interval=3
    )
    train(big, progress=False)
    train(accum, progress=False)
    a, b = read_metrics(big.run_dir), read_metrics(accum.run_dir)
    for ra, rb in zip(a, b):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)


def test_bf16_autocast_trains(make_config):
    cfg = make_config(TRAINING, dtype="bf16", max_steps=8, eval_interval=8)
    results = train(cfg, progress=False)
    assert math.isfinite(results["final_val_loss"]) and results["dtype"] == "bf16"


def test_evaluate_loss_full_pass_and_fixed_batches():
    from poslab import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, n_layer=1, n_head=1, n_embd=8, block_size=4))
    data = torch.randint(0, 5, (41,))
    full = evaluate_loss(model, data, 4, 3, None)
    windows = data[:40].view(10, 4)  # [W, T]: the 10 non-overlapping windows
    targets = data[1:41].view(10, 4)  # [W, T]
    with torch.no_grad():
        _, expected = model(windows, targets)
    assert full == pytest.approx(expected.item(), rel=1e-6)
    assert evaluate_loss(model, data, 4, 2, 3, seed=5) == evaluate_loss(model, data, 4, 2, 3, seed=5)
    assert model.training  # mode restored


def test_bpe_run_saves_and_reuses_its_tokenizer(make_config):
    from poslab.nn.generate import sample_text

    cfg = make_config(TRAINING, tokenizer="bpe:300", max_steps=4, eval_interval=2, ckpt_interval=2)
    results = train(cfg, progress=False)
    assert results["vocab_size"] == 300
    assert results["train_tokens"] < 0.8 * 54_000  # merges learned on the training split compress it
    saved = (cfg.run_dir / "tokenizer.json").read_text()
    train(
        make_config(TRAINING, tokenizer="bpe:300", max_steps=6, eval_interval=2, ckpt_interval=2),
        resume=True,
        progress=False,
    )
    assert (cfg.run_dir / "tokenizer.json").read_text() == saved
    model, tokenizer, _ = load_run(cfg.run_dir)
    assert model.config.vocab_size == 300
    text = sample_text(model, tokenizer, "白日 ROMEO", 5, seed=0)[0]  # unseen characters: byte fallback
    assert text.startswith("白日 ROMEO")


def test_progress_bar_lines():
    import io

    from poslab.training.progress import ProgressBar, format_duration, format_rate

    stream = io.StringIO()  # not a terminal: plain lines, no carriage returns
    bar = ProgressBar(100, stream=stream)
    bar.update(50, loss=2.5, val_loss=2.75, tokens_per_s=21_345.0, force=True)
    bar.close("done: summary")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith(
        "step  50/100 [##########----------]  50% | loss 2.5000 | val 2.7500 | 21.3k tok/s | ETA"
    )
    assert lines[-1] == "done: summary" and "\r" not in stream.getvalue()
    assert (format_duration(75), format_duration(3725), format_rate(950)) == ("1m15s", "1h02m", "950")
    quiet = io.StringIO()
    silent = ProgressBar(10, stream=quiet, enabled=False)
    silent.update(5, loss=1.0, force=True)
    silent.close("summary only")
    assert quiet.getvalue() == "summary only\n"
