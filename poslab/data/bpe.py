"""Byte-level BPE tokenizer trained locally with the ``tokenizers`` package (GPT-2 style).

Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units"
(https://arxiv.org/abs/1508.07909); byte-level variant of Radford et al. 2019 (GPT-2). Every text
is encodable: the 256 byte symbols are always in the vocabulary, so there is no unknown character —
a character never seen in training falls back to its UTF-8 bytes (the documented fallback).
Nothing is downloaded: the merges are learned from the corpus at hand and saved with the run.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from poslab.checks import int_at_least

MIN_VOCAB = 257  # the 256 byte symbols plus at least one merge
MAX_VOCAB = 1_000_000


class BPETokenizer:
    """Byte-level BPE with the same small interface as :class:`poslab.data.CharTokenizer`.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer`` with a byte-level pre-tokenizer and decoder.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges from ``text`` (deterministic for a given text).

        Raises:
            ValueError: ``vocab_size`` outside ``[257, 1_000_000]`` or an empty text.
        """
        int_at_least("BPE vocabulary size", vocab_size, MIN_VOCAB, maximum=MAX_VOCAB)
        if not text:
            raise ValueError("cannot train a BPE tokenizer on an empty text")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (never fails: unseen characters become their UTF-8 bytes)."""
        return self.tokenizer.encode(text).ids

    def encode_corpus(self, text: str) -> list[int]:
        """Ids of a whole corpus, encoded line by line in parallel (lines keep their ``\\n``)."""
        ids: list[int] = []
        for encoding in self.tokenizer.encode_batch(text.splitlines(keepends=True)):
            ids.extend(encoding.ids)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def to_dict(self) -> dict:
        return {"type": "bpe", "vocab_size": self.vocab_size, "tokenizer": json.loads(self.tokenizer.to_str())}

    @classmethod
    def from_dict(cls, data: dict) -> BPETokenizer:
        return cls(tokenizer_from_body(data, "bpe"))


def tokenizer_from_body(data: dict, kind: str) -> Tokenizer:
    """The ``tokenizers`` object of a saved tokenizer's ``"tokenizer"`` body (``kind`` names it in errors).

    Raises:
        KeyError: the body is missing (the caller names the file).
        ValueError: the body does not load; the library's bare ``Exception`` becomes one line.
    """
    try:
        return Tokenizer.from_str(json.dumps(data["tokenizer"]))
    except KeyError:
        raise
    except Exception as err:  # the tokenizers library raises a bare Exception for a body it cannot read
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"its {kind!r} tokenizer body does not load: {message}") from None
