"""Context extension of a RoPE model: inference-time scalings, then 100 fine-tuning steps at 4x L.

Claims tested (verdicts computed from the measured perplexities, never typed in):

* Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation"
  (PI, https://arxiv.org/abs/2306.15595); bloc97 2023 (NTK-aware); emozilla 2023 (dynamic NTK);
  Peng et al. 2023, "YaRN" (https://arxiv.org/abs/2309.00071): without fine-tuning, each scaling
  reads 4x L better than plain RoPE; a short fine-tune at the new length brings PI and YaRN close to
  the base model's in-window perplexity, YaRN at least as well as PI, and both better than
  fine-tuning plain RoPE.
* Seed 000 §3.5 and Q4: "YaRN or NTK-aware first, much better than PI"; YaRN "currently the best";
  continued pre-training "slow but the most reliable".

The RoPE model is the extrapolation experiment's (reused when that experiment ran next to this one
with the same size, else trained here). Each scaling is applied at inference with
:func:`poslab.analysis.eval.apply_rope_scaling` (factor 4, ``original_max_len = L``); the fine-tunes are new
runs initialised from the RoPE run's checkpoint (``TrainConfig.init_from``) with the scaling set and
``block_size = 4 L``, trained for 100 steps at the same tokens per step. A control run trains the same
number of extra steps at ``L`` without scaling, to separate what more training alone buys.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, parse_rope_scaling
from poslab.display import new_figure, print_table, save_figure
from poslab.lab.experiments.extrapolation import (
    claim,
    ensure_trained,
    load_model,
    models_dir,
    print_claims,
    ratio,
    shared_model,
    size_of,
    train_config,
)
from poslab.runs import RunFolder

NAME = "context-extension"
DESCRIPTION = "RoPE at 4x L with PI / NTK / dynamic / YaRN / Llama3, then 100 fine-tuning steps (seed 000 §3.5, Q4)"
IN_ALL = False  # trains models

FACTOR = 4
#: inference-time variants: label -> --rope-scaling spec
INFERENCE = {"none": "none", "PI": "linear:4", "NTK": "ntk:4", "dynamic NTK": "dynamic:4", "YaRN": "yarn:4", "Llama3": "llama3:4"}
#: fine-tuned variants: label -> --rope-scaling spec
FINETUNE = {"none": "none", "PI": "linear:4", "YaRN": "yarn:4"}


def _cell(model: Any, tokens: torch.Tensor, length: int, n_targets: int) -> dict[str, Any]:
    return evaluate_length(model, tokens, length, n_targets, stride=length // 2)


def _ppl(cell: dict[str, Any], mode: str = "nonoverlapping") -> float:
    return cell[mode]["ppl"]


def finetune_config(label: str, spec: str, lab: Any, base_run: Path, out: Path) -> Any:
    """The fine-tuning run of one variant: ``block_size = 4 L``, the scaling set, initialised from ``base_run``."""
    scaling = parse_rope_scaling(spec)
    position_config = {} if scaling["scaling"] is None else {**scaling, "original_max_len": lab.train_length}
    batch = max(1, lab.batch_size // FACTOR)  # the same tokens per step as the base run
    return train_config("rope", lab, models_dir(out, lab), name=f"rope-finetune-{spec.split(':')[0]}",
                        block_size=FACTOR * lab.train_length, position_config=position_config,
                        steps=lab.finetune_steps, batch_size=batch, lr=lab.lr / 3,
                        warmup_steps=max(1, lab.finetune_steps // 10), init_from=str(base_run))


def control_config(lab: Any, base_run: Path, out: Path) -> Any:
    """The control: the same number of extra steps at the original length ``L``, no scaling.

    It separates what more training alone buys (the base model is small and still learning) from
    what training at 4x L buys.
    """
    return train_config("rope", lab, models_dir(out, lab), name="rope-control-more-steps-at-L", steps=lab.finetune_steps,
                        lr=lab.lr / 3, warmup_steps=max(1, lab.finetune_steps // 10), init_from=str(base_run))


def context_claims(inference: dict[str, dict], finetuned: dict[str, dict], base_L: float, steps: int = 100) -> list[dict[str, Any]]:
    """Claims with figures and verdicts (non-overlapping perplexity at 4x L unless said otherwise)."""
    p = {k: _ppl(v) for k, v in inference.items()}
    out = []
    for label in ("PI", "NTK", "dynamic NTK", "YaRN"):
        out.append(claim(f"without fine-tuning, {label} reads 4x L better than no scaling",
                         "Chen et al. 2023 (PI); bloc97 2023 (NTK); Peng et al. 2023 (YaRN)",
                         f"ppl_{label}(4L) < ppl_none(4L)", {label: p[label], "none": p["none"]}, p[label] < p["none"]))
    out.append(claim("YaRN and NTK-aware are much better than PI (without fine-tuning)", "seed 000 §3.5",
                     "ppl_YaRN(4L) < ppl_PI(4L) and ppl_NTK(4L) < ppl_PI(4L)",
                     {"YaRN": p["YaRN"], "NTK": p["NTK"], "PI": p["PI"]}, p["YaRN"] < p["PI"] and p["NTK"] < p["PI"]))
    best = min((v, k) for k, v in p.items() if k != "none")
    out.append(claim("YaRN is the best inference-time scaling", "seed 000 Q4 (YaRN ★★★)",
                     "ppl_YaRN(4L) <= every other scaling's ppl(4L)", {**p, "best": best[1]}, best[1] == "YaRN"))
    f = {k: _ppl(v["4L"]) for k, v in finetuned.items()}
    for label in ("PI", "YaRN"):
        value = ratio(f[label], base_L)
        out.append(claim(f"after {steps} fine-tuning steps at 4x L, {label} is close to the base model's in-length perplexity",
                         "Chen et al. 2023 (PI); Peng et al. 2023 (YaRN)", "ppl_finetuned(4L) / ppl_base(L) <= 1.15",
                         {"finetuned_4L": f[label], "base_L": base_L, "ratio": value}, value <= 1.15))
    out.append(claim("after fine-tuning, YaRN <= PI", "Peng et al. 2023 (YaRN)", "ppl_YaRN_ft(4L) <= ppl_PI_ft(4L)",
                     {"YaRN": f["YaRN"], "PI": f["PI"]}, f["YaRN"] <= f["PI"]))
    out.append(claim("plain fine-tuning (no scaling) is the worst of the three", "Chen et al. 2023 (PI)",
                     "ppl_none_ft(4L) > ppl_PI_ft(4L) and > ppl_YaRN_ft(4L)",
                     {"none": f["none"], "PI": f["PI"], "YaRN": f["YaRN"]}, f["none"] > max(f["PI"], f["YaRN"])))
    best_ft, best_inf = min(f.values()), min(p.values())
    out.append(claim("continued training is the most reliable (beats every inference-only scaling)", "seed 000 Q4 (★★★ slow but most reliable)",
                     "min ppl_finetuned(4L) < min ppl_inference(4L)", {"best_finetuned": best_ft, "best_inference": best_inf},
                     best_ft < best_inf))
    return out


def plot(inference: dict, finetuned: dict, base_L: float, lab: Any, path: Path) -> Path:
    """Bars: perplexity at 4x L per inference-time scaling, and fine-tuned at 4x L and back at L."""
    fig, axes = new_figure(1, 2, size=(13.0, 4.8))
    names = list(inference)
    axes[0].bar(names, [_ppl(inference[n]) for n in names], color="tab:blue")
    axes[0].axhline(base_L, color="black", linestyle="--", linewidth=1, label=f"base model at L={lab.train_length}")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity (non-overlapping)")
    axes[0].set_title(f"RoPE model at 4x L = {FACTOR * lab.train_length}, no fine-tuning")
    axes[0].legend(fontsize=8)
    labels = list(finetuned)
    x = torch.arange(len(labels)).tolist()
    axes[1].bar([i - 0.2 for i in x], [_ppl(finetuned[k]["4L"]) for k in labels], width=0.4, label=f"at 4x L = {FACTOR * lab.train_length}")
    axes[1].bar([i + 0.2 for i in x], [_ppl(finetuned[k]["L"]) for k in labels], width=0.4, label=f"back at L = {lab.train_length}")
    axes[1].axhline(base_L, color="black", linestyle="--", linewidth=1, label="base model at L")
    axes[1].set_xticks(x, labels)
    axes[1].set_title(f"after {lab.finetune_steps} fine-tuning steps at 4x L")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, path)


def run(out: Path, quick: bool = False, size: str | None = None) -> dict:
    """Inference-time scalings and fine-tunes of the lab's RoPE model; table, plot, claims."""
    lab = size_of(quick, size)
    out = Path(out)
    start = time.perf_counter()
    long_length = FACTOR * lab.train_length
    base_run = shared_model("rope", lab, out)
    model, tokenizer, config = load_model(base_run)
    tokens = RunFolder(base_run).split_tokens("val", tokenizer)
    n_targets = lab.n_targets
    base = {"L": _cell(model, tokens, lab.train_length, n_targets)}
    inference: dict[str, dict] = {}
    for label, spec in INFERENCE.items():
        apply_rope_scaling(model, parse_rope_scaling(spec), original_max_len=lab.train_length)
        inference[label] = _cell(model, tokens, long_length, n_targets)
        inference[label]["rope_scaling"] = spec
    base_L = _ppl(base["L"])

    finetuned: dict[str, dict] = {}
    runs: dict[str, str] = {}
    for label, spec in FINETUNE.items():
        run_dir = ensure_trained(finetune_config(label, spec, lab, base_run, out))
        runs[label] = str(run_dir)
        tuned, _, _ = load_model(run_dir)
        finetuned[label] = {"rope_scaling": spec, "4L": _cell(tuned, tokens, long_length, n_targets),
                            "L": _cell(tuned, tokens, lab.train_length, n_targets)}

    rows = [[label, inference[label]["rope_scaling"], f"{_ppl(inference[label]):.3f}", f"{_ppl(inference[label], 'sliding'):.3f}",
             f"{_ppl(inference[label]) / base_L:.3f}"] for label in INFERENCE]
    print_table(["scaling (inference only)", "spec", f"ppl at {long_length}", "sliding", "vs base at L"], rows,
                title=f"RoPE model trained at L={lab.train_length}: base ppl at L = {base_L:.3f} "
                      f"(sliding {_ppl(base['L'], 'sliding'):.3f}); {n_targets} targets")
    control_dir = ensure_trained(control_config(lab, base_run, out))
    runs["control"] = str(control_dir)
    tuned, _, _ = load_model(control_dir)
    control = {"4L": _cell(tuned, tokens, long_length, n_targets), "L": _cell(tuned, tokens, lab.train_length, n_targets)}

    rows = [[label, spec, f"{_ppl(finetuned[label]['4L']):.3f}", f"{_ppl(finetuned[label]['L']):.3f}",
             f"{_ppl(finetuned[label]['4L']) / base_L:.3f}"] for label, spec in FINETUNE.items()]
    rows.append([f"control: {lab.finetune_steps} more steps at L", "none", f"{_ppl(control['4L']):.3f}", f"{_ppl(control['L']):.3f}",
                 f"{_ppl(control['4L']) / base_L:.3f}"])
    print_table(["fine-tuned", "spec", f"ppl at {long_length}", f"ppl back at {lab.train_length}", "at 4L vs base at L"], rows,
                title=f"after {lab.finetune_steps} steps at block size {long_length} (init from the RoPE run)")
    claims = context_claims(inference, finetuned, base_L, lab.finetune_steps)
    for c in claims:  # what the extra steps alone give, next to the fine-tuning claims
        if "fine-tun" in c["claim"] and "without" not in c["claim"]:
            c["measured"]["control_more_steps_at_L_ppl_L"] = _ppl(control["L"])
    print_claims(claims)
    figure = plot(inference, finetuned, base_L, lab, out / "context_extension.png")
    return {
        "experiment": NAME,
        "size": dataclasses.asdict(lab),
        "train_length": lab.train_length,
        "eval_length": long_length,
        "factor": FACTOR,
        "n_targets": n_targets,
        "base_run": str(base_run),
        "base": base,
        "inference": inference,
        "finetune_runs": runs,
        "finetuned": finetuned,
        "control_more_steps_at_L": control,
        "claims": claims,
        "figure": str(figure),
        "seconds": time.perf_counter() - start,
    }
