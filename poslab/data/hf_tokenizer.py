"""Tokenizers of runs converted from Hugging Face folders (``poslab convert --from-hf``).

Same small interface as :class:`poslab.data.CharTokenizer` (``encode``, ``decode``, ``vocab_size``,
``to_dict``/``from_dict``), saved in the run's ``tokenizer.json`` and rebuilt by
``poslab.data.tokenizer_from_dict`` without unpickling anything:

* :class:`HFTokenizer` (``{"type": "hf", ...}``): the folder's fast tokenizer (its ``tokenizer.json``,
  run by the ``tokenizers`` package), stored inline.
* :class:`IdsTokenizer` (``{"type": "ids", ...}``): the folder had no tokenizer; text *is* token ids
  (``"464 3290 318"``), so ``poslab sample`` and ``poslab attention`` still work, and anything that
  needs real text (``poslab eval`` on a corpus) fails with a message saying why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from poslab.data.bpe import tokenizer_from_body


class HFTokenizer:
    """A Hugging Face fast tokenizer (``tokenizers.Tokenizer``) behind poslab's tokenizer interface.

    ``encode`` adds the tokenizer's special tokens (a Llama BOS, as ``tokenizer(text)`` does in
    transformers); ``encode_corpus`` (whole corpora for evaluation) does not.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_folder(cls, folder: str | Path) -> HFTokenizer | None:
        """The tokenizer of a Hugging Face model folder, or ``None`` if it has none.

        ``tokenizer.json`` is read directly; a folder with only slow-tokenizer files (``vocab.json`` +
        ``merges.txt``, ``tokenizer.model``) is converted by ``transformers.AutoTokenizer`` offline.
        """
        folder = Path(folder)
        if (folder / "tokenizer.json").is_file():
            try:
                return cls(Tokenizer.from_file(str(folder / "tokenizer.json")))
            except Exception as err:  # tokenizers raises a bare Exception for a damaged or foreign file
                raise ValueError(
                    f"{str(folder / 'tokenizer.json')!r} is not a readable tokenizer file: {err}"
                ) from None
        slow_files = ("vocab.json", "tokenizer.model", "vocab.txt", "spiece.model")
        if not any((folder / name).is_file() for name in slow_files):
            return None
        from transformers import AutoTokenizer

        try:
            slow = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        except Exception as err:  # a broken or exotic slow tokenizer: say which and why
            raise ValueError(f"{str(folder)!r} has tokenizer files transformers cannot load offline: {err}") from err
        backend = getattr(slow, "backend_tokenizer", None) or getattr(slow, "_tokenizer", None)
        if backend is None:
            raise ValueError(f"{str(folder)!r}: transformers loaded a tokenizer with no fast (tokenizers) backend")
        return cls(backend)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_corpus(self, text: str) -> list[int]:
        """Ids of a whole text in one pass, without special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "hf", "vocab_size": self.vocab_size, "tokenizer": json.loads(self.tokenizer.to_str())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HFTokenizer:
        return cls(tokenizer_from_body(data, "hf"))


class IdsTokenizer:
    """Stand-in for a run converted without a tokenizer: texts are token ids separated by spaces or commas.

    Args:
        vocab_size: the model's vocabulary (ids must lie in ``[0, vocab_size)``).
    """

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = int(vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        pieces = [p for p in re.split(r"[\s,]+", text.strip()) if p]
        if not pieces or not all(re.fullmatch(r"\d+", p) for p in pieces):
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise ValueError(
                "this run was converted without a tokenizer (its Hugging Face folder had none): give text as token ids "
                f"separated by spaces, e.g. '464 3290 318'; got {shown!r}"
            )
        ids = [int(p) for p in pieces]
        bad = [i for i in ids if i >= self._vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self._vocab_size})")
        return ids

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "ids", "vocab_size": self._vocab_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IdsTokenizer:
        return cls(data["vocab_size"])


__all__ = ["HFTokenizer", "IdsTokenizer"]
