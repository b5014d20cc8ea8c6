"""Length extrapolation: train at ``L``, read at ``1x .. 16x L``, one small GPT per position scheme.

Claims tested (never forced; each verdict is computed from the measured perplexities):

* Press et al. 2022, "Train Short, Test Long" (ALiBi, https://arxiv.org/abs/2108.12409): ALiBi's
  perplexity stays flat past the training length, sinusoidal and rotary models degrade; at 8x L
  ALiBi < RoPE < sinusoidal (their WikiText-103 table: at 512 / 2512 tokens after training at 512,
  sinusoidal 20.05 / 132.41, rotary 20.07 / 31.58, ALiBi 19.73 / 18.41).
* Seed 000 §2.2 and Q4: learned absolute tables "collapse past the training length"; RoPE
  extrapolates "well", better than the relative-bias schemes (T5, ALiBi, rated "medium"); in practice
  RoPE's perplexity "jumps from 10 to 100+".
* Seed 002 §4.1: Transformer-XL's relative encoding "solves long-sequence generalization".

Every scheme trains with the same data (tinyshakespeare, char-level), steps, batch and seed
(:func:`poslab.session.train`), then :func:`poslab.analysis.eval.evaluate_length` scores the same validation
targets at every length, both in non-overlapping chunks (the ALiBi paper's protocol, which carries
the "early-token curse") and with a sliding window of stride ``length/2``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import evaluate_length
from poslab.display import new_figure, print_table, save_figure
from poslab.runs import RunFolder

NAME = "extrapolation"
DESCRIPTION = "train one GPT per position scheme at L, perplexity at 1x..16x L (ALiBi paper; seeds 000, 002)"
IN_ALL = False  # trains ten models

def lab_schemes() -> tuple[str, ...]:
    """The schemes the extrapolation (and attention-entropy) lab trains: every registered scheme a GPT can be
    built with from its default config (``positions.names()`` order), so a newly registered scheme reaches
    these labs without an edit here. The filter is a property of the scheme, never its name: a scheme whose
    default config does not build for the lab's geometry (it needs a hand-chosen value) is left out.
    """
    from poslab.nn import positions

    context = {"n_embd": 64, "n_heads": 4, "head_dim": 16, "max_len": 64, "original_max_len": 64, "bidirectional": False}
    out = []
    for name in positions.names():
        try:
            with torch.device("meta"):
                positions.build_for_model(name, {}, context)
        except (ValueError, TypeError):
            continue
        out.append(name)
    return tuple(out)


SCHEMES = lab_schemes()
FACTORS = (1, 2, 4, 8, 16)
CORPUS = "shakespeare"
SEED = 1337


@dataclass(frozen=True)
class Size:
    """One scale of the lab (``smoke`` for tests, ``quick`` for the demo, ``full``).

    Attributes:
        name: label (also the models' subfolder).
        train_length: ``L``, the training block size.
        n_layer, n_head, n_embd: model geometry.
        steps, batch_size, lr, warmup_steps: training.
        eval_windows: the evaluation scores ``eval_windows * 16 * L`` validation targets at every length.
        finetune_steps: context-extension fine-tuning steps at ``4 L``.
        entropy_batch: sequences per length in the attention-entropy measurement.
    """

    name: str
    train_length: int
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    eval_windows: int
    finetune_steps: int
    entropy_batch: int

    @property
    def n_targets(self) -> int:
        return self.eval_windows * max(FACTORS) * self.train_length


SIZES = {
    "smoke": Size("smoke", 16, 1, 2, 16, 8, 4, 3e-3, 2, 2, 4, 1),
    "quick": Size("quick", 64, 2, 4, 64, 250, 16, 3e-3, 25, 4, 100, 2),
    "full": Size("full", 128, 3, 4, 96, 400, 16, 2e-3, 40, 4, 100, 2),
}


def size_of(quick: bool, size: str | None = None) -> Size:
    """The :class:`Size` named ``size``, else ``quick`` or ``full``."""
    name = size or ("quick" if quick else "full")
    if name not in SIZES:
        raise ValueError(f"unknown size {name!r}; choose one of {', '.join(SIZES)}")
    return SIZES[name]


# ------------------------------------------------------------------------------------ training
def train_config(scheme: str, size: Size, models_dir: Path, *, name: str | None = None, block_size: int | None = None,
                 position_config: dict | None = None, steps: int | None = None, batch_size: int | None = None,
                 lr: float | None = None, warmup_steps: int | None = None, init_from: str | None = None) -> Any:
    """The :class:`poslab.training.config.TrainConfig` of one lab model (same data, seed and recipe for every scheme).

    The recipe is nanoGPT's (AdamW, warmup + cosine, no dropout, no biases) plus a LayerNorm on the
    token embeddings (``embed_norm``, as in Bloom) for every scheme: with nanoGPT's 0.02-std token
    embeddings, the unit-amplitude sinusoidal code swamps the content and the sinusoidal model does not
    train at this scale (quick size, measured: validation loss 3.34 against 2.45 for a learned table;
    2.50 with the norm). The norm costs the other schemes about 0.1 nats at the quick size.
    """
    from poslab.training.config import TrainConfig

    steps = steps or size.steps
    lr = lr or size.lr
    values: dict[str, Any] = {
        "name": name or scheme,
        "out_dir": str(models_dir),
        "corpus": CORPUS,
        "tokenizer": "char",
        "model": {"n_layer": size.n_layer, "n_head": size.n_head, "n_embd": size.n_embd,
                  "block_size": block_size or size.train_length, "dropout": 0.0, "bias": False,
                  "embed_norm": True, "position": scheme, "position_config": dict(position_config or {})},
        "max_steps": steps,
        "batch_size": batch_size or size.batch_size,
        "lr": lr,
        "min_lr": lr / 10,
        "warmup_steps": size.warmup_steps if warmup_steps is None else warmup_steps,
        "beta2": 0.99,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "eval_interval": steps,
        "eval_iters": 4,
        "log_interval": max(1, steps // 10),
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "seed": SEED,
    }
    if init_from is not None:
        values["init_from"] = init_from
    return TrainConfig.from_dict(values)


def _same_run(run_dir: Path, cfg: Any) -> bool:
    """A completed run in ``run_dir`` trained with exactly ``cfg`` (up to its name and folder)."""
    from poslab.runs import RunFileError, RunFolder

    run = RunFolder(run_dir)
    try:
        if run.state != "finished":
            return False
        saved = run.config()
    except (OSError, RunFileError):
        return False
    wanted = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "out_dir", "model")}
    have = {k: v for k, v in saved["train"].items() if k not in ("name", "out_dir")}
    model = {k: v for k, v in saved["model"].items() if k != "vocab_size"}
    return have == wanted and model == cfg.to_dict()["model"]


def ensure_trained(cfg: Any, reuse: tuple[Path, ...] = ()) -> Path:
    """Train ``cfg`` unless a completed identical run exists in its folder or one of ``reuse``.

    Returns:
        The run folder holding the trained model.
    """
    from poslab.session import train

    run_dir = Path(cfg.out_dir) / cfg.name
    for candidate in (run_dir, *reuse):
        if _same_run(candidate, cfg):
            return candidate
    exists = run_dir.exists() and any(run_dir.iterdir())
    train(cfg, overwrite=exists, progress=False)
    return run_dir


def models_dir(out: Path, size: Size) -> Path:
    """Where an experiment keeps its trained models: ``OUT/models/SIZE``."""
    return Path(out) / "models" / size.name


def shared_model(scheme: str, size: Size, out: Path) -> Path:
    """The lab model of ``scheme`` for ``size``: trained into ``OUT/models/SIZE/SCHEME``, or reused from
    the extrapolation experiment's folder next to ``OUT`` when that one is complete and identical."""
    cfg = train_config(scheme, size, models_dir(out, size))
    sibling = Path(out).parent / NAME / "models" / size.name / scheme
    return ensure_trained(cfg, reuse=(sibling,))


def load_model(run_dir: Path) -> tuple[Any, Any, dict]:
    """:meth:`poslab.runs.RunFolder.load` (model in eval mode)."""
    from poslab.runs import RunFolder

    model, tokenizer, config = RunFolder(run_dir).load()
    return model.eval(), tokenizer, config


# ------------------------------------------------------------------------------------ claims
def claim(claim_text: str, source: str, criterion: str, measured: dict[str, Any], held: bool | None,
          note: str | None = None) -> dict[str, Any]:
    """One tested claim: the measured figures and a verdict computed from them (``held=None``: not measurable)."""
    verdict = "not measurable" if held is None else ("held" if held else "did not hold at this scale")
    out = {"claim": claim_text, "source": source, "criterion": criterion, "measured": measured,
           "held": held, "verdict": verdict}
    if note:
        out["note"] = note
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _ppl(table: dict, scheme: str, factor: int, mode: str) -> float | None:
    cell = table.get(scheme, {}).get(str(factor))
    if cell is None or "cannot" in cell or mode not in cell:
        return None
    return cell[mode]["ppl"]


#: a model whose in-length perplexity exceeds this multiple of the median over schemes "did not train"
UNDERTRAINED = 1.5


def undertrained(table: dict[str, dict[str, Any]], mode: str = "nonoverlapping") -> dict[str, dict[str, float]]:
    """Schemes whose perplexity at L is above :data:`UNDERTRAINED` x the median over all schemes.

    Their flat or steep curves past L reflect a model that never learned, not extrapolation, so the
    claims about them are reported as not measurable (with the numbers).
    """
    at_l = {s: _ppl(table, s, 1, mode) for s in table}
    values = sorted(v for v in at_l.values() if v is not None)
    if len(values) < 3:
        return {}
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
    return {s: {"ppl_L": v, "median_L": median} for s, v in at_l.items() if v is not None and v > UNDERTRAINED * median}


def extrapolation_claims(table: dict[str, dict[str, Any]], mode: str = "nonoverlapping") -> list[dict[str, Any]]:
    """The claims this experiment tests, each with its figures and verdict (see the module docstring)."""
    def p(scheme: str, factor: int) -> float | None:
        return _ppl(table, scheme, factor, mode)

    def r(scheme: str, factor: int) -> float | None:
        return ratio(p(scheme, factor), p(scheme, 1))

    failed = undertrained(table, mode)

    def judged(schemes: tuple[str, ...], held: bool | None) -> tuple[bool | None, str | None]:
        """``held``, unless one of ``schemes`` did not learn in-length (then not measurable, with why)."""
        bad = [s for s in schemes if s in failed]
        if not bad:
            return held, None
        return None, "; ".join(f"{s} did not train (ppl at L {failed[s]['ppl_L']:.3g} > {UNDERTRAINED}x the median "
                               f"{failed[s]['median_L']:.3g}): its curve says nothing about extrapolation" for s in bad)

    out = []
    alibi_r4 = r("alibi", 4)
    out.append(claim("ALiBi's perplexity at 4x L stays within 1.10x its value at L", "Press et al. 2022 (ALiBi)",
                     "ppl(4L) / ppl(L) <= 1.10",
                     {"ppl_L": p("alibi", 1), "ppl_4L": p("alibi", 4), "ratio": alibi_r4},
                     *judged(("alibi",), None if alibi_r4 is None else alibi_r4 <= 1.10)))
    for scheme, label in (("sinusoidal", "sinusoidal"), ("rope", "plain RoPE")):
        value = r(scheme, 4)
        out.append(claim(f"{label} degrades past L: perplexity at 4x L at least 1.5x its value at L",
                         "Press et al. 2022 (ALiBi)", "ppl(4L) / ppl(L) >= 1.5",
                         {"ppl_L": p(scheme, 1), "ppl_4L": p(scheme, 4), "ratio": value},
                         *judged((scheme,), None if value is None else value >= 1.5)))
    a8, r8, s8 = p("alibi", 8), p("rope", 8), p("sinusoidal", 8)
    out.append(claim("at 8x L: ALiBi < RoPE < sinusoidal", "Press et al. 2022 (ALiBi)", "ppl_alibi(8L) < ppl_rope(8L) < ppl_sinusoidal(8L)",
                     {"alibi": a8, "rope": r8, "sinusoidal": s8},
                     *judged(("alibi", "rope", "sinusoidal"), None if None in (a8, r8, s8) else a8 < r8 < s8)))
    learned_cells = table.get("learned", {})
    past = {f: learned_cells.get(str(f), {}) for f in FACTORS if f > 1}
    out.append(claim("a learned absolute table has nothing past the training length", "seed 000 §2.2",
                     "every evaluation past L is impossible (no table row), not silently clamped",
                     {f"{f}x": c.get("cannot", "evaluated") for f, c in past.items()},
                     None if not past else all("cannot" in c for c in past.values())))
    rope_r4, t5_r4 = r("rope", 4), r("t5", 4)
    out.append(claim("RoPE extrapolates better than the relative-bias schemes T5 and ALiBi", "seed 000 §2.2 (table: RoPE 'good', T5/ALiBi 'medium')",
                     "ppl(4L)/ppl(L) of RoPE < that of T5 and of ALiBi",
                     {"rope_ratio": rope_r4, "t5_ratio": t5_r4, "alibi_ratio": alibi_r4},
                     *judged(("rope", "t5", "alibi"), None if None in (rope_r4, t5_r4, alibi_r4) else rope_r4 < min(t5_r4, alibi_r4))))
    rope_r16 = r("rope", 16)
    out.append(claim("RoPE's perplexity 'jumps from 10 to 100+' past the training length", "seed 000 Q4",
                     "ppl(16L) / ppl(L) >= 10",
                     {"ppl_L": p("rope", 1), "ppl_16L": p("rope", 16), "ratio": rope_r16},
                     *judged(("rope",), None if rope_r16 is None else rope_r16 >= 10)))
    xl_r4 = r("xl", 4)
    out.append(claim("Transformer-XL's relative encoding solves long-sequence generalization", "seed 002 §4.1",
                     "ppl(4L) / ppl(L) <= 1.10 (the ALiBi criterion)",
                     {"ppl_L": p("xl", 1), "ppl_4L": p("xl", 4), "ratio": xl_r4},
                     *judged(("xl",), None if xl_r4 is None else xl_r4 <= 1.10)))
    for c in out:
        c["mode"] = mode
    return out


# ------------------------------------------------------------------------------------ run
def evaluate_scheme(run_dir: Path, size: Size) -> dict[str, Any]:
    """Every factor's cell (non-overlapping + sliding window with stride ``length/2``) of one trained model."""
    model, tokenizer, config = load_model(run_dir)
    tokens = RunFolder(run_dir).split_tokens("val", tokenizer)
    cells = {}
    for factor in FACTORS:
        length = factor * size.train_length
        cells[str(factor)] = evaluate_length(model, tokens, length, size.n_targets, stride=max(1, length // 2))
    return cells


def plot(table: dict[str, dict[str, Any]], size: Size, path: Path) -> Path:
    """Log-log perplexity vs evaluation length, one line per scheme (non-overlapping and sliding)."""
    from matplotlib import colormaps
    from matplotlib.ticker import ScalarFormatter

    colors = colormaps["tab10"]
    fig, axes = new_figure(1, 2, size=(13.0, 5.0))
    for ax, mode, title in ((axes[0], "nonoverlapping", "non-overlapping chunks"), (axes[1], "sliding", "sliding window (stride length/2)")):
        for i, scheme in enumerate(table):
            xs = [f * size.train_length for f in FACTORS if _ppl(table, scheme, f, mode) is not None]
            ys = [_ppl(table, scheme, f, mode) for f in FACTORS if _ppl(table, scheme, f, mode) is not None]
            ax.plot(xs, ys, marker="o", label=scheme if len(xs) > 1 else f"{scheme} (only L)", color=colors(i % 10))
        ax.axvline(size.train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{title}; trained at L={size.train_length}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    return save_figure(fig, path)


def run(out: Path, quick: bool = False, size: str | None = None, schemes: tuple[str, ...] = SCHEMES) -> dict:
    """Train (or reuse) one model per scheme, evaluate at 1x..16x L, print the table, plot, return the results."""
    lab = size_of(quick, size)
    out = Path(out)
    start = time.perf_counter()
    table: dict[str, dict[str, Any]] = {}
    training: dict[str, Any] = {}
    for scheme in schemes:
        t0 = time.perf_counter()
        run_dir = shared_model(scheme, lab, out)
        trained_s = time.perf_counter() - t0
        results = RunFolder(run_dir).results() or {}
        t1 = time.perf_counter()
        table[scheme] = evaluate_scheme(run_dir, lab)
        training[scheme] = {"run": str(run_dir), "final_val_loss": results.get("final_val_loss"),
                            "train_seconds": trained_s, "eval_seconds": time.perf_counter() - t1}
    headers = ["scheme"] + [f"{f}x ({f * lab.train_length})" for f in FACTORS]
    for mode, title in (("nonoverlapping", "non-overlapping chunks"), ("sliding", "sliding window, stride length/2")):
        rows = []
        for scheme, cells in table.items():
            row = [scheme]
            for f in FACTORS:
                cell = cells[str(f)]
                row.append(f"cannot ({cell['cannot']})" if "cannot" in cell else f"{cell[mode]['ppl']:.3f}")
            rows.append(row)
        print_table(headers, rows, title=f"validation perplexity, {title} (trained at L={lab.train_length}, "
                                         f"{lab.n_targets} targets at every length)")
    claims = extrapolation_claims(table, "nonoverlapping")
    sliding_claims = extrapolation_claims(table, "sliding")
    for c, s in zip(claims, sliding_claims):
        c["held_sliding_window"] = s["held"]
        c["measured_sliding_window"] = s["measured"]
    print_claims(claims)
    figure = plot(table, lab, out / "extrapolation.png")
    return {
        "experiment": NAME,
        "size": dataclasses.asdict(lab),
        "corpus": CORPUS,
        "seed": SEED,
        "train_length": lab.train_length,
        "factors": list(FACTORS),
        "lengths": [f * lab.train_length for f in FACTORS],
        "n_targets": lab.n_targets,
        "perplexity": table,
        "training": training,
        "claims": claims,
        "figure": str(figure),
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
    }


def print_claims(claims: list[dict[str, Any]]) -> None:
    """Print the verdicts as a table."""
    rows = []
    for c in claims:
        figures = ", ".join(f"{k}={_fmt(v)}" for k, v in c["measured"].items())
        if c.get("note"):
            figures += f" ({c['note']})"
        rows.append([c["verdict"], c["claim"], figures])
    print_table(["verdict", "claim", "measured"], rows, title="claims", align="lll")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}"
    return str(value)
