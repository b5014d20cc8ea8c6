"""Interop with other libraries' models: Hugging Face ``transformers`` and Meta's RoPE layout.

* :func:`from_hf` -- a ``transformers`` causal LM (object or local folder) -> :class:`poslab.GPT`.
* :func:`to_hf` -- a GPT-2 or Llama layout :class:`poslab.GPT` -> a ``transformers`` model (and folder).
* :func:`permute_rope` / :func:`relayout_rope` -- interleaved (Meta) <-> half-split (Hugging Face) q/k rows.

``transformers`` is imported only when a Hugging Face function runs (``pip install 'poslab[hf]'``).
See ``docs/interop.md``.
"""

from poslab.interop.hf import SUPPORTED, from_hf, to_hf
from poslab.interop.permute import permute_rope, relayout_rope

__all__ = ["SUPPORTED", "from_hf", "permute_rope", "relayout_rope", "to_hf"]

# family modules register themselves with from_hf's dispatch (after hf.py is loaded)
from poslab.interop import deepseek, gemma, gpt_oss, llama4, qwen3  # noqa: E402,F401
