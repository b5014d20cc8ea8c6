"""Oracle tests against ``transformers==5.24.0``: random weights, built offline from configs.

* RoPE ``inv_freq`` and attention factor for every scaling in ``ROPE_INIT_FUNCTIONS`` (plus the
  default), with poslab's ``original_max_len`` mapped to the config field each HF function reads:
  ``max_position_embeddings`` for ``dynamic``, ``rope_parameters["original_max_position_embeddings"]``
  for ``yarn``, ``llama3`` and ``longrope``. Static ``ntk`` is not in HF: checked against its formula.
* A Llama attention layer (each RoPE type, GQA 1/2/n_heads) and a GPT-2 attention layer (and whole
  GPT-2 model) against poslab's modules holding the same weights, to 1e-5 in fp32.
* ALiBi slopes against Bloom's, T5 buckets against ``T5Attention._relative_position_bucket``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from conftest import on_backend  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

from poslab import GPT, AttentionConfig, GPTConfig, MultiHeadAttention, positions  # noqa: E402
from poslab.nn.positions.alibi import alibi_slopes  # noqa: E402
from poslab.nn.positions.rope import RopeConfig, rope_parameters  # noqa: E402
from poslab.nn.positions.t5 import relative_position_bucket  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore"),  # HF warns about factor/length mismatches on purpose
    pytest.mark.usefixtures("single_thread"),
]


def test_transformers_version() -> None:
    assert transformers.__version__ == "5.24.0"


# ----------------------------------------------------------------------------- config mapping
#: the tolerance of poslab's RoPE attention against transformers' Llama layer at the same weights (the guides quote it)
LLAMA_LAYER_TOL = 1e-5


def llama_config(
    rope: dict[str, Any],
    *,
    head_dim: int = 16,
    n_heads: int = 4,
    n_kv_heads: int = 4,
    max_position_embeddings: int = 64,
    partial_rotary_factor: float | None = None,
) -> LlamaConfig:
    """A one-layer ``LlamaConfig`` (eager attention, no biases) with ``rope_parameters = rope``."""
    params = {"rope_theta": 10000.0, **rope}
    if partial_rotary_factor is not None:
        params["partial_rotary_factor"] = partial_rotary_factor
    cfg = LlamaConfig(
        hidden_size=n_heads * head_dim,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        head_dim=head_dim,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=16,
        max_position_embeddings=max_position_embeddings,
        attention_bias=False,
        rope_parameters=params,
    )
    cfg._attn_implementation = "eager"
    return cfg


def poslab_rope_config(cfg: LlamaConfig) -> RopeConfig:
    """Map a HF config to poslab's :class:`RopeConfig` exactly as HF's init functions read it."""
    p = cfg.rope_parameters
    kind = p["rope_type"]
    head_dim = cfg.head_dim
    rotary_dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
    values: dict[str, Any] = {
        "head_dim": head_dim,
        "base": p["rope_theta"],
        "rotary_dim": None if rotary_dim == head_dim else rotary_dim,
        "scaling": None if kind == "default" else kind,
        "factor": p.get("factor", 1.0),
    }
    if kind == "dynamic":  # HF's dynamic NTK scales from max_position_embeddings
        values["original_max_len"] = cfg.max_position_embeddings
    elif kind in ("yarn", "llama3", "longrope"):
        values["original_max_len"] = p["original_max_position_embeddings"]
    if kind == "yarn":
        values["beta_fast"] = p.get("beta_fast") or 32
        values["beta_slow"] = p.get("beta_slow") or 1
        values["yarn_truncate"] = p.get("truncate", True)
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            values[key] = p.get(key)
    if kind == "llama3":
        values["low_freq_factor"] = p["low_freq_factor"]
        values["high_freq_factor"] = p["high_freq_factor"]
    if kind == "longrope":
        values.update(
            short_factor=p["short_factor"], long_factor=p["long_factor"], attention_factor=p.get("attention_factor")
        )
    return RopeConfig(**values)


HALF = 8  # rotary pairs at head_dim 16
ROPE_CASES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default"},
    "default-theta5e5": {"rope_type": "default", "rope_theta": 500000.0},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-no-truncate": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 2048,
        "truncate": False,
    },
    "yarn-betas": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "attention_factor": 1.5,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "llama3-8192": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    },
    "longrope": {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
        "long_factor": [1.0 + i for i in range(HALF)],
    },
    "longrope-attention-factor": {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "attention_factor": 1.25,
        "short_factor": [1.0] * HALF,
        "long_factor": [2.0 + i for i in range(HALF)],
    },
}


def _hf_parameters(cfg: LlamaConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    kind = cfg.rope_parameters["rope_type"]
    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS[kind](cfg, None, seq_len=seq_len)


def test_every_hf_rope_type_is_covered() -> None:
    covered = {case["rope_type"] for case in ROPE_CASES.values()}
    assert set(ROPE_INIT_FUNCTIONS) - covered == {"proportional"}  # Gemma's, not a poslab scaling


@pytest.mark.parametrize("case", list(ROPE_CASES), ids=list(ROPE_CASES))
def test_rope_inv_freq_and_attention_factor_equal_transformers(case: str) -> None:
    cfg = llama_config(dict(ROPE_CASES[case]))
    inv_hf, factor_hf = _hf_parameters(cfg)
    inv, factor = rope_parameters(poslab_rope_config(cfg))
    assert_close(inv, inv_hf, atol=0, rtol=1e-6)
    assert factor == pytest.approx(factor_hf, rel=1e-12)
    scheme = positions.build("rope", poslab_rope_config(cfg))  # the module's buffers agree too
    assert_close(scheme.inv_freq, inv_hf, atol=0, rtol=1e-6)


@pytest.mark.parametrize("case", ["linear", "dynamic", "yarn", "llama3", "longrope"])
def test_rope_partial_rotary_equals_transformers(case: str) -> None:
    cfg = llama_config(dict(ROPE_CASES[case]), head_dim=32, partial_rotary_factor=0.5)
    inv_hf, factor_hf = _hf_parameters(cfg, seq_len=100)
    assert inv_hf.shape == (8,)
    inv, factor = rope_parameters(poslab_rope_config(cfg), seq_len=100)
    assert_close(inv, inv_hf, atol=0, rtol=1e-6)
    assert factor == pytest.approx(factor_hf, rel=1e-12)


@pytest.mark.parametrize("seq_len", [None, 1, 40, 64, 65, 100, 1000, 100000])
def test_dynamic_ntk_equals_transformers_at_every_length(seq_len: int | None) -> None:
    cfg = llama_config({"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=64)
    inv_hf, _ = _hf_parameters(cfg, seq_len)
    inv, _ = rope_parameters(poslab_rope_config(cfg), seq_len)
    assert_close(inv, inv_hf, atol=0, rtol=1e-6)


@pytest.mark.parametrize("seq_len", [None, 8, 16, 17, 500])
def test_longrope_short_and_long_equal_transformers(seq_len: int | None) -> None:
    cfg = llama_config(dict(ROPE_CASES["longrope"]))
    inv_hf, factor_hf = _hf_parameters(cfg, seq_len)
    inv, factor = rope_parameters(poslab_rope_config(cfg), seq_len)
    assert_close(inv, inv_hf, atol=0, rtol=1e-6)
    assert factor == pytest.approx(factor_hf)
    short = seq_len is None or seq_len <= 16
    expected_ext = cfg.rope_parameters["short_factor" if short else "long_factor"]
    assert_close(
        inv, _hf_parameters(llama_config({"rope_type": "default"}))[0] / torch.tensor(expected_ext), atol=0, rtol=1e-6
    )


def test_static_ntk_is_not_in_transformers_and_matches_its_formula() -> None:
    assert "ntk" not in ROPE_INIT_FUNCTIONS
    s, d, base = 8.0, 16, 10000.0
    inv, factor = rope_parameters(RopeConfig(head_dim=d, base=base, scaling="ntk", factor=s))
    new_base = base * s ** (d / (d - 2))
    cfg = llama_config({"rope_type": "default", "rope_theta": new_base})
    assert_close(inv, _hf_parameters(cfg)[0], atol=0, rtol=1e-6)
    assert factor == 1.0


# ------------------------------------------------------------------------------ Llama attention
def _causal_additive_mask(T: int) -> torch.Tensor:
    return torch.full((T, T), float("-inf")).triu(1)[None, None]  # [1, 1, T, T]


def _poslab_from_llama(hf: LlamaAttention, cfg: LlamaConfig) -> MultiHeadAttention:
    """A poslab attention layer holding the HF layer's weights and the mapped RoPE."""
    rope = positions.build("rope", poslab_rope_config(cfg))
    attn = MultiHeadAttention(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        AttentionConfig(causal=True, bias=False),
        position=rope,
    )
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat((hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight), dim=0))
        attn.proj.weight.copy_(hf.o_proj.weight)
    return attn.eval()


LLAMA_CASES = ["default", "linear", "dynamic", "yarn", "yarn-mscale", "llama3", "longrope"]


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("case", LLAMA_CASES)
@pytest.mark.parametrize("T", [12, 24], ids=["T12", "T24"])
def test_llama_attention_equals_poslab(case: str, n_kv_heads: int, T: int) -> None:
    """T=24 goes past the 16-position original window of dynamic (max_position_embeddings=16) and longrope."""
    torch.manual_seed(0)
    rope = dict(ROPE_CASES[case])
    max_pos = 16 if case == "dynamic" else 64
    cfg = llama_config(rope, n_kv_heads=n_kv_heads, max_position_embeddings=max_pos)
    hf = LlamaAttention(cfg, layer_idx=0).eval()
    rotary = LlamaRotaryEmbedding(cfg)
    ours = _poslab_from_llama(hf, cfg)
    B = 2
    x = torch.randn(B, T, cfg.hidden_size)
    position_ids = torch.arange(T)[None].expand(B, T)
    with torch.no_grad():
        cos, sin = rotary(x, position_ids)  # [B, T, head_dim] each, attention factor included
        expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=_causal_additive_mask(T))
        for backend in ("sdpa", "eager"):
            assert_close(on_backend(ours, backend, x), expected, atol=LLAMA_LAYER_TOL, rtol=LLAMA_LAYER_TOL)


def test_llama_attention_with_offset_positions_equals_poslab() -> None:
    """Explicit positions 100..111 (a decode window) reach the same cos/sin on both sides."""
    torch.manual_seed(0)
    cfg = llama_config(dict(ROPE_CASES["yarn"]), n_kv_heads=2)
    hf = LlamaAttention(cfg, layer_idx=0).eval()
    ours = _poslab_from_llama(hf, cfg)
    x = torch.randn(1, 12, cfg.hidden_size)
    pos = torch.arange(100, 112)
    with torch.no_grad():
        cos, sin = LlamaRotaryEmbedding(cfg)(x, pos[None])
        expected, _ = hf(x, position_embeddings=(cos, sin), attention_mask=_causal_additive_mask(12))
        assert_close(ours(x, pos), expected, atol=LLAMA_LAYER_TOL, rtol=LLAMA_LAYER_TOL)


# ------------------------------------------------------------------------------ GPT-2 attention
def _gpt2_config(n_layer: int = 1) -> GPT2Config:
    cfg = GPT2Config(
        n_embd=32,
        n_head=4,
        n_layer=n_layer,
        n_positions=64,
        vocab_size=50,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    cfg._attn_implementation = "eager"
    return cfg


def _copy_conv1d(linear: torch.nn.Linear, conv: torch.nn.Module) -> None:
    """HF ``Conv1D`` stores ``[in, out]`` (``y = x W + b``); ``nn.Linear`` stores ``[out, in]``."""
    linear.weight.copy_(conv.weight.T)
    linear.bias.copy_(conv.bias)


def test_gpt2_attention_with_learned_positions_equals_poslab() -> None:
    torch.manual_seed(0)
    cfg = _gpt2_config()
    hf = GPT2Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        hf.c_attn.bias.normal_()
        hf.c_proj.bias.normal_()
    wpe = torch.nn.Embedding(cfg.n_positions, cfg.n_embd)
    learned = positions.build("learned", n_embd=cfg.n_embd, max_len=cfg.n_positions)
    ours = MultiHeadAttention(
        cfg.n_embd, cfg.n_head, attention=AttentionConfig(causal=True, bias=True), position=learned
    ).eval()
    with torch.no_grad():
        learned.table.weight.copy_(wpe.weight)
        _copy_conv1d(ours.qkv, hf.c_attn)
        _copy_conv1d(ours.proj, hf.c_proj)
    T = 20
    tokens = torch.randn(2, T, cfg.n_embd)
    pos = torch.arange(T)
    with torch.no_grad():
        expected, _ = hf(tokens + wpe(pos), attention_mask=_causal_additive_mask(T))
        x = learned.embed(tokens, pos)
        for backend in ("sdpa", "eager"):
            assert_close(on_backend(ours, backend, x), expected, atol=1e-5, rtol=1e-5)


def test_gpt2_model_logits_equal_poslab_gpt() -> None:
    """The whole GPT-2 (2 layers, learned positions, tied head) equals poslab's GPT with its weights."""
    torch.manual_seed(0)
    cfg = _gpt2_config(n_layer=2)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # make biases and norms non-trivial
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.normal_(std=0.1).add_(1.0 if name.endswith("weight") else 0.0)
    ours = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=4, n_embd=32, block_size=64, position="learned")).eval()
    t = hf.transformer
    with torch.no_grad():
        ours.tok_emb.weight.copy_(t.wte.weight)
        ours.position.table.weight.copy_(t.wpe.weight)
        for block, h in zip(ours.blocks, t.h):
            block.norm1.load_state_dict(h.ln_1.state_dict())
            block.norm2.load_state_dict(h.ln_2.state_dict())
            _copy_conv1d(block.attn.qkv, h.attn.c_attn)
            _copy_conv1d(block.attn.proj, h.attn.c_proj)
            _copy_conv1d(block.mlp.up, h.mlp.c_fc)
            _copy_conv1d(block.mlp.down, h.mlp.c_proj)
        ours.norm_f.load_state_dict(t.ln_f.state_dict())
    idx = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        assert_close(ours(idx), hf(idx).logits, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------- ALiBi
@pytest.mark.parametrize("n_heads", [1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 48, 64])
def test_alibi_slopes_equal_bloom(n_heads: int) -> None:
    bloom = _get_alibi_slopes(n_heads, torch.device("cpu"))
    assert_close(alibi_slopes(n_heads), bloom.float(), atol=0, rtol=1e-6)
    assert alibi_slopes(n_heads).dtype == torch.float32


@pytest.mark.parametrize("n_heads", [6, 12, 20])
def test_alibi_probabilities_equal_bloom_build_alibi_tensor(n_heads: int) -> None:
    """Bloom adds ``+m * key_pos``; poslab adds ``-m * (i - j)``: equal after the causal softmax."""
    T = 10
    bloom = build_alibi_tensor(torch.ones(1, T), n_heads, torch.float32).view(n_heads, 1, T)  # [h, 1, Tk]
    scheme = positions.build("alibi", n_heads=n_heads)
    q = torch.zeros(1, n_heads, T, 4)
    ours = scheme.score_bias(q, q, torch.arange(T), torch.arange(T), 0.5)[0]  # [h, Tq, Tk]
    scores = torch.randn(n_heads, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    p_bloom = torch.softmax((scores + bloom).masked_fill(~mask, float("-inf")), -1)
    p_ours = torch.softmax((scores + ours).masked_fill(~mask, float("-inf")), -1)
    assert_close(p_ours, p_bloom, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------- T5
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 256), (8, 20), (32, 40)])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_t5_buckets_equal_transformers(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    relative = torch.arange(-300, 301)
    expected = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, expected)
    grid = relative[None, :] - relative[::50, None]  # a 2-D [Tq, Tk] layout too
    assert torch.equal(
        relative_position_bucket(grid, bidirectional, num_buckets, max_distance),
        T5Attention._relative_position_bucket(grid, bidirectional, num_buckets, max_distance),
    )


def test_t5_scheme_buckets_use_key_minus_query() -> None:
    t5 = positions.build("t5", n_heads=2, bidirectional=True)
    q_pos, k_pos = torch.arange(3, 8), torch.arange(8)
    expected = T5Attention._relative_position_bucket(k_pos[None, :] - q_pos[:, None], True, 32, 128)
    assert torch.equal(t5.buckets(q_pos, k_pos), expected)
    assert math.isclose(float(t5.buckets(torch.tensor([5]), torch.tensor([0]))[0, 0]), 5)  # past key: low half
