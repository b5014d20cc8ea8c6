"""Multi-head attention over explicit positions: a spec, a backend registry, the KV cache, the module.

Every mask is a function of the positions, never of tensor indices:

* causal: query at position ``i`` sees keys ``j <= i``;
* sliding window ``W`` (Hugging Face / Mistral semantics): ``i - W < j <= i``, i.e. ``W`` keys
  including itself (flash-attn's ``window_size=(W-1, 0)``); without ``causal`` the window is
  symmetric, ``|i - j| < W``;
* chunk ``C`` (Llama 4): ``j // C == i // C``.

The package, bottom up (docs/attention.md describes it):

* :mod:`~poslab.nn.attention.spec`: :class:`AttentionSpec`, the frozen description of what a call
  computes; its position rule ``keep(q_pos, k_pos)`` (one :class:`MaskTerm` per mechanism) and its
  score transform (soft-cap, then bias).
* :mod:`~poslab.nn.attention.inputs`: the input checks and mask merging.
* :mod:`~poslab.nn.attention.call`: :class:`Call`, one call's tensors and per-call options.
* :mod:`~poslab.nn.attention.blocked`: query blocking with recompute, a wrapper over any per-block kernel.
* :mod:`~poslab.nn.attention.backends`: ``eager``, ``sdpa``, ``flex`` in a registry, each with a
  ``supports(spec, call)`` rule; ``auto`` takes the first (by priority) that is preferred on the
  device and supports the call.
* :mod:`~poslab.nn.attention.config`: :class:`AttentionConfig` (a layer's settings) and
  :class:`AttendOptions` (how one call runs).
* :mod:`~poslab.nn.attention.core`: :func:`attend`.
* :mod:`~poslab.nn.attention.cache`: :class:`KVCache` (plain, rolling), :class:`SegmentMemoryCache`
  (Transformer-XL memory as a cache), :class:`SegmentInputs` (Transformer-XL memory of one forward).
* :mod:`~poslab.nn.attention.rotation`: the scheme's ``rotate`` around a cache (shared with MLA).
* :mod:`~poslab.nn.attention.module`: :class:`MultiHeadAttention` (an :class:`AttentionLayer`) and
  :func:`use_backend`.
"""

from poslab.nn.attention.backends import (
    BACKENDS,
    CPU_LOWP_MATH_MAX_T,
    FLEX_CPU_BLOCK,
    REGISTRY,
    SINK_PAD,
    Backend,
    backend_names,
    backend_trains,
    check_backend_name,
    register_backend,
    resolve,
    unregister_backend,
)
from poslab.nn.attention.blocked import TRIM_TILE_BYTES, blocked, key_reach, trim_heap
from poslab.nn.attention.cache import KVCache, SegmentInputs, SegmentMemoryCache
from poslab.nn.attention.call import Call
from poslab.nn.attention.config import (
    DEFAULT_QUERY_CHUNK,
    DEFAULT_RECOMPUTE_THRESHOLD,
    AttendOptions,
    AttentionConfig,
)
from poslab.nn.attention.core import attend, resolve_backend
from poslab.nn.attention.inputs import (
    check_mask,
    check_qkv,
    validate_geometry,
    validate_head_dim,
    validate_temperature_tuning,
)
from poslab.nn.attention.module import AttentionLayer, MergeHeads, MultiHeadAttention, SplitHeads, use_backend
from poslab.nn.attention.rotation import rotate_with_cache
from poslab.nn.attention.spec import (
    MASK_TERMS,
    AttentionSpec,
    BiasFn,
    LazyScoreMod,
    MaskTerm,
    check_mechanisms,
    position_mask,
    register_mask_term,
    unregister_mask_term,
    validate_chunk,
    validate_window,
)

__all__ = [
    "BACKENDS",
    "CPU_LOWP_MATH_MAX_T",
    "DEFAULT_QUERY_CHUNK",
    "DEFAULT_RECOMPUTE_THRESHOLD",
    "FLEX_CPU_BLOCK",
    "MASK_TERMS",
    "REGISTRY",
    "SINK_PAD",
    "TRIM_TILE_BYTES",
    "AttendOptions",
    "AttentionLayer",
    "AttentionConfig",
    "AttentionSpec",
    "Backend",
    "BiasFn",
    "Call",
    "KVCache",
    "SegmentInputs",
    "SegmentMemoryCache",
    "LazyScoreMod",
    "MaskTerm",
    "MergeHeads",
    "MultiHeadAttention",
    "SplitHeads",
    "attend",
    "backend_names",
    "backend_trains",
    "blocked",
    "check_backend_name",
    "check_mask",
    "check_mechanisms",
    "check_qkv",
    "key_reach",
    "position_mask",
    "register_backend",
    "register_mask_term",
    "resolve",
    "resolve_backend",
    "rotate_with_cache",
    "trim_heap",
    "unregister_backend",
    "unregister_mask_term",
    "use_backend",
    "validate_geometry",
    "validate_head_dim",
    "validate_chunk",
    "validate_temperature_tuning",
    "validate_window",
]
