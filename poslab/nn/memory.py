"""Transformer-XL segment-level recurrence: the previous segments' hidden states, cached with stop-gradient.

Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context"
(https://arxiv.org/abs/1901.02860), §3.2. A long text is read in consecutive segments of ``L``
tokens; layer ``n`` of segment ``tau + 1`` attends its own tokens and the last ``M`` inputs to layer
``n`` of the segments before (``SG(h^{n-1}_tau)``: no gradient flows into them). Keys and values of
the memory are computed with the current weights, and positions continue across segments, so a
relative encoding sees the true distances; the context reaches ``n_layer * M`` tokens back.

``model(idx, cache=mem)`` reads ``mem`` and updates it in place::

    mem = SegmentMemory(mem_len=64)
    for segment in segments:          # [B, L] each, consecutive pieces of B streams
        logits, loss = model(segment, targets, cache=mem)

The evaluation-time KV-cache form is ``GPT.make_cache(B, SegmentMemorySpec(M))`` (one
:class:`~poslab.nn.attention.SegmentMemoryCache` per layer, a ring of the last ``M`` keys and
values): the same function, tested equal.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.checks import positive_int


class SegmentMemory:
    """Per-layer detached inputs of the last ``mem_len`` tokens and their positions.

    Attributes:
        mem_len: ``M``, tokens kept per layer.
        hidden: one ``[B, m, d]`` tensor per layer (``m <= M``), or ``None`` before the first segment.
        pos: their positions ``[m]`` (int64), or ``None``.
        length: tokens read so far (the default position of the next segment's first token).

    Args:
        mem_len: ``M > 0``.
    """

    def __init__(self, mem_len: int) -> None:
        self.mem_len = positive_int("mem_len (the segment memory's length M)", mem_len)
        self.hidden: list[Tensor] | None = None
        self.pos: Tensor | None = None
        self.length = 0

    def reset(self) -> None:
        """Forget every remembered token (a new text, or the stream wrapped around)."""
        self.hidden, self.pos, self.length = None, None, 0

    @property
    def size(self) -> int:
        """Tokens currently remembered per layer (``<= mem_len``)."""
        return 0 if self.pos is None else int(self.pos.numel())

    def layer(self, i: int) -> tuple[Tensor | None, Tensor | None]:
        """Layer ``i``'s memory ``[B, m, d]`` and positions ``[m]`` (``(None, None)`` while empty)."""
        if self.hidden is None:
            return None, None
        return self.hidden[i], self.pos

    def check(self, batch: int, n_layer: int) -> None:
        """``ValueError`` unless a non-empty memory has ``n_layer`` layers of ``batch`` rows."""
        if self.hidden is None:
            return
        if len(self.hidden) != n_layer:
            raise ValueError(f"segment memory has {len(self.hidden)} layers, the model has {n_layer}")
        if self.hidden[0].shape[0] != batch:
            raise ValueError(
                f"segment memory holds {self.hidden[0].shape[0]} streams but the batch has {batch}; "
                "use one SegmentMemory per batch of streams (or reset() it)"
            )

    def update(self, inputs: list[Tensor], pos: Tensor) -> None:
        """Append a segment: per-layer inputs ``[B, T, d]`` at positions ``[T]``; keep the last ``mem_len``.

        The tensors are detached (Transformer-XL's stop-gradient ``SG``).
        """
        M = self.mem_len
        new = [x.detach() for x in inputs]
        if self.hidden is None:
            hidden, positions = new, pos
        else:
            hidden = [torch.cat((old, x), dim=1) for old, x in zip(self.hidden, new)]  # [B, m+T, d]
            positions = torch.cat((self.pos, pos))  # [m+T]
        self.hidden = [h[:, -M:] for h in hidden]  # [B, min(m+T, M), d]
        self.pos = positions[-M:].clone()
        self.length += int(pos.numel())

    def state_tensors(self, prefix: str) -> dict[str, Tensor]:
        """The memory as checkpoint tensors: ``{prefix}.length`` (a 0-dim int64) and, when not empty,
        ``{prefix}.pos`` ``[m]`` and ``{prefix}.hidden.{i}`` ``[B, m, d]`` per layer (contiguous copies)."""
        out = {f"{prefix}.length": torch.tensor(self.length, dtype=torch.int64)}
        if self.hidden is not None and self.pos is not None:
            out[f"{prefix}.pos"] = self.pos.detach().clone().contiguous()
            out.update({f"{prefix}.hidden.{i}": h.detach().clone().contiguous() for i, h in enumerate(self.hidden)})
        return out

    def load_state(self, tensors: dict[str, Tensor], prefix: str, n_layer: int, batch: int, width: int) -> None:
        """Restore what :meth:`state_tensors` saved under ``prefix``.

        Args:
            tensors: checkpoint tensors.
            prefix: the memory's name in them.
            n_layer, batch, width: the model's layers, the streams of the batch and ``n_embd``.

        Raises:
            ValueError: the tensors are missing or of the wrong shape or dtype (a forged or foreign checkpoint).
        """
        length = tensors.get(f"{prefix}.length")
        if length is None or length.dim() != 0 or length.is_floating_point() or int(length) < 0:
            raise ValueError(f"checkpoint segment memory {prefix!r} lacks a usable length")
        self.reset()
        pos = tensors.get(f"{prefix}.pos")
        if pos is None:
            self.length = int(length)
            return
        hidden = [tensors.get(f"{prefix}.hidden.{i}") for i in range(n_layer)]
        m = pos.numel()
        if (
            pos.dim() != 1
            or pos.dtype != torch.int64
            or not 0 < m <= self.mem_len
            or any(h is None or tuple(h.shape) != (batch, m, width) or not h.is_floating_point() for h in hidden)
        ):
            raise ValueError(
                f"checkpoint segment memory {prefix!r} does not fit: {n_layer} layers of "
                f"[{batch}, m <= {self.mem_len}, {width}] and positions [m] are needed"
            )
        self.hidden, self.pos, self.length = hidden, pos, int(length)

    def __repr__(self) -> str:
        return f"SegmentMemory(mem_len={self.mem_len}, size={self.size}, length={self.length})"


__all__ = ["SegmentMemory"]
