"""Seed 002's formulas as written: RoPE's complex form in §4.2 and the sinusoidal formula's LaTeX in §2.1.

§4.2 writes the relative property as ``f_q(x_m)^T f_k(x_n) = g(x_m, x_n) e^{i(m-n)θ}``. RoFormer's (Su et al.
2021, arXiv:2104.09864, §3.2.1) is ``⟨f_q, f_k⟩ = Re[(W_q x_m)(W_k x_n)^* e^{i(m-n)θ}]``: the inner product of two
2-D vectors read as complex numbers is the real part of one times the other's conjugate. Without the conjugate the
product turns by ``e^{i(m+n)θ}`` (it depends on the positions, not their difference); without ``Re`` the right side
is a complex number where the attention score is real. :func:`rope_complex_forms` computes each reading beside
poslab's rope.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.mathtext import MathTextParser

from poslab.lab.lesson_quotes import QUOTES, quoted
from poslab.lab.verdicts import deterministic
from poslab.nn import positions

#: position pairs (m, n) with the same offset m - n and different m + n
SAME_OFFSET = ((3, 0), (10, 7), (50, 47), (400, 397))


def rope_complex_forms(d: int = 16, seed: int = 0) -> dict[str, float]:
    """The attention score of poslab's rope (interleaved pairs = complex numbers) against three complex forms.

    For each ``(m, n)`` in :data:`SAME_OFFSET`: ``score`` = ⟨R_m q, R_n k⟩ (fp32, poslab); ``correct`` =
    Re Σ_i z_q,i conj(z_k,i) e^{i(m-n)θ_i}; the lesson's left side read as written, ``f_q^T f_k`` =
    Σ_i z_q,i z_k,i e^{i(m+n)θ_i}; and its right side ``g e^{i(m-n)θ}`` with ``g = Σ z_q conj(z_k)`` per pair,
    no real part taken. Returns the largest differences and the spreads over the pairs.
    """
    rope = positions.build("rope", head_dim=d, layout="interleaved")
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, d, generator=g), torch.randn(1, 1, 1, d, generator=g)
    theta = rope.inv_freq.double()  # [d/2]
    zq = torch.view_as_complex(q.double().reshape(d // 2, 2))  # pairs (2i, 2i+1) as complex numbers
    zk = torch.view_as_complex(k.double().reshape(d // 2, 2))
    scores, corrects, lhs = [], [], []
    for m, n in SAME_OFFSET:
        qr, kr = rope.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
        scores.append(float((qr * kr).sum()))
        turn = torch.exp(1j * (m - n) * theta)
        corrects.append(complex((zq * zk.conj() * turn).sum()))
        lhs.append(complex((zq * torch.exp(1j * m * theta) * zk * torch.exp(1j * n * theta)).sum()))
    return {
        "correct_vs_score": max(abs(c.real - s) for c, s in zip(corrects, scores)),
        "lesson_lhs_vs_score": max(abs(v.real - s) for v, s in zip(lhs, scores)),
        "lesson_lhs_spread": max(abs(a - b) for a in lhs for b in lhs),
        "score_spread": max(scores) - min(scores),
        "lesson_rhs_imaginary": max(abs(v.imag) for v in corrects),  # g e^{i(m-n)θ} with no Re taken
        "score": scores[0],
    }


def rope_complex_claim() -> dict[str, Any]:
    f = rope_complex_forms()
    record = deterministic(
        "RoPE keeps the inner product relative: f_q(x_m)^T f_k(x_n) = g(x_m, x_n) e^{i(m-n)θ}",
        "seed 002 §4.2",
        "the lesson's formula holds under one of its two readings within 1e-5 at four position pairs with the same "
        "offset: as complex numbers, its left side f_q^T f_k (no conjugate) is the attention score; or as 2-D "
        "vectors, its right side g e^{i(m-n)θ} (g = z_q conj(z_k), no real part taken) is the real score (error = "
        "the smaller of the two failures: |left side - score| and the right side's imaginary part)",
        f"poslab's rope score at offset 3: {f['score']:.4f} at every pair (spread {f['score_spread']:.1e}). "
        f"Re Σ z_q conj(z_k) e^(i(m-n)θ) (RoFormer's form) matches it to {f['correct_vs_score']:.1e}. The lesson's "
        f"left side, Σ z_q z_k e^(i(m+n)θ) without the conjugate, differs from it by up to "
        f"{f['lesson_lhs_vs_score']:.2f} and changes with m + n (spread {f['lesson_lhs_spread']:.2f}); its right side "
        f"agrees in its real part but carries an imaginary part up to {f['lesson_rhs_imaginary']:.2f}. Correct: "
        "⟨f_q(x_m), f_k(x_n)⟩ = Re[(W_q x_m)(W_k x_n)^* e^{i(m-n)θ}]",
        error=min(f["lesson_lhs_vs_score"], f["lesson_rhs_imaginary"]),
        tolerance=1e-5,
        details=f,
    )
    return quoted(
        "rope_complex",
        record,
        "poslab's rope (interleaved pairs) against each complex form in float64 (Su et al. 2021, arXiv:2104.09864, "
        "§3.2.1: g = Re[(W_q x_m)(W_k x_n)^* e^{i(m-n)θ}])",
    )


# ----------------------------------------------------------------------------- seed 002 §2.1 LaTeX
#: seed 002 §2.1's formula with the LaTeX fixed: balanced braces, and ``\\`` (a line break) inside ``aligned``
FIXED_PE_LATEX = (
    r"\begin{aligned}"
    "\n"
    r"PE_{(pos,2i)} &= \sin\left(pos/10000^{2i/d_{model}}\right) \\"
    "\n"
    r"PE_{(pos,2i+1)} &= \cos\left(pos/10000^{2i/d_{model}}\right)"
    "\n"
    r"\end{aligned}"
)


def latex_faults(lines: list[str]) -> dict[str, Any]:
    """Per line of a display formula: the brace balance, whether it ends in a single ``\\`` (TeX's control space,
    not a line break) and whether matplotlib's mathtext (a TeX subset) parses it (the trailing ``\\`` removed)."""
    parser = MathTextParser("path")
    out = []
    for line in lines:
        body = line.rstrip()
        single = body.endswith("\\") and not body.endswith("\\\\")
        body = body[:-1].rstrip() if single else body
        try:
            parser.parse(f"${body}$")
            parses = True
        except ValueError:
            parses = False
        out.append(
            {"line": line, "balance": body.count("{") - body.count("}"), "single_backslash": single, "parses": parses}
        )
    faults = sum((f["balance"] != 0) + f["single_backslash"] + (not f["parses"]) for f in out)
    return {"lines": out, "faults": faults}


def fixed_lines() -> list[str]:
    """:data:`FIXED_PE_LATEX`'s two formula lines in the subset mathtext reads (no ``aligned``, ``&`` or ``\\left``)."""
    inner = FIXED_PE_LATEX.split("\n")[1:3]
    return [line.replace("&", "").replace(r"\left", "").replace(r"\right", "").removesuffix(r" \\") for line in inner]


def pe_latex_claim() -> dict[str, Any]:
    lesson = latex_faults(QUOTES["pe_latex"][1].split("\n"))
    fixed = latex_faults(fixed_lines())
    per_line = "; ".join(
        f"line {i + 1}: braces {f['balance']:+d}, single backslash {'yes' if f['single_backslash'] else 'no'}, "
        f"parses {'yes' if f['parses'] else 'no'}"
        for i, f in enumerate(lesson["lines"])
    )
    record = deterministic(
        "the sinusoidal formula's LaTeX source typesets (§2.1)",
        "seed 002 §2.1",
        "each line of the formula has balanced braces, a line break where one is meant, and parses (error = number "
        "of faults over the lines)",
        f"the lesson: {per_line}. Each line closes one brace more than it opens (`^{{2i/d_{{model}}}}}}`), and the "
        "first ends in a single `\\`, TeX's control space, so the two equations would run together on one line. "
        f"Fixed ({fixed['faults']} faults): " + FIXED_PE_LATEX.replace("\n", " ") + ". §4.2's complex form ends its "
        "first line the same way. The mathematics of §2.1 is right (poslab.nn.positions.absolute.sinusoid_table)",
        error=float(lesson["faults"]),
        tolerance=0.0,
        details={"lesson": lesson, "fixed_faults": fixed["faults"], "fixed": FIXED_PE_LATEX},
    )
    return quoted(
        "pe_latex",
        record,
        "a brace count per line and matplotlib's mathtext parser (a TeX subset) on the lesson's lines and on the "
        "fixed ones",
    )


def formula_claims() -> list[dict[str, Any]]:
    return [rope_complex_claim(), pe_latex_claim()]
