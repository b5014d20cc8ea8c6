"""The context-extension experiment's key tables: scaling at inference, fine-tunes, checkpoint averaging, each built
from its typed result (:class:`poslab.lab.experiments.context_extension.ContextResult`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from poslab.lab.experiments.cells import SLIDING
from poslab.lab.report.i18n import name_lessons, t
from poslab.lab.tables import KeyTable, MeanSd, Table, spread
from poslab.lab.verdicts import num

if TYPE_CHECKING:
    from poslab.lab.experiments.context_extension import ContextResult


def inference_table(r: ContextResult) -> Table:
    """Each RoPE scaling applied at inference: its spec and perplexity at the long length (chunks, sliding)."""
    return Table(
        t("key.ctx.base", length=r.train_length, ppl=num(r.base["L"].shown())),
        (t("key.ctx.scaling"), t("key.ctx.spec"), t("key.ctx.pplat", n=r.eval_length), t("key.sliding")),
        tuple((label, c.rope_scaling, c.shown(), c.shown(SLIDING)) for label, c in r.inference.items()),
    )


def finetuned_table(r: ContextResult) -> Table:
    """Each fine-tune at 4×L: its perplexity at the long length and back at L; below, the
    inference-only arms at the fine-tunes' token budget (the control, the same steps at L, read at 4×L with each
    scaling) below."""
    equal = tuple(
        (f"control (the same steps at L), {label} at inference", c.rope_scaling, c.shown(), None)
        for label, c in r.equal_budget.control_inference.items()
    )
    return Table(
        t("key.ctx.after"),
        (
            t("key.ctx.finetuned"),
            t("key.ctx.spec"),
            t("key.ctx.pplat", n=r.eval_length),
            t("key.ctx.back", n=r.train_length),
        ),
        tuple((label, c.rope_scaling, c.at_4L.shown(), c.at_L.shown()) for label, c in r.finetuned.items()) + equal,
    )


def averaging_table(r: ContextResult) -> Table:
    """Checkpoint averaging of a fine-tune: forgetting at L, perplexity at 4×L, passkey, distance to the fine-tune."""
    a = r.averaging
    return Table(
        t(
            "key.ctx.averaging",
            ft=a.fine_tune,
            last=a.last,
            w=a.base_weight,
            w2=f"{1 - a.base_weight:g}",
            seeds=r.seeds,
        ),
        (
            t("key.model"),
            t("key.ctx.forgetting", n=r.train_length),
            t("key.ctx.pplat", n=r.eval_length),
            t("key.ctx.passkey", f=r.factor),
            "|w − w_ft| / |w_ft|",
        ),
        tuple(
            (
                label,
                v.at_L.spread(),
                v.at_4L.spread(),
                spread([x for x in v.passkey[r.factor] if x is not None]),
                spread(v.weight_distance_to_fine_tuned, 4),
            )
            for label, v in a.variants.items()
        ),
        note=name_lessons(a.note),
    )


def passkey_table(r: ContextResult) -> Table:
    """Passkey retrieval of each scaling without and with fine-tuning at 4×L, per test length (mean ± sd over
    seeds; ``cannot`` where the length is too short for the needle)."""
    passkey, factors = r.passkey, r.passkey.factors
    rows = [
        (f"{k} (inference only)", *((MeanSd.of(v[f], 3) or "cannot") for f in factors))
        for k, v in passkey.seeds.inference.items()
    ]
    rows += [
        (
            "control (the same steps at L)" if k == "control" else f"{k} fine-tuned at 4×L",
            *((MeanSd.of(v[f], 3) or "cannot") for f in factors),
        )
        for k, v in passkey.seeds.finetuned.items()
    ]
    return Table(
        f"passkey retrieval: accuracy on the {passkey.key_letters} key letters, {passkey.prompts} prompts per "
        f"length, mean ± sd over seeds {r.seeds} (chance {num(passkey.chance)})",
        ("model", *(f"{f}×L = {f * r.train_length}" for f in factors)),
        tuple(rows),
    )


TABLES = (
    KeyTable("scaling at inference", inference_table),
    KeyTable("fine-tuned at 4×L", finetuned_table),
    KeyTable("checkpoint averaging", averaging_table),
    KeyTable("passkey retrieval", passkey_table),
)
