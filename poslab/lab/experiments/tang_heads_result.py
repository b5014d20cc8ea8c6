"""The tang-heads experiment's typed result: the fields of :func:`poslab.analysis.heads.head_results` and
:func:`poslab.analysis.attention_map.draw_attention`, each a typed value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadScore:
    """One head's scores (:func:`poslab.analysis.heads.analyze`): previous-token, induction (mean and per period),
    positional offset and confidence, share of attention on punctuation and on the first token, the loss change
    when masked, the gradient importance, and the labels its scores give it."""

    layer: int
    head: int
    previous_token: float
    induction: float
    induction_by_period: dict[str, float]
    positional_offset: int
    positional_confidence: float
    punctuation: float
    sink_rate: float
    mask_loss_delta: float
    grad_importance: float
    labels: list[str]


@dataclass(frozen=True)
class AnalysedModel:
    """The analysed model's shape and position scheme."""

    n_layer: int
    n_head: int
    n_embd: int
    position: str
    vocab_size: int


@dataclass(frozen=True)
class Evaluation:
    """How the heads were read: window length, batches, the induction periods and the random tokens' seed."""

    seq_len: int
    n_batches: int
    batch_size: int
    induction_periods: list[int]
    seed: int


@dataclass(frozen=True)
class Thresholds:
    """The score each label needs (:mod:`poslab.analysis.heads`)."""

    previous_token: float
    induction: float
    positional: float
    punctuation: float
    sink: float


@dataclass(frozen=True)
class Pruning:
    """The loss with the least important heads masked first, and in random orders, at each fraction."""

    fractions: list[float]
    loss_by_importance: list[float]
    loss_random_order: list[float]
    order: list[list[int]]


@dataclass(frozen=True)
class Pruned:
    """The loss with the least important ``fraction`` of the heads masked."""

    fraction: float
    heads_masked: int
    loss: float
    loss_increase: float


@dataclass(frozen=True)
class MeasuredText:
    """The text the analysis's loss was measured on (a corpus name or file, its tokenizer, its split)."""

    corpus: str | None
    tokenizer: str | None
    val_fraction: float


@dataclass(frozen=True)
class Training:
    """The analysed run: its folder's name, corpus, steps, final validation loss and the corpus's unigram entropy."""

    run: str
    corpus: str
    steps: int | None
    final_val_loss: float | None
    unigram_entropy: float


@dataclass(frozen=True)
class AttentionHead:
    """One head on the prompt (:func:`poslab.analysis.attention_map.summary`)."""

    layer: int
    head: int
    mean_entropy_nats: float
    previous_token_weight: float
    self_weight: float
    median_argmax_offset: float


@dataclass(frozen=True)
class AttentionShown:
    """What the attention map shows (:func:`poslab.analysis.attention_map.draw_attention`)."""

    prompt: str
    run: str
    position: str
    png: str
    tokens: list[str]
    n_layer: int
    n_head: int
    heads: list[AttentionHead]


@dataclass(frozen=True)
class TangHeadsResult:
    """The head analysis of the Tang GPT (:func:`poslab.analysis.heads.head_results`' fields), the run it read
    (``training``) and the attention map's record (``attention``)."""

    model: AnalysedModel
    eval: Evaluation
    thresholds: Thresholds
    sink_rate_uniform: float
    punctuation_ids: list[int]
    punctuation_share_of_keys: float
    base_loss: float
    repeat_loss: dict[str, float]
    heads: list[HeadScore]
    counts: dict[str, int]
    pruning: Pruning
    pruned_30: Pruned
    pruned_60: Pruned
    rank_agreement: float | None
    run: str
    text: MeasuredText
    quick: bool
    training: Training
    attention: AttentionShown
