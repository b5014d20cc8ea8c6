"""Training loop, run folders, checkpoints, resume and the fault cases (fast: tiny models on a short corpus)."""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from poslab.runs import load_run, read_metrics
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig
from poslab.training.evaluation import evaluate_loss
from poslab.training.loop import TrainingDiverged
from poslab.training.optim import lr_at, make_optimizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


COMPARED = ("step", "loss", "lr", "grad_norm", "val_loss")  # everything but timings


def tiny(tmp_path, corpus, **overrides) -> TrainConfig:
    """:func:`conftest.tiny_config` of a 2-layer model with dropout, 24 steps; ``model=`` updates its model."""
    model = {**dict(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.1), **overrides.pop("model", {})}
    values = dict(
        max_steps=24,
        batch_size=4,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=4,
        eval_interval=8,
        eval_iters=2,
        ckpt_interval=10,
        seed=7,
    )
    return tiny_config(tmp_path / "runs", corpus, model=model, **{**values, **overrides})


def curve(run_dir) -> list[tuple]:
    return [tuple(r.get(k) for k in COMPARED) for r in read_metrics(run_dir)]


def test_tiny_run_learns_and_writes_the_run_folder(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, max_steps=60, model=dict(dropout=0.0), eval_interval=30, log_interval=10)
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


def test_resume_after_ctrl_c_is_bitwise_identical(tmp_path, corpus):
    reference = tiny(tmp_path, corpus, name="straight")
    train(reference, progress=False)

    cfg = tiny(tmp_path, corpus, name="interrupted")

    def interrupt(step, record):
        if step == 13:  # not a checkpoint step: Ctrl-C must save one
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, callback=interrupt)
    assert ckpt.latest_step(cfg.run_dir) == 13
    assert [r["step"] for r in read_metrics(cfg.run_dir)][-1] == 13
    assert not (cfg.run_dir / "results.json").exists()
    train(cfg, resume=True, progress=False)
    assert curve(cfg.run_dir) == curve(reference.run_dir)  # exact float equality, dropout included
    a, _, _ = load_run(reference.run_dir)
    b, _, _ = load_run(cfg.run_dir)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_resume_after_a_crash_replays_from_the_last_checkpoint(tmp_path, corpus):
    reference = tiny(tmp_path, corpus, name="straight", model=dict(dropout=0.0), grad_accum=2)
    train(reference, progress=False)
    cfg = tiny(tmp_path, corpus, name="crashed", model=dict(dropout=0.0), grad_accum=2)

    def crash(step, record):
        if step == 17:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        train(cfg, progress=False, callback=crash)
    assert ckpt.latest_step(cfg.run_dir) == 10
    with open(cfg.run_dir / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 18, "lo')  # a torn line from the kill
    train(cfg, resume=True, progress=False)
    assert curve(cfg.run_dir) == curve(reference.run_dir)


def test_sigint_saves_a_checkpoint_then_exits(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus)

    def press_ctrl_c(step, record):
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, callback=press_ctrl_c)
    assert ckpt.latest_step(cfg.run_dir) == 5
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_the_loop_checkpoints_through_the_checkpointer_it_is_given(tmp_path, corpus):
    """The checkpointer is injected: the loop saves through it (its own ``keep``, not the config's) and resumes
    from it."""
    from poslab.runs import RunFolder
    from poslab.training.checkpointer import Checkpointer
    from poslab.training.distributed import DistContext
    from poslab.training.loop import run_training

    class Recording(Checkpointer):
        def save(self, step, state, identity):
            saved.append(step)
            return super().save(step, state, identity)

        def restore(self, state, identity):
            restored.append(state.progress.step)
            return super().restore(state, identity)

    saved, restored = [], []

    def run_it(cfg, resuming: bool) -> dict:
        run = RunFolder(cfg.run_dir)
        with run.lock():
            run.prepare(resuming, False)
            return run_training(
                cfg, run, resuming=resuming, dist_ctx=DistContext(), progress=False, checkpointer=Recording(run, 1)
            )

    run_it(tiny(tmp_path, corpus, max_steps=12, ckpt_interval=5), resuming=False)
    assert saved == [5, 10, 12] and restored == []
    assert RunFolder(tiny(tmp_path, corpus).run_dir).checkpoints() == [12]  # keep_checkpoints=0 in the config
    assert run_it(tiny(tmp_path, corpus, max_steps=14, ckpt_interval=5), resuming=True)["resumed_from"] == 12
    assert saved == [5, 10, 12, 14] and restored == [0]


def test_existing_run_folder_is_refused_unless_resume_or_overwrite(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        train(cfg, progress=False)
    marker = cfg.run_dir / "results.json"
    before = marker.read_text()
    train(cfg, overwrite=True, progress=False)
    assert marker.read_text() != before  # a new run (new timings)
    assert not list(cfg.run_dir.parent.glob(".run.replaced-*"))
    (tmp_path / "runs" / "notarun").mkdir()
    (tmp_path / "runs" / "notarun" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="not a poslab run"):
        train(tiny(tmp_path, corpus, name="notarun"), overwrite=True, progress=False)
    assert (tmp_path / "runs" / "notarun" / "thesis.tex").read_text() == "precious"
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        train(tiny(tmp_path, corpus, name="never"), resume=True, progress=False)


def test_overwrite_that_fails_early_gives_the_old_run_back(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    bad = tiny(tmp_path, corpus, max_steps=4, model=dict(block_size=100_000))
    with pytest.raises(ValueError, match="too short"):
        train(bad, overwrite=True, progress=False)
    assert (cfg.run_dir / "results.json").is_file()
    load_run(cfg.run_dir)


def test_checkpoint_write_is_atomic(tmp_path, corpus, monkeypatch):
    cfg = tiny(tmp_path, corpus, max_steps=20, ckpt_interval=10)

    def crash_at_second_save(step, record):
        if step == 15:

            def broken_save(tensors, filename, metadata=None):
                with open(filename, "wb") as handle:
                    handle.write(b"half a file")
                raise OSError("disk full")

            monkeypatch.setattr(ckpt, "save_file", broken_save)

    with pytest.raises(OSError, match="disk full"):
        train(cfg, progress=False, callback=crash_at_second_save)
    folder = cfg.run_dir / "checkpoints"
    assert ckpt.latest_step(cfg.run_dir) == 10
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step_0000010.json", "step_0000010.safetensors"]
    load_run(cfg.run_dir)  # the previous checkpoint is intact


def test_corrupt_checkpoint_and_foreign_config_are_detected(tmp_path, corpus):
    a = tiny(tmp_path, corpus, name="a", max_steps=4, ckpt_interval=4)
    b = tiny(tmp_path, corpus, name="b", max_steps=4, ckpt_interval=4, model=dict(n_head=4, dropout=0.0))
    train(a, progress=False)
    train(b, progress=False)
    # a checkpoint copied in from another run: the error lists the keys that differ
    for suffix in (".json", ".safetensors"):
        src = b.run_dir / "checkpoints" / f"step_0000004{suffix}"
        (a.run_dir / "checkpoints" / f"step_0000004{suffix}").write_bytes(src.read_bytes())
    with pytest.raises(
        ckpt.CheckpointError, match=r"model\.dropout: 0\.0 \(checkpoint\) vs 0\.1.*model\.n_head: 4 \(checkpoint\) vs 2"
    ):
        load_run(a.run_dir)
    # a damaged tensor file
    tensors = b.run_dir / "checkpoints" / "step_0000004.safetensors"
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF
    tensors.write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        load_run(b.run_dir)
    with pytest.raises(ckpt.CheckpointError, match="available steps"):
        load_run(b.run_dir, step=3)


def test_resume_with_a_different_config_lists_the_keys(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    changed = tiny(tmp_path, corpus, max_steps=8, eval_interval=2, lr=1e-2, model=dict(n_embd=64))
    with pytest.raises(ValueError, match=r"model\.n_embd: 32.*vs 64.*train\.lr"):
        train(changed, resume=True, progress=False)
    longer = tiny(tmp_path, corpus, max_steps=8, eval_interval=2)  # max_steps may change
    assert train(longer, resume=True, progress=False)["steps"] == 8


def test_loading_never_unpickles(tmp_path, corpus, monkeypatch):
    cfg = tiny(tmp_path, corpus, max_steps=4, ckpt_interval=2)
    train(cfg, progress=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while loading")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_run(cfg.run_dir)
    train(tiny(tmp_path, corpus, max_steps=6, ckpt_interval=2), resume=True, progress=False)
    suffixes = {p.suffix for p in (cfg.run_dir / "checkpoints").iterdir()}
    assert suffixes == {".json", ".safetensors", ""}  # "" is the `latest` pointer


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, max_steps=30, ckpt_interval=10)

    def poison(step, record):
        if step == 14:
            model_param = poison.model_param
            with torch.no_grad():
                model_param.fill_(float("nan"))

    import poslab.training.loop as train_module

    original = train_module.make_optimizer

    def capture(model, c):
        poison.model_param = next(model.parameters())
        return original(model, c)

    train_module.make_optimizer = capture
    try:
        with pytest.raises(TrainingDiverged, match=r"diverged at step 15.*last good checkpoint is step 10"):
            train(cfg, progress=False, callback=poison)
    finally:
        train_module.make_optimizer = original
    assert ckpt.latest_step(cfg.run_dir) == 10
    results = json.loads((cfg.run_dir / "results.json").read_text())
    assert results["status"] == "diverged" and results["diverged_at_step"] == 15
    model, _, _ = load_run(cfg.run_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())


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
    cfg = tiny(tmp_path, str(path))
    with pytest.raises(ValueError, match=message):
        train(cfg, progress=False)
    assert not cfg.run_dir.exists()  # nothing half-made left behind


def test_block_size_past_the_learned_table_is_an_error(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, model=dict(position_config={"max_len": 8}))
    with pytest.raises(ValueError, match=r"block_size 16 is larger than the 'learned' position table \(8"):
        train(cfg, progress=False)


def test_config_rejects_typos_and_bad_types(tmp_path, corpus):
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


def test_grad_accumulation_matches_one_big_batch(tmp_path, corpus):
    big = tiny(tmp_path, corpus, name="big", max_steps=3, batch_size=8, model=dict(dropout=0.0), eval_interval=3)
    accum = tiny(
        tmp_path,
        corpus,
        name="accum",
        max_steps=3,
        batch_size=4,
        grad_accum=2,
        model=dict(dropout=0.0),
        eval_interval=3,
    )
    train(big, progress=False)
    train(accum, progress=False)
    a, b = read_metrics(big.run_dir), read_metrics(accum.run_dir)
    for ra, rb in zip(a, b):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)


def test_bf16_autocast_trains(tmp_path, corpus):
    cfg = tiny(tmp_path, corpus, dtype="bf16", max_steps=8, eval_interval=8)
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


def test_bpe_run_saves_and_reuses_its_tokenizer(tmp_path, corpus):
    from poslab.nn.generate import sample_text

    cfg = tiny(tmp_path, corpus, tokenizer="bpe:300", max_steps=4, eval_interval=2, ckpt_interval=2)
    results = train(cfg, progress=False)
    assert results["vocab_size"] == 300
    assert results["train_tokens"] < 0.8 * 54_000  # merges learned on the training split compress it
    saved = (cfg.run_dir / "tokenizer.json").read_text()
    train(
        tiny(tmp_path, corpus, tokenizer="bpe:300", max_steps=6, eval_interval=2, ckpt_interval=2),
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
