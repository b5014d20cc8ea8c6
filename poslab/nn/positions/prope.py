"""p-RoPE: rotate only the highest fraction ``p`` of RoPE's frequencies.

Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?"
(https://arxiv.org/abs/2410.06205). Trained Gemma models use RoPE's highest frequencies for
positional heads and its lowest ones as near-constant "semantic channels"; p-RoPE makes that explicit
by setting the lowest ``1 - p`` of the frequencies to zero (those coordinate pairs are never rotated),
which the paper finds helps. ``p = 1`` is RoPE, ``p = 0`` is NoPE. The frequencies are transformers'
``rope_type="proportional"`` (``partial_rotary_factor = p``): the kept ones are RoPE's own
``base^(-2i/d)``, not re-spread over fewer pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.checks import is_number
from poslab.nn.positions import register
from poslab.nn.positions.rope import RoPE, RopeConfig


@dataclass
class PRopeConfig(RopeConfig):
    """RoPE's config plus ``fraction``, the share ``p`` of frequency pairs that rotate (the highest ones).

    Attributes:
        fraction: ``p`` in ``[0, 1]`` (0.75 by default); ``int(p * rotary_dim // 2)`` pairs rotate.
    """

    fraction: float = 0.75

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_number(self.fraction) or not 0.0 <= self.fraction <= 1.0:
            raise ValueError(
                f"fraction must be a number in [0, 1] (the share of frequencies that rotate), got {self.fraction!r}"
            )

    @property
    def rotated_pairs(self) -> int:
        """Frequency pairs that rotate (transformers' ``int(partial_rotary_factor * head_dim // 2)``)."""
        return int(self.fraction * self.dim // 2)


@register
class PRoPE(RoPE):
    """p-RoPE (Barbero et al. 2024, https://arxiv.org/abs/2410.06205): RoPE with its lowest ``1 - p`` frequencies
    zeroed."""

    name = "prope"
    config_class = PRopeConfig
    paper = "Barbero et al. 2024, https://arxiv.org/abs/2410.06205"
    fp32_buffers = ("inv_freq", "keep")

    def __init__(self, config: PRopeConfig) -> None:
        super().__init__(config)
        keep = (torch.arange(config.dim // 2) < config.rotated_pairs).to(torch.float32)  # [r/2]: 1 rotates, 0 stays
        self.register_buffer("keep", keep, persistent=False)
        self.inv_freq = self.inv_freq * keep

    def frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        inv_freq, attention_factor = super().frequencies(seq_len)
        return inv_freq * self.keep.to(inv_freq.device), attention_factor
