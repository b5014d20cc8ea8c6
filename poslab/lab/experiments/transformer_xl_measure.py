"""The Transformer-XL experiment's measurement: loss by place in the segment per evaluation condition, step times.

Part of :mod:`poslab.lab.experiments.transformer_xl` (its typed readings).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from poslab.lab.experiments.common import one_thread
from poslab.nn.memory import SegmentMemory
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run
from poslab.training.data import batchify
from poslab.training.loop import segment_nll

#: evaluation memories of model (b), in units of L
EVAL_MEMORY_FACTORS = (1, 2, 4)


def conditions(L: int) -> dict[str, tuple[str, int]]:
    """Evaluation label -> (arm, memory length)."""
    out = {"a, no memory": ("a", 0), f"a, memory {L}": ("a", L), "b, no memory": ("b", 0)}
    out.update({f"b, memory {f * L}": ("b", f * L) for f in EVAL_MEMORY_FACTORS})
    return out


@dataclass(frozen=True)
class Condition:
    """One model read one way (:func:`conditions`): the mean loss over the segment, by place in it, on its first
    and last quarter (nats), and how many segments were read."""

    loss: float
    by_position: list[float]
    first_quarter: float
    last_quarter: float
    segments: int


@dataclass(frozen=True)
class SeedReading:
    """One seed's two models read under every condition (label -> reading)."""

    seed: int
    block_size: int
    n_streams: int
    conditions: dict[str, Condition]


@dataclass(frozen=True)
class StepTime:
    """Median forward + backward CPU seconds per step with and without the memory, and their ratio."""

    memory_s: float
    none_s: float
    ratio: float
    steps: int
    batch: int
    mem_len: int
    clock: str


def read_seed(seed: int, run_dirs: dict[str, Path], n_streams: int, segments: int | None) -> SeedReading:
    """Loss by place in the segment for every evaluation condition of one seed's two models."""
    loaded = {arm: load_run(path) for arm, path in run_dirs.items()}
    model_b, tokenizer, _ = loaded["b"]
    L = model_b.config.block_size
    val = RunFolder(run_dirs["b"]).split_tokens("val", tokenizer)
    streams = batchify(val, n_streams, L)  # [n, S]
    read = {}
    for label, (arm, mem_len) in conditions(L).items():
        nll = segment_nll(loaded[arm][0], streams, L, mem_len, segments).double()  # [segments, n, L]
        by_place = nll.mean(dim=(0, 1))  # [L]
        quarter = max(1, L // 4)
        read[label] = Condition(
            float(nll.mean()),
            by_place.tolist(),
            float(by_place[:quarter].mean()),
            float(by_place[-quarter:].mean()),
            int(nll.shape[0]),
        )
    return SeedReading(seed, L, n_streams, read)


def step_times(model: GPT, batch: int, mem_len: int, steps: int) -> StepTime:
    """Median forward + backward CPU seconds per step with and without a memory of ``mem_len`` (alternating, one
    thread)."""
    L = model.config.block_size
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (batch, L), generator=generator)
    model.train()
    memory = SegmentMemory(mem_len)
    model(x, x, cache=memory)  # fill the memory with one segment
    times: dict[str, list[float]] = {"memory": [], "none": []}
    with one_thread():
        for i in range(steps + 1):
            for variant in ("memory", "none"):
                start = time.process_time()
                if variant == "memory":
                    _, loss = model(x, x, cache=memory)
                else:
                    _, loss = model(x, x)
                loss.backward()
                elapsed = time.process_time() - start
                model.zero_grad(set_to_none=True)
                if i:  # the first round warms up
                    times[variant].append(elapsed)
    memory_s, none_s = statistics.median(times["memory"]), statistics.median(times["none"])
    return StepTime(
        memory_s, none_s, memory_s / none_s, steps, batch, mem_len, "process CPU time, 1 thread, alternating"
    )
