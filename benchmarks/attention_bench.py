"""Attention forward+backward time and peak memory: every poslab scheme vs the references.

Equivalent to ``poslab bench --only attention``; see ``benchmarks/README.md`` for the measured
table and ``poslab/lab/bench.py`` for the method (alternating runs, medians, peak memory per case in a
fresh subprocess, matmul roofline).

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
