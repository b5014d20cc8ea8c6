"""poslab: multi-head attention and position encodings, correct, fast and measured."""

from poslab.interop import from_hf, to_hf
from poslab.nn import positions
from poslab.nn.attention import AttentionConfig, KVCache, MultiHeadAttention
from poslab.nn.caches import DecodeSpec, SegmentMemorySpec, StreamingSpec
from poslab.nn.model import GPT, GPTConfig, MLPConfig, NormConfig
from poslab.version import __version__

__all__ = [
    "GPT",
    "AttentionConfig",
    "GPTConfig",
    "MLPConfig",
    "NormConfig",
    "KVCache",
    "DecodeSpec",
    "StreamingSpec",
    "SegmentMemorySpec",
    "MultiHeadAttention",
    "from_hf",
    "positions",
    "to_hf",
    "__version__",
]
