"""Checkpoints: safetensors for tensors, JSON for everything else, every write atomic.

A checkpoint of step ``N`` in ``RUN/checkpoints/`` is two files plus a pointer::

    step_000000N.safetensors   model.* (parameters, tied copies stored once), optim.state.<i>.<key>
                               (AdamW moments and step counts), rng.<name> (RNG states as uint8);
                               its header holds the sha256 of the JSON's canonical content
    step_000000N.json          step, data position, config + its hash, optimizer param groups,
                               tied-weight aliases, the sha256 of the .safetensors file, extra state,
                               the digests of the run files it depends on (run_files_sha256)
    latest                     the name ``step_000000N`` of the newest complete checkpoint

Each file is written to a temporary name in the same folder, flushed, fsynced and renamed, in the
order tensors -> json -> latest; a checkpoint counts only once its JSON exists and the tensor file's
sha256 matches, so a kill at any moment leaves the previous checkpoint intact; a change to
either file (truncation, a flipped bit) is refused with :class:`CheckpointError`. Loading reads
safetensors and JSON only: no pickled code is ever run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from poslab.checks import is_int, is_number
from poslab.fileio import atomic_write, atomic_write_json, atomic_write_text, sha256_file
from poslab.safe_load import load_json

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest"
_STEP_RE = re.compile(r"^step_([0-9]{7,})$")  # ASCII digits only: int() would read other scripts' digits


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not belong to the run's config."""


def config_hash(config: dict) -> str:
    """sha256 of the canonical JSON of a config dict (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


# ------------------------------------------------------------------------------------ state <-> tensors
def model_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's state dict with tied tensors stored once.

    Returns:
        ``(tensors, aliases)``: ``tensors`` maps ``model.<key>`` to a contiguous CPU tensor;
        ``aliases`` maps a tied key to the key actually stored (e.g. ``lm_head.weight`` ->
        ``tok_emb.weight``).
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
    for key, value in model.state_dict().items():
        ident = (
            value.untyped_storage().data_ptr() + value.storage_offset() * value.element_size(),
            tuple(value.shape),
            value.dtype,
        )
        if ident in seen:
            aliases[key] = seen[ident]
            continue
        seen[ident] = key
        tensors[f"model.{key}"] = value.detach().to("cpu").contiguous()
    return tensors, aliases


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors (``optim.state.<i>.<key>``) and JSON metadata."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.state.{index}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def training_state_problem(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str | None:
    """What makes a checkpoint's training state unusable (its checksums may be consistent: a forgery), or ``None``.

    Checks the RNG states (``uint8`` vectors of the size torch's generators use), the optimizer's
    ``param_groups`` (a list of mappings with integer ``params``) and per-parameter scalars, the
    ``step`` counters (one number each), the running numbers of the loop, the parameter-name aliases and
    the best validation loss so far.
    """
    sizes = {"rng.torch": torch.get_rng_state().numel(), "rng.data": torch.Generator().get_state().numel()}
    for name, value in tensors.items():
        base = name.split(".rank")[0] if name.startswith("rng.torch.rank") else name
        if base in sizes and (value.dtype != torch.uint8 or value.dim() != 1 or value.numel() != sizes[base]):
            return (
                f"holds an unusable random-generator state {name!r} ({value.dtype}, shape {list(value.shape)}; "
                f"torch's is uint8 [{sizes[base]}])"
            )
        if name.startswith("optim.state.") and name.endswith(".step") and value.numel() != 1:
            return f"holds an optimizer step counter {name!r} of shape {list(value.shape)}, not one number"
    optimizer = meta.get("optimizer")
    groups = optimizer.get("param_groups") if isinstance(optimizer, dict) else None
    if (
        not isinstance(groups, list)
        or not groups
        or not all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(is_int(i) for i in g["params"])
            for g in groups
        )
    ):
        return "has unusable optimizer param_groups (a list of mappings with integer 'params' is needed)"
    scalars = optimizer.get("scalars", {})
    if not isinstance(scalars, dict) or not all(isinstance(v, dict) and str(k).isdecimal() for k, v in scalars.items()):
        return "has unusable optimizer scalars (a mapping of parameter index to values is needed)"
    for key in ("log_loss_sum", "log_loss_count", "tokens_seen"):
        value = meta.get(key)
        if not is_number(value) or not math.isfinite(value):
            return f"has an unusable {key!r}: {value!r} (a finite number is needed)"
    aliases = meta.get("model_aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        return f"has unusable model_aliases {aliases!r} (a mapping of parameter names to parameter names is needed)"
    best = meta.get("best")
    loss, step = (best.get("val_loss"), best.get("step")) if isinstance(best, dict) else (None, None)
    if (
        not isinstance(best, dict)
        or set(best) != {"val_loss", "step"}
        or not (loss is None or (is_number(loss) and math.isfinite(loss)))
        or not (step is None or (is_int(step) and step >= 0))
    ):
        return (
            f"has an unusable 'best' {best!r} (a mapping of 'val_loss' (a finite number or null) and 'step' is needed)"
        )
    return None


#: what a checkpoint must hold to continue training (a model-only one can still be sampled)
_TRAINING_META = ("optimizer", "log_loss_sum", "log_loss_count", "best", "tokens_seen")
_TRAINING_TENSORS = ("rng.torch", "rng.data")


def training_state_missing(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> list[str]:
    """What a checkpoint lacks to continue training exactly (``[]`` when it has it all)."""
    missing = [key for key in _TRAINING_TENSORS if key not in tensors]
    missing += [f"{key!r} in its JSON" for key in _TRAINING_META if key not in meta]
    optimizer = meta.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("param_groups"), list):
        for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
            # AdamW groups (they have betas) keep exp_avg/exp_avg_sq, Muon groups a momentum_buffer per parameter
            indices = [
                i
                for group in optimizer["param_groups"]
                if isinstance(group, dict) and (("betas" in group) == (key != "momentum_buffer"))
                for i in group.get("params", [])
            ]
            if (
                any(f"optim.state.{i}.{key}" not in tensors for i in indices)
                and f"the optimizer's {key}" not in missing
            ):
                missing.append(f"the optimizer's {key}")
    elif "optimizer" in meta:
        missing.append("the optimizer's param_groups")
    return missing


#: the key of a checkpoint's JSON recording the digests of the run files the checkpoint depends on
RUN_FILES = "run_files_sha256"


def run_file_digests(config_doc: dict, tokenizer: Path) -> dict[str, str | None]:
    """sha256 of what a run's model and inputs are rebuilt from, beyond the config identity a checkpoint
    already records (``config``): ``config.json``'s sections other than ``model``/``train`` and
    ``distributed`` (the data: corpus and tokenizer digests, split sizes; what an averaged run comes from)
    as canonical JSON, and
    ``tokenizer.json``'s bytes (``None`` when absent).

    A checkpoint records them (:data:`RUN_FILES`) and its own checksums cover the record, so a tokenizer
    edited together with the digest ``config.json`` keeps of it no longer matches the checkpoint.
    """
    # the process layout (world size, FSDP) is not an input: a run may resume under another one
    other = {k: v for k, v in config_doc.items() if k not in ("model", "train", "distributed")}
    if isinstance(other.get("data"), dict):  # the tokenizer's own digest below names the file that changed
        other["data"] = {k: v for k, v in other["data"].items() if k != "tokenizer_sha256"}
    return {
        "tokenizer.json": sha256_file(tokenizer) if tokenizer.is_file() else None,
        "config.json": config_hash(other),
    }


def check_run_files(meta: dict[str, Any], current: dict[str, str | None], run_dir: Path) -> None:
    """Refuse a checkpoint whose recorded :func:`run_file_digests` differ from ``current`` (the run's files now).

    A checkpoint that records none (an older format) loads without that check.

    Raises:
        CheckpointError: naming the changed file and the checkpoint.
    """
    recorded = meta.get(RUN_FILES)
    if recorded is None:
        return
    where = f"checkpoint step {meta.get('step')} of {str(run_dir)!r}"
    if not isinstance(recorded, dict) or not set(current) <= set(recorded):
        raise CheckpointError(f"{where} has an unusable {RUN_FILES!r} record: {recorded!r:.80}")
    for name, digest in current.items():
        if recorded[name] != digest:
            part = "the data section of " if name == "config.json" else ""
            raise CheckpointError(
                f"{part}{str(run_dir / name)!r} was changed after {where} was written "
                f"(sha256 {str(digest)[:16]}… vs {str(recorded[name])[:16]}… recorded in the checkpoint); "
                "the model cannot be rebuilt with the inputs it was trained on"
            )


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Load what :func:`optimizer_tensors` saved into ``optimizer``.

    Raises:
        CheckpointError: a state tensor whose shape is not its parameter's, or a state torch refuses.
    """
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if not name.startswith("optim.state."):
            continue
        index, key = name[len("optim.state.") :].split(".", 1)
        state.setdefault(int(index), {})[key] = value
    for index, entry in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(entry)
    groups = meta["param_groups"]
    for group in groups:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    inner = getattr(optimizer, "optimizer", optimizer)  # FSDP's loader wraps the optimizer it fills
    params = [p for group in inner.param_groups for p in group["params"]]
    for index, entry in state.items():
        if not 0 <= index < len(params):
            raise CheckpointError(f"checkpoint optimizer state names parameter {index}; the model has {len(params)}")
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and key != "step" and tuple(value.shape) != tuple(params[index].shape):
                raise CheckpointError(
                    f"checkpoint optimizer state {index}.{key} has shape {list(value.shape)}, "
                    f"its parameter {list(params[index].shape)}"
                )
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"checkpoint optimizer state does not load: {message}") from None


def restore_model(model: nn.Module, tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> None:
    """Load ``model.*`` tensors (and tied aliases) strictly; raises :class:`CheckpointError` listing bad keys."""
    state = {name[len("model.") :]: value for name, value in tensors.items() if name.startswith("model.")}
    for key, source in aliases.items():
        if source in state:
            state[key] = state[source]
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    wrong_kind = sorted(
        k
        for k in set(expected) & set(state)
        if expected[k].is_floating_point() != state[k].is_floating_point()
        or (state[k].dtype == torch.bool) != (expected[k].dtype == torch.bool)
    )
    if wrong_kind:  # an int64/uint8/bool tensor would be cast silently into a float weight (or the reverse)
        raise CheckpointError(
            "checkpoint does not fit the model: wrong dtype "
            + ", ".join(
                f"{k}: checkpoint {str(state[k].dtype).removeprefix('torch.')} vs model "
                f"{str(expected[k].dtype).removeprefix('torch.')}"
                for k in wrong_kind[:8]
            )
        )
    if (missing or unexpected) and not wrong_shape:
        # a module may rename its own keys on load (Transformer-XL's pre-per-layer ``r_proj.weight``,
        # ``_load_from_state_dict``): torch's own key accounting, after those hooks, has the last word
        result = model.load_state_dict(state, strict=False)
        if not result.missing_keys and not result.unexpected_keys:
            return
    if missing or unexpected or wrong_shape:
        parts = []
        if missing:
            parts.append(f"missing {missing[:8]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:8]}")
        if wrong_shape:
            parts.append(
                "shape mismatch "
                + ", ".join(
                    f"{k}: checkpoint {list(state[k].shape)} vs model {list(expected[k].shape)}"
                    for k in wrong_shape[:8]
                )
            )
        raise CheckpointError("checkpoint does not fit the model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


# ------------------------------------------------------------------------------------ save / find / load
def save_checkpoint(
    run_dir: str | Path,
    step: int,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    keep: int = 0,
) -> Path:
    """Write checkpoint ``step`` atomically and point ``latest`` at it.

    Args:
        run_dir: the run folder.
        step: optimizer steps completed.
        tensors: every tensor to store (names as in the module docstring).
        meta: JSON-serialisable metadata (``step`` and ``sha256`` are added).
        keep: keep only the newest ``keep`` checkpoints (0 = keep all); ``latest`` is never removed.

    Returns:
        Path of the JSON file.

    Raises:
        OSError: a write failed (disk full, I/O error), naming the file; safetensors' own error is turned
            into it. Nothing of the new checkpoint is left (a tensor file whose JSON could not be written
            is deleted), and ``latest`` still names the previous complete checkpoint.
    """
    folder = Path(run_dir) / CHECKPOINT_DIR
    folder.mkdir(exist_ok=True)  # in the run folder, never recreated here
    name = checkpoint_name(step)
    tensor_path = folder / f"{name}.safetensors"
    meta = {**meta, "step": step, "tensors_file": tensor_path.name}
    # the tensor file's header records a checksum of the JSON (all but "sha256"), and the JSON records
    # the tensor file's sha256: a change to either file is detected on load
    header = {"format": "poslab-checkpoint", "step": str(step), "meta_sha256": config_hash(meta)}
    atomic_write(tensor_path, lambda tmp: save_file(tensors, str(tmp), metadata=header))  # OSError names the file
    json_path = folder / f"{name}.json"
    try:
        meta = {**meta, "sha256": sha256_file(tensor_path)}
        atomic_write_json(json_path, meta)
    except Exception:  # e.g. the disk filled up: an unlisted tensor file would only hold on to the space
        with contextlib.suppress(OSError):
            tensor_path.unlink()
        raise
    atomic_write_text(folder / LATEST, name + "\n")
    if keep and keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            if old != step:  # the big tensor file first: a kill in between leaves a small stray JSON, not GBs
                for suffix in (".safetensors", ".json"):
                    (folder / f"{checkpoint_name(old)}{suffix}").unlink(missing_ok=True)
    return json_path


def list_checkpoints(run_dir: str | Path) -> list[int]:
    """Steps of the checkpoints whose JSON exists, ascending (integrity is checked on load)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    steps = []
    for path in folder.glob("step_*.json"):
        match = _STEP_RE.match(path.stem)
        if match and (folder / f"{path.stem}.safetensors").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(run_dir: str | Path) -> int | None:
    """Step named by ``checkpoints/latest``, else the newest listed checkpoint, else ``None``."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    pointer = folder / LATEST
    if pointer.is_file():
        match = _STEP_RE.match(pointer.read_text(encoding="utf-8", errors="replace").strip())
        if match and (folder / f"{match.group(0)}.json").is_file():
            return int(match.group(1))
    steps = list_checkpoints(run_dir)
    return steps[-1] if steps else None


def load_checkpoint(run_dir: str | Path, step: int | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read and verify checkpoint ``step`` (default: ``latest``) of a run.

    Returns:
        ``(tensors, meta)``.

    Raises:
        CheckpointError: no checkpoint, a step that does not exist, or a tensor file whose sha256
            differs from the one recorded (truncated or altered).
    """
    run_dir = Path(run_dir)
    if step is None:
        step = latest_step(run_dir)
        if step is None:
            raise CheckpointError(f"run {str(run_dir)!r} has no checkpoint in {CHECKPOINT_DIR}/")
    available = list_checkpoints(run_dir)
    if step not in available:
        raise CheckpointError(f"run {str(run_dir)!r} has no checkpoint of step {step}; available steps: {available}")
    folder = run_dir / CHECKPOINT_DIR
    name = checkpoint_name(step)
    json_path = folder / f"{name}.json"
    try:
        meta = load_json(json_path.read_text(encoding="utf-8"), str(json_path))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, too deep: truncated or altered
        raise CheckpointError(f"checkpoint {json_path} is corrupt: not readable JSON ({err})") from None
    except OSError as err:  # a folder in its place, unreadable permissions, an I/O error
        raise CheckpointError(f"checkpoint {json_path} cannot be read: {err.strerror or err}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {json_path} is corrupt: it holds a {type(meta).__name__}, not a JSON object")
    tensor_path = folder / f"{name}.safetensors"
    try:
        digest = sha256_file(tensor_path)
    except OSError as err:
        raise CheckpointError(f"checkpoint {tensor_path} cannot be read: {err.strerror or err}") from None
    if digest != meta.get("sha256"):
        raise CheckpointError(
            f"checkpoint {tensor_path} is corrupt: sha256 {digest[:16]}… "
            f"differs from the recorded {str(meta.get('sha256'))[:16]}…"
        )
    try:
        with safe_open(str(tensor_path), framework="pt") as handle:
            header = handle.metadata() or {}
        tensors = load_file(str(tensor_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {tensor_path} is not a readable safetensors file: {err}") from None
    recorded = header.get("meta_sha256")  # a header without one (an older format) skips this check
    if recorded is not None and config_hash({k: v for k, v in meta.items() if k != "sha256"}) != recorded:
        raise CheckpointError(
            f"checkpoint {json_path} is corrupt: its content differs from the checksum in {tensor_path.name}"
        )
    if meta.get("step") != step:
        raise CheckpointError(f"checkpoint {json_path} is corrupt: it records step {meta.get('step')!r}, not {step}")
    return tensors, meta


def config_mismatch(saved: dict, current: dict, prefix: str = "", saved_label: str = "checkpoint") -> list[str]:
    """Keys (dotted) whose values differ between two nested config dicts, as
    ``key: saved (saved_label) vs current (now)``."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines.extend(config_mismatch(a, b, f"{prefix}{key}.", saved_label))
        elif a != b:
            lines.append(f"{prefix}{key}: {a!r} ({saved_label}) vs {b!r} (now)")
    return lines


__all__ = [
    "RUN_FILES",
    "CheckpointError",
    "check_run_files",
    "config_hash",
    "config_mismatch",
    "latest_step",
    "list_checkpoints",
    "load_checkpoint",
    "model_tensors",
    "optimizer_tensors",
    "restore_model",
    "restore_optimizer",
    "run_file_digests",
    "save_checkpoint",
    "training_state_missing",
    "training_state_problem",
]
