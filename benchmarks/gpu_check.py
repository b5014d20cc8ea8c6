"""The figures of ``benchmarks/gpu_check.sh``: bf16 matmul peak, a 124M GPT's tokens/s and MFU, bias attention.

Run by ``gpu_check.sh`` after the CUDA tests (whose JUnit XML it folds into the same JSON); on its
own::

    python benchmarks/gpu_check.py --out runs/gpu_check/gpu_check.json          # one CUDA GPU
    python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check.json          # CPU, tiny sizes

Measured, in one process on one device, nothing downloaded (random tokens):

* **bf16 peak**: the best rate of a large ``bf16`` matmul (``8192^3``, CUDA-event timed), the
  denominator of MFU (the measured peak, not the datasheet's);
* **GPT-2 124M with RoPE** (12 layers, 12 heads, width 768, block 1024, vocabulary 50304, no
  bias): full training steps (forward with loss, backward, clipping, poslab's fused AdamW) under
  bf16 autocast, per attention backend (``flex``, which ``auto`` picks on CUDA, and ``sdpa``),
  and the ``sdpa`` model under ``torch.compile`` when time remains: tokens/s and MFU with
  nanoGPT's FLOP estimate (``poslab.training.mfu.matmul_flops_per_token``);
* **ALiBi and T5 through flex vs no bias**: one causal attention layer (B=8, 12 heads, width 768)
  forward + backward in bf16 at T = 1024 and 4096: ms and the ratio to the no-bias flex layer.

``--lab-size`` runs instead one GPU size of one training experiment, short: the extrapolation
experiment at the lab's ``gpu`` size (6/6/384, ``L = 256``, ``device = cuda``) capped at ``--lab-steps``
steps and one evaluation window, RoPE only, its 3 seeds, through the lab's own code path
(``poslab.lab.experiments.extrapolation.run``); it records each training's device, tokens/s and
times, the claims' verdicts, and the tokens/s extrapolated to the full ``gpu`` size's 5,000 steps
(the measured rate times the full size's tokens: an estimate of the training time, measured at the
capped length). With ``--dry-run`` it runs at the ``smoke`` size on the CPU.

``--dry-run`` runs the same code on CPU at tiny sizes with SDPA in place of flex (CPU FlexAttention has
no backward) so that the script is exercised by the default test suite. Each section is timed
against ``--budget-s``; a section that would start past it is recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from poslab import GPT, AttentionConfig, GPTConfig, MultiHeadAttention, positions
from poslab.training.config import TrainConfig
from poslab.training.mfu import matmul_flops_per_token
from poslab.training.optim import make_optimizer


class Timer:
    """Wall time of a callable on ``device`` (CUDA: events around it, after a synchronize)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, fn: Callable[[], Any], reps: int) -> list[float]:
        times = []
        for _ in range(reps):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return times


def environment(device: torch.device) -> dict[str, Any]:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "cuda_available": torch.cuda.is_available(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    else:
        env.update(threads=torch.get_num_threads())
    return env


def matmul_peak(device: torch.device, n: int, reps: int) -> dict[str, Any]:
    """Best bf16 ``n x n @ n x n`` rate (FLOP/s)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    timer = Timer(device)
    timer(lambda: a @ b, 3)
    times = timer(lambda: a @ b, reps)
    return {
        "n": n,
        "reps": reps,
        "best_flops": 2 * n**3 / min(times),
        "median_flops": 2 * n**3 / statistics.median(times),
    }


def gpt_throughput(
    device: torch.device,
    dims: dict[str, int],
    batch: int,
    backend: str,
    steps: int,
    warmup: int,
    peak: float,
    compile_model: bool = False,
) -> dict[str, Any]:
    """Training tokens/s of a RoPE GPT under bf16 autocast; MFU against the measured bf16 peak."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=dims["vocab"],
        n_layer=dims["layers"],
        n_head=dims["heads"],
        n_embd=dims["width"],
        block_size=dims["block"],
        bias=False,
        position="rope",
        dropout=0.0,
        attention=AttentionConfig(backend=backend),
    )
    model = GPT(cfg).to(device)
    model.train()
    optimizer = make_optimizer(model, TrainConfig(name="gpu-check", lr=6e-4, beta2=0.95))
    params = [p for p in model.parameters() if p.requires_grad]
    run = torch.compile(model) if compile_model else model
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, dims["vocab"], (batch, dims["block"] + 1), generator=gen).to(device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()  # [B, T] x2
    losses: list[torch.Tensor] = []

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            _, loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    timer = Timer(device)
    t0 = time.perf_counter()
    timer(step, warmup)  # compiles (flex kernels, or the whole model)
    warmup_s = time.perf_counter() - t0
    times = timer(step, steps)
    tokens = batch * dims["block"]
    flops_per_token = matmul_flops_per_token(model, dims["block"])
    rate = tokens / statistics.median(times)
    out = {
        "backend": backend,
        "compiled": compile_model,
        "batch": batch,
        **dims,
        "n_params": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": tokens,
        "step_ms_median": 1e3 * statistics.median(times),
        "step_ms_min": 1e3 * min(times),
        "tokens_per_s": rate,
        "flops_per_token": flops_per_token,
        "mfu": rate * flops_per_token / peak,
        "warmup_s": warmup_s,
        "final_loss": float(losses[-1]),
        "finite": bool(torch.isfinite(torch.stack(losses)).all()),
    }
    if device.type == "cuda":
        out["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return out


def bias_attention(
    device: torch.device, scheme: str, T: int, backend: str, batch: int, heads: int, width: int, reps: int
) -> dict[str, Any]:
    """Forward + backward of one causal attention layer with ``scheme``'s bias (bf16 autocast)."""
    torch.manual_seed(0)
    head_dim = width // heads
    pos_scheme = positions.build_for_model(
        scheme, {}, {"n_embd": width, "n_heads": heads, "head_dim": head_dim, "max_len": T, "bidirectional": False}
    )
    attn = MultiHeadAttention(width, heads, attention=AttentionConfig(backend=backend), position=pos_scheme).to(device)
    x = torch.randn(batch, T, width, device=device, requires_grad=True)

    def fwd_bwd() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = attn(x)
        out.float().square().mean().backward()
        x.grad = None
        attn.zero_grad(set_to_none=True)

    timer = Timer(device)
    t0 = time.perf_counter()
    timer(fwd_bwd, 2)
    warmup_s = time.perf_counter() - t0
    times = timer(fwd_bwd, reps)
    return {
        "scheme": scheme,
        "T": T,
        "backend": backend,
        "batch": batch,
        "heads": heads,
        "width": width,
        "ms_median": 1e3 * statistics.median(times),
        "ms_min": 1e3 * min(times),
        "warmup_s": warmup_s,
    }


def lab_gpu_size(out_dir: Path, dry_run: bool, steps: int) -> dict[str, Any]:
    """One GPU size of one training experiment, capped: extrapolation, RoPE, 3 seeds (see the module doc)."""
    import io

    from poslab.lab import scale
    from poslab.lab.experiments import extrapolation
    from poslab.runs import RunFolder

    spec = "gpu-check-cpu=smoke,steps=4,device=cpu" if dry_run else f"gpu-check=gpu,steps={steps},eval_windows=1"
    size = scale.define_size(spec)
    full = scale.SIZES["smoke" if dry_run else "gpu"]
    shutil.rmtree(out_dir, ignore_errors=True)  # trained here, every time (a finished run would be reused)
    t0 = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        results = extrapolation.run(out_dir / "extrapolation", size=size, schemes=("rope",), workers=1)
    wall = time.perf_counter() - t0
    runs = []
    for seed, run_dir in results["run_dirs"]["rope"].items():
        done = RunFolder(run_dir).results() or {}
        runs.append(
            {
                "seed": int(seed),
                **{
                    k: done.get(k)
                    for k in (
                        "device",
                        "steps",
                        "tokens_per_s",
                        "train_time_s",
                        "wall_time_s",
                        "final_val_loss",
                        "mfu",
                        "n_params",
                    )
                },
            }
        )
    rates = [r["tokens_per_s"] for r in runs if r.get("tokens_per_s")]
    full_tokens = full.steps * full.batch_size * full.train_length
    return {
        "size": spec,
        "experiment": "extrapolation",
        "schemes": ["rope"],
        "wall_s": wall,
        # one worker: the trainings one after another; None when a run did not record its time
        "train_s": None if any(r["wall_time_s"] is None for r in runs) else sum(r["wall_time_s"] for r in runs),
        "runs": runs,
        "verdicts": [c.get("verdict") for c in results["claims"]],
        "full_size": full.name,
        "full_size_tokens": full_tokens,
        "full_size_train_s_from_measured_rate": full_tokens / statistics.median(rates) if rates else None,
        "log_tail": log.getvalue()[-2000:],
    }


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts (and failing test ids) from pytest's ``--junitxml`` file."""
    if not path.is_file():
        return {"ran": False, "reason": f"no JUnit file at {path}"}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failing = []
    for case in suite.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                failing.append(
                    {
                        "test": f"{case.get('classname')}::{case.get('name')}",
                        "kind": kind,
                        "message": (node.get("message") or "")[:300],
                    }
                )
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"ran": True, **counts, "seconds": float(suite.get("time", 0.0)), "failing": failing}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check/gpu_check.json"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, sdpa for flex")
    parser.add_argument("--junit", type=Path, default=None, help="pytest --junitxml of the CUDA tests, folded in")
    parser.add_argument("--tests-rc", type=int, default=None, help="pytest's exit status")
    parser.add_argument("--budget-s", type=float, default=330.0, help="start no section past this many seconds")
    parser.add_argument(
        "--lab-size",
        action="store_true",
        help="only the lab's gpu size of the extrapolation experiment, capped (CPU smoke with --dry-run)",
    )
    parser.add_argument("--lab-steps", type=int, default=200, help="training steps of --lab-size (default 200)")
    args = parser.parse_args(argv)
    wall0 = time.perf_counter()
    if args.lab_size:
        if not args.dry_run and not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --dry-run on CPU")
        if args.dry_run:
            torch.set_num_threads(1)
        report = {"dry_run": args.dry_run, "env": environment(torch.device("cpu" if args.dry_run else "cuda"))}
        try:
            report["lab_gpu_size"] = lab_gpu_size(args.out.parent / "lab_gpu_size", args.dry_run, args.lab_steps)
        except Exception as err:  # reported in the JSON; the exit status says it failed
            report["lab_gpu_size"] = {"error": f"{type(err).__name__}: {str(err)[:1000]}"}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=float))
        row = report["lab_gpu_size"]
        if "error" in row:
            print(f"lab gpu size: ERROR {row['error']}", flush=True)
            raise SystemExit(1)
        print(
            f"lab gpu size ({row['size']}): {len(row['runs'])} trainings on {row['runs'][0]['device']}, "
            f"{statistics.median(r['tokens_per_s'] for r in row['runs']):,.0f} tokens/s, train "
            f"{'unrecorded' if row['train_s'] is None else format(row['train_s'], '.0f') + ' s'}, "
            f"all {row['wall_s']:.0f} s; the full {row['full_size']} size at this rate: "
            f"{row['full_size_train_s_from_measured_rate']:.0f} s a training; figures in {args.out}",
            flush=True,
        )
        return report

    if args.dry_run:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        peak_n, peak_reps = 128, 3
        dims = {"layers": 2, "heads": 2, "width": 32, "block": 32, "vocab": 64}
        batch, steps, warmup = 2, 2, 1
        gpt_cases = [("sdpa", False)]
        bias_sizes, bias_dims, bias_reps, flex = [32], {"batch": 1, "heads": 2, "width": 32}, 2, "sdpa"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --dry-run on CPU")
        device = torch.device("cuda")
        peak_n, peak_reps = 8192, 20
        dims = {"layers": 12, "heads": 12, "width": 768, "block": 1024, "vocab": 50304}
        batch, steps, warmup = 16, 10, 3
        gpt_cases = [("flex", False), ("sdpa", False), ("sdpa", True)]
        bias_sizes, bias_dims, bias_reps, flex = [1024, 4096], {"batch": 8, "heads": 12, "width": 768}, 10, "flex"
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)  # flex: one compile per shape and bias

    report: dict[str, Any] = {"dry_run": args.dry_run, "env": environment(device)}
    if args.junit is not None:
        report["cuda_tests"] = {**junit_summary(args.junit), "pytest_rc": args.tests_rc}
    skipped: list[str] = []

    def within_budget(label: str) -> bool:
        if time.perf_counter() - wall0 > args.budget_s:
            skipped.append(label)
            print(f"gpu_check: skipped {label} (past the {args.budget_s:.0f} s budget)", flush=True)
            return False
        return True

    peak = matmul_peak(device, peak_n, peak_reps)
    report["bf16_matmul_peak"] = peak
    print(f"bf16 matmul peak ({peak_n}^3): {peak['best_flops'] / 1e12:.1f} TFLOP/s", flush=True)

    report["gpt_rope"] = []
    for backend, compiled in gpt_cases:
        label = f"gpt {backend}{' compiled' if compiled else ''}"
        if not within_budget(label):
            continue
        try:
            row = gpt_throughput(device, dims, batch, backend, steps, warmup, peak["best_flops"], compiled)
        except Exception as err:  # a failing path is a finding to report, not the end of the check
            row = {"backend": backend, "compiled": compiled, "error": f"{type(err).__name__}: {str(err)[:500]}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the previous model's memory back before the next one
        report["gpt_rope"].append(row)
        if "error" in row:
            print(f"{label}: ERROR {row['error']}", flush=True)
        else:
            print(
                f"{label}: {row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.1%} "
                f"(step {row['step_ms_median']:.1f} ms, warm-up {row['warmup_s']:.1f} s)",
                flush=True,
            )

    report["bias_attention"] = []
    for T in bias_sizes:
        rows = {}
        for scheme in ("none", "alibi", "t5"):
            if not within_budget(f"attention {scheme} T={T}"):
                continue
            try:
                rows[scheme] = bias_attention(
                    device, scheme, T, flex, bias_dims["batch"], bias_dims["heads"], bias_dims["width"], bias_reps
                )
            except Exception as err:
                rows[scheme] = {
                    "scheme": scheme,
                    "T": T,
                    "backend": flex,
                    "error": f"{type(err).__name__}: {str(err)[:500]}",
                }
        for scheme, row in rows.items():
            base = rows.get("none", {}).get("ms_median")
            if "ms_median" in row and base:
                row["vs_none"] = row["ms_median"] / base
            report["bias_attention"].append(row)
            print(
                f"attention {flex} T={T} {scheme}: "
                + (
                    f"{row['ms_median']:.2f} ms ({row.get('vs_none', 1):.2f}x none)"
                    if "ms_median" in row
                    else f"ERROR {row['error']}"
                ),
                flush=True,
            )

    report["skipped_for_budget"] = skipped
    report["wall_s"] = time.perf_counter() - wall0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"gpu_check: figures in {args.out}", flush=True)
    return report


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
