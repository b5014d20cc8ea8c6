"""The cases of ``poslab bench``: each one self-attention layer built the same way, poslab's or a reference's."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

BATCH, HEADS, HEAD_DIM = 8, 4, 32
D_MODEL = HEADS * HEAD_DIM
WINDOW = 256
FULL_SIZES = (256, 512, 1024, 2048, 4096, 8192)
QUICK_SIZES = (256, 1024)
FULL_CONTEXTS = (64, 128, 256, 512, 1024, 2048)
QUICK_CONTEXTS = (64, 512)
THREADS_ENV = "POSLAB_BENCH_THREADS"


REFERENCES = ("torch-mha", "torch-mha-is_causal", "naive", "hf-llama-rope", "hf-bloom-alibi")
#: ``poslab:<scheme>+<mechanism>`` cases (not in the default run; ask with ``--cases``): the
#: MultiHeadAttention options of each modern mechanism at its models' settings
MECHANISMS: dict[str, dict[str, Any]] = {
    "softcap": {"softcap": 50.0},  # Gemma 2
    "qknorm": {"qk_norm": True},  # Qwen3, Gemma 3
    "sinks": {"sinks": True},  # gpt-oss
    "chunk": {"chunk": WINDOW},  # Llama 4 (8192 there; 256 here, like the window case)
    "temperature": {"temperature_tuning": (8192.0, 0.1)},  # Llama 4 NoPE layers
}
#: ``poslab:mla``: multi-head latent attention at this width (latent 64, rotary key 16, nope 32, v 32)
MLA_DIMS = {"kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}


# ================================================================================ attention cases
#: what a case builder returns: the module (for ``zero_grad``) and its forward pass
Built = tuple[nn.Module, Callable[[], Tensor]]


@dataclass(frozen=True)
class Case:
    """One benchmarked attention implementation: a builder of :data:`BUILDERS` and its typed parameters.

    Attributes:
        name: table name (what ``--cases`` and the results use).
        builder: key of :data:`BUILDERS`.
        params: keyword arguments of the builder, as ``(name, value)`` pairs (hashable).
        window: sliding window (for the FLOP count), ``None`` = causal.
        quadratic_bytes: bytes per ``T^2`` the case keeps (for the skip estimate), 0 if linear.
    """

    name: str
    builder: str
    params: tuple[tuple[str, Any], ...] = ()
    window: int | None = None
    quadratic_bytes: float = 0.0

    def to_json(self) -> str:
        """The spec as one JSON string (how the memory worker receives it)."""
        return json.dumps(
            {
                "name": self.name,
                "builder": self.builder,
                "params": [list(p) for p in self.params],
                "window": self.window,
                "quadratic_bytes": self.quadratic_bytes,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Case:
        data = json.loads(text)
        return cls(
            data["name"],
            data["builder"],
            tuple((k, v) for k, v in data["params"]),
            data["window"],
            data["quadratic_bytes"],
        )


def build_poslab(x: Tensor, T: int, *, scheme: str, window: int | None = None, mechanism: str | None = None) -> Built:
    """poslab's :class:`~poslab.nn.attention.MultiHeadAttention` with position scheme ``scheme``
    (and one of :data:`MECHANISMS`: soft-capping, QK-norm, sinks, temperature tuning)."""
    from poslab.nn import positions
    from poslab.nn.attention import AttentionConfig, MultiHeadAttention

    if mechanism is not None and mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}")
    position = positions.build_for_model(
        scheme, {}, {"n_embd": D_MODEL, "n_heads": HEADS, "head_dim": HEAD_DIM, "max_len": T, "bidirectional": False}
    )
    options = MECHANISMS[mechanism] if mechanism is not None else {}
    module = MultiHeadAttention(
        D_MODEL, HEADS, attention=AttentionConfig(window=window, bias=False, **options), position=position
    )
    module.add_module("scheme", position)
    pos = torch.arange(T)

    def forward() -> Tensor:
        return module(position.embed(x, pos), pos)  # absolute schemes add their table here

    return module, forward


def build_torch_mha(x: Tensor, T: int, *, is_causal_hint: bool = False) -> Built:
    """``torch.nn.MultiheadAttention`` with a causal ``attn_mask`` (and optionally the ``is_causal`` hint)."""
    module = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True, bias=False)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = masked (nn.MultiheadAttention)

    def forward() -> Tensor:
        return module(x, x, x, attn_mask=future, need_weights=False, is_causal=is_causal_hint)[0]

    return module, forward


def build_naive(x: Tensor, T: int) -> Built:
    """:class:`NaiveAttention`: eager ``softmax(QK^T)V``."""
    module = NaiveAttention(D_MODEL, HEADS)
    return module, lambda: module(x)


def build_hf_llama(x: Tensor, T: int) -> Built:
    """``transformers``' Llama attention (RoPE, SDPA)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=T,
        intermediate_size=4 * D_MODEL,
    )
    config._attn_implementation = "sdpa"
    module = LlamaAttention(config, layer_idx=0)
    rotary = LlamaRotaryEmbedding(config)
    position_ids = torch.arange(T)[None]

    def forward() -> Tensor:
        cos_sin = rotary(x, position_ids)  # the model computes these once per forward
        return module(x, position_embeddings=cos_sin, attention_mask=None)[0]  # None: SDPA is_causal

    return module, forward


def build_hf_bloom(x: Tensor, T: int) -> Built:
    """``transformers``' Bloom attention (ALiBi, eager, with its projection biases)."""
    from transformers import BloomConfig
    from transformers.models.bloom.modeling_bloom import BloomAttention, build_alibi_tensor

    module = BloomAttention(BloomConfig(hidden_size=D_MODEL, n_head=HEADS), layer_idx=0)
    ones = torch.ones(BATCH, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    residual = torch.zeros(BATCH, T, D_MODEL)

    def forward() -> Tensor:
        alibi = build_alibi_tensor(ones, HEADS, x.dtype)  # [B*h, 1, T], as BloomModel builds it
        mask = torch.zeros(BATCH, 1, T, T).masked_fill(future, torch.finfo(x.dtype).min)
        return module(x, residual, alibi, mask)[0]

    return module, forward


def build_mla(x: Tensor, T: int) -> Built:
    """DeepSeek's multi-head latent attention (:data:`MLA_DIMS`) with decoupled RoPE."""
    from poslab.nn import positions
    from poslab.nn.mla import MultiHeadLatentAttention

    scheme = positions.build_for_model("rope", {}, {"head_dim": MLA_DIMS["qk_rope_head_dim"], "max_len": T})
    module = MultiHeadLatentAttention(D_MODEL, HEADS, **MLA_DIMS, position=scheme)
    pos = torch.arange(T)
    return module, lambda: module(x, pos)


# ------------------------------------------------------------------ transformers' modern families
#: ``hf-<family>-<mechanism>`` cases: transformers' own attention layer of each modern family, built
#: offline from a one-layer config at this width. Each maps to ``(model_type, attn_implementation,
#: config settings)``; ``eager`` where transformers refuses SDPA for the family (``_supports_sdpa =
#: False``: Gemma 2's soft-cap, gpt-oss's sinks), ``sdpa`` elsewhere. Its ``poslab:<family>-<mechanism>``
#: twin is poslab's layer converted from the same config and weights by :mod:`poslab.interop`.
HF_FAMILY_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gemma2-softcap": ("gemma2", "eager", {"layer_types": ["full_attention"], "attn_logit_softcapping": 50.0}),
    f"gemma2-softcap-window{WINDOW}": (
        "gemma2",
        "eager",
        {"layer_types": ["sliding_attention"], "attn_logit_softcapping": 50.0},
    ),
    "gemma3-qknorm": ("gemma3_text", "sdpa", {"layer_types": ["full_attention"]}),
    "qwen3-qknorm": ("qwen3", "sdpa", {}),
    "gptoss-sinks": ("gpt_oss", "eager", {"layer_types": ["full_attention"]}),
    "gptoss-sinks-window128": ("gpt_oss", "eager", {"layer_types": ["sliding_attention"], "sliding_window": 128}),
    "llama4-chunk": (
        "llama4_text",
        "sdpa",
        {
            "layer_types": ["chunked_attention"],
            "no_rope_layers": [1],
            "attention_chunk_size": WINDOW,
            "use_qk_norm": True,
        },
    ),
    "llama4-nope-temperature": (
        "llama4_text",
        "sdpa",
        {
            "layer_types": ["full_attention"],
            "no_rope_layers": [0],
            "attn_temperature_tuning": True,
            "floor_scale": 8192,
            "attn_scale": 0.1,
        },
    ),
    "deepseek-v3-mla": (
        "deepseek_v3",
        "sdpa",
        {
            **MLA_DIMS,
            "first_k_dense_replace": 1,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
}
#: bytes per ``T^2`` transformers' layers keep (the skip estimate), measured at T=2048: eager 3.4 fp32
#: ``[B, h, T, T]`` (gpt-oss) to 4.2 (Gemma 2's soft-cap); DeepSeek-V3's SDPA 3.2 (q and v widths
#: differ: SDPA's math path); Llama 4's chunked SDPA keeps its boolean ``[B, 1, T, T]`` masks
_HF_QUADRATIC_BYTES = {
    "eager": BATCH * HEADS * 4 * 4.5,
    "deepseek-v3-mla": BATCH * HEADS * 4 * 3.5,
    "llama4-chunk": 64.0,
}


def hf_family_model(variant: str, T: int, **overrides: Any) -> nn.Module:
    """A one-layer ``...ForCausalLM`` of :data:`HF_FAMILY_CASES` ``variant`` at the bench geometry (fp32, train mode).

    Args:
        variant: key of :data:`HF_FAMILY_CASES`.
        T: longest sequence the model will see (its ``max_position_embeddings`` is at least this).
        overrides: config fields replacing the variant's (tests shrink windows, chunks, ``floor_scale``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if variant not in HF_FAMILY_CASES:
        raise ValueError(f"unknown transformers family case {variant!r}; known: {', '.join(HF_FAMILY_CASES)}")
    model_type, implementation, settings = HF_FAMILY_CASES[variant]
    common: dict[str, Any] = dict(
        vocab_size=256,
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        num_hidden_layers=1,
        intermediate_size=4 * D_MODEL,
        max_position_embeddings=max(T, 4096),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        sliding_window=WINDOW,
    )
    if model_type in ("gemma2", "gemma3_text"):
        common["query_pre_attn_scalar"] = HEAD_DIM  # softmax scale 1/sqrt(d_k), as every other case
    if model_type == "llama4_text":
        common.update(moe_layers=[], intermediate_size_mlp=4 * D_MODEL)
    if model_type == "gpt_oss":
        common.update(num_local_experts=2, num_experts_per_tok=1)
    if model_type == "deepseek_v3":
        del common["head_dim"]  # MLA: the config derives its rotary head_dim from qk_rope_head_dim
    config = AutoConfig.for_model(model_type, **{**common, **settings, **overrides})
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).float().train()


def hf_family_attention(model: nn.Module, x: Tensor, T: int) -> Built:
    """Layer 0's ``self_attn`` of ``model``, called as its model calls it: the model's rotary embedding
    and the mask of the layer's type (causal, sliding window or chunked) from ``transformers.masking_utils``."""
    from transformers import masking_utils

    config, inner = model.config, model.model
    layer_type = (getattr(config, "layer_types", None) or ["full_attention"])[0]
    make_mask = {
        "full_attention": masking_utils.create_causal_mask,
        "sliding_attention": masking_utils.create_sliding_window_causal_mask,
        "chunked_attention": masking_utils.create_chunked_causal_mask,
    }[layer_type]
    attn = inner.layers[0].self_attn
    position_ids = torch.arange(T)[None]
    per_type_rope = config.model_type == "gemma3_text"  # Gemma 3: one rotary embedding per layer type

    def forward() -> Tensor:
        rope = inner.rotary_emb(x, position_ids, layer_type) if per_type_rope else inner.rotary_emb(x, position_ids)
        mask = make_mask(config=config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids)
        return attn(x, position_embeddings=rope, attention_mask=mask)[0]

    return attn, forward


def poslab_family_attention(model: nn.Module, x: Tensor, T: int) -> Built:
    """poslab's attention for layer 0 of ``model``, converted by :mod:`poslab.interop` (``from_hf``; gpt-oss:
    ``attention_from_hf``), with the same weights and every mechanism setting taken from the config."""
    if model.config.model_type == "gpt_oss":  # MoE MLPs: from_hf refuses the model, the attention layers convert
        from poslab.interop.gpt_oss import attention_from_hf

        attn, scheme = attention_from_hf(model, 0)
    else:
        from poslab.interop.hf import from_hf

        gpt = from_hf(model)
        attn, scheme = gpt.blocks[0].attn, gpt.layer_position(0)
    attn.train()
    attn.share_position(scheme)
    pos = torch.arange(T)
    return attn, lambda: attn(x, pos)


def build_hf_family(x: Tensor, T: int, *, variant: str) -> Built:
    """``transformers``' own attention layer of :data:`HF_FAMILY_CASES` ``variant`` (:func:`hf_family_attention`)."""
    return hf_family_attention(hf_family_model(variant, T), x, T)


def build_poslab_family(x: Tensor, T: int, *, variant: str) -> Built:
    """poslab's twin of ``hf-<variant>``, converted from the same config (:func:`poslab_family_attention`)."""
    return poslab_family_attention(hf_family_model(variant, T), x, T)


#: builder name -> function ``(x [B, T, d], T, **params) -> (module, forward)``
BUILDERS: dict[str, Callable[..., Built]] = {
    "poslab": build_poslab,
    "torch-mha": build_torch_mha,
    "naive": build_naive,
    "hf-llama": build_hf_llama,
    "hf-bloom": build_hf_bloom,
    "mla": build_mla,
    "hf-family": build_hf_family,
    "poslab-family": build_poslab_family,
}


def mechanism_cases() -> list[Case]:
    """The modern-mechanism cases (RoPE, or NoPE for the temperature tuning) and MLA."""
    cases = []
    for mechanism in MECHANISMS:
        scheme = "none" if mechanism == "temperature" else "rope"
        cases.append(Case(f"poslab:{scheme}+{mechanism}", "poslab", (("scheme", scheme), ("mechanism", mechanism))))
    return [*cases, Case("poslab:mla", "mla")]


def hf_family_cases() -> list[Case]:
    """Each :data:`HF_FAMILY_CASES` variant twice: ``poslab:<variant>`` (converted) then ``hf-<variant>``."""
    cases = []
    for variant, (_, implementation, settings) in HF_FAMILY_CASES.items():
        window = (
            settings.get("sliding_window", WINDOW) if "sliding_attention" in settings.get("layer_types", ()) else None
        )
        quadratic = _HF_QUADRATIC_BYTES.get(implementation, _HF_QUADRATIC_BYTES.get(variant, 0.0))
        params = (("variant", variant),)
        cases += [
            Case(f"poslab:{variant}", "poslab-family", params, window=window),
            Case(f"hf-{variant}", "hf-family", params, window=window, quadratic_bytes=quadratic),
        ]
    return cases


def attention_cases(schemes: Sequence[str] | None = None, mechanisms: bool = False) -> list[Case]:
    """poslab with every registered scheme (or ``schemes``), a sliding window, then the references
    (and, with ``mechanisms``, :func:`mechanism_cases`)."""
    from poslab.nn import positions

    names = list(schemes) if schemes is not None else positions.names()
    cases = [Case(f"poslab:{n}", "poslab", (("scheme", n),)) for n in names]
    cases.append(Case(f"poslab:none-window{WINDOW}", "poslab", (("scheme", "none"), ("window", WINDOW)), window=WINDOW))
    cases += [
        Case("torch-mha", "torch-mha", quadratic_bytes=5.0),  # its [T, T] mask, bool then float inside SDPA
        Case("torch-mha-is_causal", "torch-mha", (("is_causal_hint", True),), quadratic_bytes=1.0),
        Case("naive", "naive", quadratic_bytes=BATCH * HEADS * 4 * 3.0),  # measured: ~3 fp32 [B, h, T, T] at the peak
        Case("hf-llama-rope", "hf-llama"),
        Case("hf-bloom-alibi", "hf-bloom", quadratic_bytes=BATCH * HEADS * 4 * 3.5),
    ]
    return cases + mechanism_cases() if mechanisms else cases


def find_cases(names: Sequence[str]) -> list[Case]:
    """The cases named (``--cases``), in that order; ``ValueError`` naming an unknown one and listing the known."""
    known = {c.name: c for c in [*attention_cases(mechanisms=True), *hf_family_cases()]}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown benchmark case {unknown[0]!r}; known: {', '.join(known)}")
    return [known[n] for n in names]


class NaiveAttention(nn.Module):
    """The textbook form: ``softmax(q k^T / sqrt(d_k))`` masked with ``-inf``, times ``v`` (eager)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)  # [B, T, d] x3
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, h, T, d_k]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, h, T, T]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(B, T, d))  # [B, h, T, d_k] -> [B, T, d]


def build_case(case: Case, T: int, seed: int = 0) -> Callable[[], None]:
    """A closure running one forward + backward of ``case`` at length ``T`` (grads reset first)."""
    if case.builder not in BUILDERS:
        raise ValueError(f"unknown benchmark builder {case.builder!r}; known: {', '.join(BUILDERS)}")
    torch.manual_seed(seed)
    x = torch.randn(BATCH, T, D_MODEL, requires_grad=True)
    module, forward = BUILDERS[case.builder](x, T, **dict(case.params))
    module.train()

    def step() -> None:
        x.grad = None
        module.zero_grad(set_to_none=True)
        forward().sum().backward()

    return step
