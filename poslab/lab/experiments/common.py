"""What every experiment shares: its description (:class:`Experiment`), the corpus baselines, seeded curves.

Not an experiment (the registry in ``__init__`` lists the experiment modules by name).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poslab.data import load_text, split_text
from poslab.lab.tables import KeyTable

#: tiers: part of ``poslab experiment all`` and the first step of every lab (computed, not trained)
FOUNDATION = "all"
#: a training experiment of both the quick and the full lab
LAB = "lab"
#: a training experiment of the full lab only (the quick lab, the demo, runs without it: docs/lab.md gives its time)
FULL_ONLY = "full"
TIERS = (FOUNDATION, LAB, FULL_ONLY)

#: seed 001's causal-leak pair: a line of the poem and its characters shuffled (the last one, 尽, in place),
#: read by the causal-leak and bidirectional experiments
LINE, SHUFFLED = "白日依山尽", "山依日白尽"


class Option(enum.Enum):
    """A command-line option that an experiment's ``run`` takes as the keyword of the same name."""

    #: ``--size``: the lab scale (a :class:`~poslab.lab.scale.Scale`)
    SIZE = "size"
    #: ``--seeds``: the seeds of every seeded arm
    SEEDS = "seeds"
    #: ``--workers``: trainings at a time
    WORKERS = "workers"
    #: ``--models``: the lab model store
    MODELS = "models"


@dataclass(frozen=True)
class Experiment:
    """One experiment, described once: what ``poslab experiment`` lists and ``poslab lab`` plans.

    Attributes:
        name: the CLI name (``poslab experiment NAME``) and the results folder ``experiments/NAME``.
        description: one line for ``poslab experiment list``.
        tier: :data:`FOUNDATION`, :data:`LAB` or :data:`FULL_ONLY`.
        run: ``run(out, quick=False, ...) -> dict`` (the dict becomes ``out/results.json``).
        after: the experiments that train lab models this one reads (from the store,
            :mod:`poslab.lab.experiments.lab_models`), for order only: the lab runs them first and reruns this one
            when they are rebuilt.
        estimate: first-run guesses of wall seconds ``(quick, full)`` on 2 quiet cores (then the last run's).
        tables: its key tables, built from its results.json for the console and the report.
        options: the options its ``run`` takes (:class:`Option`); the others are refused by name.
    """

    name: str
    description: str
    tier: str
    run: Callable[..., dict]
    after: tuple[str, ...] = ()
    estimate: tuple[float, float] = (4.0, 12.0)
    tables: tuple[KeyTable, ...] = ()
    options: frozenset[Option] = frozenset()

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"experiment {self.name!r}: tier must be one of {list(TIERS)}, got {self.tier!r}")
        wrong = [o for o in self.options if not isinstance(o, Option)]
        if wrong:
            raise ValueError(f"experiment {self.name!r}: options must be Option values, got {wrong[0]!r}")

    def takes(self, option: Option) -> bool:
        """Whether its ``run`` takes ``option`` as a keyword."""
        return option in self.options

    @property
    def in_all(self) -> bool:
        """Part of ``poslab experiment all``."""
        return self.tier == FOUNDATION


@functools.lru_cache(maxsize=8)
def unigram_entropy(corpus: str, val_fraction: float = 0.1) -> float:
    """Entropy (nats per character) of the character frequencies of ``corpus``'s training split: the loss of a model
    that learned nothing but how often each character occurs."""
    train, _ = split_text(load_text(corpus), val_fraction)
    counts = Counter(train)
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


#: the n-gram baselines' orders, by name
NGRAM_ORDERS = {"unigram": 1, "bigram": 2, "trigram": 3}
#: the absolute discount of a level whose counts hold no count of one, where ``n1 / (n1 + 2 n2)`` is undefined or 0
#: (a text too regular to estimate it from)
FALLBACK_DISCOUNT = 0.5


def _ngram_keys(ids: Any, n: int, start: int, vocab: int) -> Any:
    """The n-gram ending at each position of ``ids`` from ``start`` on, as one int64 in base ``vocab``
    ``[len(ids) - start]``."""
    import numpy as np

    key = np.zeros(len(ids) - start, dtype=np.int64)
    for j in range(n):
        key = key * vocab + ids[start - n + 1 + j : len(ids) - n + 1 + j]
    return key


def _distinct(keys: Any) -> Any:
    """The sorted distinct values of an int64 array (by one sort: faster here than ``np.unique``'s hash)."""
    import numpy as np

    ordered = np.sort(keys)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def _lookup(keys: Any, values: Any, query: Any) -> Any:
    """``values`` at ``query``'s place in the sorted ``keys``, 0 where a query is not among them."""
    import numpy as np

    if len(keys) == 0:
        return np.zeros(len(query), dtype=values.dtype)
    at = np.clip(np.searchsorted(keys, query), 0, len(keys) - 1)
    return np.where(keys[at] == query, values[at], 0)


def kneser_ney_probabilities(train: Any, val: Any, order: int, vocab: int, start: int) -> Any:
    """Interpolated Kneser–Ney probability of each validation character from ``start`` on given the
    ``order - 1`` before it (Kneser & Ney 1995; the interpolated form of Chen & Goodman 1998, §3 and eq. 17).

    Level ``m`` (1..``order``) predicts from ``m - 1`` characters:
    ``P_m(w | h) = (max(c(h w) - D_m, 0) + D_m N1+(h •) P_{m-1}(w | h')) / c(h)`` where the context
    ``h`` was seen (``c(h) = sum_w c(h w)``, ``N1+(h •)`` the distinct characters seen after it,
    ``h'`` the context less its first character), else ``P_{m-1}(w | h')``; ``P_0`` is uniform over the
    ``vocab`` characters, so every character has a probability. The top level counts the n-grams
    themselves; a lower level counts how many distinct characters precede each n-gram (the continuation
    count: a character seen after many contexts is a likely guess in a new one). Each level's discount
    is ``D_m = n1 / (n1 + 2 n2)`` of its own counts (Ney, Essen & Kneser 1994; n1, n2 the n-grams
    counted once and twice), or :data:`FALLBACK_DISCOUNT` where it has no count of one.

    Args:
        train: training token ids ``[N]`` (int64, each in ``[0, vocab)``).
        val: validation token ids ``[M]``, ``M > start``.
        order: the model's order (1 unigram, 2 bigram, ...), ``<= start + 1``.
        vocab: the character set's size ``V`` (``V ** order`` must fit an int64).
        start: the first scored position of ``val``.

    Returns:
        float64 ``[M - start]``.
    """
    import numpy as np

    prob = np.full(len(val) - start, 1.0 / vocab)
    for m in range(1, order + 1):
        if m == order:  # the top level: the n-grams' own counts
            keys, counts = np.unique(_ngram_keys(train, m, m - 1, vocab), return_counts=True)
        else:  # a lower level: the distinct characters before each m-gram
            longer = _distinct(_ngram_keys(train, m + 1, m, vocab))
            keys, counts = np.unique(longer % vocab**m, return_counts=True)
        n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
        discount = n1 / (n1 + 2 * n2) if n1 > 0 else FALLBACK_DISCOUNT
        query = _ngram_keys(val, m, start, vocab)
        # keys are sorted, so their contexts (key // vocab) are too: one run of keys per context
        contexts, first, types = np.unique(keys // vocab, return_index=True, return_counts=True)
        totals = np.add.reduceat(counts, first)
        seen = _lookup(keys, counts, query)
        total = _lookup(contexts, totals, query // vocab)
        followers = _lookup(contexts, types, query // vocab)
        known = total > 0
        safe = np.where(known, total, 1)
        prob = np.where(known, (np.maximum(seen - discount, 0.0) + discount * followers * prob) / safe, prob)
    return prob


@functools.lru_cache(maxsize=8)
def ngram_baselines(corpus: str, val_fraction: float = 0.1) -> dict[str, float]:
    """Unigram, bigram and trigram count models fitted on the training split, scored on the validation split.

    Each is interpolated Kneser–Ney (:func:`kneser_ney_probabilities`; Chen & Goodman 1998) over the whole corpus's
    character set: unlike add-k smoothing it backs off where its counts are thin, so even on a corpus of thousands
    of characters (the Tang poems) each order beats the one below (``tests/test_premises.py`` checks every shipped
    corpus). Every order is scored on the same validation targets (from the third character on), in nats per
    character, comparable with a trained model's validation loss: ``{"unigram": nats, "bigram": nats, "trigram":
    nats}``.
    """
    import numpy as np

    text = load_text(corpus)
    train, val = split_text(text, val_fraction)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    tr = np.array([index[c] for c in train], dtype=np.int64)
    va = np.array([index[c] for c in val], dtype=np.int64)
    start = max(NGRAM_ORDERS.values()) - 1
    return {
        name: float(-np.log(kneser_ney_probabilities(tr, va, n, len(chars), start)).mean())
        for name, n in NGRAM_ORDERS.items()
    }


#: a result's field that results.json holds inline, its own fields among the result's (a flat layout)
INLINE = {"inline": True}
#: a field an older results.json may lack: read as its default there (every other field must be present)
OLDER = {"older": True}
#: a field results.json holds only when it has a value: left out when ``None``, read as ``None`` where absent
WHEN_SET = {"when_set": True}


def stored_as(key: str, **metadata: Any) -> dict[str, Any]:
    """The metadata of a field results.json holds under ``key`` (a name that is no identifier, such as ``"4L"``)."""
    return {"key": key, **metadata}


@dataclass(frozen=True)
class Baselines:
    """The corpus a result's models trained on and what models that learned no context reach on its validation
    split: the yardsticks a trained loss is read against.

    Attributes:
        corpus: the corpus (a name or a path).
        unigram_entropy_nats: :func:`unigram_entropy` (``None`` in a results.json that holds only the n-gram
            baselines).
        ngram_baselines: :func:`ngram_baselines` (``"unigram"``, ``"bigram"``, ``"trigram"``: nats per character).
    """

    ngram_baselines: dict[str, float]
    corpus: str | None = field(default=None, metadata=OLDER)
    unigram_entropy_nats: float | None = field(default=None, metadata=OLDER)

    @property
    def bigram(self) -> float:
        """The bigram count model's loss: a model that uses its context beats it."""
        return self.ngram_baselines["bigram"]


def corpus_baselines(corpus: str, val_fraction: float = 0.1) -> Baselines:
    """``corpus``'s :class:`Baselines` on the validation split of ``val_fraction``."""
    return Baselines(ngram_baselines(corpus, val_fraction), corpus, unigram_entropy(corpus, val_fraction))


def baselines_field() -> Any:
    """A result's :class:`Baselines` field, held inline in results.json (``corpus``, ``unigram_entropy_nats`` and
    ``ngram_baselines`` among the result's own keys)."""
    return field(metadata=INLINE)


def draw_perplexity_baselines(ax: Any, baselines: dict[str, float] | None) -> None:
    """The bigram and trigram count models (:func:`ngram_baselines`, nats) as horizontal perplexity lines
    ``exp(nats)`` on a perplexity axis: a model that uses its context sits below the bigram line."""
    for name, style in (("bigram", "-."), ("trigram", (0, (1, 3)))):
        if baselines and name in baselines:
            value = math.exp(baselines[name])
            ax.axhline(value, color="dimgray", linestyle=style, linewidth=1, label=f"{name} count model {value:.2f}")


def scheme_style_index(labels: Sequence[str]) -> dict[str, int]:
    """Each label's :func:`poslab.display.series_style` index: a registered position scheme its place in
    ``positions.names()`` (so a scheme looks the same in every plot of the lab), any other label the next
    index past them."""
    from poslab.nn import positions

    names = positions.names()
    return {label: names.index(label) if label in names else len(names) + i for i, label in enumerate(labels)}


def plot_seeded_curves(
    runs: dict[str, list[list[tuple[int, float]]]],
    path: Path,
    title: str,
    baselines: Baselines | None = None,
    style_index: dict[str, int] | None = None,
) -> Path:
    """Validation-loss curves (``runs``: arm -> a run summary's ``val_curve`` per seed), mean over seeds (line) and
    min..max (band), with the corpus's ``baselines``; ``style_index``: arm -> :func:`poslab.display.series_style`
    index (default: the order of ``runs``; :func:`scheme_style_index` for position schemes)."""
    from poslab.display import new_figure, save_figure, series_style

    baseline = baselines.unigram_entropy_nats if baselines is not None else None
    fig, ax = new_figure(size=(8.0, 5.0))
    finals = []
    for i, (label, seeds) in enumerate(runs.items()):
        curves = [dict((int(s), float(v)) for s, v in curve) for curve in seeds if curve]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        if not steps:
            continue
        means = [sum(c[s] for c in curves) / len(curves) for s in steps]
        lows = [min(c[s] for c in curves) for s in steps]
        highs = [max(c[s] for c in curves) for s in steps]
        style = series_style((style_index or {}).get(label, i))
        ax.plot(steps, means, markersize=3, label=f"{label}: {means[-1]:.3f} (n={len(curves)})", **style)
        ax.fill_between(steps, lows, highs, color=style["color"], alpha=0.2, linewidth=0)
        finals.append(means[-1])
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label=f"unigram baseline {baseline:.3f}")
    for (name, value), style in zip(
        ((n, v) for n, v in (baselines.ngram_baselines if baselines else {}).items() if n in NGRAM_ORDERS),
        (":", "-.", ":"),
    ):
        if name == "unigram" and baseline is not None:
            continue
        ax.axhline(value, color="dimgray", linestyle=style, linewidth=1, label=f"{name} count model {value:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"{title}\nline: mean over seeds; band: min..max over seeds")
    if finals:
        top = max(max(finals) + 0.5, (baseline or 0) + 0.2)
        ax.set_ylim(min(finals) - 0.2, top)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def even_windows(tokens: Any, n: int, length: int) -> Any:
    """``[n, length]`` evenly spaced windows of the token ids ``tokens [N]`` (a fixed probe or stream set)."""
    import torch

    if tokens.numel() < length + 1:
        raise ValueError(f"the validation text has {tokens.numel()} tokens, fewer than one window of {length}")
    starts = torch.linspace(0, tokens.numel() - length - 1, n).long()
    return torch.stack([tokens[s : s + length] for s in starts.tolist()])


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside the block, its thread count restored after: a tiny model gains nothing from more
    threads, the machine is shared, and timings compare like with like."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties; NaN where either side is constant)."""
    from scipy.stats import spearmanr

    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan")
    return float(spearmanr(xs, ys).statistic)
