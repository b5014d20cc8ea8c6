"""The context-extension experiment's console tables and figures: perplexity at 4x L per scaling and fine-tune,
the equal-budget comparison, passkey accuracy by length, and checkpoint averaging."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.display import new_figure, print_table, save_figure
from poslab.lab import verdicts
from poslab.lab.experiments.common import draw_perplexity_baselines
from poslab.lab.experiments.context_extension_claims import (
    AVERAGED,
    AVERAGING,
    BASE_WEIGHT,
    FACTOR,
    FINETUNE,
    INFERENCE,
    LLAMA3_NOTE,
    SCALINGS,
    Budget,
)
from poslab.lab.experiments.context_extension_passkey import KEY_ALPHABET, KEY_LETTERS, PASSKEY_FACTORS, PASSKEY_PROMPTS
from poslab.lab.tables import mean_sd_text


def _ppl(cell: dict[str, Any], mode: str = "nonoverlapping") -> float:
    return cell[mode]["ppl"]


def plot(
    inference: dict,
    finetuned: dict,
    base_L: float,
    lab: Any,
    path: Path,
    passkey: dict[str, Any] | None = None,
    baselines: dict[str, float] | None = None,
) -> Path:
    """Perplexity at 4x L per scaling (bars, ± sd over seeds), fine-tuned at 4x L and at L, and passkey accuracy vs
    length; ``baselines`` (the corpus's n-gram count models, nats) are drawn as perplexity lines."""
    fig, axes = new_figure(1, 3, size=(18.0, 4.8))
    names = list(inference)

    def sd(cell: dict) -> float:
        return cell["nonoverlapping"].get("ppl_sd") or 0.0

    axes[0].bar(
        names, [_ppl(inference[n]) for n in names], yerr=[sd(inference[n]) for n in names], color="tab:blue", capsize=3
    )
    axes[0].axhline(base_L, color="black", linestyle="--", linewidth=1, label=f"base model at L={lab.train_length}")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity (non-overlapping)")
    axes[0].set_title(f"RoPE model at 4x L = {FACTOR * lab.train_length}, no fine-tuning")
    labels = list(finetuned)
    x = list(range(len(labels)))
    axes[1].bar(
        [i - 0.2 for i in x],
        [_ppl(finetuned[k]["4L"]) for k in labels],
        yerr=[sd(finetuned[k]["4L"]) for k in labels],
        width=0.4,
        capsize=3,
        label=f"at 4x L = {FACTOR * lab.train_length}",
    )
    axes[1].bar(
        [i + 0.2 for i in x],
        [_ppl(finetuned[k]["L"]) for k in labels],
        yerr=[sd(finetuned[k]["L"]) for k in labels],
        width=0.4,
        capsize=3,
        label=f"back at L = {lab.train_length}",
    )
    axes[1].axhline(base_L, color="black", linestyle="--", linewidth=1, label="base model at L")
    axes[1].set_xticks(x, labels)
    axes[1].set_title(f"after {lab.finetune_steps} fine-tuning steps at 4x L")
    for ax in axes[:2]:
        draw_perplexity_baselines(ax, baselines)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    ax = axes[2]
    if passkey is not None:
        rows = [(f"{k} (inference)", v, "-") for k, v in passkey["inference"].items()]
        rows += [(f"{k} fine-tuned", v, "--") for k, v in passkey["finetuned"].items()]
        for label, per_factor, style in rows:
            xs, ms, ss = [], [], []
            for f in PASSKEY_FACTORS:
                values = [v for v in per_factor[str(f)] if v is not None]
                if values:
                    m, s = verdicts.mean_sd(values)
                    xs.append(f * lab.train_length)
                    ms.append(m)
                    ss.append(s or 0.0)
            line = ax.plot(xs, ms, marker="o", markersize=3, linestyle=style, label=label)[0]
            ax.fill_between(
                xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)], color=line.get_color(), alpha=0.12
            )
        ax.axhline(1 / len(KEY_ALPHABET), color="grey", linestyle=":", linewidth=1, label="chance (1/26)")
        ax.axvline(lab.train_length, color="black", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("passkey letter accuracy")
        ax.set_title("passkey retrieval (mean ± sd over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.axis("off")
    return save_figure(fig, path)


def plot_averaging(per_seed: list[dict[str, Any]], lab: Any, last: int, path: Path) -> Path:
    """Checkpoint averaging: perplexity at L, at 4x L and passkey accuracy at 4x L of each variant
    (:data:`AVERAGING`), one dot per seed, mean ± sd."""
    fig, axes = new_figure(1, 3, size=(16.0, 4.6))
    names = list(AVERAGING)
    panels = [
        ("L", f"perplexity at L = {lab.train_length} (forgetting)"),
        ("4L", f"perplexity at 4x L = {FACTOR * lab.train_length}"),
        ("passkey", f"passkey letter accuracy at 4x L = {FACTOR * lab.train_length}"),
    ]
    for ax, (key, title) in zip(axes, panels):
        for x, name in enumerate(names):
            cells = [e["averaging"][name] for e in per_seed]
            values = [c["passkey"][str(FACTOR)] if key == "passkey" else _ppl(c[key]) for c in cells]
            values = [v for v in values if v is not None]
            if not values:
                continue
            mean, sd = verdicts.mean_sd(values)
            ax.bar(x, mean, yerr=sd or 0.0, width=0.6, capsize=4, color=f"C{x}", alpha=0.55)
            ax.scatter(
                [x + 0.12 * (j - (len(values) - 1) / 2) for j in range(len(values))],
                values,
                color="black",
                s=10,
                zorder=3,
                label="one seed" if x == 0 else None,
            )
        ax.set_xticks(range(len(names)), [n.replace("last-k", f"last-{last}") for n in names], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if key != "passkey":  # zoom on the differences
            kept = [_ppl(e["averaging"][n][key]) for e in per_seed for n in names]
            low, high = min(kept), max(kept)
            ax.set_ylim(low - 0.1 * (high - low + 1e-9), high + 0.1 * (high - low + 1e-9))
            ax.set_ylabel("perplexity (non-overlapping)")
        else:
            ax.axhline(1 / len(KEY_ALPHABET), color="grey", linestyle=":", linewidth=1, label="chance (1/26)")
            ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"checkpoint averaging of the {AVERAGED} fine-tune ({lab.finetune_steps} steps at 4x L): mean ± sd over "
        f"{len(per_seed)} seeds; base ⊕ fine-tuned = {BASE_WEIGHT:g} base + {1 - BASE_WEIGHT:g} final",
        fontsize=10,
    )
    return save_figure(fig, path)


def report(per_seed: list[dict[str, Any]], means: dict[str, Any], lab: Any, last: int, budget: Budget) -> None:
    """Print the tables: inference-time scalings, fine-tunes, the equal-budget comparison, passkey retrieval,
    checkpoint averaging."""
    long_length = FACTOR * lab.train_length
    seeds = [e["seed"] for e in per_seed]
    base_L = _ppl(means["base"]["L"])

    def ppls(get: Any) -> list[float]:
        return [get(e) for e in per_seed]

    n = len(seeds)
    rows = [
        [
            label,
            spec,
            mean_sd_text(ppls(lambda e, k=label: _ppl(e["inference"][k]))),
            mean_sd_text(ppls(lambda e, k=label: _ppl(e["inference"][k], "sliding"))),
            f"{_ppl(means['inference'][label]) / base_L:.3f}",
        ]
        for label, spec in INFERENCE.items()
    ]
    print_table(
        ["scaling (inference only)", "spec", f"ppl at {long_length}", "sliding", "vs base at L"],
        rows,
        title=f"RoPE models trained at L={lab.train_length}, mean ± sd over {n} seeds {seeds}: base ppl at L = "
        f"{mean_sd_text(ppls(lambda e: _ppl(e['base']['L'])))}; {lab.n_targets} targets",
    )
    rows = [
        [
            label,
            spec,
            mean_sd_text(ppls(lambda e, k=label: _ppl(e["finetuned"][k]["4L"]))),
            mean_sd_text(ppls(lambda e, k=label: _ppl(e["finetuned"][k]["L"]))),
            f"{_ppl(means['finetuned'][label]['4L']) / base_L:.3f}",
        ]
        for label, spec in FINETUNE.items()
    ]
    rows.append(
        [
            f"control: {lab.finetune_steps} more steps at L",
            "none",
            mean_sd_text(ppls(lambda e: _ppl(e["finetuned"]["control"]["4L"]))),
            mean_sd_text(ppls(lambda e: _ppl(e["finetuned"]["control"]["L"]))),
            f"{_ppl(means['control']['4L']) / base_L:.3f}",
        ]
    )
    print_table(
        ["fine-tuned", "spec", f"ppl at {long_length}", f"ppl back at {lab.train_length}", "at 4L vs base at L"],
        rows,
        title=f"after {lab.finetune_steps} steps at block size {long_length} (init from each seed's RoPE run)",
    )
    rows = [
        [
            "continued training (plain fine-tune at 4x L)",
            "none",
            mean_sd_text(ppls(lambda e: _ppl(e["finetuned"]["none"]["4L"]))),
        ]
    ]
    rows += [
        [
            f"{label} at inference",
            INFERENCE[label],
            mean_sd_text(ppls(lambda e, k=label: _ppl(e["control_inference"][k]))),
        ]
        for label in SCALINGS
    ]
    print_table(
        ["arm", "spec", f"ppl at {long_length}"],
        rows,
        title=f"at an equal token budget ({budget.text()}): continued training at 4x L against the control "
        f"({lab.finetune_steps} more steps at L) read at 4x L with each scaling",
    )
    passkey = means["passkey"]
    headers = ["model"] + [f"{f}x L ({f * lab.train_length})" for f in PASSKEY_FACTORS]
    rows = [
        [f"{k} (inference only)"] + [mean_sd_text(v[str(f)]) for f in PASSKEY_FACTORS]
        for k, v in passkey["inference"].items()
    ]
    rows += [
        [f"{k} fine-tuned at 4x L"] + [mean_sd_text(v[str(f)]) for f in PASSKEY_FACTORS]
        for k, v in passkey["finetuned"].items()
    ]
    print_table(
        headers,
        rows,
        title=f"passkey retrieval: accuracy on the {KEY_LETTERS} key letters, {PASSKEY_PROMPTS} prompts "
        f"per length, mean ± sd over {n} seeds (chance {1 / len(KEY_ALPHABET):.3f})",
    )
    rows = [
        [
            name.replace("last-k", f"last-{last}"),
            mean_sd_text(ppls(lambda e, k=name: _ppl(e["averaging"][k]["L"]))),
            mean_sd_text(ppls(lambda e, k=name: _ppl(e["averaging"][k]["4L"]))),
        ]
        + [mean_sd_text([e["averaging"][name]["passkey"][str(f)] for e in per_seed]) for f in PASSKEY_FACTORS]
        + [mean_sd_text([e["averaging"]["weight_distance_to_fine_tuned"].get(name, 0.0) for e in per_seed], 4)]
        for name in AVERAGING
    ]
    print_table(
        ["model", f"ppl at L={lab.train_length}", f"ppl at {long_length}"]
        + [f"passkey {f}x L" for f in PASSKEY_FACTORS]
        + ["|w - w_ft| / |w_ft|"],
        rows,
        title=f"checkpoint averaging of the {AVERAGED} fine-tune: the last {last} checkpoints (steps "
        f"{per_seed[0]['averaging']['steps']}), base ⊕ fine-tuned {BASE_WEIGHT:g}/{1 - BASE_WEIGHT:g}; "
        f"mean ± sd over {n} seeds",
    )
    print(f"  note: {LLAMA3_NOTE}")
