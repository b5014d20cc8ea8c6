"""poslab: multi-head attention and position encodings, correct, fast and measured."""

from poslab import positions
from poslab.attention import KVCache, MultiHeadAttention
from poslab.interop import from_hf, to_hf
from poslab.model import GPT, GPTConfig

__version__ = "0.1.0"

__all__ = ["GPT", "GPTConfig", "KVCache", "MultiHeadAttention", "from_hf", "positions", "to_hf", "__version__"]
