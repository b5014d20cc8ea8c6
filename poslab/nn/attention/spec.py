"""What an attention call computes: one frozen spec, its position rule ``keep`` and its score transform.

Every backend reads the same :class:`AttentionSpec`. The position rule is one elementwise function
``keep(q_pos, k_pos) -> bool`` (True = attend): eager and SDPA broadcast it over ``[Tq, 1]`` and
``[1, Tk]`` positions, the blocked path evaluates it on a block's first and last query to bound the
keys it reads, and flex calls it on the positions its ``mask_mod`` indexes. The rule is the AND of
the active :class:`MaskTerm` s, one per mechanism (causal, window, chunk); a mechanism is active when
its spec field is neither ``None`` nor ``False``.

The score transform (soft-capping, then the additive bias) is :meth:`AttentionSpec.transform`,
shared by eager (on a ``[B, h, Tq, Tk]`` tile) and flex (on one score inside its ``score_mod``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from poslab.checks import is_number, positive_int, positive_number

#: ``bias_fn(q, k, q_pos, k_pos) -> [B|1, h, Tq, Tk]`` fp32 additive bias or ``None``
BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], "Tensor | None"]


@dataclasses.dataclass(frozen=True)
class MaskTerm:
    """One mechanism's share of the position rule.

    Attributes:
        field: the :class:`AttentionSpec` field that switches the term on (active unless ``None``/``False``).
        keep: ``keep(spec, q_pos, k_pos) -> bool tensor``, elementwise and broadcasting (it runs on
            ``[Tq, 1]`` x ``[1, Tk]`` tensors and on flex's index tensors alike).
        interval: for each query the kept keys form one interval of positions whose two ends do not
            decrease as the query position grows (causal, window and chunk do). The blocked path then
            bounds a block's keys from its first and last query alone; a term that is not an interval
            makes it evaluate the whole block's rule once to find them.
        local: each query keeps a bounded number of keys (a window), so a block's tiles are small
            and the blocked path has nothing to gain from recomputing them in backward.
    """

    field: str
    keep: Callable[[Any, Tensor, Tensor], Tensor]
    interval: bool = True
    local: bool = False


def _floor_div(x: Tensor, d: int) -> Tensor:
    return torch.div(x, d, rounding_mode="floor")


#: the position rule's terms, in the order they are ANDed (:func:`register_mask_term` adds one)
MASK_TERMS: dict[str, MaskTerm] = {
    "causal": MaskTerm("causal", lambda s, qp, kp: kp <= qp),
    # Hugging Face / Mistral semantics: W keys including itself; symmetric without causal
    "window": MaskTerm(
        "window", lambda s, qp, kp: (qp - kp < s.window) if s.causal else ((qp - kp).abs() < s.window), local=True
    ),
    "chunk": MaskTerm("chunk", lambda s, qp, kp: _floor_div(kp, s.chunk) == _floor_div(qp, s.chunk)),  # Llama 4
}


#: the built-in mechanisms' fields (:func:`unregister_mask_term` keeps them)
BUILTIN_MASK_TERMS: tuple[str, ...] = tuple(MASK_TERMS)


def register(registry: dict[str, Any], name: str, entry: Any, what: str) -> None:
    """Add ``entry`` under ``name`` to one of the package's registries (mask terms, backends)."""
    if name in registry:
        raise ValueError(f"{what} {name!r} is already registered")
    registry[name] = entry


def unregister(registry: dict[str, Any], name: str, builtin: tuple[str, ...], what: str) -> None:
    """Remove a registered ``name`` (the built-in entries stay)."""
    if name in builtin:
        raise ValueError(f"the built-in {what} {name!r} cannot be removed")
    registry.pop(name, None)


def register_mask_term(term: MaskTerm) -> None:
    """Add a mechanism's term to the position rule (its field must exist on the spec class used)."""
    if not isinstance(term, MaskTerm):
        raise TypeError(f"register_mask_term takes a MaskTerm, got {type(term).__name__}")
    register(MASK_TERMS, term.field, term, "mask term")


def unregister_mask_term(field: str) -> None:
    """Remove a term added by :func:`register_mask_term`."""
    unregister(MASK_TERMS, field, BUILTIN_MASK_TERMS, "mask term")


def check_mechanisms(n_heads: int, softcap: float | None, sinks: Tensor | None, chunk: int | None) -> None:
    """Raise a clear error for a bad soft-cap, sink tensor (``n_heads`` logits) or chunk size."""
    if softcap is not None:
        positive_number("softcap", softcap, rule="a positive finite number or None")
    if sinks is not None and (not isinstance(sinks, Tensor) or sinks.shape != (n_heads,)):
        raise ValueError(
            f"sinks must be a tensor of shape [{n_heads}] (one logit per query head), "
            f"got {getattr(sinks, 'shape', sinks)!r}"
        )
    validate_chunk(chunk)


def validate_chunk(chunk: int | None, name: str = "chunk") -> None:
    """``None`` or a positive integer (tokens per attention chunk); errors call it ``name``."""
    if chunk is not None:
        positive_int(name, chunk, rule="a positive integer (tokens per attention chunk) or None")


def check_scale(scale: float | None) -> None:
    """``None`` (``1/sqrt(d_k)``) or a finite number."""
    if scale is not None and (not is_number(scale) or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


def validate_window(window: int | None) -> None:
    """``None`` or a positive integer (keys seen per query, including itself)."""
    if window is not None:
        positive_int("window", window, rule="a positive integer (keys seen per query, including itself) or None")


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionSpec:
    """What one attention call computes, validated once when it is made.

    Attributes:
        causal: query at position ``i`` sees keys ``j <= i``.
        window: sliding window ``W``: ``i - W < j`` (and ``j < i + W`` without ``causal``).
        chunk: chunked local attention ``j // C == i // C`` (Llama 4).
        sinks: ``[h]`` learned sink logits (gpt-oss): one extra logit per head joins every row's
            softmax denominator and is dropped after it.
        softcap: logit soft-capping ``c * tanh(s / c)`` of the scaled logits, before any bias.
        scale: softmax scale (``None``: ``1/sqrt(d_k)`` of the call's queries).
        bias_fn: additive fp32 bias, called on whatever block of queries and keys is computed.
        score_mod: FlexAttention form of ``bias_fn`` (or a :class:`LazyScoreMod` that builds it).
    """

    causal: bool = True
    window: int | None = None
    chunk: int | None = None
    sinks: Tensor | None = None
    softcap: float | None = None
    scale: float | None = None
    bias_fn: BiasFn | None = None
    score_mod: Callable | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {self.causal!r}")
        validate_window(self.window)
        check_mechanisms(0, self.softcap, None, self.chunk)  # sinks: checked against the queries' heads by attend
        check_scale(self.scale)

    # ------------------------------------------------------------------ the position rule
    def terms(self) -> list[MaskTerm]:
        """The active mask terms (their field is set on this spec)."""
        return [t for name, t in MASK_TERMS.items() if getattr(self, name, None) not in (None, False)]

    def term_names(self) -> frozenset[str]:
        """Names of the active mask terms (``{"causal"}`` for plain causal attention)."""
        return frozenset(t.field for t in self.terms())

    def keep(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The position rule, elementwise and broadcasting; ``None`` when no term is active (keep all)."""
        keep = None
        for term in self.terms():
            part = term.keep(self, q_pos, k_pos)
            keep = part if keep is None else keep & part
        return keep

    def local(self) -> bool:
        """Whether an active term bounds every query's reach (see :attr:`MaskTerm.local`)."""
        return any(t.local for t in self.terms())

    def intervals(self) -> bool:
        """Whether every active term keeps one non-decreasing interval of keys per query."""
        return all(t.interval for t in self.terms())

    # ------------------------------------------------------------------ the score transform
    def reshapes_scores(self) -> bool:
        """Whether :meth:`transform` does more than add a bias (soft-capping): a kernel that only adds
        masks cannot compute it, and eager has to form the scores to apply it."""
        return self.softcap is not None

    def transform(self, scores: Tensor, bias: Tensor | Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Soft-cap the scaled logits, then add the bias (a tensor, or a callable adding it).

        Eager passes a ``[B, h, Tq, Tk]`` tile and its bias tensor; flex one score and the scheme's
        ``score_mod`` bound to its indices.
        """
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if bias is None:
            return scores
        return bias(scores) if callable(bias) else scores + bias

    def with_(self, **changes: Any) -> AttentionSpec:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


class LazyScoreMod:
    """A flex ``score_mod`` built only if the flex backend runs (a bias scheme's tables cost work).

    ``build(q_pos, k_pos)`` makes the ``score_mod`` for the positions flex indexes (its padded rows
    and columns included).
    """

    def __init__(self, build: Callable[[Tensor, Tensor], Callable | None]) -> None:
        self.build = build

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Callable | None:
        return self.build(q_pos, k_pos)


def position_mask(
    q_pos: Tensor, k_pos: Tensor, causal: bool, window: int | None, chunk: int | None = None
) -> Tensor | None:
    """Boolean keep-mask ``[Tq, Tk]`` (True = attend) from positions, or ``None`` for "keep all".

    Causal: ``j <= i``. Window ``W``: ``i - W < j`` (and ``j < i + W`` when not causal). Chunk ``C``
    (Llama 4's chunked local attention): ``j // C == i // C``. The rule is :meth:`AttentionSpec.keep`.
    """
    return AttentionSpec(causal=causal, window=window, chunk=chunk).keep(q_pos[:, None], k_pos[None, :])  # [Tq, Tk]
