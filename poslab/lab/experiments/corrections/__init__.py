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
from poslab.lab.experiments.corrections.lesson000_contradictions import contradiction_claims
from poslab.lab.experiments.corrections.lesson000_heads import (
    alibi_claim,
    alibi_matrices,
    alibi_modern_claim,
    dk_variance_claim,
    position_coordinates,
    q2_space_claim,
    score_variance,
    table_22_claim,
)
from poslab.lab.experiments.corrections.lesson000_reasons import (
    distance_profiles,
    head_ranks,
    reason_claims,
    rotation_orthogonality,
)
from poslab.lab.experiments.corrections.lesson000_rope import (
    LESSON_SPREADS,
    angles_out_of_range,
    lesson_rope_spreads,
    llama3_ntk_claim,
    llama3_vs_ntk,
    ntk_claims,
    ntk_ratios,
    q4_high_freq_claim,
    rope_spread_claim,
)
from poslab.lab.experiments.corrections.lesson002_code import (
    adaptive_mask_faults,
    adaptive_span_code_claim,
    autocast_claim,
    autocast_scores_dtype,
    clipping_norms,
    fp16_claim,
    lesson_adaptive_mask,
    lesson_local_keep,
    local_mask_claim,
    pe_cache_code_claim,
    run_lesson_pe_cache,
)
from poslab.lab.experiments.corrections.lesson002_formulas import (
    FIXED_PE_LATEX,
    formula_claims,
    latex_faults,
    rope_complex_forms,
)
from poslab.lab.experiments.corrections.lesson002_sources import (
    VIT_CONFIGS,
    XL_DATASETS,
    adaptive_span_heading_claim,
    citation_claims,
    head_rule_imagenet_claim,
    rope_memory_claim,
    seven_b_counts,
    xl_r_claim,
)
from poslab.lab.experiments.corrections.plots import plot_evidence
from poslab.lab.lesson_quotes import EMPTY_TABLES, QUOTES

__all__ = [
    "CLAIMS",
    "EMPTY_TABLES",
    "EXPERIMENT",
    "FIXED_PE_LATEX",
    "LESSON_SPREADS",
    "QUOTES",
    "VIT_CONFIGS",
    "XL_DATASETS",
    "adaptive_mask_faults",
    "alibi_matrices",
    "all_corrections",
    "angles_out_of_range",
    "autocast_scores_dtype",
    "clipping_norms",
    "distance_profiles",
    "head_ranks",
    "latex_faults",
    "lesson_adaptive_mask",
    "lesson_local_keep",
    "lesson_rope_spreads",
    "llama3_vs_ntk",
    "position_coordinates",
    "rope_complex_forms",
    "rotation_orthogonality",
    "ntk_ratios",
    "run",
    "run_lesson_pe_cache",
    "score_variance",
    "seven_b_counts",
]

#: the registry: each entry makes one correction record (or a list of them), in the order the page shows them
CLAIMS: tuple[Callable[[], dict[str, Any] | list[dict[str, Any]]], ...] = (
    alibi_claim,
    ntk_claims,
    rope_memory_claim,
    citation_claims,
    xl_r_claim,
    local_mask_claim,
    fp16_claim,
    autocast_claim,
    pe_cache_code_claim,
    adaptive_span_code_claim,
    adaptive_span_heading_claim,
    head_rule_imagenet_claim,
    dk_variance_claim,
    q4_high_freq_claim,
    table_22_claim,
    llama3_ntk_claim,
    rope_spread_claim,
    alibi_modern_claim,
    q2_space_claim,
    reason_claims,
    formula_claims,
    contradiction_claims,
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
    estimate=(4, 12),
)
