"""Data-parallel training on PyTorch's own distributed engine: DDP, or FSDP2 with ``--fsdp``.

``torchrun --nproc_per_node N -m poslab train ...`` starts N processes and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each. :func:`setup` turns
them into a process group (``nccl`` when CUDA is available, each process on ``cuda:LOCAL_RANK``;
``gloo`` on CPU) and a :class:`DistContext` that ``poslab.training.loop`` calls at a few hook points.
Without torchrun :func:`setup` returns a context whose hooks do exactly what the single-process
loop did before, so a plain ``poslab train`` is unchanged bit for bit.

* **Model**: DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
  Training", https://arxiv.org/abs/2006.15704) averages the gradients over the ranks; with
  ``fsdp=True`` every transformer block and then the root module are sharded with FSDP2's
  ``fully_shard`` (Zhao et al. 2023, "PyTorch FSDP", https://arxiv.org/abs/2304.11277): parameters,
  gradients and AdamW moments live as ``DTensor`` shards, gathered for each block's forward/backward.
  FSDP2 runs on ``gloo`` (CPU) as well as ``nccl`` (tested on CPU).
* **Data**: ``batch_size`` is per process. Every rank keeps the run's data generator in the same
  state, draws the window starts of the *global* batch (``world_size * batch_size`` windows) and keeps
  rows ``[rank*B, (rank+1)*B)``. The shards are distinct and deterministic, and N processes x batch
  B train on exactly the windows of 1 process x batch N*B (tested: the loss after 20 steps agrees to
  1e-5). Because the generator is the same on every rank, rank 0's checkpointed state is everyone's.
  Evaluation uses the same global batch, each rank computing its rows, the mean shared.
* **Writes**: only rank 0 writes (run folder, metrics, checkpoints, results, progress bar). Work
  that only rank 0 does and others depend on (preparing the run folder, the matmul peak) runs there
  and its outcome (or its error) is broadcast, so every rank fails with the same message.
* **Checkpoints** keep the single-process format, loadable by plain ``poslab.runs.load_run``:
  under FSDP every ``DTensor`` (weights and AdamW moments) is gathered to a full tensor first (tied
  weights stay stored once). Resuming loads that full checkpoint on every rank (the run folder must be
  visible to every process: one machine, or a shared filesystem across machines) and re-shards it;
  DDP and FSDP checkpoints are interchangeable. A checkpoint records its ``world_size``; resuming
  with another one is refused, since it would change the global batch.
* **RNG**: rank 0 keeps the run's torch stream (dropout); rank ``r > 0`` reseeds after the model's
  initialisation with ``seed * 1_000_003 + r``, so dropout masks differ between ranks. Every rank's
  state is saved (``rng.torch`` for rank 0, ``rng.torch.rank<r>`` for the others, ``rng.cuda.rank<r>``
  on GPU) and restored by its own rank on resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from poslab.training import checkpoint as ckpt

# exceptions re-raised on every rank with rank 0's message (others become RuntimeError)
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        ValueError,
        TypeError,
        FileExistsError,
        FileNotFoundError,
        PermissionError,
        KeyError,
        RuntimeError,
        ckpt.CheckpointError,
    )
}
_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def rank_seed(seed: int, rank: int) -> int:
    """The torch seed of rank ``rank > 0`` (dropout): distinct per rank, deterministic per run."""
    return (seed * 1_000_003 + rank) % (2**63)


def is_main_process() -> bool:
    """True in rank 0 (or when not distributed): the process that writes files and prints."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0").strip() in ("", "0")


class _NullStream:
    """A text stream that drops everything (the progress bar of ranks other than 0)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class _StateDictView:
    """Duck-types ``state_dict()`` for :mod:`poslab.training.checkpoint` helpers given a ready-made state."""

    def __init__(self, state: dict) -> None:
        self._state = state

    def state_dict(self) -> dict:
        return self._state


@dataclass
class DistContext:
    """Where this process stands in a distributed run (the defaults: one plain process on CPU).

    Attributes:
        rank: global rank (0 writes files).
        world_size: number of processes.
        local_rank: rank on this machine (selects the GPU).
        backend: ``"gloo"``/``"nccl"``, or ``None`` when not distributed.
        device: where the model and batches live.
        fsdp: shard the model with FSDP2 instead of replicating it with DDP.
        owns_group: :func:`setup` created the process group (so :func:`teardown` destroys it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    fsdp: bool = False
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        """A process group exists (even of one process)."""
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ----------------------------------------------------------------------------- collectives
    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def run_on_main(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on rank 0 only and return its result on every rank.

        An exception on rank 0 is raised on every rank (same type for the usual ones, same message),
        so that all processes stop together with one clear error instead of hanging.
        """
        if not self.enabled or self.world_size == 1:
            return fn(*args)
        payload: list[Any] = [None]
        if self.is_main:
            try:
                payload[0] = ("ok", fn(*args))
            except Exception as err:
                dist.broadcast_object_list([("error", type(err).__name__, str(err))], src=0)
                raise
        dist.broadcast_object_list(payload, src=0)
        if payload[0][0] == "error":
            _, kind, message = payload[0]
            raise _ERRORS.get(kind, RuntimeError)(message)
        return payload[0][1]

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the ranks (``value`` itself when not distributed)."""
        if not self.enabled or self.world_size == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(total)
        return float(total.item()) / self.world_size

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one (e.g. one rank got Ctrl-C)."""
        if not self.enabled or self.world_size == 1:
            return flag
        count = torch.tensor([int(flag)], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(count)
        return bool(count.item())

    def _all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype on all ranks), on the CPU."""
        local = tensor.to(self._comm_device())
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        return [t.cpu() for t in gathered]

    # ----------------------------------------------------------------------------- model and data
    def prepare_model(self, model: nn.Module, seed: int) -> nn.Module:
        """Move ``model`` to the device and wrap it; returns the module to call in the training step.

        DDP returns a wrapper (``model`` stays the plain module: evaluate and checkpoint that one);
        FSDP shards ``model`` in place (every block, then the root) and returns it; a single
        process returns ``model`` unchanged. Also gives ranks ``r > 0`` their own dropout stream.
        Create the optimizer after this call (under FSDP its parameters are the shards).
        """
        model.to(self.device)
        if self.enabled and self.rank > 0:
            torch.manual_seed(rank_seed(seed, self.rank))
        if self.fsdp:
            fully_shard = _fully_shard()
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model
        if self.enabled and self.world_size > 1:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        return model

    def shard(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of a global batch, moved to the device.

        Args:
            x, y: the global batch ``[world_size*B, T]`` that :func:`poslab.data.get_batch` drew from
                the run's data generator (in the same state on every rank).
            batch_size: windows per process ``B``.

        Returns:
            ``x [B, T]`` and ``y [B, T]``: rows ``rank*B .. (rank+1)*B - 1`` (the whole batch, unchanged,
            in a single process).
        """
        if self.world_size > 1:
            rows = slice(self.rank * batch_size, (self.rank + 1) * batch_size)
            x, y = x[rows], y[rows]  # [B, T] x2, this rank's shard
        if self.device.type != "cpu":
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x, y

    def eval_model(self, model: nn.Module, batch_size: int) -> tuple[nn.Module, int]:
        """``(module, batch)`` for :func:`poslab.training.evaluation.evaluate_loss`: evaluation is sharded too.

        Evaluation uses the global batch (``world_size * batch_size`` windows, the windows a single
        process with that batch would see); each rank computes the loss of its rows and the mean
        over ranks is returned to every rank. In a single process: ``(model, batch_size)`` itself.
        """
        if not self.enabled or self.world_size == 1:
            return model, batch_size
        return _ShardedLoss(model, self), batch_size * self.world_size

    def set_grad_sync(self, train_model: nn.Module, enabled: bool) -> None:
        """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
        if self.fsdp:
            train_model.set_requires_gradient_sync(enabled)
        elif isinstance(train_model, nn.parallel.DistributedDataParallel):
            train_model.require_backward_grad_sync = enabled  # what DDP.no_sync() toggles (nanoGPT does the same)

    # ----------------------------------------------------------------------------- checkpoints
    def checkpoint_state(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, torch.Tensor], dict[str, Any]]:
        """``(model_tensors, aliases, optimizer_tensors, optimizer_meta)`` in the single-process format.

        Under FSDP every rank must call this (the shards are gathered, a collective); the others
        return empty dicts without work (only rank 0 writes).
        """
        if self.fsdp:
            full_model = _full_tensors(model.state_dict())
            state = optimizer.state_dict()
            full_optim = {
                "state": {index: _full_tensors(entry) for index, entry in state["state"].items()},
                "param_groups": state["param_groups"],
            }
            if not self.is_main:
                return {}, {}, {}, {}
            model_t, aliases = ckpt.model_tensors(_StateDictView(full_model))
            optim_t, optim_meta = ckpt.optimizer_tensors(_StateDictView(full_optim))
            return model_t, aliases, optim_t, optim_meta
        if not self.is_main:
            return {}, {}, {}, {}
        model_t, aliases = ckpt.model_tensors(model)
        optim_t, optim_meta = ckpt.optimizer_tensors(optimizer)
        return model_t, aliases, optim_t, optim_meta

    def rng_states(self) -> dict[str, torch.Tensor]:
        """Every rank's RNG states to store next to rank 0's ``rng.torch`` (a collective; ``{}`` alone)."""
        if not self.enabled:
            return {}
        states: dict[str, torch.Tensor] = {}
        if self.world_size > 1:
            for rank, state in enumerate(self._all_gather(torch.get_rng_state())):
                if rank > 0:
                    states[f"rng.torch.rank{rank}"] = state
        if self.device.type == "cuda":
            for rank, state in enumerate(self._all_gather(torch.cuda.get_rng_state(self.device))):
                states[f"rng.cuda.rank{rank}"] = state
        return states

    def checkpoint_meta(self) -> dict[str, Any]:
        """Extra checkpoint metadata (the world size a resume must match); ``{}`` when not distributed."""
        return {"world_size": self.world_size} if self.enabled else {}

    def check_resume(self, meta: dict[str, Any], run_dir: Any) -> None:
        """Refuse a checkpoint written by a different number of processes (the global batch would change)."""
        saved = int(meta.get("world_size", 1))
        if saved != self.world_size:
            how = (
                f"torchrun with {saved} processes in all (--nnodes x --nproc_per_node = {saved})"
                if saved > 1
                else "a single process (no torchrun, or --nproc_per_node 1)"
            )
            raise ValueError(
                f"cannot resume {str(run_dir)!r}: its checkpoint of step {meta.get('step')} was trained by {saved} "
                f"process(es), this launch has {self.world_size}; batch_size is per process, so the global batch "
                f"would change; resume with {how}"
            )

    def restore(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
    ) -> None:
        """Load a (full, single-process format) checkpoint into the model and optimizer of this rank."""
        if not self.fsdp:
            ckpt.restore_model(model, tensors, meta["model_aliases"])
            ckpt.restore_optimizer(optimizer, tensors, meta["optimizer"])
            return
        ckpt.restore_model(_ShardingModelLoader(model), tensors, meta["model_aliases"])
        ckpt.restore_optimizer(_ShardingOptimizerLoader(optimizer), tensors, meta["optimizer"])

    def restore_rng(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore this rank's torch (and CUDA) RNG state from a checkpoint."""
        own = tensors["rng.torch"] if self.rank == 0 else tensors.get(f"rng.torch.rank{self.rank}")
        if own is not None:
            torch.set_rng_state(own)
        cuda_state = tensors.get(f"rng.cuda.rank{self.rank}")
        if cuda_state is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(cuda_state, self.device)

    # ----------------------------------------------------------------------------- reporting
    def config_section(self) -> dict[str, Any]:
        """``{"distributed": {...}}`` for ``config.json`` (``{}`` when not distributed)."""
        if not self.enabled:
            return {}
        return {
            "distributed": {
                "world_size": self.world_size,
                "backend": self.backend,
                "fsdp": self.fsdp,
                "device": self.device.type,
            }
        }

    def results_section(self, tokens_per_s: float | None) -> dict[str, Any]:
        """Extra ``results.json`` keys: world size, backend, FSDP, tokens/s per process (``{}`` alone)."""
        if not self.enabled:
            return {}
        per_process = tokens_per_s / self.world_size if tokens_per_s else None
        return {**self.config_section()["distributed"], "tokens_per_s_per_process": per_process}

    def bar_stream(self) -> Any:
        """The progress bar's stream: stderr (``None``) on rank 0, a sink elsewhere."""
        return None if self.is_main else _NullStream()


class _ShardedLoss(nn.Module):
    """``model(x, y)`` on this rank's rows of a global batch, the loss averaged over the ranks.

    A batch that does not split evenly (the last chunk of a whole-split evaluation) is computed in
    full on every rank instead, so every rank still runs the same forward passes (FSDP needs that).
    """

    def __init__(self, model: nn.Module, context: DistContext) -> None:
        super().__init__()
        self.model = model
        self.context = context

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[None, torch.Tensor]:
        world, rank = self.context.world_size, self.context.rank
        if x.shape[0] % world:
            _, loss = self.model(x, y)
            return None, loss
        rows = x.shape[0] // world
        _, loss = self.model(x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows])  # [rows, T] x2
        total = loss.detach().to(torch.float64).reshape(1)  # [1]
        dist.all_reduce(total)
        return None, total / world


class _ShardingModelLoader:
    """``load_state_dict`` of full tensors into an FSDP-sharded module (each rank keeps its shard)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> Any:
        current = self.module.state_dict()
        sharded = {key: _shard_like(value, current[key]) if key in current else value for key, value in state.items()}
        return self.module.load_state_dict(sharded, strict=strict)


class _ShardingOptimizerLoader:
    """``load_state_dict`` of full AdamW moments into an optimizer over FSDP shards."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for index, entry in state["state"].items():
            param = params[int(index)]
            for key, value in list(entry.items()):
                if key != "step" and isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(param.shape):
                    entry[key] = _shard_like(value, param)
        self.optimizer.load_state_dict(state)


def _shard_like(full: torch.Tensor, reference: Any) -> Any:
    """``full`` distributed as ``reference`` (a DTensor) is; ``full`` itself for a plain reference."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(reference, DTensor):
        return full
    local = full.to(device=reference.device)
    return distribute_tensor(local, reference.device_mesh, reference.placements, src_data_rank=None)


def _full_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """Replace every DTensor value by its gathered full tensor (a collective, in key order).

    Values sharing one storage (tied weights) map to one full tensor, so ties survive.
    """
    from torch.distributed.tensor import DTensor

    full: dict[str, Any] = {}
    seen: dict[tuple, torch.Tensor] = {}
    for key, value in state.items():
        if isinstance(value, DTensor):
            local = value.to_local()
            ident = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(value.shape), value.dtype)
            if ident not in seen:
                seen[ident] = value.full_tensor()
            full[key] = seen[ident]
        else:
            full[key] = value
    return full


def _fully_shard() -> Callable[..., Any]:
    """FSDP2's ``fully_shard`` (``torch.distributed.fsdp`` since torch 2.6, ``_composable.fsdp`` in 2.4-2.5)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            raise ValueError(
                f"--fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.4); this torch is "
                f"{torch.__version__}; use DDP (drop --fsdp) or upgrade torch"
            ) from None
    return fully_shard


def _env_int(name: str) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} must be an integer (torchrun sets it)") from None


def setup(fsdp: bool = False) -> DistContext:
    """The distributed context of this process; initialises the process group under torchrun.

    Under torchrun (``RANK`` and ``WORLD_SIZE`` set) the backend is ``nccl`` when CUDA is available
    (device ``cuda:LOCAL_RANK``) and ``gloo`` otherwise (CPU). A process group the caller already
    initialised is used as it is. Otherwise: a single process on the CPU (the plain training loop).

    Args:
        fsdp: shard the model with FSDP2 (needs a process group, i.e. torchrun).

    Raises:
        ValueError: an incomplete or inconsistent torchrun environment, more processes on a machine
            than GPUs, ``fsdp`` without torchrun, or a torch without FSDP2.
    """
    if fsdp:
        _fully_shard()  # fail early, with the reason, on a torch without FSDP2
    present = [key for key in _ENV_KEYS[:2] if os.environ.get(key)]
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        backend = str(dist.get_backend())
        device = torch.device("cuda", local_rank) if "nccl" in backend else torch.device("cpu")
        context = DistContext(rank, world, local_rank, backend, device, fsdp, owns_group=False)
    elif present:
        if len(present) < 2:
            missing = [key for key in _ENV_KEYS[:2] if key not in present]
            raise ValueError(
                f"incomplete torchrun environment: {present} set but {missing} missing; "
                f"launch with `torchrun --nproc_per_node N -m poslab train ...`"
            )
        if not dist.is_available():
            raise ValueError("this torch build has no torch.distributed; run without torchrun")
        rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), int(os.environ.get("LOCAL_RANK", "0") or 0)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent (need 0 <= RANK < WORLD_SIZE)")
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            if local_rank >= count:
                raise ValueError(
                    f"LOCAL_RANK={local_rank} but this machine has {count} CUDA device(s); "
                    f"use --nproc_per_node <= {count}"
                )
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo")
            backend = "gloo"
        context = DistContext(rank, world, local_rank, backend, device, fsdp, owns_group=True)
    else:
        if fsdp:
            raise ValueError(
                "--fsdp shards the model over several processes: launch it with torchrun, e.g. "
                "`torchrun --nproc_per_node 2 -m poslab train --preset tiny --fsdp`"
            )
        return DistContext()
    return context


def teardown(context: DistContext) -> None:
    """Destroy the process group if :func:`setup` created it, its backend's threads joined.

    Under FSDP, DTensor's sharding caches keep ``DTensorSpec`` keys alive after the model is gone;
    each spec holds a ``DeviceMesh``, and the mesh holds the process group. ``destroy_process_group``
    alone then leaves the gloo backend (its ``gloo_tcp_loop`` and ``pt_gloo_runloop`` threads)
    running until interpreter exit, where its destruction races those threads and the process can
    die of ``terminate called without an active exception`` (SIGABRT) after a finished run. The
    caches are emptied first, so the last reference goes and ``destroy_process_group`` joins the
    threads while the interpreter is fully alive.
    """
    if context.owns_group and dist.is_available() and dist.is_initialized():
        if context.fsdp:
            _release_dtensor_caches()
        dist.destroy_process_group()


def _release_dtensor_caches() -> None:
    """Empty DTensor's caches that hold a ``DeviceMesh`` (and so the process group) after the model is gone.

    They are torch internals (torch 2.13: the sharding propagator's Python and C++ caches, its tensor
    meta cache, the redistribution plans and planners, the mesh topology cache); one that a torch
    version lacks is skipped. ``tests/test_distributed.py`` checks that no gloo thread outlives
    :func:`teardown`, so a cache a later torch adds shows up there.
    """
    import gc
    import importlib

    for module_name, path in (
        ("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding"),
        ("torch.distributed.tensor._api", "DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached"),
        ("torch.distributed.tensor._redistribute", "_gen_transform_infos"),
        ("torch.distributed.tensor._redistribute", "_planner_cache"),
        ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh"),
    ):
        try:
            target: Any = importlib.import_module(module_name)
            for name in path.split("."):
                target = getattr(target, name)
        except (ImportError, AttributeError):
            continue
        clear = getattr(target, "cache_clear", None) or getattr(target, "clear", None)
        if clear is not None:
            clear()
    clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_fast_path is not None:
        clear_fast_path()  # the C++ fast path's sharding cache
    gc.collect()  # specs and meshes in reference cycles


__all__ = ["DistContext", "is_main_process", "rank_seed", "setup", "teardown"]
