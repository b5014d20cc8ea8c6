"""RoPE layout conversion (``permute_rope`` / ``relayout_rope``): Meta interleaved <-> HF half-split rows."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import poslab
from poslab import GPT, GPTConfig, MultiHeadAttention, positions
from poslab.interop import permute_rope, relayout_rope
from poslab.nn.gpt_config import MLPConfig, NormConfig

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def test_permute_rope_known_rows() -> None:
    # one head of width 4: interleaved pairs (0,1), (2,3) -> half pairs (0,2), (1,3)
    rows = torch.arange(4.0)[:, None]
    assert permute_rope(rows, 1, to="half").flatten().tolist() == [0.0, 2.0, 1.0, 3.0]
    # two heads of width 6, partial rotary 4: only the first 4 rows of each head move
    rows = torch.arange(12.0)
    assert permute_rope(rows, 2, to="half", rotary_dim=4).tolist() == [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_permute_rope_round_trips(rotary_dim: int | None) -> None:
    weight, bias = torch.randn(3 * 8, 5), torch.randn(3 * 8)
    for tensor in (weight, bias):
        half = permute_rope(tensor, 3, to="half", rotary_dim=rotary_dim)
        assert not torch.equal(half, tensor)
        assert torch.equal(permute_rope(half, 3, to="interleaved", rotary_dim=rotary_dim), tensor)


def test_permute_rope_equals_the_meta_to_hf_conversion_formula() -> None:
    """transformers' ``convert_llama_weights_to_hf.permute``: view(h, d/2, 2, dim).transpose(1, 2)."""
    n_heads, dim = 4, 32
    w = torch.randn(dim, dim)
    expected = w.view(n_heads, dim // n_heads // 2, 2, dim).transpose(1, 2).reshape(dim, dim)
    assert torch.equal(permute_rope(w, n_heads, to="half"), expected)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_attention_with_permuted_weights_equals_the_original(n_kv_heads: int, rotary_dim: int | None) -> None:
    """An interleaved-layout attention layer == a half-layout one whose q/k rows are permuted."""
    d, h, hd = 64, 4, 16
    cfg = {} if rotary_dim is None else {"rotary_dim": rotary_dim}
    torch.manual_seed(0)
    meta = MultiHeadAttention(
        d, h, n_kv_heads, position=positions.build("rope", head_dim=hd, layout="interleaved", **cfg)
    )
    hf = MultiHeadAttention(d, h, n_kv_heads, position=positions.build("rope", head_dim=hd, layout="half", **cfg))
    q_rows, kv_rows = h * hd, n_kv_heads * hd
    with torch.no_grad():
        for name in ("weight", "bias"):  # q and k rows (and their biases) move; v rows stay
            q, k, v = getattr(meta.qkv, name).split((q_rows, kv_rows, kv_rows))
            q, k = permute_rope(q, h, "half", rotary_dim), permute_rope(k, n_kv_heads, "half", rotary_dim)
            getattr(hf.qkv, name).copy_(torch.cat([q, k, v]))
        hf.proj.load_state_dict(meta.proj.state_dict())
        x = torch.randn(2, 40, d)
        assert_close(hf(x), meta(x), rtol=1e-5, atol=1e-5)
        # without the permutation the layouts disagree: the test can fail
        plain = MultiHeadAttention(
            d, h, n_kv_heads, position=positions.build("rope", head_dim=hd, layout="half", **cfg)
        )
        plain.load_state_dict(meta.state_dict())
        assert (plain(x) - meta(x)).abs().max() > 1e-3


def test_relayout_rope_model_logits_equal() -> None:
    torch.manual_seed(0)
    meta = GPT(
        GPTConfig(
            vocab_size=50,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            n_embd=64,
            block_size=64,
            position="rope",
            position_config={"layout": "interleaved"},
            bias=False,
            norm=NormConfig(kind="rmsnorm"),
            mlp=MLPConfig(kind="swiglu"),
        )
    ).eval()
    half = relayout_rope(meta, "half")
    assert half.position.config.layout == "half" and meta.position.config.layout == "interleaved"
    idx = torch.randint(0, 50, (2, 48))
    with torch.no_grad():
        assert_close(half(idx), meta(idx), rtol=1e-5, atol=1e-5)
        assert_close(relayout_rope(half, "interleaved")(idx), meta(idx), rtol=1e-5, atol=1e-5)


def test_interleaved_model_exports_to_hf_llama_with_equal_logits() -> None:
    """A Meta-layout (interleaved) poslab model -> HF Llama (half rows): to_hf permutes on the way."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    meta = GPT(
        GPTConfig(
            vocab_size=50,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            n_embd=64,
            block_size=64,
            position="rope",
            position_config={"layout": "interleaved", "base": 500000.0},
            bias=False,
            tie_embeddings=False,
            norm=NormConfig(kind="rmsnorm"),
            mlp=MLPConfig(kind="swiglu"),
        )
    ).eval()
    hf = poslab.to_hf(meta)
    idx = torch.randint(0, 50, (2, 48))
    with torch.no_grad():
        assert_close(hf(idx).logits, meta(idx), rtol=1e-4, atol=1e-4)


def test_gptj_interleaved_partial_relayouts_to_half() -> None:
    """GPT-J (interleaved, partial rotary) == the same weights permuted into a half-split (NeoX-style) model."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPTJConfig(vocab_size=50, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    gptj = poslab.from_hf(hf)
    half = relayout_rope(gptj, "half")
    idx = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        assert_close(half(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "args, needle",
    [
        ((torch.zeros(8, 4), 2, "sideways"), "to='sideways'"),
        ((torch.zeros(9, 4), 2, "half"), "not divisible by n_heads=2"),
        ((torch.zeros(8, 4), 2, "half", 3), "rotary_dim must be an even integer"),
        ((torch.zeros(8, 4), 2, "half", 6), r"\(0, head_dim=4\]"),
        ((torch.zeros(2, 2, 2), 1, "half"), "matrix or a \\[rows\\] bias"),
        ((torch.zeros(8, 4), 0, "half"), "n_heads must be a positive integer"),
    ],
)
def test_permute_rope_errors(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        permute_rope(*args)


def test_relayout_rope_needs_a_rope_model() -> None:
    with pytest.raises(ValueError, match="position='rope'"):
        relayout_rope(GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=16, block_size=8)), "half")
    with pytest.raises(TypeError, match="poslab.GPT"):
        relayout_rope(torch.nn.Linear(2, 2), "half")
