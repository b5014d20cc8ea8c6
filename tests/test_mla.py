"""Multi-head latent attention (DeepSeek-V2/V3): the attention contract (causal; latent-cache decoding
at an offset = the full pass; the absorbed decode = the naive one; sdpa = eager), through a GPT with
its cache, the settings it refuses, and the KV-cache bytes per token against MHA, GQA and MQA.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import D_MODEL, N_HEADS, VOCAB, on_backend
from test_modern_attention import TIGHT, B, T, _gpt
from torch.testing import assert_close

from poslab import AttentionConfig, GPTConfig
from poslab.nn.caches import DecodeSpec

pytestmark = pytest.mark.usefixtures("single_thread")


MLA_DIMS = {"kv_lora_rank": 12, "q_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}


def _mla(name: str | None, **kw: Any):
    from poslab.nn import positions
    from poslab.nn.mla import MultiHeadLatentAttention

    torch.manual_seed(0)
    scheme = (
        None
        if name is None
        else positions.build_for_model(
            name, {}, {"head_dim": 4, "n_heads": N_HEADS, "n_embd": D_MODEL, "max_len": 64, "bidirectional": False}
        )
    )
    return MultiHeadLatentAttention(D_MODEL, N_HEADS, **{**MLA_DIMS, **kw}, position=scheme).eval()


@pytest.mark.parametrize("name", ["rope", "none", "xpos"])
@pytest.mark.parametrize("q_lora_rank", [10, None], ids=["q-lora", "q-full"])
def test_mla_contract(name: str, q_lora_rank: int | None) -> None:
    """Causal; latent-cache decoding at positions 20.. = full pass; absorbed decoding = naive; sdpa = eager."""
    from poslab.nn.mla import LatentKVCache

    attn = _mla(name, q_lora_rank=q_lora_rank)
    x = torch.randn(B, T, D_MODEL)
    pos = torch.arange(20, 20 + T)
    with torch.no_grad():
        base = on_backend(attn, "eager", x, pos)
        assert_close(on_backend(attn, "sdpa", x, pos), base, **TIGHT)
        changed = x.clone()
        changed[:, 7] += 1.0
        out = attn(changed, pos)
        assert_close(out[:, :7], base[:, :7], atol=1e-6, rtol=0)
        assert (out[:, 7:] - base[:, 7:]).abs().max() > 1e-4
        for absorb in (False, True):
            attn.absorb = absorb
            cache = LatentKVCache(B, 12, 4, capacity=T)
            steps = [attn(x[:, :4], pos[:4], cache=cache)] + [
                attn(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(4, T)
            ]
            assert_close(torch.cat(steps, dim=1), base, **TIGHT)
        assert_close(attn(x, torch.arange(T)), attn(x), atol=0, rtol=0)


def test_mla_gpt_cache_and_errors() -> None:
    model = _gpt(position="rope", n_kv_head=None, mla=dict(MLA_DIMS))
    idx = torch.randint(0, VOCAB, (B, 16))
    with torch.no_grad():
        full = model(idx)
        cache = model.make_cache(B, DecodeSpec(capacity=16))
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 16)]
    assert_close(torch.cat(steps, dim=1), full, **TIGHT)
    assert model.position.config.head_dim == 4  # the scheme rotates qk_rope_head_dim dims
    with pytest.raises(ValueError, match="mla .* does not combine with attention.sinks"):
        GPTConfig(mla=dict(MLA_DIMS), attention=AttentionConfig(sinks=True))
    with pytest.raises(ValueError, match="mla runs rotary .* position='alibi' adds a bias"):
        GPTConfig(mla=dict(MLA_DIMS), position="alibi")
    with pytest.raises(ValueError, match=r"mla keys: unknown \['kv_rank'\]"):
        GPTConfig(mla={**MLA_DIMS, "kv_rank": 3})
    with pytest.raises(ValueError, match="mla qk_rope_head_dim must be even"):
        GPTConfig(mla={**MLA_DIMS, "qk_rope_head_dim": 3})


def test_mla_takes_the_layer_config_and_refuses_what_it_does_not_compute() -> None:
    from poslab.nn.mla import MultiHeadLatentAttention

    attn = MultiHeadLatentAttention(D_MODEL, N_HEADS, AttentionConfig(window=3, backend="eager"), **MLA_DIMS)
    assert (attn.window, attn.backend, attn.causal) == (3, "eager", True)
    for field, value in (("softcap", 2.0), ("chunk", 4), ("sinks", True), ("qk_norm", True)):
        with pytest.raises(ValueError, match=f"multi-head latent attention does not compute {field}="):
            MultiHeadLatentAttention(D_MODEL, N_HEADS, AttentionConfig(**{field: value}), **MLA_DIMS)


def test_kv_cache_bytes_per_token_mha_gqa_mqa_mla() -> None:
    """Measured from the caches at equal width (d=32, 4 heads of 8): MHA 2*h*d_k, GQA 2*2*d_k, MQA 2*d_k, MLA r +
    d_r."""
    sizes = {}
    for label, extra in (
        ("mha", {"n_kv_head": None}),
        ("gqa", {"n_kv_head": 2}),
        ("mqa", {"n_kv_head": 1}),
        ("mla", {"n_kv_head": None, "mla": {**MLA_DIMS, "kv_lora_rank": 8}}),
    ):
        cache = _gpt(position="rope", **extra).make_cache(1, DecodeSpec(capacity=10))[0]
        held = sum(b.numel() * b.element_size() for name, b in cache.named_buffers() if name != "pos")
        sizes[label] = held // 10
    assert sizes == {"mha": 2 * 4 * 8 * 4, "gqa": 2 * 2 * 8 * 4, "mqa": 2 * 8 * 4, "mla": (8 + 4) * 4}
