"""The bidirectional experiment's leak: seed 001's two lines through untrained GPTs without and with the causal mask.

Part of :mod:`poslab.lab.experiments.bidirectional`. Without positions and without the causal mask, a
transformer is permutation-equivariant: the shuffled line's outputs are the first line's, permuted, up to
float noise; with the mask, order leaks from 2 layers on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from poslab.display import sci
from poslab.lab.experiments.common import LINE, SHUFFLED
from poslab.lab.tables import Table
from poslab.lab.verdicts import at_least, deterministic
from poslab.nn.attention import AttentionConfig

LEAK_LAYERS = (1, 2, 3)
#: float noise of an untrained fp32 GPT's logits (|logit| ~ 1): summation order only
TOLERANCE = 1e-5
#: the causal counterpart must differ by more than this from 2 layers on (causal_leak's LEAK_ABOVE)
LEAK_ABOVE = 1e-4


@dataclass(frozen=True)
class Leak:
    """Seed 001's two lines through an untrained GPT (:func:`leak_differences`): the largest logit difference at
    the last position, and over every position once the shuffled line's are put back in order."""

    last: float
    all: float


def leak_differences(n_layer: int, causal: bool, position: str = "none", seed: int = 0) -> dict[str, float]:
    """Seed 001's two lines through a fresh untrained GPT (4 heads, n_embd 128, ``tang5`` vocabulary, the causal
    mask on or off): ``last``, max |logits_a - logits_b| at the last position (the same character '尽' in both
    lines); ``all``, max over every position of |logits_b[i] - logits_a[perm[i]]| (``perm`` maps each character of
    the shuffled line to its place in the first line)."""
    from poslab.data import CharTokenizer, load_corpus
    from poslab.nn.model import GPT, GPTConfig

    tok = CharTokenizer.from_text(load_corpus("tang5"))
    perm = [LINE.index(ch) for ch in SHUFFLED]  # SHUFFLED[i] == LINE[perm[i]] (the characters are distinct)
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=tok.vocab_size,
        n_layer=n_layer,
        n_head=4,
        n_embd=128,
        block_size=128,
        dropout=0.0,
        position=position,
        attention=AttentionConfig(causal=causal),
    )
    model = GPT(config).eval()
    with torch.no_grad():
        a = model(torch.tensor([tok.encode(LINE)]))[0]  # [T, V]
        b = model(torch.tensor([tok.encode(SHUFFLED)]))[0]  # [T, V]
    return {"last": (a[-1] - b[-1]).abs().max().item(), "all": (b - a[perm]).abs().max().item()}


def leak_claims(diffs: dict[str, dict[int, Leak]]) -> list[dict[str, Any]]:
    """One deterministic claim per depth (bidirectional: noise), and one for the causal contrast (leak from 2
    layers)."""
    out = []
    for n in sorted(diffs["bidirectional"]):
        error = diffs["bidirectional"][n].all
        out.append(
            deterministic(
                f"encoder mode, no positions, {n} layer{'s' if n > 1 else ''}: the two lines' outputs are the same "
                "up to the permutation (no order leaks without the causal mask)",
                "seed 001 (leak experiment) in bidirectional mode; Haviv et al. 2022 §5",
                f"max over positions |logits(line 2)[i] - logits(line 1)[perm i]| <= {TOLERANCE:g} (fp32 float noise)",
                f"{sci(error)} (last position {sci(diffs['bidirectional'][n].last)})",
                error,
                TOLERANCE,
                details={"n_layer": n},
            ).to_dict()
        )
    deeper = [n for n in diffs["causal"] if n > 1]
    if deeper:
        smallest = min(diffs["causal"][n].last for n in deeper)
        out.append(
            at_least(
                "with the causal mask (same models otherwise) the two lines differ from 2 layers on: the mask, not "
                "depth, leaks order",
                "seed 001 (leak experiment)",
                f"min over {deeper} layers of max |last-position logit difference| >= {LEAK_ABOVE:g}",
                ", ".join(f"{n} layers {sci(diffs['causal'][n].last)}" for n in deeper),
                smallest,
                LEAK_ABOVE,
                details={"layers": deeper},
            ).to_dict()
        )
    return out


def leak_table(leak: dict[str, dict[int, Leak]]) -> Table:
    """Seed 001's two lines through untrained GPTs without positions, without and with the causal mask."""
    free, causal = leak["bidirectional"], leak["causal"]
    return Table(
        f"seed 001's two lines without and with the causal mask: max |logit difference| (tolerance {TOLERANCE:g})",
        ("untrained GPT, no positions", "encoder: last position", "encoder: every position", "causal: last position"),
        tuple(
            (f"{n} layer{'s' if n > 1 else ''}", sci(free[n].last), sci(free[n].all), sci(causal[n].last)) for n in free
        ),
    )
