"""Corpora shipped with poslab (xz-compressed) and text loading.

=================  ==========================================  ==========================================
name               source                                      license
=================  ==========================================  ==========================================
``tang5``          五言 subset of 全唐诗 (chinese-poetry, PR #412)   poems public domain; repo MIT; OpenCC Apache-2.0
``tang``           全唐诗, simplified, one poem per line           same
``shakespeare``    karpathy/char-rnn ``tinyshakespeare``       public domain text; repo MIT
=================  ==========================================  ==========================================

Checksums are of the uncompressed UTF-8 text and are verified on load. See ``poslab/data/README.md``.
"""

from __future__ import annotations

import hashlib
import lzma
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from poslab.checks import is_number


@dataclass(frozen=True)
class Corpus:
    """A shipped corpus: file name inside ``poslab/data/corpora`` and the sha256 of its text."""

    name: str
    filename: str
    sha256: str
    description: str


CORPORA: dict[str, Corpus] = {
    c.name: c
    for c in (
        Corpus(
            "tang5",
            "tang_poems_5char.txt.xz",
            "d16e79bbae7a87d5d3844e0e49cea804e8adf0dddfd45d818f3bae88fc020b17",
            "28,494 five-character Tang poems (simplified), one per line",
        ),
        Corpus(
            "tang",
            "tang_poems.txt.xz",
            "003d049c850a9ef6565c730a7419f26a60a7a93f44891b00dedb107359ea821c",
            "55,704 Tang poems (simplified), one per line",
        ),
        Corpus(
            "shakespeare",
            "tinyshakespeare.txt.xz",
            "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
            "tinyshakespeare (1,115,394 chars), as used by char-rnn and nanoGPT",
        ),
    )
}


@lru_cache(maxsize=4)
def load_corpus(name: str) -> str:
    """Text of a shipped corpus, checksum-verified.

    Raises:
        ValueError: unknown name (lists the known ones) or checksum mismatch.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; shipped corpora: {', '.join(CORPORA)} (or pass a file path)")
    corpus = CORPORA[name]
    raw = lzma.decompress(resources.files("poslab.data").joinpath("corpora", corpus.filename).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != corpus.sha256:
        raise ValueError(f"corpus {name!r} is corrupt: sha256 {digest} != expected {corpus.sha256}")
    return raw.decode("utf-8")


#: bytes of a corpus file checked (NUL bytes, UTF-8) before the rest is read
SNIFF_BYTES = 4 * 2**20


#: blocks read across a large file, and their size, before it is read whole (:func:`_probe_finds_nul`)
PROBES, PROBE_BYTES = 16, 64 * 2**10


def _probe_finds_nul(handle: BinaryIO, size: int) -> bool:
    """Whether any of :data:`PROBES` blocks spread over the file (its end included) holds a NUL byte.

    A text file that turns binary after its first :data:`SNIFF_BYTES` (a sparse hole, an archive
    appended) is refused after about 1 MiB of reads instead of being read whole first. The handle is
    left after the sniffed start.
    """
    start = handle.tell()
    try:
        for i in range(1, PROBES + 1):
            handle.seek(max(start, start + (size - start) * i // PROBES - PROBE_BYTES))
            if b"\x00" in handle.read(PROBE_BYTES):
                return True
        return False
    finally:
        handle.seek(start)


def _check_text_start(head: bytes, path: Path, complete: bool) -> None:
    """Refuse a file whose first :data:`SNIFF_BYTES` are binary or not UTF-8 (a cut last character is fine)."""
    if b"\x00" in head:
        raise ValueError(f"corpus file {str(path)!r} looks binary (contains NUL bytes); expected UTF-8 text")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if complete or err.start < len(head) - 3:  # not just a character cut by the sniff's end
            raise ValueError(f"corpus file {str(path)!r} is not valid UTF-8 (byte {err.start}): {err.reason}") from None


def load_text(name_or_path: str | Path) -> str:
    """A shipped corpus by name, or a user's UTF-8 text file by path.

    Raises:
        ValueError: missing, empty, binary or non-UTF-8 file.
    """
    if isinstance(name_or_path, str) and name_or_path in CORPORA:
        return load_corpus(name_or_path)
    path = Path(name_or_path)
    try:
        is_file = path.is_file()
    except OSError:  # a name longer than a path may be (ENAMETOOLONG): text, not a file
        is_file = False
    if not is_file:
        shown = str(name_or_path)
        shown = repr(shown) if len(shown) <= 200 else f"{shown[:60]!r}… ({len(shown):,} characters)"
        raise ValueError(f"corpus {shown} is neither a shipped corpus ({', '.join(CORPORA)}) nor an existing file")
    binary = f"corpus file {str(path)!r} looks binary (contains NUL bytes); expected UTF-8 text"
    with open(path, "rb") as handle:  # sniff the start first: a binary file is refused before it is read whole
        raw = handle.read(SNIFF_BYTES)
        _check_text_start(raw, path, complete=len(raw) < SNIFF_BYTES)
        if len(raw) == SNIFF_BYTES and _probe_finds_nul(handle, path.stat().st_size):
            raise ValueError(binary)  # a NUL (a sparse hole, a binary tail) past the sniffed start
        chunks = [raw]
        while chunk := handle.read(SNIFF_BYTES):  # chunk by chunk: a NUL stops the read where it is found
            if b"\x00" in chunk:
                raise ValueError(binary)
            chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"corpus file {str(path)!r} is not valid UTF-8 (byte {err.start}): {err.reason}") from None
    if not text.strip():
        raise ValueError(f"corpus file {str(path)!r} is empty")
    return text


class CharTokenizer:
    """Character-level tokenizer (seed 001's ``tok.encode("白日依山尽")``).

    Args:
        chars: the vocabulary, one token per character, in id order.
    """

    def __init__(self, chars: list[str] | str) -> None:
        self.chars = list(chars)
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("CharTokenizer vocabulary has duplicate characters")
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Vocabulary = sorted set of the characters in ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Token ids; an unknown character raises ``ValueError`` naming it."""
        unknown = [c for c in text if c not in self.stoi]
        if unknown:
            shown = "".join(dict.fromkeys(unknown))[:20]
            raise ValueError(f"characters not in the tokenizer's vocabulary ({self.vocab_size} chars): {shown!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        return cls(list(data["chars"]))


# ------------------------------------------------------------------ tokenizers, splits and batches
# (used by poslab.training.loop; see docs/training.md)

TOKENIZER_KINDS = ("char", "bpe:VOCAB")


def build_tokenizer(spec: str, text: str):
    """A tokenizer fitted to ``text`` from its spec: ``"char"`` or ``"bpe:VOCAB"`` (byte-level BPE).

    Args:
        spec: ``"char"`` (vocabulary = every character of ``text``) or ``"bpe:N"`` (byte-level BPE
            with ``N`` tokens, trained locally on ``text`` with the ``tokenizers`` package).
        text: the text to fit on (for BPE: the training split only, so validation stays unseen).

    Raises:
        ValueError: an unknown spec or a bad vocabulary size.
    """
    if spec == "char":
        return CharTokenizer.from_text(text)
    if isinstance(spec, str) and spec.startswith("bpe:"):
        from poslab.data.bpe import BPETokenizer

        size = spec.split(":", 1)[1]
        if not size.isdigit():
            raise ValueError(f"tokenizer {spec!r}: the BPE vocabulary size must be an integer, e.g. 'bpe:2000'")
        return BPETokenizer.train(text, int(size))
    raise ValueError(f"unknown tokenizer {spec!r}; allowed: 'char' or 'bpe:VOCAB' (e.g. 'bpe:2000')")


def tokenizer_from_dict(data: dict):
    """Rebuild a tokenizer saved with ``to_dict()`` (a run's ``tokenizer.json``); never unpickles."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "char":
        return CharTokenizer.from_dict(data)
    if kind == "bpe":
        from poslab.data.bpe import BPETokenizer

        return BPETokenizer.from_dict(data)
    if kind in ("hf", "ids"):  # runs converted from Hugging Face folders (poslab convert)
        from poslab.data.hf_tokenizer import HFTokenizer, IdsTokenizer

        return (HFTokenizer if kind == "hf" else IdsTokenizer).from_dict(data)
    raise ValueError(f"unknown tokenizer type {kind!r} in tokenizer data; known: 'char', 'bpe', 'hf', 'ids'")


def encode_corpus(tokenizer, text: str) -> torch.Tensor:
    """Token ids of a whole corpus as an int64 tensor ``[N]`` (vectorised for char tokenizers).

    Raises:
        ValueError: a character the tokenizer does not know (named in the message).
    """
    if isinstance(tokenizer, CharTokenizer):
        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)  # [N]
        vocab = np.array([ord(c) for c in tokenizer.chars], dtype=np.int64)  # [V]
        order = np.argsort(vocab)
        slot = np.clip(np.searchsorted(vocab[order], codepoints), 0, len(vocab) - 1)  # [N]
        known = vocab[order][slot] == codepoints
        if not known.all():
            tokenizer.encode(text[int(np.argmin(known)) :])  # raises, naming the unknown characters
        return torch.from_numpy(order[slot])
    if hasattr(tokenizer, "encode_corpus"):
        return torch.tensor(tokenizer.encode_corpus(text), dtype=torch.long)
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """Deterministic split: the first ``1 - val_fraction`` of the characters train, the rest validate.

    Same rule as nanoGPT's ``prepare.py`` (``n_train = int(n * 0.9)``).

    Raises:
        ValueError: ``val_fraction`` outside ``(0, 0.5]``.
    """
    if not is_number(val_fraction) or not 0.0 < val_fraction <= 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5], got {val_fraction!r}")
    n_train = int(len(text) * (1.0 - val_fraction))
    return text[:n_train], text[n_train:]


def get_batch(
    data: torch.Tensor, block_size: int, batch_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch of ``batch_size`` windows (nanoGPT's ``get_batch``).

    Args:
        data: token ids ``[N]`` (int64), ``N > block_size``.
        block_size: window length ``T``.
        batch_size: ``B``.
        generator: the random source of the window starts (the training loop keeps its own, so the
            data order is part of a checkpoint).

    Returns:
        ``x [B, T]`` and the next-token targets ``y [B, T]`` (``y[:, t] = x[:, t + 1]`` shifted by one).
    """
    if data.numel() <= block_size:
        raise ValueError(f"{data.numel()} tokens cannot fill one block of {block_size} + 1 tokens")
    starts = torch.randint(data.numel() - block_size, (batch_size,), generator=generator)  # [B]
    window = starts[:, None] + torch.arange(block_size + 1)  # [B, T+1]
    chunk = data[window]  # [B, T+1]
    return chunk[:, :-1], chunk[:, 1:]


__all__ = [
    "CORPORA",
    "TOKENIZER_KINDS",
    "CharTokenizer",
    "Corpus",
    "build_tokenizer",
    "encode_corpus",
    "get_batch",
    "load_corpus",
    "load_text",
    "split_text",
    "tokenizer_from_dict",
]
