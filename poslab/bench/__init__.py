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

from poslab.bench.cases import (
    BUILDERS,
    D_MODEL,
    FULL_CONTEXTS,
    FULL_SIZES,
    HF_FAMILY_CASES,
    QUICK_CONTEXTS,
    QUICK_SIZES,
    THREADS_ENV,
    Case,
    attention_cases,
    build_case,
    find_cases,
    hf_family_attention,
    hf_family_cases,
    hf_family_model,
    mechanism_cases,
    poslab_family_attention,
)
from poslab.bench.measure import CLOCKS, set_clock
from poslab.bench.report import rerender, run_bench

__all__ = [
    "BUILDERS",
    "CLOCKS",
    "D_MODEL",
    "FULL_CONTEXTS",
    "FULL_SIZES",
    "HF_FAMILY_CASES",
    "QUICK_CONTEXTS",
    "QUICK_SIZES",
    "THREADS_ENV",
    "Case",
    "attention_cases",
    "build_case",
    "find_cases",
    "hf_family_attention",
    "hf_family_cases",
    "hf_family_model",
    "mechanism_cases",
    "poslab_family_attention",
    "rerender",
    "run_bench",
    "set_clock",
]
