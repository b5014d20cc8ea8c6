"""Control for ``nanogpt_recipe.py``: nanoGPT's model and training loop, re-written plainly here.

The shakespeare_char CPU recipe is said to reach val loss 1.88. To know whether a gap is poslab's or
the recipe's on this machine and data, this script trains the same network the way nanoGPT's
``train.py`` does (one global RNG: seed, init, random batches and random evaluation batches all from
``torch.manual_seed(seed)``; GPT-2 init with depth-scaled residual projections; tied embeddings;
LayerNorm without bias; AdamW(0.9, 0.99) with decay on 2-D tensors; warmup 100 then cosine to 1e-4;
clip 1.0), on poslab's shipped tinyshakespeare with the same 90/10 split and 65-character vocabulary.
It shares no model or training code with poslab.

    .venv/bin/python benchmarks/nanogpt_control.py --seeds 1337 1 2

``--no-full-split`` ends with the loop, as nanoGPT's ``train.py`` does: ``time_to_loss.py --whole-process``
times this script as a process from launch to exit that way.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from poslab.data import build_tokenizer, encode_corpus, load_text, split_text


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.drop = nn.Dropout(dropout)
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # [B, T, C] x3
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # [B, h, T, hd]
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # [B, h, T, hd]
        x = x + self.drop(self.out(y.transpose(1, 2).reshape(B, T, C)))  # [B, T, C]
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)))))


class TinyGPT(nn.Module):
    """nanoGPT's GPT; ``dropout`` where nanoGPT applies it (embeddings, attention weights, both residual branches)."""

    def __init__(self, vocab: int, block: int, layers: int, heads: int, d: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.head.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
        for name, p in self.named_parameters():
            if name.endswith(("out.weight", "down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # [B, T, V]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def nanogpt_optimizer(
    model: nn.Module, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.99)
) -> torch.optim.AdamW:
    """nanoGPT's ``configure_optimizers`` on CPU: decay on 2-D tensors, none on the rest, and the
    default per-tensor-loop AdamW (nanoGPT asks for the fused kernel on CUDA only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-3, betas=betas, foreach=False)


def nanogpt_lr(it: int, lr: float = 1e-3, min_lr: float = 1e-4, warmup: int = 100, decay_iters: int = 2000) -> float:
    """nanoGPT's ``get_lr``: linear warmup, cosine to ``min_lr`` at ``decay_iters``, then ``min_lr``."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def nanogpt_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    grad_clip: float = 1.0,
) -> float:
    """One iteration of nanoGPT's loop (no accumulation): set lr, forward, backward, clip, step. Returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def run(seed: int, args: argparse.Namespace, train_ids: torch.Tensor, val_ids: torch.Tensor, vocab: int) -> dict:
    torch.manual_seed(seed)
    block, batch = args.block, args.batch
    model = TinyGPT(vocab, block, args.layers, args.heads, args.d)
    opt = nanogpt_optimizer(model)

    def get_batch(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([data[i : i + block] for i in ix])  # [B, T]
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])  # [B, T]
        return x, y

    @torch.no_grad()
    def estimate(data: torch.Tensor) -> float:
        model.eval()
        loss = sum(model(*get_batch(data)).item() for _ in range(args.eval_iters)) / args.eval_iters
        model.train()
        return loss

    start = time.perf_counter()
    train_time = 0.0  # the iterations only (batch, forward, backward, clip, update), not the estimates
    for it in range(args.iters + 1):
        if it % 250 == 0 or it == args.iters:
            tr, va = estimate(train_ids), estimate(val_ids)
            print(f"  seed {seed} step {it}: train {tr:.4f} val {va:.4f}", flush=True)
        if it == args.iters:
            break
        step_start = time.perf_counter()
        nanogpt_update(model, opt, *get_batch(train_ids), nanogpt_lr(it, decay_iters=args.iters))
        train_time += time.perf_counter() - step_start
    wall = time.perf_counter() - start
    row = {"seed": seed, "val_loss_20_batches": va, "train_loss": tr, "wall_s": wall, "train_time_s": train_time}
    if not args.full_split:
        return row
    with torch.no_grad():  # the whole validation split in non-overlapping windows
        model.eval()
        n = (len(val_ids) - 1) // block
        total = 0.0
        for first in range(0, n, 64):
            starts = torch.arange(first, min(first + 64, n)) * block
            window = starts[:, None] + torch.arange(block + 1)  # [b, T+1]
            chunk = val_ids[window]
            total += model(chunk[:, :-1], chunk[:, 1:]).item() * chunk.shape[0]
        full = total / n
    return {**row, "val_loss_full_split": full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--eval-iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-full-split",
        dest="full_split",
        action="store_false",
        help="skip the whole-split validation after training (nanoGPT's own loop has none)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/nanogpt-control.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text = load_text("shakespeare")
    tokenizer = build_tokenizer("char", text)
    train_text, val_text = split_text(text, 0.1)
    train_ids, val_ids = encode_corpus(tokenizer, train_text), encode_corpus(tokenizer, val_text)
    rows = [run(seed, args, train_ids, val_ids, tokenizer.vocab_size) for seed in args.seeds]
    print(f"\nnanoGPT-style control ({args.iters} iterations; nanoGPT's README reports val 1.88)")
    for r in rows:
        full = f"  val (full split) {r['val_loss_full_split']:.4f}" if "val_loss_full_split" in r else ""
        print(
            f"  seed {r['seed']:5d}: val (20 batches) {r['val_loss_20_batches']:.4f}{full}  "
            f"train {r['train_loss']:.4f}  wall {r['wall_s']:.0f}s (iterations {r['train_time_s']:.0f}s)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
