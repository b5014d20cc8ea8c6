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
# # 11 · 多头注意力与位置编码 / Lesson 11: multi-head attention and position encodings
#
# 本笔记本逐节运行课文 `../shared/seeds/000_*.txt` 的实验，所有数字都在这里现算。
# 中文导读：`docs/zh/lesson_000.md`。
#
# This notebook runs the lesson's experiments section by section; every number below is computed
# when the notebook runs (nothing is stored in it). Guide: `docs/zh/lesson_000.md`.
#
# 运行 / Run: `jupytext --to ipynb notebooks/lesson_000_multihead_positions.py` then open it, or
# `python notebooks/lesson_000_multihead_positions.py`.

# %% [markdown]
# ## 参数 / Parameters
#
# `POSLAB_NOTEBOOK_SMALL=1`（测试用）把训练缩到几秒钟；默认设置在笔记本电脑 CPU 上几分钟跑完。
#
# `POSLAB_NOTEBOOK_SMALL=1` (the test suite sets it) shrinks the trainings to seconds; the default
# settings take a few minutes on a laptop CPU.

# %%
import math
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import poslab
from poslab import positions
from poslab.lab.experiments import run_experiment

SMALL = os.environ.get("POSLAB_NOTEBOOK_SMALL") == "1"
STEPS = 20 if SMALL else 600  # training steps per model (§3.5)
TRAIN_LEN = 32  # the training length L of §3.5's models
# every result of this notebook goes here (POSLAB_NOTEBOOK_OUT, or a fresh temporary folder)
OUT = Path(os.environ.get("POSLAB_NOTEBOOK_OUT") or tempfile.mkdtemp(prefix="poslab-nb-000-"))
OUT.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
print("results in", OUT, "| small settings:", SMALL)

# %% [markdown]
# ## 1.2 形状推导 / The multi-head shape walk
#
# 在真实的 `MultiHeadAttention` 上挂钩子，记录每一步的形状，和课文的推导逐行对比。
#
# Hooks on the real module record each shape, compared row by row with the lesson's derivation.

# %%
shapes = run_experiment("shapes", out=OUT / "shapes")

# %% [markdown]
# ## 1.3 参数量验证 / Parameter count
#
# 课文的脚本对比的是 1 个 `Linear` 和 4 个 `Linear`（4.0x）；多头与单头的注意力层都是 $4d^2+4d$。
#
# The lesson's script compares one `Linear` with four (4.0x); single- and multi-head attention layers
# both have $4d^2+4d$ parameters.

# %%
params = run_experiment("params", out=OUT / "params")
for h in (1, 2, 4, 8, 16):
    attn = poslab.MultiHeadAttention(512, h)
    print(f"h={h:>2}  d_k={512 // h:>3}  parameters={sum(p.numel() for p in attn.parameters()):,}")

# %% [markdown]
# ## 1.4 与 Q3：$d_k$ 越大点积方差越大？ / Does a larger $d_k$ give a larger dot-product variance?
#
# 未缩放的 $q\cdot k$ 方差等于 $d_k$；除以 $\sqrt{d_k}$ 之后方差是 1，与 $d_k$ 无关。
#
# Unscaled, $\mathrm{Var}(q\cdot k) = d_k$; divided by $\sqrt{d_k}$ it is 1 whatever $d_k$.

# %%
dims = [16, 32, 64, 128, 256, 512]
raw, scaled = [], []
for d_k in dims:
    q, k = torch.randn(20000, d_k), torch.randn(20000, d_k)
    dot = (q * k).sum(-1)
    raw.append(dot.var().item())
    scaled.append((dot / math.sqrt(d_k)).var().item())
    print(f"d_k={d_k:>3}  Var(q.k)={raw[-1]:8.2f}  Var(q.k/sqrt(d_k))={scaled[-1]:.3f}")
fig, ax = plt.subplots(figsize=(5, 3))
ax.loglog(dims, raw, "o-", label="q·k")
ax.loglog(dims, scaled, "s-", label="q·k / √d_k")
ax.set_xlabel("d_k")
ax.set_ylabel("variance")
ax.legend()
plt.show()

# %% [markdown]
# ## 1.4 与 Q3：「几乎所有 LLM 的 $d_k$ 都是 64 或 128」 / "d_k is almost always 64 or 128"
#
# 39 个开源模型的 `config.json`（随 poslab 一起发布）。
#
# 39 open models' `config.json` head geometry, shipped with poslab.

# %%
zoo = run_experiment("model-zoo", out=OUT / "model-zoo")

# %% [markdown]
# ## 2.1 与实验 3：注意力是置换等变的 / Attention is permutation-equivariant
#
# 打乱输入、还原输出：没有位置编码时差异只有浮点误差；每种位置编码都打破它。
#
# Shuffle the input, un-shuffle the output: without positions the difference is float noise; every
# position scheme breaks it.

# %%
perm = run_experiment("permutation", out=OUT / "permutation")

# %% [markdown]
# ## 3.2 二维旋转 → 复数乘法 → 只依赖位置差 / 2-D rotation → complex multiplication → the offset
#
# 把 $q=(q_0,q_1)$ 看成复数 $z_q=q_0+iq_1$。旋转矩阵 $R_m$ 作用在 $q$ 上，等于乘 $e^{im\theta}$：
# $R_m q \leftrightarrow z_q e^{im\theta}$。两个二维向量的内积是
# $\langle a,b\rangle=\mathrm{Re}(z_a\overline{z_b})$，所以
#
# $$\langle R_m q, R_n k\rangle=\mathrm{Re}\big(z_q e^{im\theta}\,\overline{z_k e^{in\theta}}\big)
# =\mathrm{Re}\big(z_q\overline{z_k}\,e^{i(m-n)\theta}\big)=\langle q, R_{n-m}k\rangle ,$$
#
# 只依赖 $m-n$（取共轭让 $e^{in\theta}$ 变成 $e^{-in\theta}$；少了 Re 或共轭，这个式子就不成立）。
# $d$ 维时每一对 $(2i, 2i+1)$ 是一个复数、用自己的 $\theta_i$，内积是各对之和：
# $\mathrm{Re}\sum_i z_{q,i}\overline{z_{k,i}}\,e^{i(m-n)\theta_i}$。
# 下面一格逐步算出每一个等号两边的差。
#
# Read $q$ as the complex number $z_q$: the rotation $R_m$ is multiplication by $e^{im\theta}$, the inner product is
# $\mathrm{Re}(z_a\overline{z_b})$, so the rotated inner product is
# $\mathrm{Re}(z_q\overline{z_k}e^{i(m-n)\theta})$: a function of $m-n$ only.
# The cell below computes both sides of every step.
#
# 自己写 `apply_rope` 并检查：`poslab check apply-rope my_rope.py`
# （`poslab check apply-rope --template` 打印起始文件）。

# %%
torch.manual_seed(0)
theta = 0.3
q2, k2 = torch.randn(2, dtype=torch.float64), torch.randn(2, dtype=torch.float64)


def rotation(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=torch.float64)


def as_complex(v: torch.Tensor) -> complex:
    return complex(v[0].item(), v[1].item())


m, n = 7, 3
step1 = abs(as_complex(rotation(m * theta) @ q2) - as_complex(q2) * complex(math.cos(m * theta), math.sin(m * theta)))
print(f"1. R_m q  vs  z_q e^(i m θ):                    |difference| = {step1:.1e}")
step2 = abs(float(q2 @ k2) - (as_complex(q2) * as_complex(k2).conjugate()).real)
print(f"2. <q, k>  vs  Re(z_q conj(z_k)):               |difference| = {step2:.1e}")
lhs = float((rotation(m * theta) @ q2) @ (rotation(n * theta) @ k2))
turn = complex(math.cos((m - n) * theta), math.sin((m - n) * theta))  # e^(i(m-n)θ)
closed = (as_complex(q2) * as_complex(k2).conjugate() * turn).real
step3 = abs(lhs - closed)
step3b = abs(lhs - float(q2 @ (rotation((n - m) * theta) @ k2)))
print(f"3. <R_m q, R_n k> = {lhs:.6f}  vs  Re(z_q conj(z_k) e^(i(m-n)θ)): {step3:.1e}")
print(f"   <R_m q, R_n k>  vs  <q, R_(n-m) k>:             |difference| = {step3b:.1e}")
same_offset = [float((rotation(a * theta) @ q2) @ (rotation((a - (m - n)) * theta) @ k2)) for a in (0, 5, 50, 500)]
print(f"   the same offset m-n = {m - n} at m = 0, 5, 50, 500: {[f'{v:.6f}' for v in same_offset]}")

# d dimensions: pairs (2i, 2i+1) as complex numbers, against poslab's rope (interleaved pairing)
d = 16
qd, kd = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
rope_il = positions.build("rope", head_dim=d, layout="interleaved")
thetas = rope_il.inv_freq.double()  # θ_i = base^(-2i/d)
zq = torch.view_as_complex(qd.double().reshape(d // 2, 2))
zk = torch.view_as_complex(kd.double().reshape(d // 2, 2))
worst = 0.0
for m, n in ((0, 0), (10, 3), (3, 10), (100, 93), (400, 17)):
    qr, kr = rope_il.rotate(qd, kd, torch.tensor([m]), torch.tensor([n]))
    formula = (zq * zk.conj() * torch.exp(1j * (m - n) * thetas)).sum().real.item()
    worst = max(worst, abs((qr * kr).sum().item() - formula))
print(f"4. d = {d}: poslab rope (interleaved) vs Re Σ z_q,i conj(z_k,i) e^(i(m-n)θ_i): max |diff| {worst:.1e} (fp32)")
assert max(step1, step2, step3, step3b) < 1e-12 and worst < 1e-5  # every equality of the derivation holds


# %% [markdown]
# ## 3.4 RoPE 的相对位置性质 / RoPE's relative property
#
# 同一对 $(q, k)$ 放在不同位置，内积只依赖位置差。poslab 的 `rope` 与课文的 `apply_rope` 逐位对比。
#
# The same $(q, k)$ at different positions: the inner product depends only on the offset.

# %%
rel = run_experiment("rope-relative", out=OUT / "rope-relative")

# %%
torch.manual_seed(0)
d = 16
q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
offsets = torch.arange(0, 64)
fig, ax = plt.subplots(figsize=(6, 3))
for name, build in (("rope", lambda: positions.build("rope", head_dim=d)),):
    scheme = build()
    for start in (0, 50, 100):
        values = []
        for off in offsets.tolist():
            qr, kr = scheme.rotate(q, k, torch.tensor([start]), torch.tensor([start + off]))
            values.append((qr * kr).sum().item())
        ax.plot(offsets, values, label=f"{name}, q at position {start}")
ax.set_xlabel("offset n - m")
ax.set_ylabel("<R_m q, R_n k>")
ax.legend()
ax.set_title("three starting positions, one curve: only the offset matters")
plt.show()

# %% [markdown]
# ## 实验 4：频率的指数结构 / The frequencies' geometric structure
#
# 下图：每种 RoPE 缩放把每一维的波长拉长多少（PI 全部 ×4；NTK 高频不动、低频 ×4；YaRN 分段）。
#
# Below: how much each RoPE scaling stretches each dimension pair's wavelength.

# %%
freq = run_experiment("frequencies", out=OUT / "frequencies")

# %%
from IPython.display import Image, display  # noqa: E402

display(Image(filename=str(OUT / "frequencies" / "rope_scaling_spectrum.png")))

# %% [markdown]
# ## 3.5 与 Q4：NTK-aware 改的是哪一头？ / NTK-aware: which end does it change?
#
# 课文说「保持低频、插值高频」「减小 base」。实测：NTK 把 base **增大**，高频不动，低频被插值。
#
# The lesson says NTK keeps the low frequencies, interpolates the high ones and lowers the base.
# Measured: the base goes **up**, the highest frequency is kept, the lowest is interpolated.

# %%
plain = positions.build("rope", head_dim=128)
ntk = positions.build("rope", head_dim=128, scaling="ntk", factor=4.0)
ratio = plain.inv_freq / ntk.inv_freq  # [64]: wavelength stretch per pair
print(f"base after NTK s=4: {10000 * 4.0 ** (128 / 126):.0f} (raised)")
print(f"pair 0 (highest frequency) stretch {ratio[0].item():.4f}; pair 63 (lowest) stretch {ratio[-1].item():.4f}")
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(ratio.numpy())
ax.set_xlabel("dimension pair i (0 = highest frequency)")
ax.set_ylabel("wavelength stretch")
ax.set_title("NTK-aware, s = 4")
plt.show()

# %% [markdown]
# ## 4 ALiBi：偏置的符号 / ALiBi: the bias's sign
#
# 课文写 $j\le i$ 时偏置为 0、$j>i$ 时为 $-\alpha(i-j)$（未来位置得到正偏置）。论文：过去的 key 得到 $-m(i-j)$。
#
# The lesson puts 0 on past keys and $-\alpha(i-j)$ (a positive value) on future keys; the paper puts
# $-m(i-j)$ on past keys.
#
# 自己写偏置矩阵并检查 / write it yourself and check it: `poslab check alibi-bias my_alibi.py`.

# %%
alibi = positions.build("alibi", n_heads=8)
print("slopes (8 heads):", [f"2^{math.log2(s):.0f}" for s in alibi.slopes.tolist()])
T = 8
pos = torch.arange(T)
q = k = torch.zeros(1, 8, T, 4)
bias = alibi.score_bias(q, k, pos, pos, 1.0).reshape(-1, T, T)[0]  # head 0: [T, T]
i, j = pos[:, None], pos[None, :]
lesson = torch.where(j <= i, torch.zeros(T, T), -alibi.slopes[0] * (i - j).float())  # the lesson's formula
fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
for ax, m, title in ((axes[0], bias, "poslab (paper), head 0"), (axes[1], lesson, "lesson §4, head 0")):
    im = ax.imshow(m, cmap="coolwarm", vmin=-3.5, vmax=3.5)
    ax.set_title(title)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
fig.colorbar(im, ax=axes)
plt.show()

# %% [markdown]
# ## 3.5 外推：训练长度之外 / Past the training length
#
# 训练三个小模型（RoPE、ALiBi、无位置编码）于长度 L，在 1×、2×、4× L 上测验证损失。
# 这是 `poslab experiment extrapolation --quick` 的缩小版；完整结果见报告的 extrapolation 一节。
#
# Three small models (RoPE, ALiBi, none) trained at length L, validation loss at 1x, 2x and 4x L:
# a reduced `poslab experiment extrapolation --quick`. The numbers vary with the machine and the steps.

# %%
from poslab.data import load_text, split_text  # noqa: E402
from poslab.runs import load_run  # noqa: E402
from poslab.session import train  # noqa: E402
from poslab.training.config import TrainConfig  # noqa: E402


def train_small(name: str, position: str, steps: int = STEPS, **model) -> tuple[Path, list[float]]:
    """Train a 2-layer GPT on tinyshakespeare for ``steps`` steps; its run folder and loss curve."""
    curve: list[float] = []
    cfg = TrainConfig(
        name=name,
        out_dir=str(OUT / "runs"),
        corpus="shakespeare",
        model={"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": TRAIN_LEN, "position": position, **model},
        max_steps=steps,
        batch_size=16,
        lr=3e-3,
        warmup_steps=min(50, steps // 4),
        eval_interval=steps,
        eval_iters=4,
        log_interval=steps,
        threads=1,
        seed=0,
    )
    train(cfg, progress=False, callback=lambda step, rec: curve.append(rec["loss"]))
    return OUT / "runs" / name, curve


_, val_text = split_text(load_text("shakespeare"), 0.1)


@torch.no_grad()
def val_loss(run: Path, length: int, windows: int = 8) -> float:
    """Mean next-token loss over ``windows`` validation windows of ``length`` tokens (the model may exceed L)."""
    model, tok, _ = load_run(run)
    model.eval()
    ids = torch.tensor(tok.encode(val_text[: windows * (length + 1) + 1]))
    losses = []
    for w in range(windows):
        chunk = ids[w * length : w * length + length + 1]  # [length + 1]
        logits = model(chunk[None, :-1])  # [1, length, V]
        losses.append(torch.nn.functional.cross_entropy(logits[0].float(), chunk[1:]).item())
    return sum(losses) / len(losses)


lengths = [TRAIN_LEN, 2 * TRAIN_LEN, 4 * TRAIN_LEN]
table = {}
for scheme in ("rope", "alibi", "none"):
    run, _ = train_small(f"extrap-{scheme}", scheme)
    table[scheme] = [val_loss(run, n) for n in lengths]
    print(scheme, " ".join(f"{n}: {v:.3f}" for n, v in zip(lengths, table[scheme], strict=True)))
fig, ax = plt.subplots(figsize=(5, 3))
for scheme, values in table.items():
    ax.plot(lengths, values, "o-", label=scheme)
ax.axvline(TRAIN_LEN, color="grey", ls=":")
ax.set_xscale("log", base=2)
ax.set_xlabel("evaluation length (tokens)")
ax.set_ylabel("validation loss (nats)")
ax.legend()
plt.show()

# %% [markdown]
# ## 自测题 / Self-test
#
# - **Q1**：参数量相同（上面的 1.3 节），「多」在于 h 张独立的注意力图：`poslab heads RUN` 给训练好的模型每个头分类。
# - **Q2**：RoPE 的内积只依赖位置差（3.4 节的曲线重合）；加位置向量的方案不满足（`rope-relative` 表中的 learned /
#   sinusoidal 行 FAIL）。
# - **Q3**：$d_k$ 不都是 64/128（model-zoo 的 claims 表）；缩放后方差与 $d_k$ 无关（1.4 节）。
# - **Q4**：外推会退化（上一节的曲线，RoPE 在 L 之外变差）；NTK 是增大 base（3.5 节）。
#
# Q1-Q4 answered with the measurements above; the guide `docs/zh/lesson_000.md` gives the commands for
# the full-size versions.
