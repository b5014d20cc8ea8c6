"""The context-extension experiment's key tables: scaling at inference, fine-tunes, checkpoint averaging, each built
from its typed result (:class:`poslab.lab.experiments.context_extension.ContextResult`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from poslab.lab.report.i18n import name_lessons, t
from poslab.lab.tables import KeyTable, MeanSd, Table, ppl, ppl_spread, spread
from poslab.lab.verdicts import num

if TYPE_CHECKING:
    from poslab.lab.experiments.context_extension import ContextResult


def inference_table(r: ContextResult) -> Table:
    """Each RoPE scaling applied at inference: its spec and perplexity at the long length (chunks, sliding)."""
    base = ppl(r.base["L"], "nonoverlapping")
    return Table(
        t("key.ctx.base", length=r.train_length, ppl=num(base)),
        (t("key.ctx.scaling"), t("key.ctx.spec"), t("key.ctx.pplat", n=r.eval_length), t("key.sliding")),
        tuple(
            (label, entry.get("rope_scaling"), ppl(entry, "nonoverlapping"), ppl(entry, "sliding"))
            for label, entry in r.inference.items()
        ),
    )


def finetuned_table(r: ContextResult) -> Table:
    """Each fine-tune at 4×L: its perplexity at the long length and back at L; below, the
    inference-only arms at the fine-tunes' token budget (the control, the same steps at L, read at 4×L with each
    scaling) below."""
    budget = r.equal_budget["control_inference"]
    equal = tuple(
        (
            f"control (the same steps at L), {label} at inference",
            entry.get("rope_scaling"),
            ppl(entry, "nonoverlapping"),
            None,
        )
        for label, entry in budget.items()
    )
    return Table(
        t("key.ctx.after"),
        (
            t("key.ctx.finetuned"),
            t("key.ctx.spec"),
            t("key.ctx.pplat", n=r.eval_length),
            t("key.ctx.back", n=r.train_length),
        ),
        tuple(
            (label, entry.get("rope_scaling"), ppl(entry["4L"], "nonoverlapping"), ppl(entry["L"], "nonoverlapping"))
            for label, entry in r.finetuned.items()
        )
        + equal,
    )


def averaging_table(r: ContextResult) -> Table:
    """Checkpoint averaging of a fine-tune: forgetting at L, perplexity at 4×L, passkey, distance to the fine-tune."""
    averaging = r.averaging
    factor = str(r.factor)
    return Table(
        t(
            "key.ctx.averaging",
            ft=averaging.get("fine_tune"),
            last=averaging.get("last"),
            w=averaging.get("base_weight"),
            w2=f"{1 - averaging.get('base_weight', 0.5):g}",
            seeds=r.seeds,
        ),
        (
            t("key.model"),
            t("key.ctx.forgetting", n=r.train_length),
            t("key.ctx.pplat", n=r.eval_length),
            t("key.ctx.passkey", f=factor),
            "|w − w_ft| / |w_ft|",
        ),
        tuple(
            (
                label,
                ppl_spread(v.get("L"), "nonoverlapping"),
                ppl_spread(v.get("4L"), "nonoverlapping"),
                spread([x for x in v.get("passkey", {}).get(factor, []) if x is not None]),
                spread(v.get("weight_distance_to_fine_tuned") or [], 4),
            )
            for label, v in averaging["variants"].items()
        ),
        note=name_lessons(str(averaging.get("note", ""))),
    )


def passkey_table(r: ContextResult) -> Table:
    """Passkey retrieval of each scaling without and with fine-tuning at 4×L, per test length (mean ± sd over
    seeds; ``cannot`` where the length is too short for the needle)."""
    passkey = r.passkey
    factors = [str(f) for f in passkey["factors"]]
    rows = [
        (f"{k} (inference only)", *((MeanSd.of(v[f], 3) or "cannot") for f in factors))
        for k, v in passkey["inference"].items()
    ]
    rows += [
        (
            "control (the same steps at L)" if k == "control" else f"{k} fine-tuned at 4×L",
            *((MeanSd.of(v[f], 3) or "cannot") for f in factors),
        )
        for k, v in passkey["finetuned"].items()
    ]
    return Table(
        f"passkey retrieval: accuracy on the {passkey['key_letters']} key letters, {passkey['prompts']} prompts per "
        f"length, mean ± sd over seeds {r.seeds} (chance {num(passkey['chance'])})",
        ("model", *(f"{f}×L = {int(f) * r.train_length}" for f in factors)),
        tuple(rows),
    )


TABLES = (
    KeyTable("scaling at inference", inference_table),
    KeyTable("fine-tuned at 4×L", finetuned_table),
    KeyTable("checkpoint averaging", averaging_table),
    KeyTable("passkey retrieval", passkey_table),
)
