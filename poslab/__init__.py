"""poslab: multi-head attention and position encodings, correct, fast and measured."""

from poslab import positions
from poslab.attention import KVCache, MultiHeadAttention
from poslab.model import GPT, GPTConfig

__version__ = "0.1.0"

__all__ = ["GPT", "GPTConfig", "KVCache", "MultiHeadAttention", "positions", "__version__"]
