"""Passkey retrieval for the context-extension experiment (Mohtashami & Jaggi 2023, arXiv:2305.16300).

A random key of capital letters is hidden in validation text and asked for at the end; the accuracy of
the model's argmax on the key's letters is measured at 1x/2x/4x/8x L (:data:`PASSKEY_FACTORS`), with
the same prompts for every model of a length.
"""

from __future__ import annotations

from typing import Any

import torch

#: passkey test lengths, as multiples of L
PASSKEY_FACTORS = (1, 2, 4, 8)
#: passkey prompts per length; letters in a key
PASSKEY_PROMPTS = 48
KEY_LETTERS = 4
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: the accuracy of a guess on one key letter
CHANCE = 1 / len(KEY_ALPHABET)


def passkey_prompts(
    tokens: torch.Tensor, tokenizer: Any, length: int, n: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, list[str]] | None:
    """``n`` passkey prompts of exactly ``length`` input tokens, or ``None`` if the needle does not fit.

    A prompt is validation text with ``" key ABCD."`` inserted at a uniformly random depth, ending in
    ``" key ABCD"``: the last :data:`KEY_LETTERS` targets are the key's letters, which the model can
    only predict by finding the needle.

    Returns:
        ``(idx [n, length], targets [n, length] with -1 except on the final key letters, keys)``.
    """
    g = torch.Generator().manual_seed(seed)
    needle_len, query_len = len(" key .") + KEY_LETTERS, len(" key ") + KEY_LETTERS
    filler_len = length + 1 - needle_len - query_len
    if filler_len < 1 or tokens.numel() < filler_len + 1:
        return None
    rows, keys = [], []
    for _ in range(n):
        key = "".join(KEY_ALPHABET[int(i)] for i in torch.randint(len(KEY_ALPHABET), (KEY_LETTERS,), generator=g))
        start = int(torch.randint(tokens.numel() - filler_len, (1,), generator=g))
        depth = int(torch.randint(filler_len + 1, (1,), generator=g))
        filler = tokens[start : start + filler_len]
        needle = torch.tensor(tokenizer.encode(f" key {key}."), dtype=torch.long)
        query = torch.tensor(tokenizer.encode(f" key {key}"), dtype=torch.long)
        rows.append(torch.cat([filler[:depth], needle, filler[depth:], query]))  # [length + 1]
        keys.append(key)
    seq = torch.stack(rows)  # [n, length + 1]
    targets = torch.full((n, length), -1, dtype=torch.long)
    targets[:, -KEY_LETTERS:] = seq[:, -KEY_LETTERS:]
    return seq[:, :-1], targets, keys


@torch.no_grad()
def passkey_accuracy(
    model: Any,
    tokens: torch.Tensor,
    tokenizer: Any,
    length: int,
    n: int = PASSKEY_PROMPTS,
    seed: int = 0,
    batch: int = 16,
) -> float | None:
    """Argmax accuracy on the key letters of :func:`passkey_prompts` (``None``: does not fit ``length``)."""
    prompts = passkey_prompts(tokens, tokenizer, length, n, seed)
    if prompts is None:
        return None
    idx, targets, _ = prompts
    hits = total = 0
    for i in range(0, n, batch):
        logits = model(idx[i : i + batch])  # [b, length, V]
        keep = targets[i : i + batch] >= 0
        hits += int((logits.argmax(-1)[keep] == targets[i : i + batch][keep]).sum())
        total += int(keep.sum())
    return hits / total


def passkey_row(model: Any, tokens: torch.Tensor, tokenizer: Any, train_length: int) -> dict[int, float | None]:
    """Passkey accuracy at each of :data:`PASSKEY_FACTORS` x L (the same prompts for every model)."""
    return {f: passkey_accuracy(model, tokens, tokenizer, f * train_length, seed=f) for f in PASSKEY_FACTORS}
