"""The neural-network core: position schemes, attention, KV cache, the GPT model, sparse attention.

Nothing here imports from any other poslab layer except :mod:`poslab.config_keys` and
:mod:`poslab.display` (layer 0); see ``docs/architecture.md``.
"""
