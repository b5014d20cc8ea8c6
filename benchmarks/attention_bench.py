"""Attention forward+backward time and peak memory: every poslab scheme vs the references.

Equivalent to ``poslab bench --only attention``; see ``benchmarks/README.md`` for the measured
table and ``poslab/bench/`` for the method (alternating runs, medians, peak memory per case in a
fresh subprocess, matmul roofline).

Reading the figures: poslab's no-bias causal case is PyTorch's fused causal SDPA kernel plus the two
projections (``nn.MultiheadAttention`` with ``is_causal`` and transformers' Llama attention run the same
kernel), so its ratio to the naive form is that kernel's against eager matmul + softmax in the
setting (threads, clock). Learned biases (T5, KERPLE, FIRE, Transformer-XL) need the gradient of the
bias, which PyTorch's CPU flash kernel does not give, so their blocks run SDPA's math path; from
``recompute_threshold`` keys (default 2048) the blocked path recomputes each block's bias in backward
so memory stays linear, at the cost of one extra forward per block.

Usage::

    python benchmarks/attention_bench.py                        # T = 256 .. 8192 (long)
    python benchmarks/attention_bench.py --quick                # T = 256, 1024
    python benchmarks/attention_bench.py --sizes 1024 --cases poslab:none,naive --no-memory
"""

from __future__ import annotations

import sys

from poslab.cli.app import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", "attention", *sys.argv[1:]]))
