"""``poslab.from_hf`` / ``poslab.to_hf`` against ``transformers==5.24.0`` models built offline from configs.

Every family and option: logits equal to 1e-4 (fp32) on random batches of several lengths (past the
original context for the length-dependent RoPE scalings, past the window for Mistral); greedy
decoding with poslab's KV cache token-identical to ``generate(do_sample=False)``; round trips
``to_hf(from_hf(m))`` equal to ``m`` (state dict and logits); offline folders; clear errors.

Weights are random *everywhere* (norm gains and biases included: HF initialises them to 1 and 0,
which would hide a swapped or dropped bias).
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from conftest import on_backend  # noqa: E402

import poslab  # noqa: E402
from poslab.interop.hf import SUPPORTED  # noqa: E402
from poslab.nn.caches import DecodeSpec  # noqa: E402
from poslab.nn.generate import generate  # noqa: E402
from poslab.nn.gpt_config import MLPConfig, NormConfig  # noqa: E402
from poslab.nn.positions.alibi import alibi_slopes  # noqa: E402

transformers.logging.set_verbosity_error()

V = 97  # vocabulary of every test model
TOL = dict(rtol=1e-4, atol=1e-4)
#: the family modules this file tests (the others: tests/test_interop_modern.py)
CLASSIC_MODULES = {f"poslab.interop.{name}" for name in ("gpt2", "llama", "neox", "gptj", "bloom", "mpt")}


# ------------------------------------------------------------------------------------------ helpers
pytestmark = [
    pytest.mark.filterwarnings("ignore"),  # HF warns about tiny vocabularies / factor ratios on purpose
    pytest.mark.usefixtures("single_thread"),  # tiny models: one thread (conftest)
]


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (matrices N(0, 0.2), vectors N(0, 0.5)), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.5))
    return model.eval()


def hf_model(config: Any, seed: int = 0) -> torch.nn.Module:
    return randomize(transformers.AutoModelForCausalLM.from_config(config), seed)


def gpt2(**kw: Any) -> Any:
    return transformers.GPT2Config(
        **{"vocab_size": V, "n_positions": 96, "n_embd": 64, "n_layer": 2, "n_head": 4, **kw}
    )


def llama(rope: dict | None = None, **kw: Any) -> Any:
    base = dict(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    if rope is not None:
        base["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    return transformers.LlamaConfig(**{**base, **kw})


def mistral(**kw: Any) -> Any:
    return transformers.MistralConfig(
        **{
            "vocab_size": V,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "sliding_window": 8,
            **kw,
        }
    )


def neox(**kw: Any) -> Any:
    return transformers.GPTNeoXConfig(
        **{
            "vocab_size": V,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 128,
            "rotary_pct": 0.25,
            **kw,
        }
    )


def gptj(**kw: Any) -> Any:
    return transformers.GPTJConfig(
        **{"vocab_size": V, "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 128, **kw}
    )


def bloom(**kw: Any) -> Any:
    return transformers.BloomConfig(**{"vocab_size": V, "hidden_size": 48, "n_layer": 2, "n_head": 6, **kw})


def mpt(attn_config: dict | None = None, **kw: Any) -> Any:
    return transformers.MptConfig(
        **{
            "vocab_size": V,
            "d_model": 48,
            "n_heads": 6,
            "n_layers": 2,
            "max_seq_len": 128,
            "attn_config": attn_config or {},
            **kw,
        }
    )


_LONGROPE = {
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
}

# id -> (config, lengths). Lengths ascend: HF's dynamic RoPE keeps the largest length seen (see docs).
CASES: dict[str, tuple[Any, tuple[int, ...]]] = {
    "gpt2": (gpt2(), (1, 9, 40, 96)),
    "gpt2-untied-gelu-noscale": (
        gpt2(tie_word_embeddings=False, activation_function="gelu", n_inner=80, scale_attn_weights=False),
        (9, 40),
    ),
    "llama-default-gqa2": (llama(), (1, 9, 40)),
    "llama-gqa1-mha": (llama(num_key_value_heads=4), (9, 40)),
    "llama-gqa4-mqa": (llama(num_key_value_heads=1), (9, 40)),
    "llama-bias-tied-theta": (
        llama(
            {"rope_type": "default", "rope_theta": 500000.0},
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=True,
        ),
        (9, 40),
    ),
    "llama-linear": (llama({"rope_type": "linear", "factor": 2.0}), (9, 40)),
    "llama-dynamic": (llama({"rope_type": "dynamic", "factor": 4.0}), (9, 32, 33, 50, 90)),  # L0 = 32
    "llama-yarn": (
        llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, max_position_embeddings=64),
        (9, 40, 90),
    ),
    "llama-yarn-options": (
        llama(
            {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "truncate": False,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
            },
            max_position_embeddings=128,
        ),
        (9, 40),
    ),
    "llama-yarn-attention-factor": (
        llama(
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.3},
            max_position_embeddings=64,
        ),
        (40,),
    ),
    "llama-llama3": (
        llama(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            max_position_embeddings=512,
        ),
        (9, 90),
    ),
    "llama-longrope": (
        llama(
            {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16, **_LONGROPE},
            max_position_embeddings=64,
        ),
        (9, 16, 17, 60),
    ),  # short factors up to 16, long past it
    "mistral-window8": (mistral(), (5, 8, 9, 40)),
    "mistral-window3-mqa": (mistral(sliding_window=3, num_key_value_heads=1), (2, 20)),
    "neox-partial-parallel": (neox(), (1, 9, 40)),
    "neox-half-rotary-sequential": (neox(rotary_pct=0.5, use_parallel_residual=False), (9, 40)),
    "neox-nobias-dynamic": (
        neox(
            attention_bias=False,
            max_position_embeddings=16,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        ),
        (9, 40),
    ),
    "gptj-partial": (gptj(), (1, 9, 40)),
    "gptj-full-rotary": (gptj(rotary_dim=16, activation_function="gelu"), (9, 40)),
    "bloom-6-heads": (bloom(), (1, 9, 40)),
    "bloom-4-heads": (bloom(hidden_size=64, n_head=4), (9, 40)),
    "bloom-12-heads": (bloom(hidden_size=96, n_head=12), (40,)),
    "mpt-6-heads": (mpt(), (1, 9, 40)),
    "mpt-4-heads-clip-scale": (mpt({"clip_qkv": 0.3, "softmax_scale": 0.2}, d_model=64, n_heads=4), (9, 40)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_from_hf_logits_equal_transformers(case: str) -> None:
    config, lengths = CASES[case]
    hf = hf_model(config)
    ours = poslab.from_hf(hf)
    assert not ours.training
    for T in lengths:
        idx = torch.randint(0, V, (2, T))
        with torch.no_grad():
            expected, got = hf(idx).logits, ours(idx)
        assert expected.abs().max() > 0.5  # logits far from zero: the comparison can fail
        assert_close(got, expected, **TOL, msg=lambda m, T=T: f"{case} at T={T}: {m}")


def test_every_supported_family_is_tested() -> None:
    from poslab.interop.hf import FAMILY_MODULES  # the modern families: tests/test_interop_modern.py

    tested = {CASES[c][0].model_type for c in CASES}
    assert set(FAMILY_MODULES) == set(SUPPORTED)
    assert tested == {t for t, module in FAMILY_MODULES.items() if module in CLASSIC_MODULES}


def test_every_rope_type_is_tested() -> None:
    from poslab.interop.hf import ROPE_TYPES

    tested = {(CASES[c][0].rope_parameters or {}).get("rope_type", "default") for c in CASES if c.startswith("llama")}
    assert tested == set(ROPE_TYPES)


def test_gqa_ratios_1_2_and_n_heads_are_tested() -> None:
    ratios = {
        CASES[c][0].num_attention_heads // CASES[c][0].num_key_value_heads for c in CASES if c.startswith("llama")
    }
    assert {1, 2, 4} <= ratios


def test_mapped_configs() -> None:
    """Spot checks of what the families map onto (the logits tests prove the rest)."""
    j = poslab.from_hf(hf_model(gptj())).config
    assert (
        j.residual,
        j.attention.bias,
        j.lm_head_bias,
        j.position_config["layout"],
        j.position_config["rotary_dim"],
    ) == (
        "parallel_shared_norm",
        False,
        True,
        "interleaved",
        8,
    )
    x = poslab.from_hf(hf_model(neox())).config
    assert (x.residual, x.position_config["rotary_dim"], x.mlp.activation) == ("parallel", 4, "gelu")
    d = poslab.from_hf(hf_model(llama({"rope_type": "dynamic", "factor": 4.0}))).position.config
    assert (d.scaling, d.factor, d.original_max_len) == (
        "dynamic",
        4.0,
        32,
    )  # HF's dynamic L0 is max_position_embeddings
    m = poslab.from_hf(hf_model(mpt({"clip_qkv": 0.3})))
    assert (m.config.bias, m.config.attention.clip_qkv, m.blocks[0].attn.qkv.clip) == (False, 0.3, 0.3)
    assert poslab.from_hf(hf_model(bloom())).config.norm.embed


# ------------------------------------------------------------------------------------------ ALiBi specifics
@pytest.mark.parametrize("n_heads", [4, 6, 12])
def test_bloom_attention_probabilities_equal_poslab(n_heads: int) -> None:
    """Bloom adds ``+m*j`` (key position), poslab ``-m*(i-j)``: different logits, equal probabilities."""
    hf = hf_model(bloom(hidden_size=8 * n_heads, n_head=n_heads))
    ours = poslab.from_hf(hf)
    idx = torch.randint(0, V, (2, 24))
    probes: list[torch.Tensor] = []
    handles = [b.attn.scores_probe.register_forward_hook(lambda m, i, o: probes.append(o)) for b in ours.blocks]
    with torch.no_grad():
        expected = hf(idx, output_attentions=True).attentions
        on_backend(ours, "eager", idx)
    for h in handles:
        h.remove()
    assert len(probes) == len(expected) == 2
    for got, want in zip(probes, expected):
        assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_mpt_alibi_bias_max_matches_transformers_function_and_model() -> None:
    """poslab's ``bias_max`` reproduces ``build_mpt_alibi_tensor(..., alibi_bias_max)``; the 5.24 model ignores it."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for n_heads in (4, 6, 12):
        for bias_max in (4, 8, 16):
            tensor = build_mpt_alibi_tensor(n_heads, 16, alibi_bias_max=bias_max)  # [h, 1, 16] = -m*(15 - j)
            slopes = -tensor[:, 0, 0] / 15
            assert_close(alibi_slopes(n_heads, bias_max), slopes, rtol=1e-6, atol=0)
    config = mpt({"alibi_bias_max": 4})
    hf = hf_model(config)
    with pytest.warns(UserWarning, match="alibi_bias_max"):
        ours = poslab.from_hf(hf)
    assert ours.position.config.bias_max == 8.0  # what transformers 5.24 runs (it never passes the config value)
    idx = torch.randint(0, V, (2, 30))
    with torch.no_grad():
        assert_close(ours(idx), hf(idx).logits, **TOL)


# ------------------------------------------------------------------------------------------ generation
def hf_greedy(hf: torch.nn.Module, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(new tokens [B, n], raw logits of each step [B, n, V])`` from ``generate(do_sample=False)``."""
    out = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[:, prompt.shape[1] :], torch.stack(out.logits, dim=1)


GENERATION = {
    "gpt2": (gpt2, 8),
    "llama-gqa2": (llama, 8),
    "bloom": (bloom, 8),
    "mistral-window8": (mistral, 8),
    "mpt": (mpt, 8),
    "neox": (neox, 8),
    "gptj": (gptj, 8),
    # the dynamic-NTK trap: decoding past L0=16 recomputes the base every step while cached keys keep theirs
    "llama-dynamic-past-L0": (lambda: llama({"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=16), 8),
    "llama-dynamic-prompt-past-L0": (
        lambda: llama({"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=16),
        24,
    ),
    "llama-longrope-past-L0": (
        lambda: llama(
            {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16, **_LONGROPE},
            max_position_embeddings=64,
        ),
        8,
    ),
}


@pytest.mark.parametrize("case", list(GENERATION))
def test_greedy_generation_with_kv_cache_equals_transformers(case: str) -> None:
    make, prompt_len = GENERATION[case]
    hf = hf_model(make())  # a fresh HF model: its dynamic RoPE is stateful (see docs/interop.md)
    ours = poslab.from_hf(hf)
    prompt = torch.randint(0, V, (2, prompt_len))
    hf_tokens, hf_logits = hf_greedy(hf, prompt, 32)
    got = generate(ours, prompt, 32, temperature=0, max_len=prompt_len + 32)
    assert torch.equal(got[:, prompt_len:], hf_tokens)
    # teacher-forced through the cache: every step's logits, not only their argmax
    cache = ours.make_cache(2, DecodeSpec(capacity=prompt_len + 32))
    seq = torch.cat([prompt, hf_tokens], dim=1)
    with torch.no_grad():
        steps = [ours(prompt, cache=cache)[:, -1]]
        steps += [ours(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(prompt_len, prompt_len + 31)]
    assert_close(torch.stack(steps, dim=1), hf_logits, **TOL)


def test_dynamic_ntk_cached_decoding_differs_from_full_recompute_like_transformers() -> None:
    """Past L0 a cached decode (stale keys) and a full forward (one base) differ, in HF and poslab alike."""
    hf = hf_model(llama({"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=16))
    ours = poslab.from_hf(hf)
    prompt = torch.randint(0, V, (1, 8))
    tokens, hf_logits = hf_greedy(hf, prompt, 24)
    seq = torch.cat([prompt, tokens], dim=1)  # [1, 32]
    with torch.no_grad():
        within = ours(seq[:, :16])[:, 7:]  # positions 7..15: all within L0, the original base throughout
        full = ours(seq[:, :31])[:, -1]  # position 30 with every key under the base of length 31
    assert_close(within, hf_logits[:, :9], **TOL)  # within L0 caching changes nothing
    assert (full - hf_logits[:, -1]).abs().max() > 1e-2  # past L0 the cached keys carry the bases of earlier steps


# ------------------------------------------------------------------------------------------ folders, offline, errors
@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails: proves a code path is offline."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("case", ["gpt2", "llama-yarn", "bloom-6-heads"])
def test_from_hf_local_folder_is_offline_and_equal(case: str, tmp_path, no_network) -> None:
    config, lengths = CASES[case]
    hf = hf_model(config)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    ours = poslab.from_hf(tmp_path)
    idx = torch.randint(0, V, (2, lengths[-1]))
    with torch.no_grad():
        assert_close(ours(idx), hf(idx).logits, **TOL)


def test_from_hf_sharded_folder(tmp_path) -> None:
    hf = hf_model(llama())
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    idx = torch.randint(0, V, (1, 12))
    with torch.no_grad():
        assert_close(poslab.from_hf(tmp_path)(idx), hf(idx).logits, **TOL)


def test_from_hf_keeps_the_checkpoint_dtype_unless_asked() -> None:
    hf = hf_model(llama()).to(torch.bfloat16)
    assert poslab.from_hf(hf).tok_emb.weight.dtype == torch.bfloat16
    ours = poslab.from_hf(hf, dtype=torch.float32)
    assert ours.tok_emb.weight.dtype == torch.float32
    assert ours.position.inv_freq.dtype == torch.float32


def test_unsupported_family_lists_supported() -> None:
    opt = transformers.OPTConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=4)
    with pytest.raises(ValueError, match=r"model_type 'opt' is not supported.*gpt2 = .*llama = .*mpt = "):
        poslab.from_hf(hf_model(opt))


@pytest.mark.parametrize(
    "config, needle",
    [
        (gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (llama(head_dim=32), "head_dim=32"),
        (llama(hidden_act="quick_gelu"), "activation 'quick_gelu'"),
        (bloom(apply_residual_connection_post_layernorm=True), "apply_residual_connection_post_layernorm"),
    ],
)
def test_unsupported_option_is_named(config: Any, needle: str) -> None:
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match=needle):
        poslab.from_hf(hf)


def test_unsupported_rope_type_lists_supported() -> None:
    config = llama()
    config.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0}
    hf = transformers.AutoModelForCausalLM.from_config(llama())
    hf.config = config
    with pytest.raises(ValueError, match=r"rope_type 'proportional'.*default, linear, dynamic, yarn, llama3, longrope"):
        poslab.from_hf(hf)


def test_bad_sources(tmp_path) -> None:
    with pytest.raises(ValueError, match="not a local folder"):
        poslab.from_hf(tmp_path / "missing")
    with pytest.raises(ValueError, match="no config.json"):
        poslab.from_hf(tmp_path)
    with pytest.raises(TypeError, match="transformers model or a local folder"):
        poslab.from_hf(42)
    hf_model(gpt2()).config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no weights"):
        poslab.from_hf(tmp_path)


def test_unmapped_or_missing_weights_are_errors(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    hf_model(gpt2()).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({**tensors, "transformer.h.0.attn.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="does not map: transformer|does not map: h.0.attn.extra.weight"):
        poslab.from_hf(tmp_path)
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="no weight 'h.1.mlp.c_fc.bias'"):
        poslab.from_hf(tmp_path)


def test_dynamic_rope_is_stateless_where_transformers_remembers_the_longest_call() -> None:
    """HF keeps the base of the longest call seen until a call shorter than L0; poslab uses each call's length."""
    config = llama({"rope_type": "dynamic", "factor": 4.0})  # L0 = 32
    hf = hf_model(config)
    ours = poslab.from_hf(hf)
    long, short = torch.randint(0, V, (1, 90)), torch.randint(0, V, (1, 50))
    with torch.no_grad():
        fresh = hf_model(config)(short).logits  # a model that never saw the 90-token call
        hf(long)
        remembered = hf(short).logits  # HF: still the base of length 90
        got = ours(short)
    assert_close(got, fresh, **TOL)
    assert (remembered - fresh).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides, error, needle",
    [
        ({"mlp": {"activation": "gelu_fast"}}, ValueError, "mlp.activation='gelu_fast' is not allowed"),
        ({"residual": "parallel_norms"}, ValueError, "residual='parallel_norms' is not allowed"),
        ({"attention": {"scale": 0}}, ValueError, "attention.scale must be a positive number"),
        ({"attention": {"clip_qkv": -1.0}}, ValueError, "clip_qkv must be a positive number"),
        ({"mlp": {"bias": "yes"}}, TypeError, "mlp.bias must be a bool or None"),
        ({"norm": {"embed": 1}}, TypeError, "norm.embed must be a bool"),
    ],
)
def test_gptconfig_family_fields_are_validated(overrides: dict, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        poslab.GPTConfig(**overrides)


def test_gptconfig_family_fields_default_to_the_nanogpt_block() -> None:
    cfg = poslab.GPTConfig()
    assert (cfg.residual, cfg.mlp.activation, cfg.bias_of("attn"), cfg.bias_of("norm"), cfg.norm.embed) == (
        "sequential",
        "gelu",
        True,
        True,
        False,
    )  # nanoGPT's nn.GELU() is the exact GELU
    model = poslab.GPT(poslab.GPTConfig(bias=False, mlp=MLPConfig(bias=True), norm=NormConfig(bias=True)))
    assert model.blocks[0].attn.qkv.bias is None and model.blocks[0].mlp.up.bias is not None
    assert model.blocks[0].norm1.bias is not None and model.lm_head.bias is None
