"""Corpora, tokenizers (char and byte-level BPE), the train/val split and batching."""

from __future__ import annotations

import json

import pytest
import torch

from poslab.data import (
    CharTokenizer,
    build_tokenizer,
    encode_corpus,
    get_batch,
    load_corpus,
    load_text,
    split_text,
    tokenizer_from_dict,
)
from poslab.data.bpe import BPETokenizer


def test_seed_001_encoding_and_the_nanogpt_split():
    text = load_corpus("shakespeare")
    train, val = split_text(text, 0.1)
    assert (len(train), len(val)) == (1_003_854, 111_540)  # nanoGPT's shakespeare_char split
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65
    ids = encode_corpus(tok, train[:5000])
    assert ids.dtype == torch.long and ids.tolist() == tok.encode(train[:5000])
    poems = load_corpus("tang5")
    tang = CharTokenizer.from_text(poems)
    assert tang.decode(encode_corpus(tang, "白日依山尽").tolist()) == "白日依山尽"
    assert "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。" in poems


def test_encode_corpus_names_unknown_characters():
    tok = CharTokenizer("abc\n")
    with pytest.raises(ValueError, match="'z'"):
        encode_corpus(tok, "abcabc\nz")


def test_split_bounds():
    for bad in (0.0, 0.6, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="val_fraction"):
            split_text("abcdefghij", bad)
    assert split_text("abcdefghij", 0.2) == ("abcdefgh", "ij")


def test_get_batch_windows_and_targets():
    data = torch.arange(100)
    generator = torch.Generator().manual_seed(0)
    x, y = get_batch(data, 8, 5, generator)
    assert x.shape == y.shape == (5, 8)
    assert torch.equal(y, x + 1)  # consecutive ids: the target is the next token
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(5, 7, dtype=torch.long))
    again = get_batch(data, 8, 5, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x)
    with pytest.raises(ValueError, match="cannot fill one block"):
        get_batch(torch.arange(8), 8, 1)


def test_bad_corpus_files(tmp_path):
    cases = {"empty.txt": b"  \n", "binary.bin": b"\x89PNG\x00\x00", "latin1.txt": "café".encode("latin-1")}
    messages = {"empty.txt": "empty", "binary.bin": "binary", "latin1.txt": "not valid UTF-8"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=messages[name]):
            load_text(str(tmp_path / name))
    with pytest.raises(ValueError, match="neither a shipped corpus"):
        load_text(str(tmp_path / "missing.txt"))


def test_byte_level_bpe_round_trip_and_fallback():
    text = load_corpus("shakespeare")[:50_000]
    tok = build_tokenizer("bpe:400", text)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 400
    ids = encode_corpus(tok, text)
    assert tok.decode(ids.tolist()) == text
    assert len(ids) < 0.6 * len(text)  # merges compress English
    unseen = "白日依山尽 ☃"  # never in training: falls back to UTF-8 bytes, still round-trips
    assert tok.decode(tok.encode(unseen)) == unseen
    restored = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert restored.encode(text[:500]) == tok.encode(text[:500])
    again = build_tokenizer("bpe:400", text)  # deterministic training
    assert again.to_dict() == tok.to_dict()


def test_tokenizer_spec_errors():
    for spec, message in (("word", "unknown tokenizer"), ("bpe:abc", "integer"), ("bpe:100", r"\[257")):
        with pytest.raises(ValueError, match=message):
            build_tokenizer(spec, "some text")
    with pytest.raises(ValueError, match="unknown tokenizer type"):
        tokenizer_from_dict({"type": "sentencepiece"})
