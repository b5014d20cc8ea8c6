"""Hostile inputs, one section per cause (docs/reliability.md section 14): each gets the right answer
or one line naming the value and the rule (exit 2), never a traceback, a silently different model or
lost work. Deep nesting and alias bombs, training options the CPU cannot run, values at the edge of
fp32, a deleted lock file, forged files with consistent checksums, an interrupted ``--memory`` run and
costs refused before they are paid.

The figures go to ``test-artifacts/reliability.json`` under ``hostile_inputs`` (docs/reliability.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_reliability_runs import corpus, error_line, reforge, rewrite_config, run, trained  # noqa: F401

from poslab.cli.app import main
from poslab.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("single_thread")

FIGURES: dict[str, int] = {}
DRY = ["train", "--preset", "tiny", "--dry-run"]


@pytest.fixture(autouse=True)
def _record(request):
    """What each test tried goes to ``test-artifacts/reliability.json`` (the reliability table)."""
    from test_reliability_artifacts import mode, record

    FIGURES.clear()
    FIGURES.update(cases=0, refused_one_line=0, right_answer=0)
    yield
    if FIGURES["cases"]:
        record("hostile_inputs", mode(request), dict(FIGURES))


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Run ``poslab ARGV``: exit 2 with one ``poslab: error:`` line holding every needle."""
    assert main(argv) == 2
    line = error_line(capsys)
    for needle in needles:
        assert needle in line, line
    FIGURES["cases"] += 1
    FIGURES["refused_one_line"] += 1
    return line


def answered() -> None:
    FIGURES["cases"] += 1
    FIGURES["right_answer"] += 1


# ---------------------------------------------------------------------- 1. deep nesting
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    "key", ["model.position_config", "model.position_config.base", "model.layer_pattern", "model.mla"]
)
def test_deeply_nested_cli_values_are_one_line(key, capsys):
    refused(capsys, [*DRY, f"--{key}", DEEP], f"--{key}", "nested more than 100 levels")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "metrics.jsonl", "peak.json", "checkpoint"])
def test_deeply_nested_run_files_are_one_line(run, name, capsys):  # noqa: F811
    deep = "[" * 200_000 + "]" * 200_000
    if name == "checkpoint":
        (path,) = (run / ckpt.CHECKPOINT_DIR).glob("*.json")
    else:
        path = run / name
    path.write_text(deep + ("\n" if name == "metrics.jsonl" else ""), encoding="utf-8")
    if name == "tokenizer.json":  # consistent: the digest in config.json matches
        digest = ckpt.sha256_file(path)
        rewrite_config(run, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})
    if name in ("metrics.jsonl", "peak.json"):  # readers that skip a damaged file: no traceback
        from poslab.runs import RunFolder

        folder = RunFolder(run)
        if name == "metrics.jsonl":
            assert folder.metrics() == []
        else:
            assert folder.matmul_peak("k", lambda: 2.0) == 2.0  # measured again, the damaged cache replaced
        answered()
        return
    refused(capsys, ["sample", str(run), "--tokens", "2"], "nested more than 100 levels")


def test_deeply_nested_longrope_file_is_one_line(run, tmp_path, capsys):  # noqa: F811
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    refused(
        capsys,
        ["eval", str(run), "--rope-scaling", f"longrope:{deep}", "--lengths", "16"],
        "nested more than 100 levels",
    )


# ---------------------------------------------------------------------- 2. alias bombs in CLI values
def cli_bomb(levels: int = 9, width: int = 9) -> str:
    """About 300 bytes of flow YAML expanding to ``width ** levels`` values."""
    names = [chr(ord("a") + i) for i in range(levels)]
    parts = [f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    parts += [f"{n}: &{n} [{', '.join([f'*{names[i]}'] * width)}]" for i, n in enumerate(names[1:])]
    return "{" + ", ".join(parts) + "}"


@pytest.mark.parametrize("key", ["model.position_config.base", "model.position_config", "model.layer_pattern"])
def test_an_alias_bomb_in_a_cli_value_is_refused_at_once(key, capsys):
    assert len(cli_bomb()) < 400
    value = cli_bomb() if key != "model.layer_pattern" else f"[{cli_bomb()}]"
    refused(capsys, [*DRY, f"--{key}", value], f"--{key}", "more than 100,000 values through its aliases")


# ---------------------------------------------------------------------- 3. flex cannot train on CPU
def test_flex_backend_is_refused_for_training_on_cpu_by_dry_run_and_train(tmp_path, capsys):
    argv = ["train", "--preset", "tiny", "--model.backend", "flex", "--out_dir", str(tmp_path), "--max_steps", "1"]
    refused(capsys, [*argv, "--dry-run"], "model.backend='flex' cannot train on cpu", "sdpa or eager")
    refused(capsys, argv, "model.backend='flex' cannot train on cpu")
    assert not any(tmp_path.iterdir())  # refused before the run folder was made


# ---------------------------------------------------------------------- 14. dry-run checks what train checks
def test_dry_run_refuses_memory_with_a_position_table(tmp_path, capsys):
    refused(
        capsys,
        [*DRY, "--memory", "16", "--model.position", "learned", "--out_dir", str(tmp_path)],
        "memory=16 continues positions across segments",
        "'learned' table",
    )


def test_dry_run_refuses_init_from_weights_that_do_not_fit(run, tmp_path, capsys):  # noqa: F811
    base = [
        "train",
        "--preset",
        "tiny",
        "--out_dir",
        str(tmp_path),
        "--init_from",
        str(run),
        "--model.n_layer",
        "1",
        "--model.n_head",
        "2",
        "--model.block_size",
        "16",
    ]
    refused(capsys, [*base, "--model.n_embd", "64", "--dry-run"], "checkpoint does not fit the model", "shape mismatch")
    assert main([*base, "--model.n_embd", "16", "--dry-run"]) == 0  # the run's own geometry passes
    capsys.readouterr()
    answered()


# ---------------------------------------------------------------------- 4. top-p below fp32's range
def test_a_top_p_that_underflows_fp32_is_greedy(run, capsys):  # noqa: F811
    from poslab.nn.generate import filter_logits

    logits = torch.tensor([[0.5, 2.0, -1.0, 1.9]])
    kept = torch.isfinite(filter_logits(logits, 1.0, None, 1e-300))
    assert kept.tolist() == [[False, True, False, False]]  # the best token only, as p -> 0
    base = ["sample", str(run), "--prompt", "白日", "--tokens", "5", "--seed", "1"]
    assert main([*base, "--top-p", "1e-46"]) == 0
    tiny = capsys.readouterr().out
    assert main([*base, "--temperature", "0"]) == 0
    assert tiny == capsys.readouterr().out
    answered()


# ---------------------------------------------------------------------- 6. averaging weights past float's range
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, corpus):  # noqa: F811
    """A rope run with two checkpoints (steps 2 and 4)."""
    from test_reliability_runs import tiny

    from poslab.session import train

    cfg = tiny(
        tmp_path_factory.mktemp("runs"),
        corpus,
        name="B",
        ckpt_interval=2,
        model=dict(n_layer=1, n_head=2, n_embd=16, block_size=16, position="rope"),
    )
    train(cfg, progress=False)
    return cfg.run_dir


def test_average_weights_summing_past_float_range_are_an_equal_mean(two_checkpoints, tmp_path, capsys):
    from poslab.runs import load_run

    huge, plain = tmp_path / "huge", tmp_path / "plain"
    assert (
        main(["average", str(two_checkpoints), "--last", "2", "--out", str(huge), "--weights", "1e308", "1e308"]) == 0
    )
    assert main(["average", str(two_checkpoints), "--last", "2", "--out", str(plain)]) == 0
    capsys.readouterr()
    a, b = load_run(huge)[0].state_dict(), load_run(plain)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and any(bool(v.abs().sum() > 0) for v in a.values())
    assert json.loads((huge / "results.json").read_text())["averaged_from"]["weights"] == [0.5, 0.5]
    answered()


# ---------------------------------------------------------------------- 7. the lock file deleted while a run trains
def test_a_deleted_lock_file_does_not_let_a_second_train_in(run, capsys):  # noqa: F811
    from poslab.runs import RunFolder
    from poslab.training.lock import RunLock, is_locked, lock_path

    metrics = (run / "metrics.jsonl").read_bytes()
    holder = RunLock(run).acquire()  # the training run A (flock is per open file: this process counts as another)
    try:
        lock_path(run).unlink()  # a user tidying up next to the folder
        assert is_locked(run) and RunFolder(run).state == "running"
        refused(capsys, [*resume_args(run), "--max_steps", "6"], "is in use by another poslab process", "was deleted")
        assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing of A's rewritten
    finally:
        holder.release()
    assert not is_locked(run)


def resume_args(folder: Path) -> list[str]:
    return ["train", "--resume", "--name", folder.name, "--out_dir", str(folder.parent), "--no-progress"]


# ---------------------------------------------------------------------- 8. forged files with consistent checksums
def forge_rng(name: str):
    return lambda t: {**t, name: torch.zeros(7, dtype=torch.uint8)}


def forge_step(t):
    (key,) = [k for k in t if k.startswith("optim.state.0.") and k.endswith(".step")] or ["optim.state.0.step"]
    return {**t, key: torch.zeros(5)}


@pytest.mark.parametrize(
    ("tensors_edit", "meta_edit", "needle"),
    [
        (forge_rng("rng.torch"), None, "unusable random-generator state 'rng.torch'"),
        (forge_rng("rng.data"), None, "unusable random-generator state 'rng.data'"),
        (forge_step, None, "step counter"),
        (
            None,
            lambda m: {**m, "optimizer": {**m["optimizer"], "param_groups": [1]}},
            "unusable optimizer param_groups",
        ),
    ],
    ids=["rng-torch-7-bytes", "rng-data-7-bytes", "step-shape-5", "param-groups-1"],
)
def test_a_forged_training_state_is_refused_by_resume(run, tensors_edit, meta_edit, needle, capsys):  # noqa: F811
    reforge(run, tensors_edit=tensors_edit, meta_edit=meta_edit)
    refused(capsys, [*resume_args(run), "--max_steps", "6"], needle)


def forge_tokenizer(folder: Path, data: dict) -> None:
    """A tokenizer forged consistently everywhere: its digest in ``config.json`` and in the checkpoint's
    record of the run files (checksums recomputed), so what is left to refuse it is the tokenizer itself."""
    from poslab.runs import RunFolder

    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    digest = ckpt.sha256_file(folder / "tokenizer.json")
    rewrite_config(folder, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})  # consistent
    reforge(folder, meta_edit=lambda meta: {**meta, ckpt.RUN_FILES: RunFolder(folder).file_digests()})


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (lambda chars: {"type": "char", "chars": chars[:10]}, "has 10 tokens but the model has"),
        (lambda chars: {"type": "ids", "vocab_size": 3}, "has 3 tokens but the model has"),
        (
            lambda chars: {"type": "bpe", "vocab_size": 5, "tokenizer": {"garbage": 1}},
            "'bpe' tokenizer body does not load",
        ),
        (lambda chars: {"type": "hf", "vocab_size": 5, "tokenizer": [1, 2]}, "'hf' tokenizer body does not load"),
    ],
    ids=["char-10-of-V", "ids-vocab-3", "bpe-garbage", "hf-garbage"],
)
def test_a_forged_tokenizer_is_refused_by_sample(run, body, needle, capsys):  # noqa: F811
    chars = json.loads((run / "tokenizer.json").read_text(encoding="utf-8"))["chars"]
    forge_tokenizer(run, body(chars))
    refused(capsys, ["sample", str(run), "--prompt", chars[0], "--tokens", "3"], needle)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_weights_of_an_integer_dtype_are_refused_not_cast(run, dtype, capsys):  # noqa: F811
    def cast(tensors):
        return {k: (v.to(dtype) if k == "model.tok_emb.weight" else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=cast)
    refused(capsys, ["sample", str(run), "--tokens", "2"], "wrong dtype", "tok_emb")


def test_weights_that_overflow_the_logits_are_one_line(run, capsys):  # noqa: F811
    def scale(tensors):
        return {k: (v * 1e25 if k.startswith("model.") and v.is_floating_point() else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=scale)
    refused(capsys, ["sample", str(run), "--tokens", "3", "--seed", "1"], "logits are not finite")


@pytest.mark.parametrize("factor", [1e30, 1e8])
def test_eval_of_weights_that_overflow_the_loss_is_one_line_and_writes_no_json(run, factor, tmp_path, capsys):  # noqa: F811
    """Embeddings x1e30 make the loss NaN; x1e8 a finite loss whose perplexity overflows a float: neither is
    printed as ``nan``/``inf`` nor written to ``--out`` as JSON's invalid ``NaN``."""

    def scale(tensors):
        return {k: (v * factor if k == "model.tok_emb.weight" else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=scale)
    out = tmp_path / "e.json"
    line = refused(
        capsys, ["eval", str(run), "--lengths", "16", "--out", str(out)], "the model's loss is", "at length 16"
    )
    assert "checkpoint is damaged" in line and not out.exists()


def test_heads_of_weights_whose_loss_is_not_finite_is_one_line_and_writes_nothing(run, tmp_path, capsys):  # noqa: F811
    """``heads`` printed ``loss nan (+nan)`` and wrote ``NaN`` into its results.json."""
    reforge(run, tensors_edit=lambda t: {k: (v * 1e30 if k == "model.tok_emb.weight" else v) for k, v in t.items()})
    out = tmp_path / "heads"
    refused(capsys, ["heads", str(run), "--quick", "--out", str(out)], "loss on the evaluation text is nan")
    assert not out.exists()


def test_a_json_output_with_a_non_finite_number_is_refused_naming_the_file(tmp_path):
    from poslab.fileio import atomic_write_json

    with pytest.raises(ValueError, match=r"'.*r.json' is not written: it would hold a non-finite number"):
        atomic_write_json(tmp_path / "r.json", {"loss": float("nan")}, allow_nan=False)
    assert not (tmp_path / "r.json").exists()
    answered()


# ---------------------------------------------------------------------- 13. extreme legal values: refused, not NaN
EXTREME = [
    ("rope", {"base": 1e-300}, "base=1e-300 gives frequencies"),
    ("prope", {"base": 1e-300}, "base=1e-300 gives frequencies"),
    ("xpos", {"base": 1e-300}, "base=1e-300 gives frequencies"),
    ("sinusoidal", {"base": 1e-300}, "base=1e-300 gives frequencies"),
    ("xl", {"base": 1e-300}, "base=1e-300 gives frequencies"),
    ("xpos", {"gamma": 1e-300}, "zeta_0 = gamma/(1+gamma) must be a normal fp32 number"),
    ("fire", {"c_init": 1e-300}, "log(c_init * threshold_init + 1)"),
    ("fire", {"threshold_init": 1e-300}, "log(c_init * threshold_init + 1)"),
    *[
        (
            "rope",
            {"scaling": s, "factor": 1e-300, **({"original_max_len": 16} if s != "linear" else {})},
            "frequencies up to",
        )
        for s in ("linear", "yarn", "llama3")
    ],
    ("rope", {"scaling": "ntk", "factor": 1e-300}, "frequencies up to"),
    ("xpos", {"scale_base": 5e-324}, "scale_base (the decay length, in positions)"),  # found by the fuzzer
]


@pytest.mark.parametrize(
    ("position", "config", "needle"), EXTREME, ids=[f"{p}-{'-'.join(map(str, c.values()))}" for p, c, _ in EXTREME]
)
def test_extreme_position_configs_are_refused_with_the_rule(position, config, needle):
    from poslab.nn.model import GPTConfig

    with pytest.raises(ValueError, match=None) as err:
        GPTConfig(
            n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, position=position, position_config=config
        )
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    FIGURES["cases"] += 1
    FIGURES["refused_one_line"] += 1


@pytest.mark.parametrize("value", [1e300, 3.4028235677973366e38, 5e-324])  # the last two found by the fuzzer
@pytest.mark.parametrize("key", ["attn_scale", "embed_scale", "attn_softcap", "final_softcap"])
def test_extreme_model_scales_are_refused(key, value):
    from poslab.nn.model import GPTConfig

    with pytest.raises(ValueError, match=f"{key} must be at most 1e\\+06 and at least 1e-06"):
        GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, **{key: value})
    FIGURES["cases"] += 1
    FIGURES["refused_one_line"] += 1


def test_ordinary_extreme_but_finite_configs_still_train_finite():
    """The bounds refuse only what overflows: the edge values just inside them give finite logits."""
    from poslab.nn.model import GPT, GPTConfig

    for position, config in [
        ("rope", {"base": 1.0}),
        ("sinusoidal", {"base": 2.0}),
        ("xpos", {"gamma": 1e-30}),
        ("fire", {"c_init": 1e-3, "threshold_init": 1.0}),
        ("rope", {"scaling": "linear", "factor": 1e-5}),
    ]:
        torch.manual_seed(0)
        model = GPT(
            GPTConfig(
                n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, position=position, position_config=config
            )
        )
        logits = model(torch.randint(0, 11, (1, 16)))
        assert bool(torch.isfinite(logits).all()), (position, config)
    answered()


def test_eval_rope_scaling_that_overflows_is_refused(two_checkpoints, capsys):
    refused(
        capsys, ["eval", str(two_checkpoints), "--rope-scaling", "yarn:1e-300", "--lengths", "16"], "frequencies up to"
    )


def test_sinusoidal_positions_past_fp32_integers_are_refused():
    from poslab.nn.model import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, position="sinusoidal"))
    with pytest.raises(ValueError, match=r"sinusoidal positions must be < 2\^24"):
        model(torch.zeros(1, 3, dtype=torch.long), pos=torch.tensor([0, 1, 2**62]))
    FIGURES["cases"] += 1
    FIGURES["refused_one_line"] += 1


# ---------------------------------------------------------------------- 11. --memory resumes bitwise
def test_a_memory_run_interrupted_and_resumed_continues_bitwise(tmp_path, corpus):  # noqa: F811
    """The segment memory is saved with the checkpoint (``memory.{micro}.*``): the resumed curve and
    weights equal the uninterrupted run's (a memory restarted empty changes the loss from step 5)."""
    from test_reliability_runs import tiny

    from poslab.runs import load_run, read_metrics
    from poslab.session import train

    model = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, position="rope", dropout=0.1)
    same = dict(ckpt_interval=3, eval_interval=3, lr_decay_steps=6, memory=8, model=model)
    whole = tiny(tmp_path / "a", corpus, max_steps=6, **same)
    train(whole, progress=False)
    part = tiny(tmp_path / "b", corpus, max_steps=3, **same)
    train(part, progress=False)
    assert any(k.startswith("memory.0.hidden.") for k in ckpt.load_checkpoint(part.run_dir)[0])
    train(tiny(tmp_path / "b", corpus, max_steps=6, **same), resume=True, progress=False)
    keys = ("step", "loss", "lr", "grad_norm", "val_loss")
    reference = [[r.get(k) for k in keys] for r in read_metrics(whole.run_dir)]
    assert [[r.get(k) for k in keys] for r in read_metrics(part.run_dir)] == reference
    a, b = load_run(whole.run_dir)[0], load_run(part.run_dir)[0]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    answered()


# ---------------------------------------------------------------------- 10. costs estimated before they are paid
def test_text_then_a_sparse_hole_is_refused_without_reading_it_whole(tmp_path):
    """5 MiB of text, then a 2 GiB sparse hole (no disk used): refused after about 1 MiB of probes, not
    after reading 2 GiB (which takes 43 s and 4.4 GB)."""
    import subprocess
    import sys

    path = tmp_path / "text-then-hole.txt"
    with open(path, "wb") as handle:
        handle.write(("白日依山尽，黄河入海流。\n" * 200_000).encode("utf-8")[: 5 * 2**20])
        handle.truncate(2 * 2**30)
    code = (
        "import resource, sys, time\nfrom poslab.data import load_text\nt = time.process_time()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    load_text(sys.argv[1])\nexcept ValueError as err:\n    print(err)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    message, grown_mib = done.stdout.strip().splitlines()
    assert "looks binary (contains NUL bytes)" in message
    assert int(grown_mib) < 256, grown_mib  # MiB the process grew by; the file is 2048
    FIGURES["cases"] += 1
    FIGURES["refused_one_line"] += 1


def test_a_huge_num_samples_is_refused_before_any_memory_is_spent(run, capsys):  # noqa: F811
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(
        capsys,
        ["sample", str(run), "--num-samples", "100000000", "--tokens", "8"],
        "--num-samples 100000000 needs about",
        "sample fewer at once",
    )
    assert (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    ) // 1024 < 64  # MiB grown (allocating first takes 1.8 GB)


def test_eval_prints_its_cost_before_scoring(run, capsys, monkeypatch):  # noqa: F811
    """``eval --stride 1`` at a long length: the estimate is printed before the first window is scored."""
    from poslab.analysis import eval as evaluation

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # scoring began: the warning must already be out

    monkeypatch.setattr(evaluation, "WARN_TOKEN_POSITIONS", 1000)
    monkeypatch.setattr(evaluation, "evaluate", stop)
    assert main(["eval", str(run), "--stride", "1", "--lengths", "16"]) == 130
    err = capsys.readouterr().err
    assert "poslab: warning: this evaluation runs" in err and "token positions" in err and "TFLOP" in err
    from poslab.runs import load_run

    cost = evaluation.estimate_cost(load_run(run)[0], n_targets=100, lengths=[16], stride=1)
    assert cost["windows"] == 7 + 1 + 84  # ceil(100/16) non-overlapping; 1 + (100-16)/1 sliding
    answered()
