"""Max |logit difference| of the modern families against transformers (the figures in docs/interop.md).

Runs the configs of ``tests/test_interop_modern.py`` (random weights, fp32) and prints, per case,
the worst absolute logit difference over its lengths, whether greedy 32-token decoding with
poslab's KV cache is token-identical to ``generate()`` (and the worst cached step), and the gpt-oss
attention layers alone (full pass; transformers' cached generate replayed through poslab's cache).

    PYTHONPATH=. python benchmarks/modern_interop_diffs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers

import poslab
from poslab.interop.gpt_oss import attention_from_hf
from poslab.nn.attention import KVCache
from poslab.nn.caches import DecodeSpec
from poslab.nn.generate import generate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_interop_modern import CASES, GENERATION, V, _record_attention, gpt_oss, hf_greedy, hf_model  # noqa: E402


def main() -> None:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    for case, (config, lengths) in CASES.items():
        hf = hf_model(config)
        ours = poslab.from_hf(hf)
        worst = 0.0
        for T in lengths:
            idx = torch.randint(0, V, (2, T))
            with torch.no_grad():
                worst = max(worst, (ours(idx) - hf(idx).logits).abs().max().item())
        print(f"logits {case:36s} T={lengths} max|diff|={worst:.2e}")
    for case, config in GENERATION.items():
        hf = hf_model(config)
        ours = poslab.from_hf(hf)
        prompt = torch.randint(0, V, (2, 8))
        tokens, logits = hf_greedy(hf, prompt, 32)
        got = generate(ours, prompt, 32, temperature=0, max_len=40)
        cache = ours.make_cache(2, DecodeSpec(capacity=40))
        seq = torch.cat([prompt, tokens], 1)
        with torch.no_grad():
            steps = [ours(prompt, cache=cache)[:, -1]] + [
                ours(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(8, 39)
            ]
        diff = (torch.stack(steps, 1) - logits).abs().max().item()
        print(f"generate {case:14s} identical={torch.equal(got[:, 8:], tokens)} cached-step max|diff|={diff:.2e}")
    hf = hf_model(gpt_oss())
    seen, handles = _record_attention(hf)
    with torch.no_grad():
        hf(torch.randint(0, V, (2, 40)))
    for h in handles:
        h.remove()
    for i in range(2):
        attn, _ = attention_from_hf(hf, i)
        x, want = seen[i][0]
        with torch.no_grad():
            diff = (attn(x) - want).abs().max().item()
        print(f"gpt_oss layer {i} full pass T=40 max|diff|={diff:.2e}")
    hf = hf_model(gpt_oss())
    seen, handles = _record_attention(hf)
    hf_greedy(hf, torch.randint(0, V, (2, 8)), 32)
    for h in handles:
        h.remove()
    for i in range(2):
        attn, _ = attention_from_hf(hf, i)
        cache = KVCache(2, 2, 24, capacity=attn.window, rolling=True) if attn.window else KVCache(2, 2, 24, capacity=48)
        with torch.no_grad():
            diff = max((attn(x, cache=cache) - w).abs().max().item() for x, w in seen[i])
        print(f"gpt_oss layer {i} cached generate ({len(seen[i])} calls) max|diff|={diff:.2e}")


if __name__ == "__main__":
    main()
