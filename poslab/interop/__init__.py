"""Interop with other libraries' models: Hugging Face ``transformers`` and Meta's RoPE layout.

* :func:`from_hf` -- a ``transformers`` causal LM (object or local folder) -> :class:`poslab.GPT`.
* :func:`to_hf` -- a :class:`poslab.GPT` -> the ``transformers`` family that expresses it (and a
  folder), or a one-line refusal.
* :func:`permute_rope` / :func:`relayout_rope` -- interleaved (Meta) <-> half-split (Hugging Face) q/k rows.

One module per family (``gpt2``, ``llama`` with Mistral, ``neox``, ``gptj``, ``bloom``, ``mpt``,
``qwen3``, ``gemma``, ``gpt_oss``, ``llama4``, ``deepseek``); ``hf`` is the registry, ``common`` and
``checkpoint`` the shared helpers. ``transformers`` is imported only when a Hugging Face function
runs (``pip install 'poslab[hf]'``). See ``docs/interop.md``.
"""

from poslab.interop.hf import SUPPORTED, from_hf, to_hf
from poslab.interop.permute import permute_rope, relayout_rope

__all__ = ["SUPPORTED", "from_hf", "permute_rope", "relayout_rope", "to_hf"]
