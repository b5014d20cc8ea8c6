"""Decoding speed: per-token latency with the KV cache vs recomputing the full forward per token.

Equivalent to ``poslab bench --only decode``: a 4-layer GPT (RoPE, ALiBi, and RoPE with a rolling
256-token window cache) at contexts 64 .. 2048. See ``benchmarks/README.md``.

Usage::

    python benchmarks/decode_bench.py                      # contexts 64 .. 2048
    python benchmarks/decode_bench.py --contexts 64,512 --repeats 3
"""

from __future__ import annotations

import sys

from poslab.cli.app import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", "decode", *sys.argv[1:]]))
