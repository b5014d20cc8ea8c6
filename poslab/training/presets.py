"""Named training presets (``poslab presets`` lists them; ``poslab train --preset NAME``).

A preset is a partial :class:`poslab.training.config.TrainConfig` (flat training keys plus a ``model`` dict
of :class:`poslab.GPTConfig` fields) with a description and a ``quick`` variant (``--quick``).
``--preset FILE.yaml`` loads the same structure from a YAML file (``yaml.safe_load`` only).

* ``tang-small``: seed 001's GPT (4 heads, n_embd 128, block 128; the lesson does not give the depth,
  poslab uses 4 layers as nanoGPT's small recipe) on the five-character Tang poems, char-level.
* ``tang-demo``: the demo poem model ``make demo`` samples: ``tang-small``'s GPT with RoPE instead of
  learned positions (relative positions let it count the characters since the last comma) and a
  64-character block, 600 steps of 16 x 64 under warmup-stable-decay (lr 2e-3 after a 30-step warmup,
  held until step 360, then linear to 1e-4), one evaluation at the end: an estimated 67-74 s of
  training on 2 quiet cores. Over three seeds 96% of its sampled line segments have five characters
  (``，`` and ``。`` close them) and its validation loss sits 0.28-0.30 nats below the bigram's, where the
  lab's ``tang-small`` quick model, vanilla as the lesson has it, scans about half the time
  (``benchmarks/tang_demo.py``, ``benchmarks/README.md``).
* ``shakespeare-char``: nanoGPT's README CPU recipe for shakespeare_char (4 layers, 4 heads, n_embd
  128, block 64, batch 12, 2000 iters, lr 1e-3 decayed to 1e-4 at 2000, warmup 100, beta2 0.99,
  weight decay 0.1, grad clip 1.0, no bias, dropout 0, 20 eval batches): nanoGPT reports val loss 1.88.

Both GPT presets use the exact GELU (``mlp: {activation: gelu}``) as nanoGPT's ``nn.GELU()`` does, rather
than GPT-2's tanh approximation (poslab's ``GPTConfig`` default): on CPU its forward + backward
costs about half as much.
* ``shakespeare-char-fast``: time to quality (``benchmarks/time_to_loss.py``): the ``shakespeare-char``
  model with 3 layers instead of 4, an MLP of hidden width 256 (2x n_embd, not GPT-2's 4x) and RoPE:
  0.74x the 3-layer 4x-MLP step's cost in fp32, 0.85x in bf16 (``benchmarks/preset_step_cost.py``).
  Warmup-stable-decay: lr 3e-3 (warmup 50) held until step 600, then linear to 0 at step 900, the
  last step; AdamW beta2 0.95; dtype auto. The whole validation split is evaluated once, at step
  900, where the run ends, reached val 1.90 (``stop_val_loss``) or not: after a decay to 0 more
  steps would change nothing. Chosen on seeds 3, 4 and 5 (not the benchmark's), where it reaches
  1.90 in fp32 and in bf16 (``benchmarks/README.md``, "Time to quality"). The recipe's windows
  (block 64, batch 12) keep its whole-split loss comparable with nanoGPT's.
* ``shakespeare-char-gpu``: nanoGPT's GPU recipe for shakespeare_char (``config/train_shakespeare_char.py``:
  6 layers, 6 heads, n_embd 384, block 256, batch 64, dropout 0.2, 5000 iters, lr 1e-3 decayed to 1e-4,
  warmup 100, beta2 0.99; nanoGPT reports val about 1.47 in about 3 minutes on one A100) with the
  levers of ``shakespeare-char-fast`` that carry over unmeasured: RoPE, dtype auto (bf16 where the GPU
  supports it), the whole validation split every 250 steps, stopping at val 1.47. Not yet run on a GPU:
  ``benchmarks/gpu_check.sh`` measures it against nanoGPT's model side by side.
* ``tiny``: a seconds-long run for tests and smoke checks.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from poslab.data import safe_yaml

# nanoGPT's shakespeare_char optimisation and logging settings, shared by the Tang and Shakespeare presets
NANOGPT_SCHEDULE: dict[str, Any] = {
    "lr": 1e-3,
    "min_lr": 1e-4,
    "warmup_steps": 100,
    "beta2": 0.99,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "eval_interval": 250,
    "eval_iters": 20,
    "log_interval": 10,
    "ckpt_interval": 500,
}

#: every preset's precision: bf16 only where it measured faster on this machine (poslab.training.precision)
AUTO_DTYPE: dict[str, Any] = {"dtype": "auto"}

#: seed 001's Tang-poem GPT (the lesson gives 4 heads, n_embd 128, block 128; 4 layers is nanoGPT's small depth)
TANG_MODEL: dict[str, Any] = {
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 128,
    "dropout": 0.0,
    "bias": True,
    "position": "learned",
    "mlp": {"activation": "gelu"},
}

PRESETS: dict[str, dict[str, Any]] = {
    "tang-small": {
        "description": "seed 001's GPT (4 layers, 4 heads, n_embd 128, block 128) on five-character Tang poems",
        "config": {
            "corpus": "tang5",
            "tokenizer": "char",
            "model": TANG_MODEL,
            "max_steps": 2000,
            "batch_size": 32,
            **NANOGPT_SCHEDULE,
            **AUTO_DTYPE,
        },
        # quick: 300 steps of 12 x 128 tokens, about 90 s on 2 cores (the budget: 2 minutes), and
        # about half its sampled line segments have five characters (44-53%, benchmarks/tang_demo.py; the
        # demo poem model is tang-demo); lr 2e-3 measured val 6.00 vs 6.10 for 1e-3 at 400 x 16
        "quick": {
            "max_steps": 300,
            "batch_size": 12,
            "lr": 2e-3,
            "min_lr": 2e-4,
            "lr_decay_steps": 300,
            "warmup_steps": 30,
            "eval_interval": 100,
            "eval_iters": 10,
            "ckpt_interval": 150,
        },
    },
    "tang-demo": {
        "description": (
            "the demo poem model: tang-small's GPT (4/4/128) with RoPE instead of learned positions and a "
            "64-character block, 600 steps of 16 x 64 under warmup-stable-decay at lr 2e-3 (about 70 s of "
            "training on 2 cores); its poems scan"
        ),
        "config": {
            "corpus": "tang5",
            "tokenizer": "char",
            "model": {**TANG_MODEL, "position": "rope", "block_size": 64},
            "max_steps": 600,
            "lr_decay_steps": 600,
            "cooldown_steps": 240,
            "batch_size": 16,
            **NANOGPT_SCHEDULE,
            "lr": 2e-3,
            "warmup_steps": 30,
            # one evaluation, at the end: evaluations count in the 90 s budget
            "eval_interval": 600,
            "ckpt_interval": 300,
            **AUTO_DTYPE,
        },
        "quick": {
            "max_steps": 150,
            "lr_decay_steps": 150,
            "cooldown_steps": 60,
            "warmup_steps": 15,
            "eval_interval": 75,
            "eval_iters": 5,
            "ckpt_interval": 75,
        },
    },
    "shakespeare-char": {
        "description": (
            "nanoGPT's CPU shakespeare_char recipe (4/4/128, block 64, batch 12, 2000 iters; nanoGPT: val 1.88)"
        ),
        "config": {
            "corpus": "shakespeare",
            "tokenizer": "char",
            "model": {
                "n_layer": 4,
                "n_head": 4,
                "n_embd": 128,
                "block_size": 64,
                "dropout": 0.0,
                "bias": False,
                "position": "learned",
                "mlp": {"activation": "gelu"},
            },
            "max_steps": 2000,
            "lr_decay_steps": 2000,
            "batch_size": 12,
            **NANOGPT_SCHEDULE,
            **AUTO_DTYPE,
        },
        "quick": {
            "max_steps": 300,
            "lr_decay_steps": 300,
            "warmup_steps": 30,
            "eval_interval": 100,
            "ckpt_interval": 100,
        },
    },
    "shakespeare-char-fast": {
        "description": (
            "time to quality: the shakespeare-char model with 3 layers, a 2x MLP (hidden 256) and RoPE, "
            "warmup-stable-decay at lr 3e-3 to 0 at step 900, beta2 0.95 and the measured faster precision "
            "(dtype auto); stops at whole-split val 1.90 (benchmarks/time_to_loss.py)"
        ),
        "config": {
            "corpus": "shakespeare",
            "tokenizer": "char",
            "model": {
                "n_layer": 3,
                "n_head": 4,
                "n_embd": 128,
                "block_size": 64,
                "dropout": 0.0,
                "bias": False,
                "position": "rope",
                # half GPT-2's 4x width: 0.74x the step in fp32 (0.85x in bf16), and with the schedule
                # below it crosses 1.90 at step 900 at every selection seed
                "mlp": {"activation": "gelu", "hidden": 256},
            },
            "max_steps": 900,
            "lr_decay_steps": 900,
            "cooldown_steps": 300,
            "batch_size": 12,
            **NANOGPT_SCHEDULE,
            "lr": 3e-3,
            "min_lr": 0.0,
            "beta2": 0.95,
            "warmup_steps": 50,
            **AUTO_DTYPE,
            # one whole-split evaluation, at the last step, where the decay to 0 ends: an earlier one
            # cannot reach 1.90 (val about 2.1 at step 450) and costs a whole-split pass
            "eval_interval": 900,
            "eval_iters": 0,
            "stop_val_loss": 1.90,
        },
        "quick": {
            "max_steps": 200,
            "lr_decay_steps": 200,
            "cooldown_steps": 70,
            "warmup_steps": 20,
            "eval_interval": 100,
            "eval_iters": 10,
            "ckpt_interval": 100,
            "stop_val_loss": None,
        },
    },
    "shakespeare-char-gpu": {
        "description": (
            "nanoGPT's GPU shakespeare_char recipe (6/6/384, block 256, batch 64, dropout 0.2, 5000 iters; "
            "nanoGPT: val about 1.47) with RoPE and dtype auto; stops at whole-split val 1.47 "
            "(benchmarks/time_to_loss.py --recipe gpu)"
        ),
        "config": {
            "corpus": "shakespeare",
            "tokenizer": "char",
            "model": {
                "n_layer": 6,
                "n_head": 6,
                "n_embd": 384,
                "block_size": 256,
                "dropout": 0.2,
                "bias": False,
                "position": "rope",
                "mlp": {"activation": "gelu"},
            },
            "max_steps": 5000,
            "lr_decay_steps": 5000,
            "batch_size": 64,
            **NANOGPT_SCHEDULE,
            **AUTO_DTYPE,
            "eval_iters": 0,
            "stop_val_loss": 1.47,
        },
        "quick": {
            "max_steps": 200,
            "lr_decay_steps": 200,
            "warmup_steps": 20,
            "eval_interval": 100,
            "eval_iters": 10,
            "ckpt_interval": 100,
            "stop_val_loss": None,
        },
    },
    "tiny": {
        "description": "a seconds-long smoke run (2 layers, 2 heads, n_embd 32, block 32) on tinyshakespeare",
        "config": {
            "corpus": "shakespeare",
            "tokenizer": "char",
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0, "position": "learned"},
            "max_steps": 40,
            "batch_size": 8,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_steps": 5,
            "eval_interval": 20,
            "eval_iters": 4,
            "log_interval": 5,
            "ckpt_interval": 20,
            **AUTO_DTYPE,
        },
        "quick": {"max_steps": 20, "eval_interval": 10, "ckpt_interval": 10},
    },
}


def names() -> list[str]:
    """Preset names, in listing order."""
    return list(PRESETS)


def load_preset_file(path: str | Path) -> dict[str, Any]:
    """A preset from a YAML file: ``{description?, config: {...}, quick?: {...}}`` or just the config mapping."""
    path = Path(path)
    try:
        data = safe_yaml.load(path.read_text(encoding="utf-8"), f"preset file {str(path)!r}")  # refuses alias bombs
    except UnicodeDecodeError as err:
        raise ValueError(f"preset file {str(path)!r} is not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:  # one line: the problem and where (the YAML text itself may be anything)
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
        raise ValueError(f"preset file {str(path)!r} is not valid YAML{where}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"preset file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    if "config" not in data:
        data = {"description": f"from {path.name}", "config": data}
    unknown = set(data) - {"description", "config", "quick"}
    if unknown:
        raise ValueError(
            f"preset file {str(path)!r} has unknown top-level keys {sorted(unknown)}; "
            "allowed: description, config, quick"
        )
    return data


def get(name: str) -> dict[str, Any]:
    """A deep copy of preset ``name`` (a registered name or a ``.yaml``/``.yml`` file path).

    Raises:
        ValueError: an unknown name (suggests the close one and lists the known).
    """
    if name.endswith((".yaml", ".yml")):
        return load_preset_file(name)
    if name not in PRESETS:
        import difflib

        close = difflib.get_close_matches(name, list(PRESETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown preset {name!r}{hint}; known: {', '.join(PRESETS)} (or a .yaml file)")
    return copy.deepcopy(PRESETS[name])


def preset_config(name: str, quick: bool = False) -> dict[str, Any]:
    """The config mapping of a preset (with its ``quick`` overrides applied when ``quick``)."""
    preset = get(name)
    config = copy.deepcopy(preset["config"])
    if quick:
        for key, value in preset.get("quick", {}).items():
            if key == "model":
                config.setdefault("model", {}).update(value)
            else:
                config[key] = value
    return config


__all__ = ["PRESETS", "get", "load_preset_file", "names", "preset_config"]
