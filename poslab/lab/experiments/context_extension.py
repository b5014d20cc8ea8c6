"""Context extension of a RoPE model: inference-time scalings, then fine-tuning at 4x L; perplexity and passkey.

Claims tested (verdicts computed from the measured values over seeds, never typed in; every claim is a
:class:`poslab.lab.verdicts.ClaimRecord` decided by :func:`poslab.lab.verdicts.compare`):

* Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation"
  (PI, https://arxiv.org/abs/2306.15595); bloc97 2023 (NTK-aware); emozilla 2023 (dynamic NTK);
  Peng et al. 2023, "YaRN" (https://arxiv.org/abs/2309.00071): without fine-tuning, each scaling
  reads 4x L better than plain RoPE; a short fine-tune at the new length brings PI and YaRN close to
  the base model's in-window perplexity, YaRN at least as well as PI, and both better than
  fine-tuning plain RoPE.
* Seed 000 §3.5 and Q4: "YaRN or NTK-aware first, much better than PI"; YaRN "currently the best";
  continued pre-training "slow but the most reliable".
* Passkey retrieval (Mohtashami & Jaggi 2023, https://arxiv.org/abs/2305.16300; the test the PI,
  YaRN and LongRoPE papers report): a random key of capital letters is hidden in validation text and
  asked for at the end; accuracy of the model's argmax on the key's letters at 1x/2x/4x/8x L for each
  scaling, without and with fine-tuning. Fine-tuning at 4x L should retrieve there better than the
  same scaling without it.
* Seed 000 Q4's Llama 3 recipe, checkpoint averaging "avoids catastrophic forgetting": the mean of the
  YaRN fine-tune's last k checkpoints, and base ⊕ fine-tuned, against the plain fine-tune (below).

The RoPE models are the extrapolation experiment's, one per seed (at least :data:`MIN_SEEDS`): the
seeds are read from that experiment's ``results.json`` when it lists them, completed identical runs
anywhere under its ``models/SIZE`` folder are reused, and missing seeds are trained here. Each scaling
is applied at inference by :func:`scale_rope` (factor 4, ``original_max_len = L``); the fine-tunes are
new runs initialised from each seed's RoPE run (``TrainConfig.init_from``) with the scaling set and
``block_size = 4 L``, trained at the same tokens per step. A control run trains the same number of
extra steps at ``L`` without scaling, to separate what more training alone buys.

Checkpoint averaging (seed 000 Q4: 「LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 +
平均检查点（averaging checkpoints）避免灾难性遗忘。」, "Llama 3: pre-train at 8K, extend to 128K in stages, with
NTK-aware + continued pre-training + averaging checkpoints to avoid catastrophic forgetting"). The
:data:`AVERAGED` fine-tune keeps its last :data:`AVERAGE_LAST` checkpoints (every
``finetune_steps // 10`` steps); four models of each seed are compared at ``L`` (forgetting), at
``4 L`` and on the passkey: the base model (no scaling at ``L``; the fine-tune's scaling at inference
at ``4 L``), the plain fine-tune (its final checkpoint), the mean of its last ``k`` checkpoints
(:meth:`poslab.runs.RunFolder.averaged_model`), and base ⊕ fine-tune, the mean with weights
:data:`BASE_WEIGHT` / ``1 - BASE_WEIGHT`` of the base's and the final fine-tune's weights (the same shapes:
RoPE has no weights; the average uses the fine-tune's position config). Averaging costs no training
step. In the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783)
checkpoint averaging belongs to the annealing stage of pre-training (§3.4.3) and to post-training
(§4.1.5, averaging models across RM / SFT / DPO runs), not to the long-context stage (§3.4.2) the lesson
ties it to.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, loss_by_position, parse_rope_scaling
from poslab.display import new_figure, print_table, save_figure
from poslab.lab import verdicts
from poslab.lab.experiments import context_extension_tables, read_results
from poslab.lab.experiments.common import LAB, Experiment, baseline_line, draw_perplexity_baselines, ngram_baselines
from poslab.lab.experiments.extrapolation import CORPUS, POSITION_TRAINING, models_dir, size_of, train_config
from poslab.lab.experiments.extrapolation import EXPERIMENT as EXTRAPOLATION
from poslab.lab.experiments.training import CONTEXT_WINDOWS, SEED, ensure_many, load_model
from poslab.lab.premises import all_of, attach, below_bigram, retrieves, uses_context
from poslab.lab.runner import check_workers, default_workers
from poslab.lab.tables import mean_sd_text
from poslab.runs import RunFolder
from poslab.training.averaging import average_state_dicts

FACTOR = 4
#: inference-time variants: label -> --rope-scaling spec
INFERENCE = {
    "none": "none",
    "PI": "linear:4",
    "NTK": "ntk:4",
    "dynamic NTK": "dynamic:4",
    "YaRN": "yarn:4",
    "Llama3": "llama3:4",
}
#: fine-tuned variants: label -> --rope-scaling spec
FINETUNE = {"none": "none", "PI": "linear:4", "YaRN": "yarn:4"}
#: fewest seeds the experiment runs (a comparison needs this many to be conclusive)
MIN_SEEDS = verdicts.MIN_SEEDS
#: passkey test lengths, as multiples of L
PASSKEY_FACTORS = (1, 2, 4, 8)
#: passkey prompts per length; letters in a key
PASSKEY_PROMPTS = 48
KEY_LETTERS = 4
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
SOURCE_SCALINGS = "Chen et al. 2023 (PI); bloc97 2023 (NTK); Peng et al. 2023 (YaRN)"
SOURCE_PASSKEY = "Mohtashami & Jaggi 2023; Chen et al. 2023 (PI); Peng et al. 2023 (YaRN)"
#: the fine-tune whose checkpoints are averaged (seed 000 Q4's first choice, YaRN)
AVERAGED = "YaRN"
#: checkpoints of the :data:`AVERAGED` fine-tune that are kept and averaged, per lab size
AVERAGE_LAST = {"smoke": 3, "quick": 3, "full": 5}
#: weight of the base model in base ⊕ fine-tune (the fine-tune gets ``1 - BASE_WEIGHT``)
BASE_WEIGHT = 0.5
#: the averaging variants: label -> what it is (the order of the tables and the plot)
AVERAGING = {
    "base": "the base model (no fine-tuning)",
    "fine-tuned": "the plain fine-tune (its final checkpoint)",
    "last-k average": "the mean of the fine-tune's last k checkpoints",
    "base ⊕ fine-tuned": "base and final fine-tune weights averaged",
}
#: non-inferiority tolerances of the averaging claims (stated before any measurement)
PPL_TOLERANCE = 1.01
PASSKEY_TOLERANCE = 0.05
SOURCE_AVERAGING = "seed 000 Q4 (LLaMA3: 平均检查点 avoids catastrophic forgetting)"
SOURCE_WISE = "Wortsman et al. 2022 (WiSE-FT: interpolating base and fine-tuned weights)"
#: where averaging belongs in the Llama 3 recipe (shown with the results and in the report)
LLAMA3_NOTE = (
    'In the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783) checkpoint '
    "averaging belongs to the annealing stage of pre-training (§3.4.3: the final pre-trained model is the "
    "average of checkpoints taken during annealing) and to post-training (§4.1.5: models from runs with "
    "different data or hyperparameters are averaged at each RM, SFT and DPO stage), not to the long-context "
    "pre-training stage (§3.4.2) that seed 000 Q4 ties it to."
)


def scale_rope(model: Any, spec: str, original_max_len: int) -> Any:
    """Apply RoPE scaling ``spec`` (``"linear:4"``, ``"none"``, ...) to ``model`` at inference, in place.

    The one place this experiment changes a trained model's positions (today
    :func:`poslab.analysis.eval.apply_rope_scaling`).
    """
    apply_rope_scaling(model, parse_rope_scaling(spec), original_max_len=original_max_len)
    return model


def _cell(model: Any, tokens: torch.Tensor, length: int, n_targets: int) -> dict[str, Any]:
    return evaluate_length(model, tokens, length, n_targets, stride=length // 2)


def _ppl(cell: dict[str, Any], mode: str = "nonoverlapping") -> float:
    return cell[mode]["ppl"]


# ------------------------------------------------------------------------------------ passkey
def passkey_prompts(
    tokens: torch.Tensor, tokenizer: Any, length: int, n: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, list[str]] | None:
    """``n`` passkey prompts of exactly ``length`` input tokens, or ``None`` if the needle does not fit.

    A prompt is validation text with ``" key ABCD."`` inserted at a uniformly random depth, ending in
    ``" key ABCD"``: the last :data:`KEY_LETTERS` targets are the key's letters, which the model can
    only predict by finding the needle.

    Returns:
        ``(idx [n, length], targets [n, length] with -1 except on the final key letters, keys)``.
    """
    g = torch.Generator().manual_seed(seed)
    needle_len, query_len = len(" key .") + KEY_LETTERS, len(" key ") + KEY_LETTERS
    filler_len = length + 1 - needle_len - query_len
    if filler_len < 1 or tokens.numel() < filler_len + 1:
        return None
    rows, keys = [], []
    for _ in range(n):
        key = "".join(KEY_ALPHABET[int(i)] for i in torch.randint(len(KEY_ALPHABET), (KEY_LETTERS,), generator=g))
        start = int(torch.randint(tokens.numel() - filler_len, (1,), generator=g))
        depth = int(torch.randint(filler_len + 1, (1,), generator=g))
        filler = tokens[start : start + filler_len]
        needle = torch.tensor(tokenizer.encode(f" key {key}."), dtype=torch.long)
        query = torch.tensor(tokenizer.encode(f" key {key}"), dtype=torch.long)
        rows.append(torch.cat([filler[:depth], needle, filler[depth:], query]))  # [length + 1]
        keys.append(key)
    seq = torch.stack(rows)  # [n, length + 1]
    targets = torch.full((n, length), -1, dtype=torch.long)
    targets[:, -KEY_LETTERS:] = seq[:, -KEY_LETTERS:]
    return seq[:, :-1], targets, keys


@torch.no_grad()
def passkey_accuracy(
    model: Any,
    tokens: torch.Tensor,
    tokenizer: Any,
    length: int,
    n: int = PASSKEY_PROMPTS,
    seed: int = 0,
    batch: int = 16,
) -> float | None:
    """Argmax accuracy on the key letters of :func:`passkey_prompts` (``None``: does not fit ``length``)."""
    prompts = passkey_prompts(tokens, tokenizer, length, n, seed)
    if prompts is None:
        return None
    idx, targets, _ = prompts
    hits = total = 0
    for i in range(0, n, batch):
        logits = model(idx[i : i + batch])  # [b, length, V]
        keep = targets[i : i + batch] >= 0
        hits += int((logits.argmax(-1)[keep] == targets[i : i + batch][keep]).sum())
        total += int(keep.sum())
    return hits / total


def passkey_row(model: Any, tokens: torch.Tensor, tokenizer: Any, train_length: int) -> dict[str, float | None]:
    """Passkey accuracy at each of :data:`PASSKEY_FACTORS` x L (the same prompts for every model)."""
    return {str(f): passkey_accuracy(model, tokens, tokenizer, f * train_length, seed=f) for f in PASSKEY_FACTORS}


# ------------------------------------------------------------------------------------ runs
def seeds_of(out: Path) -> list[int]:
    """The seeds of the RoPE models: the extrapolation experiment's (its ``results.json``) when it
    lists them, topped up to :data:`MIN_SEEDS` with ``SEED, SEED + 1, ...``."""
    seeds: list[int] = []
    results = read_results(Path(out).parent / EXTRAPOLATION.name)
    listed = results.get("seeds", [results["seed"]] if isinstance(results.get("seed"), int) else [])
    for seed in listed if isinstance(listed, list) else []:
        if isinstance(seed, int) and not isinstance(seed, bool) and seed not in seeds:
            seeds.append(seed)
    candidate = SEED
    while len(seeds) < MIN_SEEDS:
        if candidate not in seeds:
            seeds.append(candidate)
        candidate += 1
    return seeds


def with_seed(cfg: Any, seed: int, name: str) -> Any:
    """``cfg`` with another seed and run name."""
    from poslab.training.config import TrainConfig

    return TrainConfig.from_dict({**cfg.to_dict(), "seed": seed, "name": name})


def _seeded_name(name: str, seed: int) -> str:
    return name if seed == SEED else f"{name}-seed{seed}"


def _run_folders(root: Path, depth: int = 3) -> list[Path]:
    """Run folders (holding ``config.json``) under ``root``, at most ``depth`` levels down."""
    if not root.is_dir():
        return []
    found, level = [], [root]
    for _ in range(depth):
        level = [p for d in level for p in sorted(d.iterdir()) if p.is_dir()]
        found += [p for p in level if (p / "config.json").is_file()]
    return found


def base_config(lab: Any, out: Path, seed: int) -> Any:
    return with_seed(train_config("rope", lab, models_dir(out, lab)), seed, _seeded_name("rope", seed))


def finetune_config(label: str, spec: str, lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The fine-tuning run of one variant: ``block_size = 4 L``, the scaling set, initialised from ``base_run``."""
    scaling = parse_rope_scaling(spec)
    position_config = {} if scaling["scaling"] is None else {**scaling, "original_max_len": lab.train_length}
    batch = max(1, lab.batch_size // FACTOR)  # the same tokens per step as the base run
    cfg = train_config(
        "rope",
        lab,
        models_dir(out, lab),
        name=f"rope-finetune-{spec.split(':')[0]}",
        block_size=FACTOR * lab.train_length,
        position_config=position_config,
        steps=lab.finetune_steps,
        batch_size=batch,
        lr=lab.lr / 3,
        warmup_steps=max(1, lab.finetune_steps // 10),
        init_from=str(base_run),
    )
    if label == AVERAGED:  # its last k checkpoints are averaged: keep them (saving costs no step)
        from poslab.training.config import TrainConfig

        cfg = TrainConfig.from_dict(
            {**cfg.to_dict(), "ckpt_interval": max(1, lab.finetune_steps // 10), "keep_checkpoints": average_last(lab)}
        )
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


def average_last(lab: Any) -> int:
    """How many checkpoints of the :data:`AVERAGED` fine-tune are averaged at this size (:data:`AVERAGE_LAST`)."""
    return AVERAGE_LAST.get(lab.name, 3)


def averaging_models(base: Any, run_dir: Path, last: int, base_weight: float = BASE_WEIGHT) -> dict[str, Any]:
    """The two averaged models of one seed: the mean of the fine-tune's last ``last`` checkpoints, and
    base ⊕ fine-tuned (``base_weight`` on the base model's weights, the rest on the final fine-tune's).

    Args:
        base: the base model (its weights only are read).
        run_dir: the fine-tune's run folder.
        last: checkpoints averaged.
        base_weight: the base model's weight in base ⊕ fine-tuned.

    Returns:
        ``{"last-k average": model, "base ⊕ fine-tuned": model, "steps": averaged steps}``; both models
        carry the fine-tune's position config (its scaling).
    """
    averaged, steps = RunFolder(run_dir).averaged_model(last)
    mixed, _, _ = load_model(run_dir)
    mixed.load_state_dict(average_state_dicts([base.state_dict(), mixed.state_dict()], [base_weight, 1 - base_weight]))
    return {"last-k average": averaged, "base ⊕ fine-tuned": mixed.eval(), "steps": steps}


def control_config(lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The control: the same number of extra steps at the original length ``L``, no scaling.

    It separates what more training alone buys (the base model is small and still learning) from
    what training at 4x L buys.
    """
    cfg = train_config(
        "rope",
        lab,
        models_dir(out, lab),
        name="rope-control-more-steps-at-L",
        steps=lab.finetune_steps,
        lr=lab.lr / 3,
        warmup_steps=max(1, lab.finetune_steps // 10),
        init_from=str(base_run),
    )
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


# ------------------------------------------------------------------------------------ claims
def context_claims(
    inference: dict[str, list[float]],
    finetuned: dict[str, list[float]],
    base_L: list[float],
    steps: int = 100,
    passkey: dict[str, Any] | None = None,
) -> list[verdicts.ClaimRecord]:
    """Claims as :class:`~poslab.lab.verdicts.ClaimRecord`, from per-seed values.

    Args:
        inference: scaling label -> per-seed perplexity at 4x L without fine-tuning.
        finetuned: fine-tuned label -> per-seed perplexity at 4x L.
        base_L: per-seed perplexity of the base models at L.
        steps: fine-tuning steps (for the wording).
        passkey: ``{"inference": {label: {factor: [per seed]}}, "finetuned": {...}, "base": {factor: [...]}}``
            (``None``: no passkey claims).
    """

    def cmp(
        claim: str,
        source: str,
        better: list[float],
        worse: list[float],
        b: str,
        w: str,
        metric: str,
        lower: bool = True,
    ) -> verdicts.ClaimRecord:
        return verdicts.compare(
            claim, source, better, worse, better_label=b, worse_label=w, metric=metric, lower_is_better=lower
        )

    def mean(values: list[float]) -> float:
        return statistics.fmean(values)

    ppl4 = f"perplexity at {FACTOR}x L (non-overlapping)"
    out = []
    for label in ("PI", "NTK", "dynamic NTK", "YaRN"):
        out.append(
            cmp(
                f"without fine-tuning, {label} reads 4x L better than no scaling",
                SOURCE_SCALINGS,
                inference[label],
                inference["none"],
                label,
                "no scaling",
                ppl4,
            )
        )
    for label in ("NTK", "YaRN"):
        out.append(
            cmp(
                f'without fine-tuning, {label} reads 4x L better than PI ("YaRN or NTK-aware first, much better than '
                'PI")',
                "seed 000 §3.5",
                inference[label],
                inference["PI"],
                label,
                "PI",
                ppl4,
            )
        )
    rival = min((k for k in inference if k not in ("none", "YaRN")), key=lambda k: mean(inference[k]))
    out.append(
        cmp(
            "YaRN is the best inference-time scaling",
            "seed 000 Q4 (YaRN ★★★)",
            inference["YaRN"],
            inference[rival],
            "YaRN",
            f"the best other scaling ({rival})",
            ppl4,
        )
    )
    for label in ("PI", "YaRN"):
        ratios = [f / b for f, b in zip(finetuned[label], base_L)]
        out.append(
            cmp(
                f"after {steps} fine-tuning steps at 4x L, {label} is close to the base model's in-length perplexity",
                SOURCE_SCALINGS,
                ratios,
                [1.15] * len(ratios),
                f"ppl_{label}_ft(4L) / ppl_base(L)",
                "the 1.15 bound",
                "perplexity ratio",
            )
        )
    out.append(
        cmp(
            "after fine-tuning, YaRN <= PI",
            "Peng et al. 2023 (YaRN)",
            finetuned["YaRN"],
            finetuned["PI"],
            "YaRN fine-tuned",
            "PI fine-tuned",
            ppl4,
        )
    )
    weaker = max(("PI", "YaRN"), key=lambda k: mean(finetuned[k]))
    out.append(
        cmp(
            "plain fine-tuning (no scaling) is the worst of the three",
            "Chen et al. 2023 (PI)",
            finetuned[weaker],
            finetuned["none"],
            f"{weaker} fine-tuned (the weaker scaling)",
            "plain RoPE fine-tuned",
            ppl4,
        )
    )
    best_ft = min(finetuned, key=lambda k: mean(finetuned[k]))
    best_inf = min(inference, key=lambda k: mean(inference[k]))
    out.append(
        cmp(
            "continued training is the most reliable (beats every inference-only scaling)",
            "seed 000 Q4 (★★★ slow but most reliable)",
            finetuned[best_ft],
            inference[best_inf],
            f"best fine-tuned ({best_ft})",
            f"best inference-only ({best_inf})",
            ppl4,
        )
    )
    if passkey is not None:
        out += passkey_claims(passkey)
    return out


def averaging_claims(
    ppl_L: dict[str, list[float]], ppl_4L: dict[str, list[float]], passkey_4L: dict[str, list[float | None]], last: int
) -> list[verdicts.ClaimRecord]:
    """Claims of the checkpoint-averaging comparison, paired by seed (each seed's four models share its base run).

    The criteria and tolerances (:data:`PPL_TOLERANCE`, :data:`PASSKEY_TOLERANCE`) were fixed before any run.

    Args:
        ppl_L: variant (:data:`AVERAGING`) -> per-seed perplexity at L (forgetting).
        ppl_4L: variant -> per-seed perplexity at 4x L.
        passkey_4L: variant -> per-seed passkey accuracy at 4x L (``None``: the needle does not fit).
        last: checkpoints averaged (for the wording).
    """
    avg, mix, ft, base = "last-k average", "base ⊕ fine-tuned", "fine-tuned", "base"
    at_L, at_4L = "perplexity at L (non-overlapping)", f"perplexity at {FACTOR}x L (non-overlapping)"
    claims = [
        verdicts.paired(
            f"the plain {AVERAGED} fine-tune forgets (higher perplexity at L than the base model; the premise "
            "of the forgetting claims below)",
            SOURCE_AVERAGING,
            ppl_L[ft],
            ppl_L[base],
            better_label="plain fine-tune",
            worse_label="base",
            metric=at_L,
            lower_is_better=False,
        ),
        verdicts.paired(
            f"averaging the last {last} checkpoints of the {AVERAGED} fine-tune reduces forgetting "
            "(lower perplexity at L than the plain fine-tune)",
            SOURCE_AVERAGING,
            ppl_L[avg],
            ppl_L[ft],
            better_label=f"mean of the last {last}",
            worse_label="plain fine-tune",
            metric=at_L,
        ),
        verdicts.bound(
            f"averaging the last {last} checkpoints does not hurt perplexity at {FACTOR}x L "
            f"(within {PPL_TOLERANCE - 1:.0%} of the plain fine-tune)",
            "seed 000 Q4 (the recipe keeps the extension)",
            [a / b for a, b in zip(ppl_4L[avg], ppl_4L[ft])],
            PPL_TOLERANCE,
            below=True,
            label=f"mean of the last {last} / plain fine-tune",
            metric=f"ratio of {at_4L}",
        ),
        verdicts.paired(
            f"base ⊕ fine-tuned ({BASE_WEIGHT:g}/{1 - BASE_WEIGHT:g}) reduces forgetting (lower perplexity "
            "at L than the plain fine-tune)",
            f"{SOURCE_AVERAGING}; {SOURCE_WISE}",
            ppl_L[mix],
            ppl_L[ft],
            better_label="base ⊕ fine-tuned",
            worse_label="plain fine-tune",
            metric=at_L,
        ),
        verdicts.paired(
            f"base ⊕ fine-tuned keeps the extension (lower perplexity at {FACTOR}x L than the base model "
            f"with {AVERAGED} at inference)",
            SOURCE_WISE,
            ppl_4L[mix],
            ppl_4L[base],
            better_label="base ⊕ fine-tuned",
            worse_label=f"base with {AVERAGED}",
            metric=at_4L,
        ),
    ]
    claim = (
        f"averaging the last {last} checkpoints keeps passkey retrieval at {FACTOR}x L "
        f"(at most {PASSKEY_TOLERANCE:g} below the plain fine-tune)"
    )
    metric = f"passkey accuracy at {FACTOR}x L"
    if None in passkey_4L[avg] or None in passkey_4L[ft]:
        claims.append(
            verdicts.ClaimRecord(
                claim,
                SOURCE_AVERAGING,
                f"{metric} of the mean at most {PASSKEY_TOLERANCE:g} below",
                f"{FACTOR}x L is too short for the needle",
                None,
                None,
                0,
                verdicts.INCONCLUSIVE,
            )
        )
        return claims
    record = verdicts.paired(
        claim,
        SOURCE_AVERAGING,
        passkey_4L[avg],
        passkey_4L[ft],
        better_label=f"mean of the last {last}",
        worse_label="plain fine-tune",
        metric=metric,
        lower_is_better=False,
        offset=-PASSKEY_TOLERANCE,
    )
    chance = [1.0 / len(KEY_ALPHABET)] * len(passkey_4L[ft])
    gate = verdicts.compare(
        "the plain fine-tune retrieves",
        SOURCE_PASSKEY,
        passkey_4L[ft],
        chance,
        better_label="fine-tuned",
        worse_label="chance",
        metric=metric,
        lower_is_better=False,
    )
    if gate.verdict != verdicts.HELD and record.verdict != verdicts.INCONCLUSIVE:
        record = dataclasses.replace(
            record,
            verdict=verdicts.INCONCLUSIVE,
            measured=record.measured
            + f" (the plain fine-tune does not retrieve above chance at {FACTOR}x L: not judged)",
        )
    claims.append(record)
    return claims


def weight_distance(model: Any, reference: Any) -> float:
    """``||w - w_ref|| / ||w_ref||`` over every floating tensor of two models' state dicts (same keys)."""
    a, b = model.state_dict(), reference.state_dict()
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b if b[k].is_floating_point())
    den = sum(float(b[k].double().pow(2).sum()) for k in b if b[k].is_floating_point())
    return (num / den) ** 0.5 if den else 0.0


def passkey_claims(passkey: dict[str, Any]) -> list[verdicts.ClaimRecord]:
    """Passkey claims; inconclusive (with why) unless the base models retrieve above chance at the
    shortest length the needle fits in, and wherever a length is too short for the needle."""
    acc = f"passkey accuracy at {FACTOR}x L"
    first = next((f for f in PASSKEY_FACTORS if None not in passkey["base"][str(f)]), None)
    if first is None:
        gate = verdicts.ClaimRecord(
            "the base RoPE models retrieve the passkey in length",
            SOURCE_PASSKEY,
            "passkey accuracy above chance",
            "no length fits the needle",
            None,
            None,
            0,
            verdicts.INCONCLUSIVE,
        )
    else:
        chance = [1.0 / len(KEY_ALPHABET)] * len(passkey["base"][str(first)])
        gate = verdicts.compare(
            f"the base RoPE models retrieve the passkey at {first}x L",
            SOURCE_PASSKEY,
            passkey["base"][str(first)],
            chance,
            better_label=f"base at {first}x L",
            worse_label=f"chance ({chance[0]:.3f})",
            metric=f"passkey accuracy at {first}x L",
            lower_is_better=False,
        )
    claims = [gate]
    wanted = []
    for label in ("PI", "YaRN"):
        wanted.append(
            (
                f"fine-tuning at 4x L makes {label} retrieve the passkey at 4x L better than {label} without it",
                passkey["finetuned"][label][str(FACTOR)],
                passkey["inference"][label][str(FACTOR)],
                f"{label} fine-tuned",
                f"{label} inference-only",
            )
        )
    wanted.append(
        (
            "without fine-tuning, PI retrieves the passkey at 4x L better than no scaling",
            passkey["inference"]["PI"][str(FACTOR)],
            passkey["inference"]["none"][str(FACTOR)],
            "PI",
            "no scaling",
        )
    )
    for claim, better, worse, b, w in wanted:
        if None in better or None in worse:
            claims.append(
                verdicts.ClaimRecord(
                    claim,
                    SOURCE_PASSKEY,
                    f"{acc} of {b} higher than {w}",
                    f"{FACTOR}x L is too short for the needle",
                    None,
                    None,
                    0,
                    verdicts.INCONCLUSIVE,
                )
            )
            continue
        record = verdicts.compare(
            claim, SOURCE_PASSKEY, better, worse, better_label=b, worse_label=w, metric=acc, lower_is_better=False
        )
        if gate.verdict != verdicts.HELD and record.verdict != verdicts.INCONCLUSIVE:
            record = dataclasses.replace(
                record,
                verdict=verdicts.INCONCLUSIVE,
                measured=record.measured + " (the base models do not retrieve in length: not judged)",
            )
        claims.append(record)
    return claims


# ------------------------------------------------------------------------------------ tables
def _mean_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell of mean perplexities over seeds (the shape of one seed's cell), with the per-seed values."""
    out: dict[str, Any] = {"length": cells[0]["length"]}
    for mode in ("nonoverlapping", "sliding"):
        if all(c.get(mode) for c in cells):
            values = [c[mode]["ppl"] for c in cells]
            out[mode] = {
                "ppl": statistics.fmean(values),
                "ppl_sd": statistics.stdev(values) if len(values) > 1 else None,
                "ppl_per_seed": values,
            }
    return out


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


# ------------------------------------------------------------------------------------ run
def base_reuse(lab: Any, out: Path) -> tuple[Path, ...]:
    """Where the lab's RoPE base models may already be: the extrapolation experiment's models, and the
    runs of position-training's quick form (which extrapolation itself reuses, so its own models folder
    may hold none)."""
    return tuple(
        _run_folders(out.parent / EXTRAPOLATION.name / "models" / lab.name)
        + _run_folders(out.parent / POSITION_TRAINING / "runs", depth=1)
    )


def train_models(lab: Any, out: Path, seeds: list[int], workers: int) -> tuple[list[Path], list[Path]]:
    """Train (or reuse) the RoPE base model of each seed, then every fine-tune and control of each base.

    Returns:
        ``(base_runs, tuned_runs)``: one base run per seed; the fine-tunes seed by seed in the order of
        :data:`FINETUNE`, then one control run per seed.
    """
    reuse = base_reuse(lab, out)
    base_runs = ensure_many([(base_config(lab, out, s), reuse) for s in seeds], workers)
    tuned = [
        finetune_config(label, spec, lab, base_runs[i], out, seed)
        for i, seed in enumerate(seeds)
        for label, spec in FINETUNE.items()
    ]
    tuned += [control_config(lab, base_runs[i], out, seed) for i, seed in enumerate(seeds)]
    return base_runs, ensure_many([(cfg, ()) for cfg in tuned], workers)


def measure_seed(lab: Any, seed: int, base_run: Path, tuned_runs: dict[str, Path], last: int) -> dict[str, Any]:
    """Every measurement of one seed: the base at L, each inference-time scaling and fine-tune at 4 L
    and back at L, passkey retrieval of each, and the checkpoint-averaging variants.

    Args:
        lab: the size.
        seed: the seed (recorded).
        base_run: the seed's RoPE run.
        tuned_runs: fine-tune label (and ``"control"``) -> its run.
        last: checkpoints averaged (:func:`average_last`).
    """
    long_length = FACTOR * lab.train_length
    model, tokenizer, _ = load_model(base_run)
    tokens = RunFolder(base_run).split_tokens("val", tokenizer)
    entry: dict[str, Any] = {
        "seed": seed,
        "base_run": str(base_run),
        "base": {"L": _cell(model, tokens, lab.train_length, lab.n_targets)},
        "inference": {},
        "finetuned": {},
        "passkey": {"inference": {}, "finetuned": {}},
    }
    entry["passkey"]["base"] = passkey_row(model, tokens, tokenizer, lab.train_length)
    entry["loss_by_position"] = [float(v) for v in loss_by_position(model, tokens, lab.train_length, CONTEXT_WINDOWS)]
    for label, spec in INFERENCE.items():  # scale_rope changes the model: every measurement at L comes first
        scale_rope(model, spec, lab.train_length)
        entry["inference"][label] = {**_cell(model, tokens, long_length, lab.n_targets), "rope_scaling": spec}
        entry["passkey"]["inference"][label] = passkey_row(model, tokens, tokenizer, lab.train_length)
    for label, spec in [*FINETUNE.items(), ("control", "none")]:
        tuned, _, _ = load_model(tuned_runs[label])
        entry["finetuned"][label] = {
            "rope_scaling": spec,
            "run": str(tuned_runs[label]),
            "4L": _cell(tuned, tokens, long_length, lab.n_targets),
            "L": _cell(tuned, tokens, lab.train_length, lab.n_targets),
        }
        entry["passkey"]["finetuned"][label] = passkey_row(tuned, tokens, tokenizer, lab.train_length)
        if label == AVERAGED:
            final = tuned
    made = averaging_models(model, tuned_runs[AVERAGED], last)
    entry["averaging"] = {
        "steps": made["steps"],
        "base": {
            "L": entry["base"]["L"],
            "4L": entry["inference"][AVERAGED],
            "passkey": entry["passkey"]["inference"][AVERAGED],
        },
        "fine-tuned": {
            "L": entry["finetuned"][AVERAGED]["L"],
            "4L": entry["finetuned"][AVERAGED]["4L"],
            "passkey": entry["passkey"]["finetuned"][AVERAGED],
        },
        "weight_distance_to_fine_tuned": {"base": weight_distance(model, final)},
    }
    for label in ("last-k average", "base ⊕ fine-tuned"):
        averaged = made[label]
        entry["averaging"][label] = {
            "L": _cell(averaged, tokens, lab.train_length, lab.n_targets),
            "4L": _cell(averaged, tokens, long_length, lab.n_targets),
            "passkey": passkey_row(averaged, tokens, tokenizer, lab.train_length),
        }
        entry["averaging"]["weight_distance_to_fine_tuned"][label] = weight_distance(averaged, final)
    return entry


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-seed measurements as means over seeds: ``base``, ``inference``, ``finetuned``, ``control``,
    ``passkey``."""

    def mean_of(get: Any) -> dict[str, Any]:
        return _mean_cell([get(e) for e in per_seed])

    return {
        "base": {"L": mean_of(lambda e: e["base"]["L"])},
        "inference": {
            label: {**mean_of(lambda e, k=label: e["inference"][k]), "rope_scaling": spec}
            for label, spec in INFERENCE.items()
        },
        "finetuned": {
            label: {
                "rope_scaling": spec,
                "4L": mean_of(lambda e, k=label: e["finetuned"][k]["4L"]),
                "L": mean_of(lambda e, k=label: e["finetuned"][k]["L"]),
            }
            for label, spec in FINETUNE.items()
        },
        "control": {
            "4L": mean_of(lambda e: e["finetuned"]["control"]["4L"]),
            "L": mean_of(lambda e: e["finetuned"]["control"]["L"]),
        },
        "passkey": {
            "base": {str(f): [e["passkey"]["base"][str(f)] for e in per_seed] for f in PASSKEY_FACTORS},
            "inference": {
                k: {str(f): [e["passkey"]["inference"][k][str(f)] for e in per_seed] for f in PASSKEY_FACTORS}
                for k in INFERENCE
            },
            "finetuned": {
                k: {str(f): [e["passkey"]["finetuned"][k][str(f)] for e in per_seed] for f in PASSKEY_FACTORS}
                for k in [*FINETUNE, "control"]
            },
        },
    }


def report(per_seed: list[dict[str, Any]], means: dict[str, Any], lab: Any, last: int) -> None:
    """Print the tables: inference-time scalings, fine-tunes, passkey retrieval, checkpoint averaging."""
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


def all_claims(
    per_seed: list[dict[str, Any]], means: dict[str, Any], lab: Any, last: int
) -> list[verdicts.ClaimRecord]:
    """The context-extension, passkey and checkpoint-averaging claims from the per-seed measurements."""

    def ppls(get: Any) -> list[float]:
        return [get(e) for e in per_seed]

    passkey = means["passkey"]
    claims = context_claims(
        {k: ppls(lambda e, k=k: _ppl(e["inference"][k])) for k in INFERENCE},
        {k: ppls(lambda e, k=k: _ppl(e["finetuned"][k]["4L"])) for k in FINETUNE},
        ppls(lambda e: _ppl(e["base"]["L"])),
        lab.finetune_steps,
        passkey={**passkey, "finetuned": {k: v for k, v in passkey["finetuned"].items() if k != "control"}},
    )
    claims += averaging_claims(
        {k: ppls(lambda e, k=k: _ppl(e["averaging"][k]["L"])) for k in AVERAGING},
        {k: ppls(lambda e, k=k: _ppl(e["averaging"][k]["4L"])) for k in AVERAGING},
        {k: [e["averaging"][k]["passkey"][str(FACTOR)] for e in per_seed] for k in AVERAGING},
        last,
    )
    return claims


def premise_of(record: verdicts.ClaimRecord, per_seed: list[dict[str, Any]], bigram: float) -> verdicts.Premise:
    """Every claim here is about reading past ``L``: the base RoPE models must be language models that use
    their context within ``L`` (every seed clearly below the bigram baseline at L; later positions of the
    window clearly better than positions 1-4). A passkey claim also needs the base models to retrieve the
    key at the shortest length it fits in (:func:`poslab.lab.premises.retrieves`)."""
    language = all_of(
        below_bigram({"base RoPE": [math.log(_ppl(e["base"]["L"])) for e in per_seed]}, bigram),
        uses_context({"base RoPE": [e["loss_by_position"] for e in per_seed]}),
    )
    if "passkey" not in record.details.get("metric", ""):
        return language
    first = next((f for f in PASSKEY_FACTORS if all(e["passkey"]["base"][str(f)] is not None for e in per_seed)), None)
    if first is None:
        return all_of(language, verdicts.Premise("the passkey fits in some tested length", "it fits in none", False))
    found = retrieves(
        {f"base at {first}x L": [e["passkey"]["base"][str(first)] for e in per_seed]}, 1 / len(KEY_ALPHABET)
    )
    return all_of(language, found)


def averaging_summary(per_seed: list[dict[str, Any]], lab: Any, last: int, figure: Path) -> dict[str, Any]:
    """The checkpoint-averaging block of results.json."""
    return {
        "fine_tune": AVERAGED,
        "rope_scaling": FINETUNE[AVERAGED],
        "last": last,
        "base_weight": BASE_WEIGHT,
        "ckpt_interval": max(1, lab.finetune_steps // 10),
        "steps": [e["averaging"]["steps"] for e in per_seed],
        "variants": {
            name: {
                "what": what,
                "L": _mean_cell([e["averaging"][name]["L"] for e in per_seed]),
                "4L": _mean_cell([e["averaging"][name]["4L"] for e in per_seed]),
                "passkey": {
                    str(f): [e["averaging"][name]["passkey"][str(f)] for e in per_seed] for f in PASSKEY_FACTORS
                },
                "weight_distance_to_fine_tuned": [
                    e["averaging"]["weight_distance_to_fine_tuned"].get(name, 0.0) for e in per_seed
                ],
            }
            for name, what in AVERAGING.items()
        },
        "tolerances": {"ppl_ratio": PPL_TOLERANCE, "passkey": PASSKEY_TOLERANCE},
        "note": LLAMA3_NOTE,
        "figure": str(figure),
    }


def run(
    out: Path,
    quick: bool = False,
    size: str | None = None,
    workers: int | None = None,
    seeds: tuple[int, ...] | None = None,
) -> dict:
    """Inference-time scalings and fine-tunes of the lab's RoPE models (one per seed); tables, plot, claims.

    Args:
        out: output folder.
        quick: the lab's quick size (else full).
        size: a size name overriding ``quick`` (``smoke`` for tests).
        workers: trainings at a time (default: one per core, at most two).
        seeds: the RoPE models' seeds (default :func:`seeds_of`: the extrapolation experiment's, at
            least :data:`MIN_SEEDS`); with fewer than :data:`MIN_SEEDS` every claim is inconclusive.
    """
    lab = size_of(quick, size)
    out = Path(out)
    start = time.perf_counter()
    workers = default_workers() if workers is None else check_workers(workers)
    seeds = list(seeds) if seeds is not None else seeds_of(out)
    last = average_last(lab)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    base_runs, tuned_runs = train_models(lab, out, seeds, workers)
    labels = [*FINETUNE, "control"]
    per_seed = [
        measure_seed(
            lab,
            seed,
            base_runs[i],
            {
                label: tuned_runs[i * len(FINETUNE) + j]
                if label != "control"
                else tuned_runs[len(seeds) * len(FINETUNE) + i]
                for j, label in enumerate(labels)
            },
            last,
        )
        for i, seed in enumerate(seeds)
    ]
    means = aggregate(per_seed)
    report(per_seed, means, lab, last)
    ngrams = ngram_baselines(CORPUS)
    bigram = ngrams["bigram"]
    print(baseline_line(CORPUS))
    claims = attach(all_claims(per_seed, means, lab, last), lambda record: premise_of(record, per_seed, bigram))
    figure = plot(
        means["inference"],
        means["finetuned"],
        _ppl(means["base"]["L"]),
        lab,
        out / "context_extension.png",
        means["passkey"],
        ngrams,
    )
    averaging_figure = plot_averaging(per_seed, lab, last, out / "checkpoint_averaging.png")
    return {
        "experiment": EXPERIMENT.name,
        "size": dataclasses.asdict(lab),
        "train_length": lab.train_length,
        "eval_length": FACTOR * lab.train_length,
        "factor": FACTOR,
        "n_targets": lab.n_targets,
        "seeds": seeds,
        "base_run": str(base_runs[0]),
        "base_runs": [str(p) for p in base_runs],
        "base": means["base"],
        "inference": means["inference"],
        "finetune_runs": {label: [e["finetuned"][label]["run"] for e in per_seed] for label in labels},
        "finetuned": means["finetuned"],
        "control_more_steps_at_L": means["control"],
        "passkey": {
            **means["passkey"],
            "factors": list(PASSKEY_FACTORS),
            "prompts": PASSKEY_PROMPTS,
            "key_letters": KEY_LETTERS,
            "chance": 1 / len(KEY_ALPHABET),
        },
        "averaging": averaging_summary(per_seed, lab, last, averaging_figure),
        "per_seed": per_seed,
        "claims": claims,
        "ngram_baselines": ngrams,
        "figure": str(figure),
        "figures": [str(figure), str(averaging_figure)],
        "seconds": time.perf_counter() - start,
        "workers": workers,
    }


EXPERIMENT = Experiment(
    name="context-extension",
    description="RoPE at 4x L with PI / NTK / dynamic / YaRN / Llama3, fine-tuning at 4x L, checkpoint averaging; "
    "perplexity + passkey, 3 seeds (seed 000 §3.5, Q4)",
    tier=LAB,
    run=run,
    reuses=("extrapolation", "position-training"),
    estimate=(65, 600),
    tables=context_extension_tables.TABLES,
)
