"""``poslab convert --from-hf DIR --out runs/NAME``: a Hugging Face model folder -> a poslab run folder.

The run folder has the training engineer's layout (``docs/training.md``), written with
:mod:`poslab.training.checkpoint`'s writer, so ``poslab sample``, ``poslab eval``, ``poslab attention`` and
``poslab.runs.load_run`` treat it like any trained run::

    config.json      {"model": GPTConfig, "train": TrainConfig (corpus for eval), "data": {..., "converted_from"}}
    tokenizer.json   {"type": "hf", ...} (the folder's fast tokenizer) or {"type": "ids", ...} (none: ids as text)
    metrics.jsonl    empty (nothing was trained)
    checkpoints/     step_0000000.safetensors + .json + latest
    results.json     {"status": "converted", ...}

The folder is built under a temporary name next to ``--out`` and renamed at the end, so a failure
leaves nothing half-written, and an existing non-empty ``--out`` is never touched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from poslab.data.hf_tokenizer import HFTokenizer, IdsTokenizer
from poslab.interop.hf import from_hf

DTYPES = {"source": None, "fp32": torch.float32, "bf16": torch.bfloat16}


def convert_hf_folder(
    source: str | Path, out: str | Path, *, corpus: str = "shakespeare", dtype: str = "source"
) -> Path:
    """Convert the Hugging Face model folder ``source`` into the poslab run folder ``out``.

    Args:
        source: a local folder with ``config.json`` and safetensors (read offline).
        out: the run folder to create (must not exist, or be empty).
        corpus: the corpus ``poslab eval`` scores the run on (a shipped name or a text file path).
        dtype: ``"source"`` (the checkpoint's), ``"fp32"`` or ``"bf16"`` for the stored weights.

    Returns:
        The run folder.

    Raises:
        ValueError: not a supported model folder, a bad corpus or dtype (see :func:`poslab.from_hf`).
        FileExistsError: ``out`` exists and is not an empty folder.
    """
    from poslab.data import CORPORA
    from poslab.runs import refuse_existing_run, write_model_run
    from poslab.training.config import TrainConfig

    source, out = Path(source), Path(out)
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of {list(DTYPES)}")
    refuse_existing_run(out, "convert")  # before the conversion's work
    if corpus not in CORPORA and not Path(corpus).is_file():
        raise ValueError(f"corpus {corpus!r} is neither a shipped corpus ({', '.join(CORPORA)}) nor an existing file")
    try:
        model = from_hf(source, dtype=DTYPES[dtype])
    except ImportError as err:
        raise ValueError(str(err)) from None
    tokenizer: Any = HFTokenizer.from_folder(source) or IdsTokenizer(model.config.vocab_size)
    model_doc = model.config.to_dict()
    train = TrainConfig(
        name=out.name, out_dir=str(out.parent), corpus=corpus, tokenizer=tokenizer.to_dict()["type"], model=model.config
    )
    hf_type = _model_type(source)
    config_doc = {
        "model": model_doc,
        "train": {k: v for k, v in train.to_dict().items() if k != "model"},
        "data": {
            "corpus": corpus,
            "vocab_size": model.config.vocab_size,
            "converted_from": {"path": str(source.resolve()), "model_type": hf_type},
        },
    }

    converted_from = config_doc["data"]["converted_from"]
    return write_model_run(
        out,
        model,
        tokenizer,
        config_doc,
        step=0,
        meta={"tokens_seen": 0, "converted_from": converted_from},
        results={
            "status": "converted",
            "model_type": hf_type,
            "source": str(source.resolve()),
            "tokenizer": tokenizer.to_dict()["type"],
            "dtype": str(model.tok_emb.weight.dtype).replace("torch.", ""),
        },
    )


def _model_type(source: Path) -> str:
    return str(json.loads((source / "config.json").read_text(encoding="utf-8")).get("model_type"))
