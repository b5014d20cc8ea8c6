"""``poslab train --preset NAME [--quick] [--name RUN] [--resume|--overwrite] [--KEY VALUE ...]``.

Overrides: ``--KEY VALUE`` (or ``--KEY=VALUE``) for a :class:`poslab.training.config.TrainConfig` field,
``--model.KEY VALUE`` for a :class:`poslab.GPTConfig` field, ``--model.position_config.KEY VALUE``
for a field of the position scheme's config (or ``--model.position_config '{"base": 500}'``).
Values are checked against the field's type; ``none`` sets an optional field to ``None``; dashes in
keys are read as underscores (``--max-steps`` = ``--max_steps``). A key that does not exist is an
error suggesting the close one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from poslab.cli import paths
from poslab.config import key_help, merge, parse_overrides, preflight
from poslab.nn.footprint import check_training, parameter_count
from poslab.runs import RunFolder
from poslab.session import train
from poslab.training import presets
from poslab.training.config import TrainConfig
from poslab.training.distributed import is_main_process
from poslab.training.loop import TrainingDiverged


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
        run = RunFolder(Path(overrides.get("out_dir", "runs")) / args.name)
        if not run.is_run:
            raise FileNotFoundError(f"cannot resume: {str(run.file('config.json'))!r} does not exist")
        base = run.train_config().to_dict()
        default_name = args.name
    else:
        raise ValueError("give --preset NAME (see `poslab presets`), or --resume --name RUN")
    values = merge(base, overrides)
    values["name"] = args.name or overrides.get("name") or default_name
    return TrainConfig.from_dict(values)


def resume_or_start(cfg: TrainConfig, resume: bool) -> bool:
    """``--resume`` of a run whose folder does not exist yet (killed before it was made, or a retry script
    that always passes ``--resume``) starts it instead, saying so; the full config is on the command line."""
    run_dir = cfg.run_dir
    if resume and not RunFolder(run_dir).is_run and not (run_dir.is_dir() and any(run_dir.iterdir())):
        print(f"poslab: note: {str(run_dir)!r} does not exist yet: --resume starts the run", file=sys.stderr)
        return False
    return resume


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a GPT from a preset with --KEY VALUE overrides",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="keys: " + ", ".join(key_help()),
    )
    p.add_argument("--preset", help="preset name (see `poslab presets`) or a .yaml file")
    p.add_argument("--quick", action="store_true", help="the preset's short form (a few hundred steps)")
    p.add_argument("--name", help="run name (default: the preset's name, + '-quick')")
    p.add_argument("--resume", action="store_true", help="continue the run from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder of the same name")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar (the summary still prints)")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard the model with FSDP2 (fully_shard) instead of DDP (docs/scaling.md)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and the run folder, print the resolved config as JSON, write nothing",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="train even when the memory estimate says the model cannot fit this machine",
    )
    p.set_defaults(func=run, overrides=[])
    original = p.parse_known_args

    def parse_known_args(args=None, namespace=None):  # collect --KEY VALUE overrides instead of failing
        namespace, extras = original(args, namespace)
        namespace.overrides = list(getattr(namespace, "overrides", []) or []) + extras
        return namespace, []

    p.parse_known_args = parse_known_args


def dry_run(cfg: TrainConfig, resume: bool, overwrite: bool) -> dict[str, Any]:
    """What ``train`` would do with ``cfg``, checked without reading the corpus or writing anything
    (:func:`poslab.config.preflight`, shared with ``poslab sweep``).

    Raises:
        ValueError, TypeError, FileNotFoundError, FileExistsError: what ``train`` would raise.
    """
    action = preflight(cfg, resume=resume, overwrite=overwrite)
    per_step = cfg.batch_size * cfg.grad_accum * cfg.model.block_size
    params = parameter_count({"vocab_size": 256, **cfg.to_dict()["model"]})  # the vocabulary before the corpus is read
    cost = {  # what the training will cost, before it is paid (6 FLOPs per parameter and token: forward + backward)
        "tokens_per_step": per_step,
        "tokens": per_step * cfg.max_steps,
        "parameters_estimate": params,
        "flops_estimate": float(6 * params * per_step * cfg.max_steps),
    }
    return {"dry_run": True, "action": action, "run_dir": str(cfg.run_dir), "cost": cost, "config": cfg.to_dict()}


def run(args: argparse.Namespace) -> int:
    paths.run_name(args.name)  # '' or a newline: refused, not replaced or accepted
    cfg = build_config(args)
    paths.writable_folder(cfg.out_dir, "--out_dir")
    if cfg.init_from:
        paths.run_folder(cfg.init_from, "--init_from")
    check_training(cfg.model, cfg.batch_size, cfg.eval_iters, force=args.force)  # before anything is built
    resume = resume_or_start(cfg, args.resume) if args.preset else args.resume
    if args.dry_run:
        print(json.dumps(dry_run(cfg, resume, args.overwrite), indent=2, ensure_ascii=False))
        return 0
    try:
        results = train(
            cfg,
            resume=resume,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            fsdp=getattr(args, "fsdp", False),
        )
    except TrainingDiverged as err:
        if is_main_process():  # under torchrun every rank stops; rank 0 reports
            print(f"poslab: error: {err}", file=sys.stderr)
        return 1
    if is_main_process():
        print(f"run {cfg.run_dir}: val loss {results['final_val_loss']:.4f}, results in {cfg.run_dir / 'results.json'}")
    return 0
