"""The neural-network core: position schemes, attention, KV cache, the GPT model, sparse attention.

Layer 1: nothing here imports other poslab parts except :mod:`poslab.config_keys` (layer 0) and
:mod:`poslab.safe_load` (layer -1), never :mod:`poslab.display` beside it; see ``docs/architecture.md``.
"""
