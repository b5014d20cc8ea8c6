"""Transformer-XL as the paper has it: one ``W_R`` per layer, and segment-level recurrence.

The recurrence (``poslab.nn.memory.SegmentMemory``, ``GPT.forward(cache=SegmentMemory)``) is a model mechanism:
the contract part runs over every registered scheme (``conftest.scheme_variants``). Two independent
implementations are compared: the hidden-state memory (keys recomputed from the remembered layer
inputs) and the segment-memory KV cache (``GPT.make_cache(B, SegmentMemorySpec(M))``, keys stored).
"""

from __future__ import annotations

import pytest
import torch
from conftest import VARIANTS, VOCAB, Variant, make_gpt
from torch.testing import assert_close

from poslab import positions
from poslab.nn.attention import KVCache, SegmentMemoryCache
from poslab.nn.caches import SegmentMemorySpec
from poslab.nn.memory import SegmentMemory
from poslab.nn.model import GPT, GPTConfig
from poslab.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("single_thread")
B = 2


def _idx(T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def _xl_gpt(n_layer: int = 3) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=n_layer, n_head=4, n_embd=32, block_size=32, position="xl"))


# ------------------------------------------------------------------------------- per-layer W_R
def test_xl_has_one_distinct_w_r_per_layer_and_shared_u_v() -> None:
    model = _xl_gpt(3)
    views = [model.layer_position(i) for i in range(3)]
    weights = [v.r_proj[v.layer].weight for v in views]
    assert len({id(w) for w in weights}) == 3, "each layer must use its own W_R parameter"
    assert all(v.u is model.position.u and v.v is model.position.v for v in views), "u, v are tied across layers"
    keys = [k for k in model.state_dict() if k.startswith("position.")]
    assert sorted(keys) == [
        "position.r_proj.0.weight",
        "position.r_proj.1.weight",
        "position.r_proj.2.weight",
        "position.u",
        "position.v",
    ]
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    # each layer's W_R gets the gradient of its own layer only: the views really are used
    _, loss = model(_idx(16), _idx(16, seed=2))
    loss.backward()
    grads = [model.position.r_proj[i].weight.grad for i in range(3)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    assert not torch.allclose(grads[0], grads[1])


def test_xl_layer_views_differ_and_a_bad_layer_index_is_refused() -> None:
    scheme = positions.build("xl", n_embd=32, n_heads=4, head_dim=8, n_layer=2)
    with torch.no_grad():
        scheme.r_proj[1].weight.mul_(3.0)
    q = torch.randn(1, 4, 6, 8)
    pos = torch.arange(6)
    b0 = scheme.for_layer(0).score_bias(q, q, pos, pos, 0.3)
    b1 = scheme.for_layer(1).score_bias(q, q, pos, pos, 0.3)
    assert scheme.for_layer(0) is scheme and scheme.for_layer(1) is scheme.for_layer(1)
    assert not torch.allclose(b0, b1)
    with pytest.raises(ValueError, match=r"xl layer index must be an integer in \[0, 2\)"):
        scheme.for_layer(2)


def test_an_old_xl_checkpoint_with_one_shared_w_r_loads_into_every_layer() -> None:
    model = _xl_gpt(3)
    state = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("position.r_proj.")}
    shared = torch.randn_like(model.position.r_proj[0].weight)
    state["position.r_proj.weight"] = shared  # the layout before per-layer W_R
    fresh = _xl_gpt(3)
    ckpt.restore_model(fresh, {f"model.{k}": v for k, v in state.items()}, {"lm_head.weight": "tok_emb.weight"})
    for i in range(3):
        assert torch.equal(fresh.position.r_proj[i].weight, shared)
    assert fresh.position.r_proj[0].weight is not fresh.position.r_proj[1].weight
    idx = _idx(10)
    old = GPT(fresh.config)
    old.load_state_dict(fresh.state_dict())
    assert_close(old(idx), fresh(idx))


def test_a_real_checkpoint_mismatch_is_still_refused() -> None:
    model = _xl_gpt(2)
    state = {f"model.{k}": v for k, v in model.state_dict().items() if k != "position.u"}
    with pytest.raises(ckpt.CheckpointError, match="missing"):
        ckpt.restore_model(_xl_gpt(2), state, {})


# ------------------------------------------------------------------------------- recurrence
RUNNABLE = list(VARIANTS)  # every registered scheme runs with memory (positions stay < block_size here)


@pytest.mark.parametrize("variant", RUNNABLE, ids=lambda v: v.id)
def test_memory_over_the_whole_past_equals_one_pass(variant: Variant) -> None:
    """Segment 2 with a memory holding all of segment 1 gives the logits of the full pass over both."""
    model = make_gpt(variant)
    idx = _idx(20)
    full = model(idx)  # [B, 20, V]
    memory = SegmentMemory(12)
    first = model(idx[:, :12], cache=memory)
    assert memory.size == 12 and memory.length == 12 and memory.pos.tolist() == list(range(12))
    second = model(idx[:, 12:], cache=memory)
    assert_close(first, full[:, :12], atol=1e-5, rtol=1e-5)
    assert_close(second, full[:, 12:], atol=2e-5, rtol=2e-5)
    # and the memory is used: without it the second segment is read at the same positions differently
    alone = model(idx[:, 12:], pos=torch.arange(12, 20))
    assert (alone - second).abs().max() > 1e-3


@pytest.mark.parametrize("variant", RUNNABLE, ids=lambda v: v.id)
def test_hidden_state_memory_equals_the_segment_memory_kv_cache(variant: Variant) -> None:
    """Three segments, M = T: keys recomputed from remembered inputs == keys kept in a ring of M."""
    model = make_gpt(variant)
    T = 8
    idx = _idx(3 * T)
    memory, cache = SegmentMemory(T), model.make_cache(B, SegmentMemorySpec(T))
    for s in range(3):
        segment = idx[:, s * T : (s + 1) * T]
        assert_close(model(segment, cache=memory), model(segment, cache=cache), atol=2e-5, rtol=2e-5)
    assert memory.pos.tolist() == list(range(2 * T, 3 * T)) and cache[0].length == 3 * T


def test_a_short_memory_forgets_and_a_decoded_token_attends_the_memory_plus_itself() -> None:
    model = _xl_gpt(2).eval()
    idx = _idx(12)
    memory, cache = SegmentMemory(4), model.make_cache(B, SegmentMemorySpec(4))
    for s in range(3):  # segments of 4 with a memory of 4 == the segment-memory cache
        segment = idx[:, 4 * s : 4 * s + 4]
        assert_close(model(segment, cache=memory), model(segment, cache=cache), atol=2e-5, rtol=2e-5)
    # one token at a time through the segment-memory cache: each sees the previous 4 tokens and itself
    cache, memory = model.make_cache(B, SegmentMemorySpec(4)), SegmentMemory(4)
    for t in range(8):
        tok = idx[:, t : t + 1]
        assert_close(model(tok, cache=cache), model(tok, cache=memory), atol=2e-5, rtol=2e-5)


def test_no_gradient_flows_into_the_memory() -> None:
    """Stop-gradient: the remembered states carry no graph, so segment 1's graph can be freed first."""
    model = _xl_gpt(2).train()
    memory = SegmentMemory(8)
    idx = _idx(16)
    _, loss1 = model(idx[:, :8], idx[:, 1:9], cache=memory)
    assert all(not h.requires_grad and h.grad_fn is None for h in memory.hidden)
    loss1.backward()  # frees segment 1's graph
    model.zero_grad()
    remembered = [h.clone() for h in memory.hidden]
    _, loss2 = model(idx[:, 8:15], idx[:, 9:16], cache=memory)
    loss2.backward()  # raises "backward through the graph a second time" if the memory kept segment 1's graph
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # the same gradient as with the remembered states handed in as constants
    model.zero_grad()
    constant = SegmentMemory(8)
    constant.hidden, constant.pos, constant.length = remembered, torch.arange(8), 8
    _, loss3 = model(idx[:, 8:15], idx[:, 9:16], cache=constant)
    loss3.backward()
    for name, p in model.named_parameters():
        if name in grads:
            assert_close(p.grad, grads[name])


def test_the_memory_is_a_cache_type_and_a_bad_cache_mem_len_or_batch_is_refused() -> None:
    """The memory and the KV caches share the one ``cache=`` slot, so they cannot be combined; a cache of
    any other type is a one-line error naming it."""
    model = _xl_gpt(2)
    idx = _idx(8)
    with pytest.raises(TypeError, match="memory"):
        model(idx, memory=SegmentMemory(4), cache=model.make_cache(B))  # type: ignore[call-arg]
    rule = "cache must be the per-layer list make_cache returns or a SegmentMemory, got KVCache"
    with pytest.raises(TypeError, match=rule):
        model(idx, cache=model.make_cache(B)[0])  # type: ignore[arg-type]
    mla = {"kv_lora_rank": 12, "q_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}
    latent = GPT(GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=4, n_embd=32, block_size=32, position="rope", mla=mla))
    with pytest.raises(ValueError, match="segment memory needs standard attention; this model uses mla"):
        latent(idx, cache=SegmentMemory(4))
    for bad in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="mem_len .* must be a positive integer"):
            SegmentMemory(bad)  # type: ignore[arg-type]
        if bad is not None:
            with pytest.raises(ValueError, match="memory .* must be a positive integer"):
                model.make_cache(B, SegmentMemorySpec(bad))  # type: ignore[arg-type]
    memory = SegmentMemory(4)
    model(idx, cache=memory)
    with pytest.raises(ValueError, match="segment memory holds 2 streams but the batch has 1"):
        model(idx[:1], cache=memory)


def test_the_segment_memory_cache_is_its_own_type() -> None:
    """``make_cache(B, SegmentMemorySpec(M))`` gives :class:`SegmentMemoryCache` rings of ``M``; a plain cache has no
    memory flag."""
    model = _xl_gpt(2)
    caches = model.make_cache(B, SegmentMemorySpec(4))
    assert [type(c) for c in caches] == [SegmentMemoryCache] * 2
    assert all(c.mem_len == c.capacity == 4 and c.rolling for c in caches)
    with pytest.raises(TypeError, match="memory"):
        KVCache(1, 1, 4, 4, rolling=True, memory=True)  # type: ignore[call-arg]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"mem_len \(the segment memory's length M\) must be a positive integer"):
            SegmentMemoryCache(1, 1, 4, bad)  # type: ignore[arg-type]


def test_a_mask_with_a_segment_memory_cache_is_refused() -> None:
    """A full ring returns its keys in ring order: a ``[T, Tk]`` mask cannot name them."""
    model = _xl_gpt(2)
    idx = _idx(3)
    rule = r"mask= cannot be combined with a rolling cache \(SegmentMemoryCache, capacity 4\)"
    with pytest.raises(ValueError, match=rule):
        model(idx, cache=model.make_cache(B, SegmentMemorySpec(4)), mask=torch.ones(3, 3, dtype=torch.bool))


def test_a_rolling_cache_without_a_window_still_needs_the_memory_flag() -> None:
    model = _xl_gpt(1)
    cache = [KVCache(B, 4, 8, 4, rolling=True)]
    with pytest.raises(ValueError, match="segment-memory cache"):
        model(_idx(3), cache=cache)
