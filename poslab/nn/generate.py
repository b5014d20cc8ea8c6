"""Sampling from a trained GPT with the KV cache (``poslab sample RUN --prompt 白日依山尽``).

The prompt is run once through the model (prefill) to fill a preallocated per-layer
:class:`poslab.KVCache`; every new token then costs one single-token forward pass that reads the
cache, so decoding does not recompute the whole sequence. Logits are filtered in fp32:
temperature, then top-k (Fan et al. 2018, https://arxiv.org/abs/1805.04833), then top-p / nucleus
(Holtzman et al. 2020, https://arxiv.org/abs/1904.09751).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from poslab.checks import int_at_least, is_number, positive_int
from poslab.nn.caches import DecodeSpec
from poslab.nn.model import GPT


def filter_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Temperature-scaled logits with everything outside top-k / top-p set to ``-inf``.

    Args:
        logits: ``[B, V]`` (any float dtype; computed in fp32).
        temperature: > 0 (callers treat 0 as greedy before reaching here).
        top_k: keep the ``k`` largest logits (``None`` = all).
        top_p: keep the smallest set of tokens whose probability mass reaches ``p`` (``None`` = all).

    Returns:
        ``[B, V]`` fp32 logits.
    """
    raw = logits.float()  # [B, V]
    logits = raw / temperature  # [B, V]
    if not bool(torch.isfinite(logits[torch.isfinite(raw)]).all()):
        # a tiny temperature (1e-45) overflowed fp32 to inf (then NaN in the softmax), or is 0 in fp32
        # (1e-300): shift first, which softmax ignores, and divide in fp64 (which holds every Python
        # float > 0); the best logit stays 0, the others go to -inf: greedy, as the limit is
        shifted = raw.double() - raw.double().amax(dim=-1, keepdim=True)  # [B, V]
        logits = (shifted / temperature).float()  # [B, V]
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V] x2
        probs = torch.softmax(sorted_logits, dim=-1)  # [B, V]
        mass_before = torch.cumsum(probs, dim=-1) - probs  # [B, V]: mass of the better tokens
        drop_sorted = mass_before >= top_p  # [B, V]
        # the best token is always kept: a top_p below fp32's smallest number (1e-46) compares as 0.0,
        # and p -> 0 is greedy decoding in the limit
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ``ValueError`` naming a bad sampling argument and its allowed range."""
    if not is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        positive_int("top_k", top_k, rule="a positive integer or None")
    if top_p is not None and (not is_number(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How :func:`sample_text` draws each next token: softmax ``temperature`` (0 = greedy), then the
    ``top_k`` / ``top_p`` filters of :func:`filter_logits` (``None`` = all tokens).

    Raises:
        ValueError: a bad value, named with its allowed range (:func:`check_sampling_args`).
    """

    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_sampling_args(self.temperature, self.top_k, self.top_p)


@torch.no_grad()
def generate(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_len: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``idx`` by up to ``max_new_tokens`` sampled tokens, with the KV cache.

    Args:
        model: a :class:`GPT` (eval mode recommended).
        idx: prompt token ids ``[B, T0]``, ``T0 >= 1``.
        max_new_tokens: tokens to add.
        temperature: softmax temperature; 0 = greedy (argmax).
        top_k, top_p: see :func:`filter_logits`.
        max_len: stop when the sequence reaches this many tokens (default ``block_size``); must fit
            the position scheme (a learned table has ``block_size`` rows).
        generator: random source (for ``--seed``).

    Returns:
        ``[B, T0 + n]`` with ``n <= max_new_tokens`` (fewer when ``max_len`` is reached).

    Raises:
        ValueError: a bad argument, a prompt longer than ``max_len``, or ``max_len`` past what the
            position scheme can encode.
    """
    check_sampling_args(temperature, top_k, top_p)
    int_at_least("the number of new tokens", max_new_tokens, 0)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"the prompt must be a non-empty [B, T] tensor of token ids, got shape {list(idx.shape)}")
    max_len = model.config.block_size if max_len is None else max_len
    positive_int("max_len", max_len)
    limit = model.position.max_positions
    if limit is not None and max_len > limit:
        raise ValueError(
            f"max_len {max_len} is past the {model.config.position!r} position table ({limit} positions); "
            f"use --max-len {limit} or less"
        )
    B, T0 = idx.shape
    if T0 > max_len:
        raise ValueError(f"the prompt has {T0} tokens, more than max_len {max_len}")
    steps = min(max_new_tokens, max_len - T0)
    if steps == 0:
        return idx
    cache = model.make_cache(B, DecodeSpec(capacity=T0 + steps))
    logits = model(idx, cache=cache)[:, -1]  # prefill: [B, V] at the last prompt position
    out = [idx]
    for i in range(steps):
        if temperature == 0:
            next_id = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
        else:
            if not bool(torch.isfinite(logits.float()).all()):
                raise ValueError(
                    f"the model's logits are not finite (NaN/inf) at generated token {i}: its weights "
                    "overflow fp32; the checkpoint is damaged or was not trained by poslab"
                )
            probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)  # [B, V]
            next_id = torch.multinomial(probs, 1, generator=generator)  # [B, 1]
        out.append(next_id)
        if i + 1 < steps:
            logits = model(next_id, cache=cache)[:, -1]  # one token through the cache: [B, V]
    return torch.cat(out, dim=1)  # [B, T0 + steps]


def sampling_bytes(model: GPT, num_samples: int, prompt_len: int, tokens: int, max_len: int | None = None) -> int:
    """Bytes that sampling ``num_samples`` rows at once needs, estimated from the config before anything is built.

    Per row: the KV cache (``n_layer * 2 * T * n_embd`` fp32, an upper bound with grouped heads), the
    prefill's activations (``~16 * T0 * n_embd``) and eager scores (``n_head * T0^2``) in fp32, four fp32
    copies of the logits and the ids (int64), with ``T = min(prompt + tokens, max_len)``.
    """
    cfg = model.config
    limit = cfg.block_size if max_len is None else max_len
    T = max(1, min(prompt_len + max(tokens, 0), limit if isinstance(limit, int) and limit > 0 else prompt_len))
    T0 = min(prompt_len, T)
    row = (
        cfg.n_layer * 2 * T * cfg.n_embd * 4
        + 16 * T0 * cfg.n_embd * 4
        + cfg.n_head * T0 * T0 * 4
        + 4 * cfg.vocab_size * 4
        + T * 8
    )
    return num_samples * row


def check_sampling_memory(
    model: GPT, num_samples: int, prompt_len: int, tokens: int, max_len: int | None = None
) -> None:
    """Refuse, before paying for it, a sampling call that needs more than half of the available memory.

    Raises:
        ValueError: ``--num-samples N needs about X GiB ... Y GiB available``, naming the way out.
    """
    from poslab.nn.footprint import available_bytes

    needed, available = sampling_bytes(model, num_samples, prompt_len, tokens, max_len), available_bytes()
    if needed > available // 2:
        raise ValueError(
            f"--num-samples {num_samples} needs about {needed / 2**30:,.1f} GiB at once (KV cache, "
            f"logits and ids of every sample), more than half of the {available / 2**30:,.1f} GiB "
            "available; sample fewer at once"
        )


def sample_text(
    model: GPT,
    tokenizer,
    prompt: str,
    tokens: int,
    *,
    num_samples: int = 1,
    sampling: Sampling | None = None,
    max_len: int | None = None,
    seed: int | None = None,
) -> list[str]:
    """Texts that continue ``prompt`` (each includes the prompt), drawn as ``sampling`` says (default
    :class:`Sampling`'s: temperature 0.8, no filter); ``max_len`` and ``seed`` as :func:`generate` takes them.

    Raises:
        ValueError: an empty prompt, or characters the tokenizer does not know (char tokenizers
            name them; byte-level BPE encodes any text).
    """
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character")
    positive_int("num_samples", num_samples)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError(f"the prompt {prompt!r} encodes to no tokens")
    check_sampling_memory(model, num_samples, len(ids), tokens, max_len)
    device = next(model.parameters()).device
    idx = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # [n, T0]
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    sampling = Sampling() if sampling is None else sampling
    out = generate(
        model,
        idx,
        tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        max_len=max_len,
        generator=generator,
    )
    return [tokenizer.decode(row.tolist()) for row in out]


__all__ = [
    "Sampling",
    "check_sampling_args",
    "check_sampling_memory",
    "sampling_bytes",
    "filter_logits",
    "generate",
    "sample_text",
]
