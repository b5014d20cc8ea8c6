"""``poslab train --preset NAME [--quick] [--name RUN] [--resume|--overwrite] [--KEY VALUE ...]``.

Overrides: ``--KEY VALUE`` (or ``--KEY=VALUE``) for a :class:`poslab.train.TrainConfig` field,
``--model.KEY VALUE`` for a :class:`poslab.GPTConfig` field, ``--model.position_config.KEY VALUE``
for a field of the position scheme's config (or ``--model.position_config '{"base": 500}'``).
Values are checked against the field's type; ``none`` sets an optional field to ``None``; dashes in
keys are read as underscores (``--max-steps`` = ``--max_steps``). A key that does not exist is an
error suggesting the close one.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from poslab import presets
from poslab.data import CORPORA, build_tokenizer
from poslab.distributed import is_main_process
from poslab.lock import interrupted_start
from poslab.model import GPTConfig
from poslab.train import TrainConfig, TrainingDiverged, train

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _parse_value(key: str, text: str, hint: Any) -> Any:
    """Convert ``text`` to the type ``hint`` of field ``key`` or raise ``ValueError`` naming both."""
    args = typing.get_args(hint)
    if type(None) in args:
        if text.lower() in ("none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"--{key} expects true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--{key} expects an integer, got {text!r}") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"--{key} expects a number, got {text!r}") from None
    if hint is str:
        return text
    # dict / Any (position_config): a JSON or YAML mapping
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"--{key} expects a mapping such as '{{\"base\": 500}}', got {text!r}")
    return value


def _key_help() -> list[str]:
    train_keys = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "model"]
    model_keys = [f"model.{f.name}" for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size"]
    return train_keys + model_keys


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--max_steps", "20", "--model.n_head=8"]`` -> ``{"max_steps": 20, "model": {"n_head": 8}}``.

    Raises:
        ValueError: a token that is not ``--KEY``, a missing value, an unknown key (with the close
            one suggested) or a value of the wrong type.
    """
    train_hints = typing.get_type_hints(TrainConfig)
    model_hints = typing.get_type_hints(GPTConfig)
    result: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ValueError(f"unexpected argument {token!r}; overrides are written --KEY VALUE (e.g. --max_steps 20)")
        if "=" in token:
            raw_key, text = token[2:].split("=", 1)
            i += 1
        else:
            raw_key = token[2:]
            if i + 1 >= len(tokens):
                raise ValueError(f"--{raw_key} needs a value")
            text = tokens[i + 1]
            i += 2
        key = raw_key.replace("-", "_")
        parts = key.split(".")
        if parts[0] == "model" and len(parts) >= 2:
            field_name = parts[1]
            if field_name == "position_config" and len(parts) == 3:
                try:
                    value = yaml.safe_load(text)
                except yaml.YAMLError:
                    value = text
                model = result.setdefault("model", {})
                model.setdefault("position_config", {})[parts[2]] = value
                continue
            if len(parts) == 2 and field_name in model_hints and field_name != "vocab_size":
                value = _parse_value(key, text, model_hints[field_name])
                model = result.setdefault("model", {})
                if field_name == "position_config":
                    model.setdefault("position_config", {}).update(value)
                else:
                    model[field_name] = value
                continue
        elif len(parts) == 1 and key in train_hints and key != "model":
            result[key] = _parse_value(key, text, train_hints[key])
            continue
        candidates = _key_help()
        close = difflib.get_close_matches(key, candidates, n=1) or difflib.get_close_matches(
            f"model.{key}", candidates, n=1
        )
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise ValueError(f"unknown key --{raw_key}{hint}; see `poslab train --help` for the keys")
    return result


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides on top of a preset config (``model`` and ``model.position_config`` merge key by key)."""
    merged = {**base, **{k: v for k, v in overrides.items() if k != "model"}}
    model = dict(base.get("model", {}))
    for key, value in overrides.get("model", {}).items():
        if key == "position_config" and isinstance(model.get("position_config"), dict):
            model["position_config"] = {**model["position_config"], **value}
        else:
            model[key] = value
    if "position" in overrides.get("model", {}) and "position_config" not in overrides.get("model", {}):
        model["position_config"] = {}  # a new scheme starts from its own defaults
    merged["model"] = model
    return merged


def build_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` the command line describes."""
    overrides = parse_overrides(args.overrides or [])
    if args.preset:
        base = presets.preset_config(args.preset, quick=args.quick)
        default_name = Path(args.preset).stem if args.preset.endswith((".yaml", ".yml")) else args.preset
        default_name += "-quick" if args.quick else ""
    elif args.resume:
        if not args.name:
            raise ValueError("--resume without --preset needs --name RUN (the run folder to continue)")
        out_dir = overrides.get("out_dir", "runs")
        config_path = Path(out_dir) / args.name / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"cannot resume: {str(config_path)!r} does not exist")
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        base = {**saved["train"], "model": {k: v for k, v in saved["model"].items() if k != "vocab_size"}}
        default_name = args.name
    else:
        raise ValueError("give --preset NAME (see `poslab presets`), or --resume --name RUN")
    values = merge(base, overrides)
    values["name"] = args.name or overrides.get("name") or default_name
    return TrainConfig.from_dict(values)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a GPT from a preset with --KEY VALUE overrides",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="keys: " + ", ".join(_key_help()),
    )
    p.add_argument("--preset", help="preset name (see `poslab presets`) or a .yaml file")
    p.add_argument("--quick", action="store_true", help="the preset's short form (a few hundred steps)")
    p.add_argument("--name", help="run name (default: the preset's name, + '-quick')")
    p.add_argument("--resume", action="store_true", help="continue the run from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder of the same name")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (the summary still prints)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard the model with FSDP2 (fully_shard) instead of DDP (docs/scaling.md)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the config and the run folder, print the resolved config as JSON, write nothing")
    p.set_defaults(func=run, overrides=[])
    original = p.parse_known_args

    def parse_known_args(args=None, namespace=None):  # collect --KEY VALUE overrides instead of failing
        namespace, extras = original(args, namespace)
        namespace.overrides = list(getattr(namespace, "overrides", []) or []) + extras
        return namespace, []

    p.parse_known_args = parse_known_args


def dry_run(cfg: TrainConfig, resume: bool, overwrite: bool) -> dict[str, Any]:
    """What ``train`` would do with ``cfg``, checked without reading the corpus or writing anything.

    Checks the model config (with a placeholder vocabulary), the tokenizer spec, that the corpus is
    shipped or an existing file, and the run folder against ``--resume``/``--overwrite``.

    Raises:
        ValueError, TypeError, FileNotFoundError, FileExistsError: what ``train`` would raise.
    """
    GPTConfig.from_dict({**cfg.model, "vocab_size": 256})  # keys, types, geometry, position config
    build_tokenizer(cfg.tokenizer, "ab")  # the spec only (fitted on a two-character text)
    if cfg.corpus not in CORPORA and not Path(cfg.corpus).is_file():
        raise ValueError(f"corpus {cfg.corpus!r} is neither a shipped corpus ({', '.join(CORPORA)}) nor an existing file")
    run_dir = cfg.run_dir
    if resume and overwrite:
        raise ValueError("choose one of resume and overwrite, not both")
    occupied = run_dir.is_dir() and any(run_dir.iterdir()) and not interrupted_start(run_dir)
    is_run = (run_dir / "config.json").is_file()
    if resume and not is_run:
        raise FileNotFoundError(f"cannot resume: {str(run_dir)!r} has no config.json (not a poslab run)")
    if occupied and not resume and not overwrite:
        raise FileExistsError(
            f"run folder {str(run_dir)!r} already exists; pass --resume to continue it or --overwrite to replace it"
        )
    if occupied and overwrite and not is_run:
        raise FileExistsError(f"refusing to overwrite {str(run_dir)!r}: it is not a poslab run folder (no config.json)")
    action = "resume" if resume else ("overwrite" if occupied else "start")
    return {"dry_run": True, "action": action, "run_dir": str(run_dir), "config": cfg.to_dict()}


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.dry_run:
        print(json.dumps(dry_run(cfg, args.resume, args.overwrite), indent=2, ensure_ascii=False))
        return 0
    try:
        results = train(cfg, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
                        fsdp=getattr(args, "fsdp", False))
    except TrainingDiverged as err:
        if is_main_process():  # under torchrun every rank stops; rank 0 reports
            print(f"poslab: error: {err}", file=sys.stderr)
        return 1
    if is_main_process():
        print(f"run {cfg.run_dir}: val loss {results['final_val_loss']:.4f}, results in {cfg.run_dir / 'results.json'}")
    return 0
