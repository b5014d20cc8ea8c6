"""poslab's training loop is nanoGPT's, step for step.

``benchmarks/nanogpt_control.py`` re-writes nanoGPT's model and loop plainly (no poslab code). Given
the same initial weights and the same batches, ``poslab.training.loop`` and that loop must produce the same
losses at every step and the same weights at the end, to float rounding: same architecture (tied
embeddings, bias-free LayerNorm, exact GELU, depth-scaled init), same AdamW groups and betas, same
warmup + cosine schedule, same clipping. This is what makes the shakespeare_char recipe comparison in
``benchmarks/nanogpt_recipe.py`` about seeds and evaluation, not about a different optimizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.data import get_batch, load_corpus
from poslab.runs import load_run
from poslab.session import train
from poslab.training.config import TrainConfig
from poslab.training.data import data_seed, prepare_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from nanogpt_control import TinyGPT, nanogpt_lr, nanogpt_optimizer, nanogpt_update  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)

LAYERS, HEADS, WIDTH, BLOCK, BATCH, STEPS, WARMUP = 2, 2, 32, 16, 4, 24, 6
NAMES = {"wte.weight": "tok_emb.weight", "wpe.weight": "position.table.weight", "ln_f.weight": "norm_f.weight"}
for _i in range(LAYERS):
    for _ours, _theirs in (
        ("ln1", "norm1"),
        ("qkv", "attn.qkv"),
        ("out", "attn.proj"),
        ("ln2", "norm2"),
        ("up", "mlp.up"),
        ("down", "mlp.down"),
    ):
        NAMES[f"blocks.{_i}.{_ours}.weight"] = f"blocks.{_i}.{_theirs}.weight"


def test_train_equals_nanogpt_loop(tmp_path):
    corpus = tmp_path / "shakespeare_30k.txt"
    corpus.write_text(load_corpus("shakespeare")[:30_000], encoding="utf-8")
    cfg = TrainConfig.from_dict(
        {
            "name": "run",
            "out_dir": str(tmp_path / "runs"),
            "corpus": str(corpus),
            "seed": 7,
            "model": {
                "n_layer": LAYERS,
                "n_head": HEADS,
                "n_embd": WIDTH,
                "block_size": BLOCK,
                "dropout": 0.0,
                "bias": False,
                "position": "learned",
                "mlp": {"activation": "gelu"},
            },
            "max_steps": STEPS,
            "lr_decay_steps": STEPS,
            "batch_size": BATCH,
            "lr": 1e-3,
            "min_lr": 1e-4,
            "warmup_steps": WARMUP,
            "beta2": 0.99,
            "weight_decay": 0.1,
            "grad_clip": 1.0,
            "eval_interval": 1000,
            "eval_iters": 1,
            "log_interval": 1,
            "ckpt_interval": 0,
        }
    )
    data = prepare_data(cfg)

    # nanoGPT's side: the weights poslab starts from (train() seeds, then builds the GPT), its batches
    torch.manual_seed(cfg.seed)
    start = GPT(GPTConfig.from_dict({**cfg.to_dict()["model"], "vocab_size": data.tokenizer.vocab_size})).state_dict()
    reference = TinyGPT(data.tokenizer.vocab_size, BLOCK, LAYERS, HEADS, WIDTH)
    weights = {ours: start[theirs] for ours, theirs in NAMES.items()}
    reference.load_state_dict({**weights, "head.weight": weights["wte.weight"]})  # tied: one tensor
    optimizer = nanogpt_optimizer(reference, weight_decay=0.1, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(data_seed(cfg.seed))
    reference_losses = []
    for it in range(STEPS):
        x, y = get_batch(data.train, BLOCK, BATCH, generator)  # [B, T] x2
        lr = nanogpt_lr(it, lr=1e-3, min_lr=1e-4, warmup=WARMUP, decay_iters=STEPS)
        reference_losses.append(nanogpt_update(reference, optimizer, x, y, lr))

    train(cfg, progress=False)
    lines = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses), rtol=0, atol=1e-5)
    assert losses[-1] < losses[0] - 0.2  # it trained: the comparison is not between two idle models

    model, _, _ = load_run(cfg.run_dir)
    trained = model.state_dict()
    for ours, theirs in NAMES.items():
        torch.testing.assert_close(reference.state_dict()[ours], trained[theirs], rtol=1e-4, atol=1e-5, msg=ours)
