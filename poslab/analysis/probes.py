"""Synthetic probe tasks where position decides the answer, and a seconds-long trainer for them.

Every task builds sequences ``[BOS, problem..., SEP, answer part...]``: the model reads the whole
sequence causally and is scored only on the answer tokens (teacher forcing, argmax accuracy). A task
has a *size* ``n`` (items, pairs or filler tokens); a model is trained on sizes from
``[max(2, L // 4), L]`` (a recipe may raise the smallest, grow the largest over a curriculum, and
draw one size per batch or put every size in every batch: :class:`ProbeRecipe`) and tested at
exactly ``L``, ``2 L`` and ``4 L``.

Tasks (Kazemnejad et al. 2023, https://arxiv.org/abs/2305.19466, for copy and reverse; Arora et al.
2023, "Zoology", https://arxiv.org/abs/2312.04927, for multi-query associative recall; Mohtashami &
Jaggi 2023, https://arxiv.org/abs/2305.16300, for passkey retrieval):

* ``copy``: ``x_1..x_n SEP x_1..x_n``.
* ``reverse``: ``x_1..x_n SEP x_n..x_1``.
* ``retrieve``: ``x_1..x_n SEP (i_k, x_k) x Q``: an index token ``i_k`` asks for the token at position
  ``k`` (``k < min(n, L)``, so every index token is seen in training).
* ``mqar``: ``n`` key-value pairs ``k v``, then ``max(1, n // 2)`` of the keys again (``queries="half"``)
  or every key once in a random order (``queries="all"``), each followed by its value (distinct keys
  per sequence).
* ``count``: ``n`` tokens holding each of ``M`` countable symbols ``c_s <= C`` times (the rest filler),
  then every countable symbol followed by its count token (counts stay in ``[0, C]`` at every size).
* ``passkey``: ``n`` filler tokens with ``KEY d_1..d_D`` hidden at a random place, then ``SEP d_1..d_D``.

All generation is vectorised and driven by a ``torch.Generator``, so a (task, size, seed) triple
always gives the same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.checks import int_at_least, is_int, positive_int
from poslab.nn.gpt_config import NormConfig
from poslab.training.step import StepSettings, train_step

BOS, SEP = 0, 1
#: first task-specific token id
FIRST = 2

SYMBOLS = 16  # content alphabet of copy / reverse / retrieve
QUERIES = 4  # retrieve: queries per sequence
VALUES = 16  # mqar: value alphabet
COUNTABLE = 4  # count: symbols that are counted
MAX_COUNT = 4  # count: each countable symbol appears 0..MAX_COUNT times
FILLER = 8  # count / passkey: filler alphabet
DIGITS = 10  # passkey: digit alphabet
KEY_DIGITS = 4  # passkey: digits of the key

TASKS = ("copy", "reverse", "retrieve", "mqar", "count", "passkey")
#: mqar: which keys are asked again ("half": ``max(1, n // 2)`` of them; "all": every key, in a random order)
MQAR_QUERIES = ("half", "all")
#: a probe's training step: the global gradient norm clipped to 1, fp32
PROBE_STEP = StepSettings(grad_clip=1.0)


@dataclass(frozen=True)
class Task:
    """One probe task at training size ``L`` (``train_size``).

    Attributes:
        name: one of :data:`TASKS`.
        train_size: ``L``; also fixes vocabularies that depend on it (retrieve's index tokens,
            mqar's keys: ``4 L`` distinct keys so that sizes up to ``4 L`` stay distinct).
        queries: mqar only, one of :data:`MQAR_QUERIES`: ``"half"`` asks ``max(1, n // 2)`` of the
            ``n`` keys again, ``"all"`` asks every key once (``n`` scored answers per sequence).
    """

    name: str
    train_size: int
    queries: str = "half"

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"unknown probe task {self.name!r}; choose one of {', '.join(TASKS)}")
        int_at_least("train size L", self.train_size, 2)
        if self.queries not in MQAR_QUERIES:
            raise ValueError(f"mqar queries must be one of {', '.join(MQAR_QUERIES)}, got {self.queries!r}")

    # ------------------------------------------------------------------------------ vocabulary
    @property
    def n_keys(self) -> int:
        """mqar: distinct keys available (``4 L``, enough for the ``4 L`` test)."""
        return 4 * self.train_size

    def n_queries(self, n: int) -> int:
        """mqar: keys asked again at size ``n`` (``max(1, n // 2)``, or ``n`` with ``queries="all"``)."""
        return n if self.queries == "all" else max(1, n // 2)

    @property
    def vocab_size(self) -> int:
        """Tokens the task uses: ``BOS``, ``SEP`` and its own."""
        L = self.train_size
        extra = {
            "copy": SYMBOLS,
            "reverse": SYMBOLS,
            "retrieve": SYMBOLS + L,  # symbols, then one index token per position < L
            "mqar": self.n_keys + VALUES,
            "count": COUNTABLE + FILLER + MAX_COUNT + 1,
            "passkey": FILLER + 1 + DIGITS,  # filler, KEY, digits
        }[self.name]
        return FIRST + extra

    def seq_len(self, n: int) -> int:
        """Model input length (tokens fed, the full sequence less its last token) at size ``n``."""
        total = {
            "copy": 2 * n + 2,
            "reverse": 2 * n + 2,
            "retrieve": n + 2 + 2 * QUERIES,
            "mqar": 1 + 2 * n + 2 * self.n_queries(n),
            "count": n + 2 + 2 * COUNTABLE,
            "passkey": n + 2 + 2 * KEY_DIGITS + 1,
        }[self.name]
        return total - 1

    def min_size(self) -> int:
        """Smallest training size, ``max(2, L // 4)`` (count needs room for every count)."""
        return max(2, self.train_size // 4)

    def answers_per_sequence(self, n: int) -> int:
        return {
            "copy": n,
            "reverse": n,
            "retrieve": QUERIES,
            "mqar": self.n_queries(n),
            "count": COUNTABLE,
            "passkey": KEY_DIGITS,
        }[self.name]

    # ------------------------------------------------------------------------------ sampling
    def sample(self, n: int, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A batch at size ``n``.

        Returns:
            ``(idx, targets)``, both ``[batch, seq_len(n)]`` int64; ``targets`` is the next token on
            answer positions and ``-1`` elsewhere.
        """
        positive_int("task size n", n)
        positive_int("batch", batch)
        if self.name == "mqar" and n > self.n_keys:
            raise ValueError(f"mqar has {self.n_keys} keys (4 L), so n must be <= {self.n_keys}; got {n}")
        seq, answer = _BUILDERS[self.name](self, n, batch, generator)
        return seq[:, :-1], torch.where(answer[:, 1:], seq[:, 1:], torch.full_like(seq[:, 1:], -1))


def _randint(high: int, shape: tuple[int, ...], g: torch.Generator, low: int = 0) -> Tensor:
    return torch.randint(low, high, shape, generator=g)


def _perm(batch: int, n: int, g: torch.Generator) -> Tensor:
    """One random permutation of ``range(n)`` per row: ``[batch, n]``."""
    return torch.rand(batch, n, generator=g).argsort(dim=1)


def _frame(batch: int, problem: Tensor, answer_part: Tensor, answer_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``[BOS, problem, SEP, answer_part]`` and the mask of answer tokens, both ``[B, T+1]``."""
    bos = torch.full((batch, 1), BOS, dtype=torch.long)
    sep = torch.full((batch, 1), SEP, dtype=torch.long)
    seq = torch.cat([bos, problem, sep, answer_part], dim=1)  # [B, 1 + P + 1 + A]
    mask = torch.cat([torch.zeros(batch, problem.shape[1] + 2, dtype=torch.bool), answer_mask], dim=1)
    return seq, mask


def _copy(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    x = FIRST + _randint(SYMBOLS, (batch, n), g)  # [B, n]
    return _frame(batch, x, x.clone(), torch.ones(batch, n, dtype=torch.bool))


def _reverse(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    x = FIRST + _randint(SYMBOLS, (batch, n), g)  # [B, n]
    return _frame(batch, x, x.flip(1), torch.ones(batch, n, dtype=torch.bool))


def _retrieve(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    x = FIRST + _randint(SYMBOLS, (batch, n), g)  # [B, n]
    limit = min(n, task.train_size)
    k = torch.stack([_randint(limit, (QUERIES,), g) for _ in range(batch)])  # [B, Q] positions asked for
    index_tokens = FIRST + SYMBOLS + k  # [B, Q]
    values = x.gather(1, k)  # [B, Q]
    part = torch.stack([index_tokens, values], dim=2).reshape(batch, 2 * QUERIES)  # [B, Q, 2] -> [B, 2Q]
    mask = torch.tensor([False, True]).repeat(QUERIES).expand(batch, -1)  # [B, 2Q]
    return _frame(batch, x, part, mask)


def _mqar(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    keys = _perm(batch, task.n_keys, g)[:, :n]  # [B, n] distinct keys
    values = _randint(VALUES, (batch, n), g)  # [B, n]
    key_tok, value_tok = FIRST + keys, FIRST + task.n_keys + values
    pairs = torch.stack([key_tok, value_tok], dim=2).reshape(batch, 2 * n)  # [B, n, 2] -> [B, 2n]
    q = task.n_queries(n)
    asked = _perm(batch, n, g)[:, :q]  # [B, q] which pairs are queried, in the order asked
    part = torch.stack([key_tok.gather(1, asked), value_tok.gather(1, asked)], dim=2).reshape(batch, 2 * q)  # [B, 2q]
    bos = torch.full((batch, 1), BOS, dtype=torch.long)
    seq = torch.cat([bos, pairs, part], dim=1)  # [B, 1 + 2n + 2q] (the queries follow the pairs, no SEP)
    mask = torch.cat(
        [torch.zeros(batch, 1 + 2 * n, dtype=torch.bool), torch.tensor([False, True]).repeat(q).expand(batch, -1)],
        dim=1,
    )
    return seq, mask


def _count(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    cap = min(MAX_COUNT, n // COUNTABLE)
    counts = _randint(cap + 1, (batch, COUNTABLE), g)  # [B, M], sum <= n
    ends = counts.cumsum(1)  # [B, M]
    slot = torch.arange(n).expand(batch, n)  # [B, n]
    which = torch.searchsorted(ends.contiguous(), slot.contiguous(), right=True)  # [B, n] symbol index, M = filler
    filler = FIRST + COUNTABLE + _randint(FILLER, (batch, n), g)  # [B, n]
    sorted_tokens = torch.where(which < COUNTABLE, FIRST + which, filler)  # [B, n] counted symbols first
    x = sorted_tokens.gather(1, _perm(batch, n, g))  # [B, n] shuffled
    order = _perm(batch, COUNTABLE, g)  # [B, M] query order
    count_tok = FIRST + COUNTABLE + FILLER + counts.gather(1, order)  # [B, M]
    part = torch.stack([FIRST + order, count_tok], dim=2).reshape(batch, 2 * COUNTABLE)  # [B, M, 2] -> [B, 2M]
    mask = torch.tensor([False, True]).repeat(COUNTABLE).expand(batch, -1)
    return _frame(batch, x, part, mask)


def _passkey(task: Task, n: int, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    key_token = FIRST + FILLER
    digits = FIRST + FILLER + 1 + _randint(DIGITS, (batch, KEY_DIGITS), g)  # [B, D]
    filler = FIRST + _randint(FILLER, (batch, n), g)  # [B, n]
    where = _randint(n + 1, (batch, 1), g)  # [B, 1] the key goes before filler token `where`
    block = torch.cat([torch.full((batch, 1), key_token, dtype=torch.long), digits], dim=1)  # [B, 1 + D]
    width = 1 + KEY_DIGITS
    t = torch.arange(n + width).expand(batch, -1)  # [B, n + 1 + D]
    in_block = (t >= where) & (t < where + width)
    from_filler = torch.where(t < where, t, t - width).clamp(0, n - 1)  # [B, n + 1 + D]
    from_block = (t - where).clamp(0, width - 1)
    haystack = torch.where(in_block, block.gather(1, from_block), filler.gather(1, from_filler))  # [B, n + 1 + D]
    return _frame(batch, haystack, digits, torch.ones(batch, KEY_DIGITS, dtype=torch.bool))


_BUILDERS: dict[str, Callable[[Task, int, int, torch.Generator], tuple[Tensor, Tensor]]] = {
    "copy": _copy,
    "reverse": _reverse,
    "retrieve": _retrieve,
    "mqar": _mqar,
    "count": _count,
    "passkey": _passkey,
}


# ---------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class ProbeRecipe:
    """How a probe model is built and trained (the same for every scheme).

    Attributes:
        n_layer, n_head, n_embd: model geometry.
        steps, batch_size, lr, warmup_steps: AdamW with linear warmup then linear decay to ``lr / 10``.
        eval_batch: sequences scored per test size.
        min_size: smallest training size (``None``: the task's, ``max(2, L // 4)``).
        curriculum_steps: over the first ``curriculum_steps`` steps the largest training size grows
            linearly from ``min_size`` to ``L`` (0: every step draws from the whole range).
        embed_norm: a norm right after the token embedding, before the position scheme adds its
            code (token vectors at unit scale; off: the token and a learned table both start at
            std 0.02).
        mixed_sizes: every batch holds every training size in equal shares (right-padded to the
            longest; pad targets ``-1``); off: one size per batch, drawn uniformly.
        mqar_queries: the mqar task's :attr:`Task.queries`, in training and in test (other tasks
            ignore it).
    """

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    eval_batch: int = 128
    min_size: int | None = None
    curriculum_steps: int = 0
    embed_norm: bool = True
    mixed_sizes: bool = False
    mqar_queries: str = "half"

    def __post_init__(self) -> None:
        if self.min_size is not None:
            positive_int("min_size", self.min_size, rule="a positive integer or None")
        if not is_int(self.curriculum_steps) or self.curriculum_steps < 0:
            raise ValueError(f"curriculum_steps must be a non-negative integer, got {self.curriculum_steps!r}")
        if self.mqar_queries not in MQAR_QUERIES:
            raise ValueError(f"mqar_queries must be one of {', '.join(MQAR_QUERIES)}, got {self.mqar_queries!r}")

    def task(self, name: str, train_size: int) -> Task:
        """The task ``name`` at ``L = train_size`` as this recipe trains and tests it."""
        return Task(name, train_size, queries=self.mqar_queries if name == "mqar" else "half")

    def size_range(self, task: Task, step: int) -> tuple[int, int]:
        """The training sizes ``(low, high)`` (inclusive) drawn from at ``step``.

        Raises:
            ValueError: ``min_size`` is larger than the task's ``L``.
        """
        L = task.train_size
        low = task.min_size() if self.min_size is None else self.min_size
        if low > L:
            raise ValueError(f"min_size {low} must be <= the training size L = {L}")
        if step >= self.curriculum_steps:
            return low, L
        return low, low + (L - low) * step // self.curriculum_steps


def training_batch(task: Task, recipe: ProbeRecipe, step: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """The training batch of ``step``: sizes from :meth:`ProbeRecipe.size_range`, drawn from ``g``.

    With ``recipe.mixed_sizes`` the ``batch_size`` rows are split as evenly as they go over every
    size of the range (smallest sizes first), each share right-padded (``BOS`` inputs, ``-1``
    targets) to the range's longest sequence; the models are causal, so padding changes no
    earlier logit. Otherwise one size is drawn uniformly for the whole batch.

    Returns:
        ``(idx, targets)``, both ``[batch_size, T]`` int64 (``T``: the sequence length of the batch's
        largest size).
    """
    low, high = recipe.size_range(task, step)
    if not recipe.mixed_sizes:
        n = int(torch.randint(low, high + 1, (1,), generator=g))
        return task.sample(n, recipe.batch_size, g)
    sizes = list(range(low, high + 1))
    base, extra = divmod(recipe.batch_size, len(sizes))
    T = task.seq_len(high)
    parts = [task.sample(n, base + (i < extra), g) for i, n in enumerate(sizes) if base + (i < extra)]
    idx = torch.cat([F.pad(x, (0, T - x.shape[1]), value=BOS) for x, _ in parts])  # [B, T]
    targets = torch.cat([F.pad(t, (0, T - t.shape[1]), value=-1) for _, t in parts])  # [B, T]
    return idx, targets


def build_model(task: Task, scheme: str, recipe: ProbeRecipe, seed: int) -> Any:
    """A fresh GPT for ``task`` with position ``scheme``; ``block_size`` is the longest training input."""
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=task.vocab_size,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        n_embd=recipe.n_embd,
        block_size=task.seq_len(task.train_size),
        dropout=0.0,
        bias=False,
        position=scheme,
        position_config={},
        norm=NormConfig(embed=recipe.embed_norm),
    )
    return GPT(config)


def cannot_reason(model: Any, length: int) -> str | None:
    """Why ``model`` cannot read ``length`` tokens (its scheme's ``max_positions``), else ``None``."""
    limit = model.position.max_positions
    if limit is not None and length > limit:
        return f"{model.config.position} encodes at most {limit} positions; this test needs {length}"
    return None


@torch.no_grad()
def accuracy(model: Any, task: Task, n: int, batch: int, seed: int) -> float:
    """Argmax accuracy on the answer tokens of a fixed test batch at size ``n`` (teacher forcing)."""
    g = torch.Generator().manual_seed(seed)
    idx, targets = task.sample(n, batch, g)
    was_training = model.training
    model.eval()
    logits = model(idx)  # [B, T, V]
    model.train(was_training)
    keep = targets >= 0
    return float((logits.argmax(-1)[keep] == targets[keep]).float().mean())


def train_probe(
    task_name: str,
    train_size: int,
    scheme: str,
    seed: int,
    recipe: ProbeRecipe,
    test_factors: tuple[int, ...] = (1, 2, 4),
    threads: int | None = None,
) -> dict[str, Any]:
    """Train one probe model and test it at ``factor * L`` for each factor.

    Args:
        task_name: one of :data:`TASKS`.
        train_size: ``L``.
        scheme: a registered position scheme.
        seed: model initialisation and training batches (the test batches use their own fixed seeds,
            the same for every scheme and training seed).
        recipe: the model and schedule.
        test_factors: test sizes as multiples of ``L``.
        threads: torch threads for this training (``None``: leave as is).

    Returns:
        ``{"accuracy": {factor: acc or None}, "cannot": {factor: reason}, "final_loss", "seconds", ...}``.
    """
    import time

    if threads is not None:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    task = recipe.task(task_name, train_size)
    model = build_model(task, scheme, recipe, seed)
    model.train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.0)
    g = torch.Generator().manual_seed(10_000 + seed)
    losses = []
    for step in range(recipe.steps):
        idx, targets = training_batch(task, recipe, step, g)  # [B, T], [B, T]

        def loss_of(_micro: int, idx: Tensor = idx, targets: Tensor = targets) -> Tensor:
            logits = model(idx)  # [B, T, V]
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)

        losses.append(train_step(optimizer, params, loss_of, PROBE_STEP, lr=probe_lr(step, recipe)).loss)
    return _result(model, task, scheme, seed, recipe, test_factors, losses, time.perf_counter() - start)


def probe_lr(step: int, recipe: ProbeRecipe) -> float:
    """The probes' schedule: linear warmup over ``warmup_steps``, then linear decay to ``lr / 10``."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    frac = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.lr * (1.0 - 0.9 * frac)


def _result(
    model: Any,
    task: Task,
    scheme: str,
    seed: int,
    recipe: ProbeRecipe,
    test_factors: tuple[int, ...],
    losses: list[float],
    seconds: float,
) -> dict[str, Any]:
    """A trained probe model tested at ``factor * L`` for each factor: :func:`train_probe`'s result."""
    acc: dict[str, float | None] = {}
    cannot: dict[str, str] = {}
    for factor in test_factors:
        n = factor * task.train_size
        reason = cannot_reason(model, task.seq_len(n))
        if reason is not None:
            acc[str(factor)] = None
            cannot[str(factor)] = reason
            continue
        acc[str(factor)] = accuracy(model, task, n, recipe.eval_batch, seed=1_000_000 + factor)
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "task": task.name,
        "scheme": scheme,
        "seed": seed,
        "n_head": recipe.n_head,
        "accuracy": acc,
        "cannot": cannot,
        "final_loss": sum(tail) / len(tail),
        "seconds": seconds,
        "chance": chance(task),
    }


def chance(task: Task) -> float:
    """Accuracy of guessing uniformly among the answer alphabet (the floor of every table)."""
    alphabet = {
        "copy": SYMBOLS,
        "reverse": SYMBOLS,
        "retrieve": SYMBOLS,
        "mqar": VALUES,
        "count": MAX_COUNT + 1,
        "passkey": DIGITS,
    }[task.name]
    return 1.0 / alphabet


def describe(task: Task) -> str:
    """One line: what a sequence of the task looks like."""
    return {
        "copy": "x1..xn SEP x1..xn",
        "reverse": "x1..xn SEP xn..x1",
        "retrieve": f"x1..xn SEP (index k, x_k) x {QUERIES}",
        "mqar": f"n pairs (key value), then {'every key' if task.queries == 'all' else 'n/2 keys'} "
        "each followed by its value",
        "count": f"n tokens, {COUNTABLE} symbols each 0..{MAX_COUNT} times; SEP (symbol, count) x {COUNTABLE}",
        "passkey": f"n filler tokens hiding KEY d1..d{KEY_DIGITS}; SEP d1..d{KEY_DIGITS}",
    }[task.name]


__all__ = [
    "MQAR_QUERIES",
    "TASKS",
    "ProbeRecipe",
    "Task",
    "accuracy",
    "build_model",
    "cannot_reason",
    "chance",
    "describe",
    "probe_lr",
    "train_probe",
]
