"""The lessons' errors, corrected with the evidence that can settle them.

Each statement the lab judges is quoted verbatim (with an English gloss), tested as a claim record
and given its evidence (:mod:`poslab.lab.evidence`): *measured* — a computation on poslab's modules
(ALiBi's bias matrix, RoPE's frequencies under NTK-aware scaling, a 7B parameter count on the
``meta`` device, the local-window mask, a ``GradScaler`` run) or the model zoo; *source* — what a
paper reports, a date, or two passages of the lesson side by side, with its reference; or
*withdrawn* — where the test cannot settle the statement, with the reason. A claim record here is the
*lesson's* statement, so "did not hold" means the lesson is wrong and "held" that the lesson is
right. Seed 002's empty tables are listed with what poslab measured instead.

One module per group of statements (``lesson000_heads``, ``lesson000_rope``, ``lesson000_reasons``,
``lesson000_contradictions``, ``lesson002_sources``, ``lesson002_code``, ``lesson002_formulas``);
:data:`CLAIMS` is the registry, in the order the page shows them.

Papers: ALiBi, Press et al. 2022 (https://arxiv.org/abs/2108.12409); NTK-aware scaling, bloc97 2023
and YaRN, Peng et al. 2023 (https://arxiv.org/abs/2309.00071); Transformer-XL, Dai et al. 2019
(https://arxiv.org/abs/1901.02860); PG-19, Rae et al. 2019 (https://arxiv.org/abs/1911.05507);
adaptive span, Sukhbaatar et al. 2019 (https://arxiv.org/abs/1905.07799); mixed precision, Micikevicius
et al. 2018 (https://arxiv.org/abs/1710.03740).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from poslab.display import cut, print_table
from poslab.lab.experiments.common import FOUNDATION, Experiment
from poslab.lab.experiments.corrections import lesson000_contradictions as contradictions
from poslab.lab.experiments.corrections import lesson000_heads as heads
from poslab.lab.experiments.corrections import lesson000_reasons as reasons
from poslab.lab.experiments.corrections import lesson000_rope as rope
from poslab.lab.experiments.corrections import lesson002_code as code
from poslab.lab.experiments.corrections import lesson002_formulas as formulas
from poslab.lab.experiments.corrections import lesson002_sources as sources
from poslab.lab.experiments.corrections.plots import plot_evidence
from poslab.lab.lesson_quotes import EMPTY_TABLES, QUOTES

#: the registry: each entry makes one correction record (or a list of them), in the order the page shows them
CLAIMS: tuple[Callable[[], dict[str, Any] | list[dict[str, Any]]], ...] = (
    heads.alibi_claim,
    rope.ntk_claims,
    sources.rope_memory_claim,
    sources.citation_claims,
    sources.xl_r_claim,
    code.local_mask_claim,
    code.fp16_claim,
    code.autocast_claim,
    code.pe_cache_code_claim,
    code.adaptive_span_code_claim,
    sources.adaptive_span_heading_claim,
    sources.head_rule_imagenet_claim,
    heads.dk_variance_claim,
    rope.q4_high_freq_claim,
    heads.table_22_claim,
    rope.llama3_ntk_claim,
    rope.rope_spread_claim,
    heads.alibi_modern_claim,
    heads.q2_space_claim,
    reasons.reason_claims,
    formulas.formula_claims,
    contradictions.contradiction_claims,
)


def all_corrections() -> list[dict[str, Any]]:
    """Every correction as a claim-record dict (with quote, gloss and evidence in ``details``)."""
    out: list[dict[str, Any]] = []
    for make in CLAIMS:
        made = make()
        out.extend(made if isinstance(made, list) else [made])
    return out


def run(out: Path, quick: bool = False) -> dict:
    """Compute every correction, print them, plot the ALiBi and NTK evidence (quick and full are the same)."""
    out = Path(out)
    claims = all_corrections()
    print_table(
        ["verdict", "where", "lesson (gloss)", "measured"],
        [[c["verdict"], c["source"], cut(c["details"]["gloss"], 50), cut(c["measured"], 70)] for c in claims],
        title="the lessons' statements, tested (full texts: results.json)",
        align="llll",
    )
    print_table(
        ["where", "empty in the lesson", "what poslab measured instead"],
        [[e["where"], cut(e["gloss"], 50), cut(e["poslab"], 70)] for e in EMPTY_TABLES],
        title="seed 002's empty tables",
        align="lll",
    )
    plot = plot_evidence(out / "corrections.png")
    return {
        "quick": quick,
        "claims": claims,
        "empty_tables": EMPTY_TABLES,
        "plots": [str(plot)],
        "quotes": {k: {"where": w, "text": t, "gloss": g} for k, (w, t, g) in QUOTES.items()},
    }


EXPERIMENT = Experiment(
    name="corrections",
    description="the lessons' wrong statements, each tested against a measurement (ALiBi sign, NTK, 12%, masks, fp16)",
    tier=FOUNDATION,
    run=run,
)
