"""Modern families against ``transformers==5.24.0`` models built offline from small random configs.

Qwen3, Gemma 2, Gemma 3 (text) and Llama 4 (text, every layer dense: ``moe_layers=[]``) are whole-model
oracles: logits equal to 1e-4 (fp32) at lengths past every sliding window and attention chunk, and
greedy 32-token decoding with poslab's KV cache token-identical to ``generate()`` (every step's logits
compared too). gpt-oss has only routed-MoE MLPs, which poslab does not implement: its attention
layers are compared alone, fed the hidden states transformers' own layers receive (a full pass, and
every step of transformers' cached ``generate()`` against poslab's KV cache).

Weights are random everywhere (norm gains included: Gemma stores ``w`` for ``1 + w``, so a missed
offset shows).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from conftest import merged, on_backend  # noqa: E402

import poslab  # noqa: E402
from poslab.interop.gpt_oss import attention_from_hf  # noqa: E402
from poslab.interop.hf import FAMILY_MODULES  # noqa: E402
from poslab.nn.attention import KVCache  # noqa: E402
from poslab.nn.caches import DecodeSpec  # noqa: E402
from poslab.nn.generate import generate  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.usefixtures("single_thread")]

V = 97
TOL = dict(rtol=1e-4, atol=1e-4)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (matrices N(0, 0.2), vectors N(0, 0.5)), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.5))
    return model.eval()


def hf_model(config: Any, seed: int = 0) -> torch.nn.Module:
    return randomize(transformers.AutoModelForCausalLM.from_config(config), seed)


_SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    max_position_embeddings=256,
)


def qwen3(**kw: Any) -> Any:
    return transformers.Qwen3Config(**{**_SMALL, "num_hidden_layers": 2, **kw})


def gemma2(**kw: Any) -> Any:
    return transformers.Gemma2Config(
        **{
            **_SMALL,
            "num_hidden_layers": 3,
            "sliding_window": 6,
            "query_pre_attn_scalar": 20,
            "attn_logit_softcapping": 3.0,
            "final_logit_softcapping": 5.0,
            **kw,
        }
    )


def gemma3(**kw: Any) -> Any:
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    return transformers.Gemma3TextConfig(
        **{
            **_SMALL,
            "num_hidden_layers": 4,
            "sliding_window": 6,
            "query_pre_attn_scalar": 20,
            "sliding_window_pattern": 3,
            "rope_parameters": rope,
            **kw,
        }
    )


def llama4(**kw: Any) -> Any:
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    }
    return transformers.Llama4TextConfig(
        **{
            **_SMALL,
            "intermediate_size": 32,
            "intermediate_size_mlp": 96,
            "num_hidden_layers": 4,
            "moe_layers": [],
            "attention_chunk_size": 8,
            "floor_scale": 4,
            "rope_parameters": rope,
            "attn_scale": 0.5,
            **kw,
        }
    )


def gpt_oss(**kw: Any) -> Any:
    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 150000.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    }
    return transformers.GptOssConfig(
        **{
            **_SMALL,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 6,
            "rope_parameters": rope,
            **kw,
        }
    )


def deepseek(**kw: Any) -> Any:
    return transformers.DeepseekV3Config(
        **{
            "vocab_size": V,
            "hidden_size": 64,
            "intermediate_size": 96,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "kv_lora_rank": 16,
            "q_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 12,
            "v_head_dim": 10,
            "first_k_dense_replace": 2,
            "max_position_embeddings": 128,
            **kw,
        }
    )


_DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}

# id -> (config, lengths): every length list goes past the windows (6) and chunks (8)
CASES: dict[str, tuple[Any, tuple[int, ...]]] = {
    "qwen3": (qwen3(), (1, 9, 40)),
    "qwen3-sliding-bias-tied": (
        qwen3(
            num_hidden_layers=3,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
            attention_bias=True,
            tie_word_embeddings=True,
        ),
        (9, 40),
    ),
    "qwen3-yarn-mqa": (
        qwen3(
            num_key_value_heads=1,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 16,
            },
        ),
        (40,),
    ),
    "gemma2": (gemma2(), (1, 9, 40)),
    "gemma2-default-caps-untied": (
        gemma2(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=False),
        (40,),
    ),
    "gemma2-no-caps": (gemma2(attn_logit_softcapping=None, final_logit_softcapping=None), (9, 40)),
    "gemma3": (gemma3(), (1, 9, 40)),
    "gemma3-final-cap-bias": (gemma3(final_logit_softcapping=5.0, attention_bias=True), (40,)),
    "llama4": (llama4(), (1, 9, 40)),
    "llama4-no-qk-norm-no-temperature": (llama4(use_qk_norm=False, attn_temperature_tuning=False), (40,)),
    "llama4-no-chunk-interval-2": (llama4(attention_chunk_size=None, no_rope_layer_interval=2), (40,)),
    "deepseek-v3-mla": (deepseek(), (1, 9, 40)),
    "deepseek-v3-full-q-half-rope-bias": (
        deepseek(q_lora_rank=None, rope_interleave=False, attention_bias=True),
        (40,),
    ),
    "deepseek-v3-yarn-mscale": (deepseek(rope_parameters=_DEEPSEEK_YARN), (9, 40)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_from_hf_logits_equal_transformers(case: str) -> None:
    config, lengths = CASES[case]
    hf = hf_model(config)
    ours = poslab.from_hf(hf)
    for T in lengths:
        idx = torch.randint(0, V, (2, T))
        with torch.no_grad():
            expected, got = hf(idx).logits, ours(idx)
        assert expected.abs().max() > 0.5  # logits far from zero: the comparison can fail
        assert_close(got, expected, **TOL, msg=lambda m, T=T: f"{case} at T={T}: {m}")


def test_every_registered_modern_family_is_tested() -> None:
    from test_interop import CLASSIC_MODULES

    tested = {CASES[c][0].model_type for c in CASES} | {"gpt_oss"}
    assert tested == {t for t, module in FAMILY_MODULES.items() if module not in CLASSIC_MODULES}


def test_mapped_configs_use_the_mechanisms() -> None:
    """Spot checks (the logits tests prove them): what each family turns on."""
    g2 = poslab.from_hf(hf_model(gemma2())).config
    assert (g2.attention.softcap, g2.final_softcap, g2.residual, g2.attention.head_dim) == (3.0, 5.0, "sandwich", 24)
    assert [g2.layer_value(i, "window") for i in range(3)] == [6, None, 6]
    g3 = poslab.from_hf(hf_model(gemma3()))
    assert g3.config.attention.qk_norm and g3.config.attention.softcap is None
    assert [g3.layer_position(i).config.base for i in range(4)] == [1e4, 1e4, 1e6, 1e4]
    l4 = poslab.from_hf(hf_model(llama4())).config
    assert [l4.layer_value(i, "chunk") for i in range(4)] == [8, 8, 8, None]
    assert [l4.layer_value(i, "position") for i in range(4)] == ["rope", "rope", "rope", "none"]
    assert l4.layer_value(3, "temperature_tuning") == [4.0, 0.5] and l4.layer_value(0, "temperature_tuning") is None
    assert poslab.from_hf(hf_model(qwen3())).config.attention.qk_norm
    ds = poslab.from_hf(hf_model(deepseek()))
    assert type(ds.blocks[0].attn).__name__ == "MultiHeadLatentAttention"
    assert type(ds.make_cache(1)[0]).__name__ == "LatentKVCache"


def test_deepseek_absorbed_decoding_equals_the_naive_path() -> None:
    """The absorbed-projection decode path (kv_b folded into q and the output) gives HF's cached logits too."""
    hf = hf_model(deepseek())
    ours = poslab.from_hf(hf)
    prompt = torch.randint(0, V, (2, 8))
    tokens, hf_logits = hf_greedy(hf, prompt, 16)
    for block in ours.blocks:
        block.attn.absorb = True
    cache = ours.make_cache(2, DecodeSpec(capacity=24))
    seq = torch.cat([prompt, tokens], dim=1)
    with torch.no_grad():
        steps = [ours(prompt, cache=cache)[:, -1]] + [ours(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(8, 23)]
    assert_close(torch.stack(steps, dim=1), hf_logits, **TOL)
    assert cache[0].bytes_per_token() == 2 * (16 + 8) * 4  # latent + rotary key, fp32, batch 2


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
    "qwen3-sliding": CASES["qwen3-sliding-bias-tied"][0],
    "gemma2": gemma2(),
    "gemma3": gemma3(),
    "llama4": llama4(),
    "deepseek-v3-latent-cache": deepseek(rope_parameters=_DEEPSEEK_YARN),
}


@pytest.mark.parametrize("case", list(GENERATION))
def test_greedy_generation_with_kv_cache_equals_transformers(case: str) -> None:
    hf = hf_model(GENERATION[case])
    ours = poslab.from_hf(hf)
    prompt_len = 8
    prompt = torch.randint(0, V, (2, prompt_len))
    hf_tokens, hf_logits = hf_greedy(hf, prompt, 32)
    got = generate(ours, prompt, 32, temperature=0, max_len=prompt_len + 32)
    assert torch.equal(got[:, prompt_len:], hf_tokens)
    cache = ours.make_cache(2, DecodeSpec(capacity=prompt_len + 32))  # rolling rings on the windowed layers
    seq = torch.cat([prompt, hf_tokens], dim=1)
    with torch.no_grad():
        steps = [ours(prompt, cache=cache)[:, -1]]
        steps += [ours(seq[:, t : t + 1], cache=cache)[:, -1] for t in range(prompt_len, prompt_len + 31)]
    assert_close(torch.stack(steps, dim=1), hf_logits, **TOL)


# ------------------------------------------------------------------------------------------ gpt-oss attention
def _record_attention(hf: torch.nn.Module) -> tuple[dict[int, list], list]:
    """Forward hooks keeping ``(hidden_states in, attention out)`` of every ``self_attn`` call per layer."""
    seen: dict[int, list] = {i: [] for i in range(len(hf.model.layers))}

    def hook(module, args, kwargs, out, i):
        seen[i].append((kwargs["hidden_states"].detach().clone(), out[0].detach().clone()))

    handles = [
        layer.self_attn.register_forward_hook(lambda mod, a, kw, out, i=i: hook(mod, a, kw, out, i), with_kwargs=True)
        for i, layer in enumerate(hf.model.layers)
    ]
    return seen, handles


def test_gpt_oss_attention_layers_equal_transformers_full_pass() -> None:
    hf = hf_model(gpt_oss())
    seen, handles = _record_attention(hf)
    with torch.no_grad():
        hf(torch.randint(0, V, (2, 40)))
    for h in handles:
        h.remove()
    assert hf.config.layer_types == ["sliding_attention", "full_attention"]
    for i in range(2):
        attn, rope = attention_from_hf(hf, i)
        assert attn.window == (6 if i == 0 else None) and attn.sinks is not None
        x, want = seen[i][0]
        with torch.no_grad():
            got = attn(x)
            assert_close(got, want, **TOL)
            assert_close(on_backend(attn, "eager", x), want, **TOL)


def test_gpt_oss_attention_layers_equal_transformers_cached_generate() -> None:
    """Every step of HF's cached greedy decoding, replayed through poslab's KV cache, layer by layer."""
    hf = hf_model(gpt_oss())
    seen, handles = _record_attention(hf)
    hf_greedy(hf, torch.randint(0, V, (2, 8)), 32)
    for h in handles:
        h.remove()
    for i in range(2):
        attn, rope = attention_from_hf(hf, i)
        calls = seen[i]
        assert calls[0][0].shape[1] == 8 and all(x.shape[1] == 1 for x, _ in calls[1:]) and len(calls) >= 32
        window = attn.window
        cache = KVCache(2, 2, 24, capacity=window, rolling=True) if window else KVCache(2, 2, 24, capacity=48)
        with torch.no_grad():
            for x, want in calls:
                assert_close(attn(x, cache=cache), want, **TOL)
        assert cache.length == 8 + len(calls) - 1


def test_gpt_oss_whole_model_is_refused_naming_the_moe() -> None:
    with pytest.raises(
        ValueError, match=r"gpt_oss: the routed mixture-of-experts MLP \(num_local_experts=4.*attention_from_hf"
    ):
        poslab.from_hf(hf_model(gpt_oss()))
    with pytest.raises(ValueError, match="layer must be an integer in"):
        attention_from_hf(hf_model(gpt_oss()), 2)


# ------------------------------------------------------------------------------------------ refusals and warnings
@pytest.mark.parametrize(
    "config, needle",
    [
        (llama4(moe_layers=[1]), r"llama4_text: moe_layers=\[1\]"),
        (
            deepseek(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1),
            "deepseek_v3: first_k_dense_replace=1 with num_hidden_layers=2",
        ),
        (gemma2(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (qwen3(hidden_act="quick_gelu"), "activation 'quick_gelu'"),
        (qwen3(hidden_size=66, num_attention_heads=4), "hidden_size=66 not divisible"),
    ],
)
def test_unsupported_option_is_refused_naming_the_field(config: Any, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        poslab.from_hf(hf_model(config))


def test_unknown_layer_type_is_refused() -> None:
    hf = hf_model(qwen3())
    hf.config.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="layer_types entry 'chunked_attention'"):
        poslab.from_hf(hf)


def test_gemma3_attention_softcap_follows_transformers_with_a_warning() -> None:
    """transformers 5.24's Gemma3Attention never passes attn_logit_softcapping on; poslab follows it and says so."""
    hf = hf_model(gemma3(attn_logit_softcapping=3.0))
    with pytest.warns(UserWarning, match="attn_logit_softcapping=3.0"):
        ours = poslab.from_hf(hf)
    assert ours.config.attention.softcap is None
    idx = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        assert_close(ours(idx), hf(idx).logits, **TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        poslab.from_hf(hf_model(gemma3()))  # no cap: no warning


def test_from_hf_folder_gemma2(tmp_path) -> None:
    """``poslab.from_hf(path_to_a_gemma2_folder)`` gives equal logits (offline folder read)."""
    hf = hf_model(gemma2())
    hf.save_pretrained(tmp_path)
    ours = poslab.from_hf(tmp_path)
    idx = torch.randint(0, V, (2, 30))
    with torch.no_grad():
        assert_close(ours(idx), hf(idx).logits, **TOL)


# ------------------------------------------------------------------------------------------ export
def _exporters() -> dict[str, Any]:
    from poslab.interop import deepseek, gemma, llama4, qwen3

    return {
        "qwen3": qwen3.to_hf,
        "gemma2": gemma.to_hf_gemma2,
        "gemma3_text": gemma.to_hf_gemma3,
        "llama4_text": llama4.to_hf,
        "deepseek_v3": deepseek.to_hf,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_to_hf_from_hf_equals_original(case: str) -> None:
    """``<family>.to_hf(from_hf(m))`` has ``m``'s weights (Gemma's ``1 + w`` gains to fp32 rounding) and logits."""
    config, _ = CASES[case]
    hf = hf_model(config)
    back = _exporters()[config.model_type](poslab.from_hf(hf))
    assert type(back) is type(hf)
    assert getattr(back.config, "layer_types", None) == getattr(hf.config, "layer_types", None)
    want, got = hf.state_dict(), back.state_dict()
    assert set(got) == set(want)
    for key in want:
        exact = "norm" not in key or not config.model_type.startswith("gemma")
        assert_close(got[key], want[key], atol=0 if exact else 1e-6, rtol=0, msg=key)
    idx = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert_close(back(idx).logits, hf(idx).logits, rtol=0, atol=1e-5)


def test_to_hf_folder_loads_with_from_pretrained(tmp_path) -> None:
    from poslab.interop import llama4 as family

    hf = hf_model(llama4())
    family.to_hf(poslab.from_hf(hf), tmp_path / "export")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    idx = torch.randint(0, V, (2, 30))
    with torch.no_grad():
        assert_close(loaded(idx).logits, hf(idx).logits, **TOL)
    with pytest.raises(FileExistsError, match="not an empty folder"):
        family.to_hf(poslab.from_hf(hf), tmp_path / "export")


@pytest.mark.parametrize(
    ("family", "overrides", "needle"),
    [
        ("qwen3", {"attention": {"qk_norm": False}}, "attention.qk_norm=False"),
        ("qwen3", {"attention": {"sinks": True}}, "attention.sinks=True"),
        ("qwen3", {"layer_pattern": [{"window": 3}, {"window": 5}]}, r"windows of several sizes \[3, 5\]"),
        ("gemma2", {"residual": "sequential"}, "residual='sequential'"),
        ("gemma3_text", {"attention": {"softcap": 3.0}}, "attention.softcap=3.0"),
        ("llama4_text", {"layer_pattern": [{"position": "alibi"}, {}]}, "position='alibi'"),
        ("llama4_text", {"layer_pattern": [{"position": "none", "qk_norm": True}, {}]}, "qk_norm on a NoPE layer"),
    ],
)
def test_to_hf_refuses_what_the_family_cannot_hold(family: str, overrides: dict, needle: str) -> None:
    base = {
        "qwen3": dict(
            position="rope", bias=False, norm={"kind": "rmsnorm"}, mlp={"kind": "swiglu"}, attention={"qk_norm": True}
        ),
        "gemma2": dict(
            position="rope",
            bias=False,
            residual="sandwich",
            embed_scale=8.0,
            norm={"kind": "rmsnorm"},
            mlp={"kind": "swiglu"},
        ),
        "gemma3_text": dict(
            position="rope",
            bias=False,
            residual="sandwich",
            embed_scale=8.0,
            norm={"kind": "rmsnorm"},
            mlp={"kind": "swiglu"},
            attention={"qk_norm": True},
        ),
        "llama4_text": dict(
            position="rope",
            position_config={"layout": "interleaved"},
            bias=False,
            norm={"kind": "rmsnorm"},
            mlp={"kind": "swiglu"},
            attention={"qk_norm_affine": False},
        ),
    }[family]
    model = poslab.GPT(
        poslab.GPTConfig(vocab_size=V, n_layer=2, n_head=4, n_embd=64, block_size=32, **merged(base, overrides))
    )
    with pytest.raises(ValueError, match=needle):
        _exporters()[family](model)


@pytest.mark.parametrize("case", list(CASES))
def test_poslab_to_hf_of_a_loaded_model_picks_its_family(case: str) -> None:
    """``poslab.to_hf(from_hf(m))`` (the one front door) writes ``m``'s own family with ``m``'s logits."""
    config, _ = CASES[case]
    hf = hf_model(config)
    back = poslab.to_hf(poslab.from_hf(hf))
    assert type(back) is type(hf)
    idx = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert_close(back(idx).logits, hf(idx).logits, rtol=0, atol=1e-5)
