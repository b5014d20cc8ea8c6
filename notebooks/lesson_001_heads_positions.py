# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 「多頭注意力和位置編碼」 / Multi-head attention and position encodings (lesson 001)
#
# 课文 `../shared/seeds/001_*.txt` 的 `heads_positions.py`、练习 1-3 和自测，在 poslab 上逐一运行。
# 中文导读：`docs/zh/lesson_001.md`。所有数字在运行时现算。
#
# The lesson's `heads_positions.py`, exercises 1-3 and self-test, run on poslab. Every number is
# computed when the notebook runs. Guide: `docs/zh/lesson_001.md`.

# %% [markdown]
# ## 参数 / Parameters
#
# `POSLAB_NOTEBOOK_SMALL=1`（测试用）：几秒钟的训练。默认：课文的宽度 n_embd 128，每个模型几百步。
#
# `POSLAB_NOTEBOOK_SMALL=1` (the tests): trainings of seconds. Default: the lesson's width, n_embd 128,
# a few hundred steps per model.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import poslab
from poslab.data import build_tokenizer, load_text
from poslab.lab.experiments import run_experiment
from poslab.session import train
from poslab.training.config import TrainConfig

SMALL = os.environ.get("POSLAB_NOTEBOOK_SMALL") == "1"
STEPS = 10 if SMALL else 250  # training steps per model (exercises 2 and 3)
N_EMBD = 32 if SMALL else 128  # the lesson keeps n_embd 128
BATCH = 4 if SMALL else 16  # sequences per step
# every result of this notebook goes here (POSLAB_NOTEBOOK_OUT, or a fresh temporary folder)
OUT = Path(os.environ.get("POSLAB_NOTEBOOK_OUT") or tempfile.mkdtemp(prefix="poslab-nb-001-"))
OUT.mkdir(parents=True, exist_ok=True)
print("results in", OUT, "| small settings:", SMALL)

# %% [markdown]
# ## 多头：32 维切成 4 个头 / 32 dimensions in 4 heads of 8
#
# 课文打印的形状和参数（qkv 3168、proj 1056，与头数无关），在 poslab 的 `MultiHeadAttention(32, h)` 上。
#
# The lesson's shapes and parameter counts (qkv 3168, proj 1056 for any head count).
#
# 自己写拆头与拼头并检查 / write the split and the merge yourself and check them:
# `poslab check split-heads my_heads.py`、`poslab check merge-heads my_heads.py`（`--template` 打印起始文件）。

# %%
for h in (1, 2, 4, 8):
    attn = poslab.MultiHeadAttention(32, h)
    qkv = sum(p.numel() for p in attn.qkv.parameters())
    proj = sum(p.numel() for p in attn.proj.parameters())
    print(f"heads={h}  head dim={32 // h:>2}  qkv={qkv}  proj={proj}")
x = torch.randn(1, 5, 32)  # (sentences, characters, dims)
q = x.view(1, 5, 4, 8).transpose(1, 2)  # [1, 5, 32] -> [1, 4, 5, 8]: (sentences, heads, characters, head dim)
print("split into heads", tuple(q.shape), "| scores", tuple((q @ q.transpose(-2, -1)).shape))

# %% [markdown]
# ## 注意力分不清顺序 / Attention cannot tell the order
#
# 「白日依山尽」对「山依日白尽」：最后一个位置的输出差多少。1 层没有位置时只剩浮点误差；
# 2 层起因果掩码泄露了顺序。表中的 3 层一行就是**练习 1** 的答案。
#
# '白日依山尽' vs '山依日白尽': one layer without positions gives float noise; from two layers on the
# causal mask leaks the order. The 3-layer row answers **exercise 1**.
#
# 自己做这个实验并检查 / run the experiment yourself and check it: `poslab check causal-leak my_leak.py`。

# %%
leak = run_experiment("causal-leak", out=OUT / "causal-leak")

# %%
tok = build_tokenizer("char", load_text("tang5"))
diffs = {}
for layers in (1, 2, 3):
    torch.manual_seed(0)
    model = poslab.GPT(
        poslab.GPTConfig(
            vocab_size=tok.vocab_size, n_layer=layers, n_head=4, n_embd=128, block_size=128, position="none"
        )
    ).eval()
    with torch.no_grad():
        a = model(torch.tensor([tok.encode("白日依山尽")]))[0, -1]
        b = model(torch.tensor([tok.encode("山依日白尽")]))[0, -1]
    diffs[layers] = (a - b).abs().max().item()
    print(f"{layers} layer(s), no positions: max |difference| = {diffs[layers]:.1e}")
fig, ax = plt.subplots(figsize=(4, 3))
ax.bar([str(n) for n in diffs], list(diffs.values()))
ax.set_yscale("log")
ax.set_xlabel("layers (no position encoding)")
ax.set_ylabel("max |logit difference|")
plt.show()

# %% [markdown]
# ## 练习 2：1、4、8 个头 / Exercise 2: 1, 4 and 8 heads
#
# 同样的 GPT（n_embd 不变），只改头数，训练同样的步数，比较验证损失。一个种子、几百步的差别通常在噪声之内：
# 要下结论，用 `poslab experiment heads --quick`（3 个种子，报告给出 95% 区间）。
#
# The same GPT with 1, 4 and 8 heads, the same steps. One seed and a few hundred steps usually sit
# inside the noise: `poslab experiment heads --quick` decides it over 3 seeds with a 95% interval.


# %%
def train_small(name: str, steps: int = STEPS, **model) -> tuple[dict, list[float]]:
    """Train a 2-layer GPT on the five-character Tang poems; its results and loss curve."""
    curve: list[float] = []
    cfg = TrainConfig(
        name=name,
        out_dir=str(OUT / "runs"),
        corpus="tang5",
        model={"n_layer": 2, "n_head": 4, "n_embd": N_EMBD, "block_size": 64, "position": "learned", **model},
        max_steps=steps,
        batch_size=BATCH,
        lr=2e-3,
        warmup_steps=min(50, steps // 4),
        eval_interval=steps,
        eval_iters=2 if SMALL else 8,
        log_interval=steps,
        threads=1,
        seed=0,
    )
    results = train(cfg, progress=False, callback=lambda step, rec: curve.append(rec["loss"]))
    return results, curve


fig, ax = plt.subplots(figsize=(6, 3))
for heads in (1, 4, 8):
    results, curve = train_small(f"heads-{heads}", n_head=heads)
    print(f"{heads} head(s): final val loss {results['final_val_loss']:.4f}")
    ax.plot(curve, label=f"{heads} head(s)")
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.legend()
plt.show()

# %% [markdown]
# ## 练习 3：RoPE 替换 pos_emb / Exercise 3: RoPE instead of pos_emb
#
# poslab 的 GPT 用 `position="rope"` 在每层旋转 q、k，且没有 `pos_emb` 表；`"learned"` 是 GPT-2 的表，
# `"none"` 什么也不加。
#
# `position="rope"` rotates q and k in every layer and has no `pos_emb` table; `"learned"` is GPT-2's
# table; `"none"` adds nothing.

# %%
fig, ax = plt.subplots(figsize=(6, 3))
for scheme in ("learned", "rope", "none"):
    results, curve = train_small(f"pos-{scheme}", position=scheme)
    model = poslab.GPT(
        poslab.GPTConfig(vocab_size=100, n_layer=2, n_head=4, n_embd=N_EMBD, block_size=64, position=scheme)
    )
    table = sum(p.numel() for name, p in model.named_parameters() if name.startswith("position."))
    print(f"{scheme:>7}: final val loss {results['final_val_loss']:.4f}  position parameters: {table:,}")
    ax.plot(curve, label=scheme)
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.legend()
plt.show()

# %% [markdown]
# ## 自测 / Self-test
#
# 1. 多头不增加参数：第一节的表（qkv 3168、proj 1056，头数 1/2/4/8 都一样）。
# 2. 注意力需要位置：1 层、无位置时差异只有浮点误差（第二节）。
# 3. 2 层无位置也能分辨：因果掩码泄露顺序（第二节，2 层和 3 层的差异远大于浮点误差）。
#
# Answers with the measurements above; `docs/zh/lesson_001.md` has the full-size commands.
