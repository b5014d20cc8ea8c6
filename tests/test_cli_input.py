"""Command-line values at and past their edges: each gets the right answer or one ``poslab: error:``
line naming the argument and the rule (exit 2), never a traceback or a silently different result.

The figures go to ``test-artifacts/reliability.json`` under ``inputs`` and ``hostile_inputs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import DRY, answered, refused, tally
from lab_helpers import one_thread, tiny_run
from run_helpers import tiny

from poslab.cli.app import main
from poslab.nn.caches import DecodeSpec
from poslab.nn.model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("single_thread", "hostile_figures", "input_figures")


# ------------------------------------------------------------------------------------------ CLI rough edges
@pytest.fixture(scope="module")
def run_dir() -> Path:
    with one_thread():
        return tiny_run("rope")


@pytest.mark.parametrize("temperature", ["1e-45", "1e-300", "5e-324"])
def test_tiny_temperature_is_greedy_not_a_traceback(run_dir, temperature, capsys):
    """``logits / 1e-45`` overflows fp32 to inf and the softmax to NaN, and 1e-300 is 0 in fp32: a temperature
    that small samples greedily."""
    argv = ["sample", str(run_dir), "--prompt", "白日", "--tokens", "6", "--temperature", temperature, "--seed", "1"]
    assert main(argv) == 0
    tiny = capsys.readouterr().out
    assert main(["sample", str(run_dir), "--prompt", "白日", "--tokens", "6", "--temperature", "0"]) == 0
    assert tiny == capsys.readouterr().out  # the limit of a vanishing temperature is greedy decoding
    tally(1, refused=0)  # accepted: greedy, no traceback


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--preset", "tiny", "--out_dir", "{file}"], "--out_dir '{file}' is a file, not a folder"),
        (["train", "--preset", "tiny", "--out_dir", "{file}/sub"], "'{file}' is a file, not a folder"),
        (
            ["train", "--preset", "tiny", "--out_dir", "{tmp}", "--init_from", "{file}"],
            "--init_from '{file}' is a file",
        ),
        (
            ["train", "--preset", "tiny", "--out_dir", "{tmp}", "--init_from", "{dir}"],
            "--init_from '{dir}' is not a poslab run folder",
        ),
        (["experiment", "params", "--out", "{file}"], "--out '{file}' is a file, not a folder"),
        (["bench", "--out", "{file}", "--only", "decode"], "--out '{file}' is a file, not a folder"),
        (["eval", "{run}", "--out", "{dir}"], "--out '{dir}' is a folder; give the path of a file"),
        (["attention", "{run}", "--json", "{dir}"], "--json '{dir}' is a folder"),
        (["heads", "{run}", "--out", "{file}"], "--out '{file}' is a file, not a folder"),
        (["train", "--preset", "tiny", "--name", ""], "--name must not be empty"),
        (["train", "--preset", "tiny", "--out_dir", "/proc/self"], "--out_dir '/proc/self': files cannot be created"),
        (  # a text, not a path: never tried as a file name ("File name too long", exit 1)
            ["heads", "{run}", "--quick", "--text", "白" * 100_000],
            "… (100,000 characters) is neither a shipped corpus",
        ),
        (["train", "--preset", "tiny", "--name", "a\nb"], "--name must not contain control characters such as '\\n'"),
    ],
)
def test_path_and_name_arguments_get_one_line_naming_the_argument(tmp_path, capsys, run_dir, argv, message):
    """Exit 2 with a line naming the argument, never the raw OSError of the first file touched ('cannot create the
    run lock ... File exists', 'Not a directory: .../tokenizer.json', '[Errno 17] File exists'); ``--name ''``
    is refused, not replaced by the preset's name."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    names = {
        "file": str(tmp_path / "f"),
        "dir": str(tmp_path / "d"),
        "tmp": str(tmp_path / "runs"),
        "run": str(run_dir),
    }
    argv = [a.format(**names) for a in argv] + (
        ["--dry-run"] if argv[0] == "train" and "--init_from" not in argv else []
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("poslab: error: ") and message.format(**names) in err and len(err.splitlines()) == 1, err
    tally()


def test_token_ids_and_targets_get_clear_errors():
    with torch.random.fork_rng():
        model = GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=8))
    ids = torch.tensor([[1, 2, 3]])
    expected = model(ids)
    torch.testing.assert_close(model(ids.to(torch.uint8)), expected, rtol=0, atol=0)  # uint8 ids index like int64 ones
    torch.testing.assert_close(model(ids.to(torch.int16)), expected, rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"targets must hold integer token ids \(-1 = ignored\), got torch.float32"):
        model(ids, ids.float())
    with pytest.raises(
        ValueError, match=r"target id 30 is outside the vocabulary: targets must lie in \[0, 10\) or be -1"
    ):
        model(ids, torch.tensor([[1, 2, 30]]))
    with pytest.raises(ValueError, match="target id -5 is outside"):
        model(ids, torch.tensor([[1, -5, 3]]))
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(1, 3\), got \(1, 2\)"):
        model(ids, torch.tensor([[1, 2]]))
    _, loss = model(ids, torch.tensor([[2, -1, 4]]))
    assert torch.isfinite(loss)
    tally(6, refused=4)  # uint8 and int16 ids are accepted, the 4 bad targets refused


def test_make_cache_capacity_zero_is_refused():
    with torch.random.fork_rng():
        model = GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=8))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"capacity must be a positive integer \(or None = block_size\)"):
            model.make_cache(1, DecodeSpec(capacity=bad))
    assert len(model.make_cache(1, DecodeSpec(capacity=4))) == 1 and len(model.make_cache(1)) == 1
    tally(4)


# ---------------------------------------------------------------------- flex cannot train on CPU
def test_flex_backend_is_refused_for_training_on_cpu_by_dry_run_and_train(tmp_path, capsys):
    argv = [
        "train",
        *("--preset", "tiny", "--model.attention.backend", "flex", "--out_dir", str(tmp_path), "--max_steps", "1"),
    ]
    refused(capsys, [*argv, "--dry-run"], "model.attention.backend='flex' cannot train on cpu", "sdpa or eager")
    refused(capsys, argv, "model.attention.backend='flex' cannot train on cpu")
    assert not any(tmp_path.iterdir())  # refused before the run folder was made


# ---------------------------------------------------------------------- dry-run checks what train checks
def test_dry_run_refuses_memory_with_a_position_table(tmp_path, capsys):
    refused(
        capsys,
        [*DRY, "--memory", "16", "--model.position", "learned", "--out_dir", str(tmp_path)],
        "memory=16 continues positions across segments",
        "'learned' table",
    )


def test_dry_run_refuses_init_from_weights_that_do_not_fit(run, tmp_path, capsys):
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


# ---------------------------------------------------------------------- top-p below fp32's range
def test_a_top_p_that_underflows_fp32_is_greedy(run, capsys):
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


# ---------------------------------------------------------------------- averaging weights past float's range
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, corpus):
    """A rope run with two checkpoints (steps 2 and 4)."""
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


def test_eval_rope_scaling_that_overflows_is_refused(two_checkpoints, capsys):
    refused(
        capsys, ["eval", str(two_checkpoints), "--rope-scaling", "yarn:1e-300", "--lengths", "16"], "frequencies up to"
    )


def test_a_json_output_with_a_non_finite_number_is_refused_naming_the_file(tmp_path):
    from poslab.fileio import atomic_write_json

    with pytest.raises(ValueError, match=r"'.*r.json' is not written: it would hold a non-finite number"):
        atomic_write_json(tmp_path / "r.json", {"loss": float("nan")}, allow_nan=False)
    assert not (tmp_path / "r.json").exists()
    answered()
