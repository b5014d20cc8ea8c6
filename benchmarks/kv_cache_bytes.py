"""KV-cache bytes per token and layer for MHA / GQA / MQA / MLA at DeepSeek-V3's width, measured from the caches.

Builds one poslab cache of each kind on the meta device (no memory is allocated; shapes and dtypes
are real) for width 7168 with 128 query heads of 128 dims (DeepSeek-V3's attention width), and
divides the bytes its key/value buffers hold by the capacity. MLA: ``kv_lora_rank`` 512 + shared
rotary key 64 (DeepSeek-V2/V3).

    PYTHONPATH=. python benchmarks/kv_cache_bytes.py
"""

from __future__ import annotations

import torch

from poslab.nn.attention import KVCache
from poslab.nn.mla import LatentKVCache

CAPACITY = 4096


def held_bytes(cache: torch.nn.Module) -> int:
    return sum(b.numel() * b.element_size() for name, b in cache.named_buffers() if name != "pos")


def main() -> None:
    head_dim = 128
    rows = []
    with torch.device("meta"):
        for label, kv_heads in (("MHA (128 kv heads)", 128), ("GQA (8 kv heads)", 8), ("MQA (1 kv head)", 1)):
            rows.append((label, held_bytes(KVCache(1, kv_heads, head_dim, CAPACITY, torch.bfloat16, "meta"))))
        rows.append(
            (
                "MLA (latent 512 + rotary key 64)",
                held_bytes(LatentKVCache(1, 512, 64, CAPACITY, torch.bfloat16, "meta")),
            )
        )
    mha = rows[0][1]
    print("| attention | bytes / token / layer (bf16) | vs MHA |\n|---|---:|---:|")
    for label, total in rows:
        print(f"| {label} | {total // CAPACITY:,} | {total / mha:.4f} |")


if __name__ == "__main__":
    main()
