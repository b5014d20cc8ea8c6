"""Stacked training: several independent GPTs trained as one batched model in one process.

The lab trains many small models (seeds x schemes) at widths where one core is mostly idle: a
``[16, 64] @ [64, 192]`` matmul costs little more than its launch. :func:`train_stacked` stacks ``M``
models of one geometry (``torch.func.stack_module_state``: every parameter gets a leading member
dimension ``[M, ...]``), runs their forward passes as one ``torch.vmap``-ed ``functional_call`` (each
matmul becomes one batched matmul over the members) and updates them with one fused AdamW over the
stacked tensors. Each member is the model :func:`poslab.training.loop.run_training` would train with
its config alone:

* the same initialisation (``torch.manual_seed(seed)`` then ``GPT(config)``);
* the same batches (its own generator seeded with :func:`~poslab.training.data.data_seed`, drawn
  with :func:`poslab.data.get_batch` in the same order, ``grad_accum`` micro-batches per step);
* the same loss (mean next-token cross-entropy, fp32) and gradient (the members' losses are summed
  before the backward pass; no member's loss depends on another's parameters, so each member's
  gradient is its own);
* the same clipping (each member's global gradient norm clipped to ``grad_clip`` as
  ``torch.nn.utils.clip_grad_norm_`` does) and the same AdamW (nanoGPT's weight-decay groups, the
  fused kernel, the shared :func:`~poslab.training.optim.lr_at` schedule). AdamW is elementwise, so
  one update of the stacked tensors is each member's update.

``tests/test_batched.py`` checks a few steps of every member against the single-model loop to 1e-5.

What stacks: members whose configs agree on everything except ``seed``, ``name`` and ``out_dir``
(:func:`stack_key`); :func:`train_stacked` groups the configs it is given by that key. Supported
configs: the causal LM objective, ``fp32``, ``dropout = 0``, AdamW, one process, no segment memory,
no ``compile``, no ``init_from``. A position scheme whose attention bias has learned parameters
(T5, KERPLE, FIRE, ...) cannot run under ``vmap`` here (torch's CPU SDPA has no batching rule and
refuses a gradient through its mask): such a group is trained member after member in this process
(the same result, no speed-up), and the returned results say ``"stacked": 1``.

Each member's run is written through the :class:`~poslab.training.loop.RunStore` handed in for it
(``poslab.session.train_stacked`` hands :class:`poslab.runs.RunFolder` folders): its config,
tokenizer, metrics lines (every ``log_interval`` / ``eval_interval`` step, as the loop writes them),
one model checkpoint at the last step (model tensors only: ``load_model`` reads it; it holds no
optimizer state, so such a run cannot be resumed) and ``results.json`` with the loop's keys.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state

from poslab.data import get_batch
from poslab.nn.model import GPT, GPTConfig
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig, model_config, resume_identity
from poslab.training.data import RunData, data_seed, model_vocab_size, prepare_data
from poslab.training.loop import RunStore, TrainingDiverged, evaluate_loss
from poslab.training.optim import lr_at

#: config keys that may differ between the members of one stack
MEMBER_KEYS = ("seed", "name", "out_dir")


def stack_key(cfg: TrainConfig) -> str:
    """The part of ``cfg`` members of one stack share (everything but :data:`MEMBER_KEYS`), as text."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in MEMBER_KEYS}
    return repr(sorted(values.items(), key=lambda kv: kv[0]))


def check_stackable(cfg: TrainConfig) -> None:
    """A one-line ``ValueError`` naming the first setting :func:`train_stacked` does not support."""
    rules = [
        (cfg.objective == "clm", f"objective={cfg.objective!r}", "stacked training is next-token (clm) only"),
        (cfg.dtype == "fp32", f"dtype={cfg.dtype!r}", "stacked training runs in fp32"),
        (
            cfg.model.dropout == 0.0,
            f"model.dropout={cfg.model.dropout!r}",
            "stacked members must draw no random numbers after initialisation (dropout 0)",
        ),
        (cfg.optimizer == "adamw", f"optimizer={cfg.optimizer!r}", "stacked training uses AdamW"),
        (
            not cfg.memory and not cfg.stream_batches,
            f"memory={cfg.memory}, stream_batches={cfg.stream_batches}",
            "stacked training reads random windows",
        ),
        (not cfg.compile, "compile=True", "stacked training runs eagerly"),
        (cfg.init_from is None, f"init_from={cfg.init_from!r}", "stacked members start from their seed"),
    ]
    for ok, value, rule in rules:
        if not ok:
            raise ValueError(f"{cfg.name}: {value} cannot be trained stacked: {rule}")


def _decay_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """nanoGPT's groups by name: weight decay on parameters with 2+ dims, none on the rest (:func:`make_optimizer`)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, p in named if p.dim() >= 2], [n for n, p in named if p.dim() < 2]


def _adamw(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    """The optimizer :func:`poslab.training.optim.make_optimizer` builds (fused where the device has the kernel)."""
    kwargs: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, **kwargs)


class StackedGPT:
    """``M`` GPTs of one config as stacked parameters ``[M, ...]`` and one vmapped forward.

    Args:
        models: the members (same config; their current weights are copied into the stack).
        vmap: run the members' forward passes as one vmapped call; ``False``: one after another on
            slices of the stacked tensors (for schemes that cannot run under vmap; the same results).

    Attributes:
        params: name -> ``[M, ...]`` leaf tensor (requires grad), tied weights stored once.
        buffers: name -> ``[M, ...]`` buffer.
        base: a copy of the first member whose module structure every call runs.
    """

    def __init__(self, models: Sequence[GPT], vmap: bool = True) -> None:
        if not models:
            raise ValueError("a stack needs at least one model")
        params, buffers = stack_module_state(list(models))
        self.params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        self.buffers = buffers
        self.base = copy.deepcopy(models[0])
        self.size = len(models)
        self.vocab_size = models[0].config.vocab_size
        self.vmap = vmap

    def _one(self, params: dict[str, Tensor], buffers: dict[str, Tensor], idx: Tensor) -> Tensor:
        # sdpa: torch's fallback loops it over the members; the matmuls around it are batched
        return functional_call(self.base, (params, buffers), (idx,), {"backend": "sdpa"})

    def logits(self, idx: Tensor) -> Tensor:
        """``idx [M, B, T]`` (member ``m`` reads ``idx[m]``) -> logits ``[M, B, T, V]``."""
        if idx.dim() != 3 or idx.shape[0] != self.size:
            raise ValueError(f"stacked input must be [{self.size}, B, T], got {list(idx.shape)}")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.vocab_size):  # the check vmap skips
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got [{int(idx.min())}, {int(idx.max())}]")
        if not self.vmap:
            return torch.stack(
                [
                    functional_call(
                        self.base,
                        ({k: v[m] for k, v in self.params.items()}, {k: v[m] for k, v in self.buffers.items()}),
                        (idx[m],),
                    )
                    for m in range(self.size)
                ]
            )  # [M, B, T, V]
        with warnings.catch_warnings():  # torch's note that sdpa has no batching rule (it loops over members)
            warnings.filterwarnings("ignore", message="There is a performance drop")
            return torch.vmap(self._one)(self.params, self.buffers, idx)

    def losses(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Each member's mean next-token loss (``-1`` targets ignored), fp32: ``[M]``."""
        logits = self.logits(idx)  # [M, B, T, V]
        V = logits.shape[-1]
        per_token = F.cross_entropy(
            logits.float().reshape(-1, V), targets.reshape(-1), ignore_index=-1, reduction="none"
        ).view(targets.shape)  # [M, B, T]
        keep = (targets >= 0).flatten(1).sum(1).clamp(min=1)  # [M] counted targets per member
        return per_token.flatten(1).sum(1) / keep  # [M]

    def member(self, i: int) -> GPT:
        """Member ``i`` as a plain :class:`GPT` (a copy of its current weights)."""
        model = copy.deepcopy(self.base)
        state = {k: v[i].detach().clone() for k, v in {**self.params, **self.buffers}.items()}
        model.load_state_dict(state, strict=False)  # tied lm_head.weight follows tok_emb.weight
        return model


def clip_members(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """Clip each member's global gradient norm as ``torch.nn.utils.clip_grad_norm_`` would; the norms before.

    Args:
        params: stacked parameters ``[M, ...]`` with gradients.
        max_norm: the clipping threshold (``<= 0``: no clipping, the norms only).

    Returns:
        ``[M]`` fp32 gradient norms before clipping.
    """
    grads = [p.grad for p in params if p.grad is not None]
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])  # [P, M]
    norms = torch.linalg.vector_norm(per_tensor, dim=0)  # [M]
    if max_norm > 0:
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # [M], clip_grad_norm_'s factor
        for g in grads:
            g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))
    return norms


def vmappable(model: GPT) -> bool:
    """Whether ``model``'s forward and backward run under vmap (probed on a copy with one tiny batch)."""
    probe = StackedGPT([model])
    idx = torch.zeros(1, 1, min(4, model.config.block_size), dtype=torch.long)  # [1, 1, T]
    try:
        probe.losses(idx, idx).sum().backward()
    except RuntimeError:
        return False
    return True


def train_stacked(
    configs: Sequence[TrainConfig],
    stores: Sequence[RunStore | None] | None = None,
    *,
    data: RunData | None = None,
    progress: Callable[[str], None] | None = print,
) -> list[dict[str, Any]]:
    """Train every config, stacking those that share a :func:`stack_key`; results in the order of ``configs``.

    Args:
        configs: the runs (each checked by :func:`check_stackable`).
        stores: one store per config to write its run through (already prepared for writing, as
            :func:`poslab.session.train_stacked` does), or ``None`` entries / ``None`` to write nothing.
        data: the encoded corpus when every config reads the same one (default: prepared once per
            group from its config).
        progress: called with a line per evaluation (``None``: silent).

    Returns:
        One results dict per config with the loop's keys (``final_val_loss``, ``final_train_loss``,
        ``best_val_loss``, ``tokens_per_s``, ...) plus ``"stacked"`` (members trained together) and
        ``"val_curve"`` ``[(step, val_loss)]``.

    Raises:
        ValueError: an unsupported setting (named), or ``stores`` of the wrong length.
        TrainingDiverged: a member's loss or gradient norm became NaN/inf.
    """
    configs = list(configs)
    stores = list(stores) if stores is not None else [None] * len(configs)
    if len(stores) != len(configs):
        raise ValueError(f"train_stacked got {len(configs)} configs but {len(stores)} stores")
    for cfg in configs:
        check_stackable(cfg)
    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(stack_key(cfg), []).append(i)
    results: list[dict[str, Any] | None] = [None] * len(configs)
    for members in groups.values():
        out = _train_group([configs[i] for i in members], [stores[i] for i in members], data, progress)
        for i, r in zip(members, out):
            results[i] = r
    return [r for r in results if r is not None]


def _train_group(
    configs: list[TrainConfig],
    stores: list[RunStore | None],
    data: RunData | None,
    progress: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    """Train one group of configs that differ only in :data:`MEMBER_KEYS`."""
    wall_start = time.perf_counter()
    cfg = configs[0]
    data = data if data is not None else prepare_data(cfg)
    mcfg = model_config(cfg, model_vocab_size(data.tokenizer.vocab_size, cfg.objective))
    models = []
    for c in configs:
        torch.manual_seed(c.seed)  # the loop's initialisation
        models.append(GPT(copy.copy(mcfg)))
    limit = models[0].position.max_positions
    if limit is not None and mcfg.block_size > limit:
        raise ValueError(
            f"block_size {mcfg.block_size} is larger than the {mcfg.position!r} position table "
            f"({limit} positions); lower model.block_size or raise the table's max_len"
        )
    vmap = vmappable(models[0])
    if not vmap and progress is not None:
        progress(f"--- {mcfg.position}: cannot run under vmap; its {len(configs)} members run one after another")
    cfg, M, T = configs[0], len(configs), mcfg.block_size
    stack = StackedGPT(models, vmap=vmap)
    decay, no_decay = _decay_names(models[0])
    optimizer = _adamw(
        [
            {"params": [stack.params[n] for n in decay], "weight_decay": cfg.weight_decay},
            {"params": [stack.params[n] for n in no_decay], "weight_decay": 0.0},
        ],
        cfg,
    )
    params = [stack.params[n] for n in decay + no_decay]
    rngs = [torch.Generator().manual_seed(data_seed(c.seed)) for c in configs]
    train_doc = [{k: v for k, v in c.to_dict().items() if k != "model"} for c in configs]
    docs = [{"model": mcfg.to_dict(), "train": doc, "data": data.info} for doc in train_doc]
    for store, doc in zip(stores, docs):
        if store is not None:
            store.write_start(data.tokenizer)
            store.write_config(doc)
    records: list[list[dict[str, Any]]] = [[] for _ in configs]
    log_sum = torch.zeros(M, dtype=torch.float64)
    log_count = 0
    best: list[dict[str, Any]] = [{"val_loss": None, "step": None} for _ in configs]
    train_time, interval_time, interval_tokens = 0.0, 0.0, 0
    tokens_per_step = cfg.batch_size * cfg.grad_accum * T
    for step in range(cfg.max_steps):
        start = time.perf_counter()
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        step_loss = torch.zeros(M, dtype=torch.float64)
        for _ in range(cfg.grad_accum):
            batches = [get_batch(data.train, T, cfg.batch_size, g) for g in rngs]  # M x ([B, T], [B, T])
            x = torch.stack([b[0] for b in batches])  # [M, B, T]
            y = torch.stack([b[1] for b in batches])  # [M, B, T]
            losses = stack.losses(x, y)  # [M]
            (losses.sum() / cfg.grad_accum).backward()
            step_loss += losses.detach().double()
        step_loss /= cfg.grad_accum
        norms = clip_members(params, cfg.grad_clip)  # [M]
        if not (torch.isfinite(step_loss).all() and torch.isfinite(norms).all()):
            bad = int((~(torch.isfinite(step_loss) & torch.isfinite(norms))).nonzero()[0])
            raise TrainingDiverged(
                f"{configs[bad].name}: training diverged at step {step + 1} (stacked training stops "
                f"at the first non-finite loss or gradient norm): loss={float(step_loss[bad])}, "
                f"grad_norm={float(norms[bad])}"
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        train_time += elapsed
        interval_time += elapsed
        interval_tokens += tokens_per_step
        log_sum += step_loss
        log_count += 1
        done = step + 1
        evaluate = done % cfg.eval_interval == 0 or done == cfg.max_steps
        if not (evaluate or done % cfg.log_interval == 0 or done == cfg.max_steps):
            continue
        rate = interval_tokens / interval_time if interval_time > 0 else 0.0
        vals = _evaluate(stack, data.val, configs, 1, cfg.eval_iters) if evaluate else None
        for m in range(M):
            record: dict[str, Any] = {
                "step": done,
                "loss": float(log_sum[m]) / log_count,
                "lr": lr,
                "tokens_per_s": rate,
                "grad_norm": float(norms[m]),
                "time_s": time.perf_counter() - wall_start,
            }
            if vals is not None:
                record["val_loss"] = vals[m]
                if best[m]["val_loss"] is None or vals[m] < best[m]["val_loss"]:
                    best[m] = {"val_loss": vals[m], "step": done}
            records[m].append(record)
        if vals is not None and progress is not None:
            progress(
                f"--- {mcfg.position} x{M}: step {done}/{cfg.max_steps}, val "
                + " ".join(f"{v:.3f}" for v in vals)
                + f", {rate * M:,.0f} tokens/s (all members)"
            )
        log_sum.zero_()
        log_count = 0
        interval_time, interval_tokens = 0.0, 0
    final_val = _evaluate(stack, data.val, configs, 1, cfg.eval_iters)
    final_train = _evaluate(stack, data.train, configs, 2, cfg.eval_iters or 20)
    out = []
    for m, (c, store) in enumerate(zip(configs, stores)):
        model = stack.member(m)
        tokens_seen = cfg.max_steps * tokens_per_step
        results = {
            "name": c.name,
            "status": "completed",
            "steps": cfg.max_steps,
            "final_train_loss": final_train[m],
            "final_val_loss": final_val[m],
            "best_val_loss": best[m]["val_loss"],
            "best_val_step": best[m]["step"],
            "tokens_per_s": tokens_seen / train_time if train_time > 0 else None,  # this member's share
            "tokens_per_s_all_members": M * tokens_seen / train_time if train_time > 0 else None,
            "dtype": c.dtype,
            "threads": torch.get_num_threads(),
            "train_time_s": train_time,
            "wall_time_s": time.perf_counter() - wall_start,
            "tokens_seen": tokens_seen,
            "n_params": sum(p.numel() for p in model.parameters()),
            "train_tokens": data.info["train_tokens"],
            "val_tokens": data.info["val_tokens"],
            "vocab_size": data.info["vocab_size"],
            "resumed_from": None,
            "skipped_nonfinite": [],
            "stacked": M if vmap else 1,
        }
        if store is not None:
            _write_run(store, model, mcfg, docs[m], records[m], results, cfg.max_steps)
        out.append(
            {
                **results,
                "val_curve": [(r["step"], r["val_loss"]) for r in records[m] if "val_loss" in r],
                "model": model,
            }
        )
    return out


def _write_run(
    store: RunStore, model: GPT, mcfg: GPTConfig, doc: dict, records: list[dict], results: dict, step: int
) -> None:
    """A member's metrics lines, its model-only checkpoint at ``step`` and ``results.json``."""
    with store.metrics_appender(True) as append:
        for record in records:
            append(record)
    tensors, aliases = ckpt.model_tensors(model)
    identity = resume_identity(doc, mcfg)
    store.save_checkpoint(
        step,
        tensors,
        {
            "config": identity,
            "config_hash": ckpt.config_hash(identity),
            "model_aliases": aliases,
            "tokens_seen": results["tokens_seen"],
            "stacked": results["stacked"],
            "torch_version": torch.__version__,
        },
        keep=0,
    )
    store.write_results(results)


@torch.no_grad()
def _evaluate(stack: StackedGPT, data: Tensor, configs: list[TrainConfig], offset: int, iters: int) -> list[float]:
    """Each member's :func:`~poslab.training.loop.evaluate_loss` (its windows seeded with ``seed + offset``).

    ``iters = 0`` reads the whole split in consecutive windows (the same for every member).
    """
    T, B = stack.base.config.block_size, configs[0].batch_size
    if not iters:
        return [evaluate_loss(stack.member(m), data, T, B, None, seed=c.seed + offset) for m, c in enumerate(configs)]
    gens = [torch.Generator().manual_seed(c.seed + offset) for c in configs]
    total = torch.zeros(len(configs), dtype=torch.float64)
    for _ in range(iters):
        batches = [get_batch(data, T, B, g) for g in gens]  # M x ([B, T], [B, T])
        x = torch.stack([b[0] for b in batches])  # [M, B, T]
        y = torch.stack([b[1] for b in batches])  # [M, B, T]
        total += stack.losses(x, y).double()
    return [float(v) / iters for v in total]


__all__ = ["MEMBER_KEYS", "StackedGPT", "check_stackable", "clip_members", "stack_key", "train_stacked", "vmappable"]
