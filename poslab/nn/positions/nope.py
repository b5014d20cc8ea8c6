"""NoPE: no position encoding at all.

Haviv et al. 2022, "Transformer Language Models without Positional Encodings Still Learn Positional
Information" (https://arxiv.org/abs/2203.16634). Attention without positions is permutation
equivariant; a causal mask alone still leaks order from the second layer on.
"""

from __future__ import annotations

from dataclasses import dataclass

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme


@dataclass
class NoPEConfig:
    """NoPE has nothing to configure."""


@register
class NoPE(PositionScheme):
    """Identity on every hook (Haviv et al. 2022, https://arxiv.org/abs/2203.16634)."""

    name = "none"
    config_class = NoPEConfig
    relative = True
    paper = "Haviv et al. 2022, https://arxiv.org/abs/2203.16634"
