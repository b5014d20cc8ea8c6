"""The position scheme's rotation around a KV cache: before it, or after it on every cached key."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from poslab.nn.positions.base import PositionScheme

#: ``update(k) -> (k_all [B, h_kv, Tk, d], q_pos [Tq], k_pos [Tk])``: write the new keys, read every key
CacheUpdate = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]


def rotate_with_cache(
    scheme: PositionScheme | None,
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    update: CacheUpdate | None = None,
    *,
    keys_unrotated: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Apply ``scheme.rotate`` to ``q [B, h, Tq, d]`` and ``k [B, h_kv, Tq, d]`` around a cache ``update``.

    Keys are cached after ``rotate``, except for a scheme whose key rotation depends on the other
    positions (``rotate_needs_all_keys``: xPos's anchor) or a cache that stores keys unrotated
    (``keys_unrotated``: one that reassigns positions, StreamingLLM): then the cache holds the keys
    before ``rotate``, and every key is rotated with the new queries after the update.

    Returns:
        ``(q, k, q_pos, k_pos)``: rotated queries, every key the queries see, and their positions.
    """
    rotates = scheme is not None and scheme.rotates
    late = update is not None and rotates and (scheme.rotate_needs_all_keys or keys_unrotated)
    if rotates and not late:
        q, k = scheme.rotate(q, k, q_pos, k_pos)
    if update is not None:
        k, q_pos, k_pos = update(k)
    if late:
        q, k = scheme.rotate(q, k, q_pos, k_pos)
    return q, k, q_pos, k_pos
