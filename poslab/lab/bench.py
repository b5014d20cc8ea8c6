"""``poslab bench``: attention speed and memory, and KV-cache decoding, measured side by side.

Attention (forward + backward of one self-attention layer with its projections, no projection
biases except Bloom's (built in), ``B=8, h=4, d_k=32, d=128``, causal, fp32) for every registered
position scheme, a sliding window, and four
references: ``torch.nn.MultiheadAttention`` (causal ``attn_mask``, ``need_weights=False``, and the
same with the ``is_causal`` hint), a naive eager ``softmax(QK^T)V``, ``transformers``' Llama
attention (RoPE, SDPA) and Bloom attention (ALiBi). On request (``--cases``): the modern mechanisms
(:func:`mechanism_cases`), and transformers' own attention of each modern family next to poslab's layer
converted from the same model by :mod:`poslab.interop` (:func:`hf_family_cases`).

Honesty rules:

* **Alternating runs, medians.** Every case is built once per ``T`` and warmed up (``T <= 2048``;
  longer runs skip the warm-up and take at least 3 rounds); then the cases run in turn, the order
  rotating each round; the table shows the median.
* **Clock.** Wall time by default; ``--clock cpu --threads 1`` times this process's CPU time on one
  thread, which stays honest when other jobs share the cores (an oversubscribed OpenMP thread pool
  waits for descheduled peers, inflating wall time unevenly).
* **Peak memory per case in a fresh subprocess.** The worker builds the case, records its resident
  set, resets the kernel's high-water mark (``/proc/self/clear_refs``), runs forward + backward once
  and reports ``VmHWM - VmRSS(before)``. Cases whose naive estimate exceeds half the free memory are
  skipped and marked so.
* **Roofline.** The machine's fp32 matmul GFLOP/s is measured first; each case's achieved rate counts
  the *useful* FLOPs of causal attention (``3x`` the forward: projections ``8 B T d^2`` plus
  ``4 B T k d`` for ``k`` visible keys per query on average), whatever the implementation computes.

Decoding: a 4-layer GPT (d=128, 4 heads, RoPE/ALiBi, batch 1) prefilled to a context of 64 .. 2048
tokens, then per-token latency with the KV cache vs recomputing the full forward for each token.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
#: the clock of every timing: wall time (``perf_counter``) or this process's CPU time (``process_time``)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def set_clock(name: str) -> None:
    """Time with ``"wall"`` (default) or ``"cpu"`` (process CPU time: steadier on a busy machine at 1 thread)."""
    global _clock
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {list(CLOCKS)}, got {name!r}")
    _clock = CLOCKS[name]


def clock_name() -> str:
    return next(name for name, fn in CLOCKS.items() if fn is _clock)


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
        D_MODEL, HEADS, attention=AttentionConfig(window=window, **options), position=position, bias=False
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
    pos = torch.arange(T)
    return attn, lambda: attn(x, pos, position=scheme)


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


def useful_flops(T: int, window: int | None) -> float:
    """FLOPs of causal attention (with projections), forward + backward (= 3x forward)."""
    keys = (T + 1) / 2 if window is None or window >= T else (window * T - window * (window - 1) / 2) / T
    forward = 8 * BATCH * T * D_MODEL**2 + 4 * BATCH * T * keys * D_MODEL
    return 3 * forward


def matmul_gflops(n: int = 1024, repeats: int = 7) -> float:
    """The machine's fp32 ``torch.matmul`` rate (median of ``repeats``), in GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        start = _clock()
        a @ b
        times.append(_clock() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def time_cases(steps: dict[str, Callable[[], None]], repeats: int, warmup: bool = True) -> dict[str, list[float]]:
    """Warm up each step once (optional), then ``repeats`` rounds in rotating order; seconds per run."""
    names = list(steps)
    for name in names if warmup else ():
        steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # alternate who goes first
        for name in order:
            gc.collect()
            start = _clock()
            steps[name]()
            times[name].append(_clock() - start)
    return times


# ---------------------------------------------------------------------------------- memory
def _status_kb(field: str) -> int:
    match = re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def _worker(case: Case, T: int) -> None:
    """Subprocess entry: peak resident memory of one forward + backward, printed as JSON (MiB)."""
    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    step = build_case(case, T)
    gc.collect()
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    step()
    peak = _status_kb("VmHWM")
    print(json.dumps({"peak_mib": (peak - before) / 1024}))


def available_mib() -> float:
    match = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return int(match.group(1)) / 1024 if match else float("inf")


def measure_memory(case: Case, T: int, timeout: float = 1800) -> float | None:
    """Peak MiB of ``case`` at ``T`` in a fresh subprocess (``None`` if skipped or failed)."""
    if case.quadratic_bytes * T * T / 2**20 > 0.5 * available_mib():
        return None
    cmd = [sys.executable, "-m", "poslab.lab.bench", "--worker", case.to_json(), str(T)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    if done.returncode != 0:
        print(
            f"  memory worker for {case.name} at T={T} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr
        )
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"])


# ------------------------------------------------------------------------------------- run
def run_attention(
    sizes: Sequence[int],
    repeats: int,
    memory: bool = True,
    cases: Sequence[Case] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time (and measure) every case (default :func:`attention_cases`) at every size; the rows and the roofline."""
    peak = matmul_gflops()
    log(f"fp32 matmul roofline: {peak:.0f} GFLOP/s ({torch.get_num_threads()} threads)")
    cases = list(cases) if cases is not None else attention_cases()
    rows = []
    for T in sizes:
        runnable = [c for c in cases if c.quadratic_bytes * T * T / 2**20 <= 0.5 * available_mib()]
        skipped = [c.name for c in cases if c not in runnable]
        # long sizes: no warm-up round, at least 3 timed rounds (the median drops a cold first run)
        n_repeats, warmup = (repeats, True) if T <= 2048 else (max(3, repeats // 2), False)
        log(
            f"T={T}: timing {len(runnable)} cases x {n_repeats} alternating rounds"
            + (f" (skipped, too much memory: {', '.join(skipped)})" if skipped else "")
        )
        steps = {c.name: build_case(c, T) for c in runnable}
        times = time_cases(steps, n_repeats, warmup)
        del steps
        gc.collect()
        for case in cases:
            row: dict[str, Any] = {"case": case.name, "T": T, "ms": None, "runs_ms": [], "peak_mib": None}
            if case.name in times:
                median = statistics.median(times[case.name])
                flops = useful_flops(T, case.window)
                row.update(
                    ms=median * 1e3,
                    runs_ms=[t * 1e3 for t in times[case.name]],
                    gflops=flops / median / 1e9,
                    roofline=flops / median / 1e9 / peak,
                )
                if memory:
                    row["peak_mib"] = measure_memory(case, T)
            else:
                row["skipped"] = "estimated memory above half of MemAvailable"
            rows.append(row)
            if row["ms"] is not None:
                mem = f"{row['peak_mib']:.0f} MiB" if row["peak_mib"] is not None else "-"
                log(f"  {case.name:24s} {row['ms']:10.1f} ms  {mem}")
    return {
        "roofline_gflops": peak,
        "threads": torch.get_num_threads(),
        "clock": clock_name(),
        "rows": rows,
        "geometry": {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "window": WINDOW},
    }


# ======================================================================================== decode
def _decode_model(position: str, window: int | None, block: int) -> nn.Module:
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=256, n_layer=4, n_head=4, n_embd=128, block_size=block, position=position, window=window)
    ).eval()


def run_decode(
    contexts: Sequence[int], repeats: int, steps: int = 16, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Per-token latency at each context: KV cache (RoPE, ALiBi, rolling window) vs full recompute (RoPE)."""
    block = max(contexts) + steps + 1
    models = {
        "kv-cache:rope": _decode_model("rope", None, block),
        "kv-cache:alibi": _decode_model("alibi", None, block),
        f"kv-cache:rope-window{WINDOW}": _decode_model("rope", WINDOW, block),
    }
    recompute = models["kv-cache:rope"]
    rows = []
    with torch.no_grad():
        for context in contexts:
            idx = torch.randint(0, 256, (1, context + steps))
            latencies: dict[str, list[float]] = {name: [] for name in [*models, "recompute:rope"]}
            for r in range(repeats):
                names = list(latencies)
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    gc.collect()
                    if name == "recompute:rope":  # one new token = one forward over everything so far
                        start = _clock()
                        recompute(idx[:, : context + 1])
                        latencies[name].append(_clock() - start)
                        continue
                    model = models[name]
                    cache = model.make_cache(1, capacity=context + steps)
                    model(idx[:, :context], cache=cache)  # prefill (not timed)
                    for t in range(context, context + steps):
                        start = _clock()
                        model(idx[:, t : t + 1], cache=cache)
                        latencies[name].append(_clock() - start)
            for name, values in latencies.items():
                median = statistics.median(values)
                rows.append(
                    {"case": name, "context": context, "ms_per_token": median * 1e3, "tokens_per_s": 1 / median}
                )
                log(f"  context {context:5d}  {name:24s} {median * 1e3:8.2f} ms/token  {1 / median:8.1f} tokens/s")
    return {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "batch": 1},
        "steps": steps,
        "rows": rows,
        "threads": torch.get_num_threads(),
        "clock": clock_name(),
    }


# ======================================================================================= report
def _lookup(rows: list[dict], case: str, key: str, **where: Any) -> float | None:
    for row in rows:
        if row["case"] == case and all(row.get(k) == v for k, v in where.items()):
            return row.get(key)
    return None


def check_targets(attention: dict | None, decode: dict | None) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the measured numbers (``None`` where not measured)."""
    checks: list[dict[str, Any]] = []

    def add(target: str, value: float | None, ok: Callable[[float], bool | None], fmt: str = "{:.2f}x") -> None:
        met = None if value is None else ok(value)
        checks.append(
            {
                "target": target,
                "measured": None if value is None else fmt.format(value),
                "met": None if met is None else bool(met),
            }
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    if attention is not None:
        rows = attention["rows"]

        def ms(case: str, T: int) -> float | None:
            return _lookup(rows, case, "ms", T=T)

        add(
            "causal fwd+bwd vs nn.MultiheadAttention (mask), T=1024: >= 1.3x",
            ratio(ms("torch-mha", 1024), ms("poslab:none", 1024)),
            lambda v: v >= 1.3,
        )
        add(
            "(info) causal fwd+bwd vs nn.MultiheadAttention with the is_causal hint (same SDPA kernel), T=1024",
            ratio(ms("torch-mha-is_causal", 1024), ms("poslab:none", 1024)),
            lambda v: None,
        )
        add(
            "causal fwd+bwd vs naive, T=1024: >= 5x",
            ratio(ms("naive", 1024), ms("poslab:none", 1024)),
            lambda v: v >= 5,
        )
        add(
            "causal fwd+bwd vs naive, T=4096: >= 10x",
            ratio(ms("naive", 4096), ms("poslab:none", 4096)),
            lambda v: v >= 10,
        )
        add(
            "RoPE over no position, T=1024: <= +10%",
            ratio(ms("poslab:rope", 1024), ms("poslab:none", 1024)),
            lambda v: v <= 1.10,
        )
        for scheme in ("alibi", "t5"):
            add(
                f"{scheme} / no-bias causal, T=1024: <= 1.6x",
                ratio(ms(f"poslab:{scheme}", 1024), ms("poslab:none", 1024)),
                lambda v: v <= 1.6,
            )
        add(
            f"window {WINDOW} vs full causal, T=8192: >= 4x",
            ratio(ms("poslab:none", 8192), ms(f"poslab:none-window{WINDOW}", 8192)),
            lambda v: v >= 4,
        )
        add(
            "poslab RoPE vs transformers Llama attention, T=1024: > 1x",
            ratio(ms("hf-llama-rope", 1024), ms("poslab:rope", 1024)),
            lambda v: v > 1,
        )
        add(
            "poslab ALiBi vs transformers Bloom attention, T=1024: > 1x",
            ratio(ms("hf-bloom-alibi", 1024), ms("poslab:alibi", 1024)),
            lambda v: v > 1,
        )
        for case in sorted({r["case"] for r in rows}, key=lambda c: (not c.startswith("poslab:"), c)):
            measured = sorted((r["T"], r["peak_mib"]) for r in rows if r["case"] == case and r.get("peak_mib"))
            if len(measured) < 2:
                continue
            (lo, m_lo), (hi, m_hi) = measured[0], measured[-1]
            growth = math.log(m_hi / m_lo) / math.log(hi / lo)
            if case.startswith("poslab:"):
                add(
                    f"{case} peak memory ~ T^k, T={lo}..{hi}: k <= 1.2 (linear)", growth, lambda v: v <= 1.2, "k={:.2f}"
                )
            else:
                add(f"(info) {case} peak memory ~ T^k, T={lo}..{hi}", growth, lambda v: None, "k={:.2f}")
    if decode is not None:
        rows = decode["rows"]
        contexts = sorted({r["context"] for r in rows})
        lo, hi = contexts[0], contexts[-1]

        def lat(case: str, c: int) -> float | None:
            return _lookup(rows, case, "ms_per_token", context=c)

        add(
            f"KV-cache decode latency at {hi} / at {lo}: <= 2x",
            ratio(lat("kv-cache:rope", hi), lat("kv-cache:rope", lo)),
            lambda v: v <= 2,
        )
        add(
            f"KV-cache vs full recompute at context {hi}: >= 10x",
            ratio(lat("recompute:rope", hi), lat("kv-cache:rope", hi)),
            lambda v: v >= 10,
        )
    return checks


def format_report(attention: dict | None, decode: dict | None, checks: list[dict], command: str) -> str:
    """Markdown: the attention table, the decode table and the targets."""
    lines = [f"Command: `{command}`", ""]
    if attention is not None:
        peak = attention["roofline_gflops"]
        g = attention["geometry"]
        lines += [
            f"Attention forward+backward, B={g['batch']}, h={g['heads']}, d_k={g['head_dim']}, causal, fp32, "
            f"{attention['threads']} thread(s), {attention['clock']} clock; "
            f"roofline = measured fp32 matmul {peak:.0f} GFLOP/s. "
            "Median of alternating runs; peak = resident-memory high-water mark of one run in a fresh process.",
            "",
            "| T | case | fwd+bwd ms | peak MiB | GFLOP/s | % roofline | vs naive |",
            "|---:|:---|---:|---:|---:|---:|---:|",
        ]
        for row in attention["rows"]:
            naive = _lookup(attention["rows"], "naive", "ms", T=row["T"])
            if row["ms"] is None:
                lines.append(f"| {row['T']} | {row['case']} | skipped | (memory) | | | |")
                continue
            mem = f"{row['peak_mib']:.0f}" if row.get("peak_mib") is not None else "-"
            vs = f"{naive / row['ms']:.1f}x" if naive else "-"
            lines.append(
                f"| {row['T']} | {row['case']} | {row['ms']:.1f} | {mem} | {row['gflops']:.1f} "
                f"| {100 * row['roofline']:.1f}% | {vs} |"
            )
        lines.append("")
    if decode is not None:
        m = decode["model"]
        lines += [
            f"Decoding: GPT {m['n_layer']} layers, d={m['n_embd']}, {m['n_head']} heads, batch {m['batch']}, "
            f"{decode['threads']} thread(s), {decode['clock']} clock; median of "
            f"{decode['steps']} decode steps per round (cache) or one full forward per round (recompute).",
            "",
            "| context | case | ms/token | tokens/s |",
            "|---:|:---|---:|---:|",
        ]
        for row in decode["rows"]:
            lines.append(
                f"| {row['context']} | {row['case']} | {row['ms_per_token']:.2f} | {row['tokens_per_s']:.1f} |"
            )
        lines.append("")
    if checks:
        lines += ["| target | measured | met |", "|:---|---:|:---:|"]
        for c in checks:
            met = "n/a" if c["met"] is None else ("yes" if c["met"] else "**no**")
            lines.append(f"| {c['target']} | {c['measured'] or '-'} | {met} |")
        lines.append("")
    return "\n".join(lines)


def plot(attention: dict | None, decode: dict | None) -> bytes:
    """PNG: time and peak memory against T, decode latency against context (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = (2 if attention else 0) + (1 if decode else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 5), squeeze=False)
    ax_iter = iter(axes[0])
    if attention is not None:
        rows = attention["rows"]
        cases = list(dict.fromkeys(r["case"] for r in rows))
        sizes = sorted({r["T"] for r in rows})
        colors = plt.cm.tab20(range(len(cases)))
        for key, label in (("ms", "forward+backward (ms)"), ("peak_mib", "peak memory (MiB)")):
            ax = next(ax_iter)
            for case, color in zip(cases, colors):
                pts = [(r["T"], r[key]) for r in rows if r["case"] == case and r.get(key)]
                if pts:
                    style = "-" if case.startswith("poslab") else "--"
                    ax.plot(*zip(*pts), style, marker="o", markersize=3, label=case, color=color)
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label, title=f"attention {label}")
            ax.set_xticks(sizes, [str(t) for t in sizes], minor=False)
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    if decode is not None:
        ax = next(ax_iter)
        rows = decode["rows"]
        for case in dict.fromkeys(r["case"] for r in rows):
            pts = [(r["context"], r["ms_per_token"]) for r in rows if r["case"] == case]
            ax.plot(*zip(*pts), marker="o", label=case)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms per generated token", title="decoding")
        contexts = sorted({r["context"] for r in rows})
        ax.set_xticks(contexts, [str(c) for c in contexts], minor=False)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


# ========================================================================================= entry
def rerender(path: Path, out: Path) -> int:
    """Rebuild the report, targets and plot of a finished run from its ``results.json`` (no measuring)."""
    from poslab.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

    if not path.is_file():
        raise FileNotFoundError(f"--from-results: no such file {str(path)!r}")
    try:
        results = json.loads(path.read_text())
        attention, decode, command = results["attention"], results["decode"], results["command"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"--from-results: {str(path)!r} is not a poslab bench results.json ({err})") from err
    results["targets"] = check_targets(attention, decode)
    report = format_report(attention, decode, results["targets"], command)
    print(report)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report + "\n")
    atomic_write_bytes(out / "bench.png", plot(attention, decode))
    print(f"re-rendered into {out}/ (results.json, report.md, bench.png)")
    return 0


def run_bench(
    out: Path,
    sizes: Sequence[int],
    contexts: Sequence[int],
    repeats: int,
    cases: Sequence[Case] | None = None,
    only: str | None = None,
    memory: bool = True,
    command: str = "",
) -> dict[str, Any]:
    """Measure, print the report and write ``out/results.json``, ``report.md``, ``bench.png``.

    Args:
        out: output folder (created).
        sizes: attention lengths ``T``.
        contexts: decode contexts.
        repeats: alternating rounds per size (positive).
        cases: the attention cases (default :func:`attention_cases`).
        only: ``"attention"`` or ``"decode"`` to run one half.
        memory: measure each case's peak memory in a subprocess.
        command: the command line recorded in the report.

    Returns:
        The results written to ``results.json``.
    """
    from poslab.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

    if repeats <= 0:
        raise ValueError(f"--repeats must be a positive integer, got {repeats}")
    if only not in (None, "attention", "decode"):
        raise ValueError(f"only must be None, 'attention' or 'decode', got {only!r}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    attention = decode = None
    if only in (None, "attention"):
        print("== attention forward+backward")
        attention = run_attention(sizes, repeats, memory=memory, cases=cases)
    if only in (None, "decode"):
        print("== decoding: KV cache vs full recompute")
        decode = run_decode(contexts, repeats)
    checks = check_targets(attention, decode)
    report = format_report(attention, decode, checks, command)
    print()
    print(report)
    results = {
        "command": command,
        "seconds": time.time() - started,
        "torch": torch.__version__,
        "attention": attention,
        "decode": decode,
        "targets": checks,
    }
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", report + "\n")
    atomic_write_bytes(out / "bench.png", plot(attention, decode))
    print(f"results in {out}/ (results.json, report.md, bench.png)")
    return results


if __name__ == "__main__":  # memory worker: python -m poslab.lab.bench --worker CASE T
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        _worker(Case.from_json(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: python -m poslab.lab.bench --worker CASE_JSON T (use `poslab bench` for the benchmark)")
