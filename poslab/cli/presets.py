"""``poslab presets [NAME]``: list the training presets, or show one in full."""

from __future__ import annotations

import argparse
import json

from poslab.training import presets


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list the training presets (or show one: poslab presets NAME)")
    p.add_argument("name", nargs="?", help="show this preset's full config and its --quick overrides")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name:
        preset = presets.get(args.name)
        print(json.dumps(preset, indent=2, ensure_ascii=False))
        return 0
    print(
        f"{'preset':18s} {'model (layers/heads/n_embd/block)':34s} {'corpus':12s} "
        f"{'steps':>6s} {'quick':>6s}  description"
    )
    for name in presets.names():
        preset = presets.get(name)
        config, model = preset["config"], preset["config"].get("model", {})
        dims = f"{model.get('n_layer')}/{model.get('n_head')}/{model.get('n_embd')}/{model.get('block_size')}"
        quick = preset.get("quick", {}).get("max_steps", "")
        print(
            f"{name:18s} {dims:34s} {config.get('corpus', ''):12s} {config.get('max_steps', ''):>6} {quick:>6}  "
            f"{preset['description']}"
        )
    print("\nuse: poslab train --preset NAME [--quick] [--KEY VALUE ...]; details: poslab presets NAME")
    return 0
