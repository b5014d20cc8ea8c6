"""Sampling: KV-cached decoding equals full recompute, filters, limits and errors."""

from __future__ import annotations

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.data import CharTokenizer
from poslab.nn.caches import DecodeSpec
from poslab.nn.generate import Sampling, filter_logits, generate, sample_text

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def model_with(position: str, block_size: int = 32) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, n_layer=2, n_head=2, n_embd=16, block_size=block_size, position=position))
    return model.eval()


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "t5", "none"])
def test_cached_greedy_decoding_equals_full_recompute(position):
    model = model_with(position)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    cached = generate(model, prompt, 12, temperature=0)
    idx = prompt
    with torch.no_grad():
        for _ in range(12):  # the naive loop: the whole sequence every token
            logits = model(idx)[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, idx)


def test_cached_logits_match_full_forward():
    model = model_with("rope")
    seq = torch.randint(0, 13, (1, 10))
    with torch.no_grad():
        full = model(seq)  # [1, 10, V]
        cache = model.make_cache(1, DecodeSpec(capacity=10))
        steps = [model(seq[:, :4], cache=cache)[:, -1]]
        steps += [model(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(4, 10)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 3:], rtol=1e-5, atol=1e-5)


def test_sampling_is_seeded_and_respects_max_len():
    model = model_with("learned", block_size=16)
    prompt = torch.tensor([[1, 2]])
    a = generate(model, prompt, 8, generator=torch.Generator().manual_seed(3))
    b = generate(model, prompt, 8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (1, 10)
    assert generate(model, prompt, 100).shape == (1, 16)  # stops at block_size
    assert generate(model, prompt, 100, max_len=5).shape == (1, 5)
    with pytest.raises(ValueError, match=r"max_len 17 is past the 'learned' position table \(16"):
        generate(model, prompt, 4, max_len=17)
    with pytest.raises(ValueError, match="prompt has 3 tokens, more than max_len 2"):
        generate(model, torch.tensor([[1, 2, 3]]), 4, max_len=2)
    # an unbounded scheme may go past the training length (extrapolation)
    assert generate(model_with("rope", block_size=8), prompt, 20, max_len=20).shape == (1, 20)


def test_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    top2 = filter_logits(logits, top_k=2)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    probs = torch.softmax(logits, -1)[0]  # 0.644, 0.237, 0.087, 0.032
    nucleus = filter_logits(logits, top_p=0.7)  # 0.644 < 0.7: the second token is needed too
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()
    assert torch.isfinite(filter_logits(logits, top_p=float(probs[0]) - 1e-3)[0]).sum() == 1
    torch.testing.assert_close(filter_logits(logits, temperature=2.0), logits / 2)
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            generate(model_with("none"), torch.tensor([[1]]), 2, **bad)


def test_sample_text_and_unknown_characters():
    tok = CharTokenizer("白日依山尽黄河入海流，。\n")
    model = model_with("learned")
    texts = sample_text(model, tok, "白日", 6, num_samples=2, seed=0)
    assert len(texts) == 2 and all(t.startswith("白日") and len(t) == 8 for t in texts)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary.*'明月'"):
        sample_text(model, tok, "明月", 6)
    with pytest.raises(ValueError, match="empty"):
        sample_text(model, tok, "", 6)


def test_sample_text_draws_as_its_sampling_says():
    tok = CharTokenizer("白日依山尽黄河入海流，。\n")
    model = model_with("learned")
    greedy = generate(model, torch.tensor([tok.encode("白日")]), 6, temperature=0)
    want = tok.decode(greedy[0].tolist())
    # temperature 0 is greedy whatever the seed: the sampling reaches the decoder
    assert {sample_text(model, tok, "白日", 6, sampling=Sampling(temperature=0), seed=s)[0] for s in (0, 1, 2)} == {
        want
    }
    for bad, says in (
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\] or None, got 1.5"),
    ):
        with pytest.raises(ValueError, match=says) as error:
            Sampling(**bad)
        assert "\n" not in str(error.value)


def test_decoding_feeds_one_token_per_step():
    model = model_with("rope")
    lengths = []
    handle = model.tok_emb.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[1]))
    try:
        generate(model, torch.tensor([[1, 2, 3, 4, 5]]), 6, temperature=0)
    finally:
        handle.remove()
    assert lengths == [5, 1, 1, 1, 1, 1]  # prefill once, then the cache: no full recompute
