"""Unbounded and rough inputs: each refused in one line before it costs anything.

* YAML alias bombs in sweep and preset files (one guard, :mod:`poslab.data.safe_yaml`);
* a model that cannot fit this machine, refused by ``--dry-run`` too, with the estimate (``--force`` overrides);
* ``--eval_iters`` past any real use; eager attention that would take most of the RAM;
* a huge binary corpus refused from its first megabytes;
* ``--temperature 1e-45``; path arguments of the wrong kind; ``--name ''`` and names with a newline;
  uint8 ids, float or out-of-range targets; ``make_cache(capacity=0)``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lab_helpers import one_thread, tiny_run

from poslab.cli.app import main
from poslab.data import safe_yaml
from poslab.nn import footprint
from poslab.nn.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
FIGURES: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _record(request):
    """What each test tried goes to ``test-artifacts/reliability.json`` (the reliability table)."""
    from test_reliability_artifacts import mode, record

    FIGURES.clear()
    FIGURES.update(cases=0, refused_one_line=0, tracebacks=0)
    yield
    if FIGURES["cases"]:
        record("inputs", mode(request), dict(FIGURES))


def tally(cases: int = 1, refused: int | None = None) -> None:
    """Count ``cases`` bad inputs of a test that passed its assertions (``refused`` of them refused)."""
    FIGURES["cases"] += cases
    FIGURES["refused_one_line"] += cases if refused is None else refused


# ------------------------------------------------------------------------------------------ YAML alias bombs
def bomb(levels: int = 9, width: int = 9) -> str:
    """About 500 bytes whose ``description`` expands to ``width ** levels`` strings (9^9 = 387 million)."""
    lines = ["description:", f"  - &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_bomb_is_small():
    assert len(bomb()) < 600


def test_sweep_file_alias_bomb_is_refused(tmp_path, capsys):
    """Refused before ``--dry-run`` describes it: ``str(description)`` would walk 9^9 strings (gigabytes)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb() + "preset: tiny\ngrid:\n  seed: [1]\n")
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "expands to more than 100,000 values through its aliases" in err and "bomb.yaml" in err
    assert len(err.strip().splitlines()) == 1
    tally()


def test_preset_file_alias_bomb_is_refused_by_the_same_guard(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "config:\n  corpus: shakespeare\n"
        + bomb().replace("description:", "  model:\n    position_config:\n      x:").replace("\n  - ", "\n        - ")
    )
    assert main(["train", "--preset", str(path), "--dry-run"]) == 2
    assert "expands to more than 100,000 values" in capsys.readouterr().err
    tally()


def test_recursive_alias_is_refused(tmp_path):
    with pytest.raises(ValueError, match="refers to itself"):
        safe_yaml.load("a: &a [1, *a]\n", "x.yaml")
    tally()


def test_ordinary_aliases_still_load():
    text = "base: &b {lr: 0.001, n: [1, 2]}\nrun1: *b\nrun2: {<<: *b, lr: 0.01}\n"
    assert safe_yaml.load(text, "x") == {
        "base": {"lr": 0.001, "n": [1, 2]},
        "run1": {"lr": 0.001, "n": [1, 2]},
        "run2": {"lr": 0.01, "n": [1, 2]},
    }


def test_expanded_size_counts_every_reference():
    import yaml

    node = yaml.compose("a: &x [1, 2, 3]\nb: [*x, *x]\n")
    # mapping 1 + key a 1 + [1,2,3] 4 + key b 1 + [*x, *x] (1 + 2 * 4)
    assert safe_yaml.expanded_size(node, 10**6) == 1 + 1 + 4 + 1 + 1 + 2 * 4


# ------------------------------------------------------------------------------------------ memory pre-flight
def test_a_model_that_cannot_fit_is_refused_by_dry_run(tmp_path, capsys):
    """The memory estimate refuses it at ``--dry-run``: building 10^8 layers grows memory ~4 GB a minute."""
    args = ["train", "--preset", "tiny", "--dry-run", "--out_dir", str(tmp_path), "--model.n_layer", "100000000"]
    assert main(args) == 2
    err = capsys.readouterr().err
    # 10^8 layers of 12 * 32^2 weights (+ the vocabulary's embedding, whose size the corpus decides later)
    assert (
        re.search(r"this training needs about [\d,.]+ GiB \(1,228,800,0\d\d,\d\d\d parameters", err)
        and "--force" in err
    )
    assert "available" in err and len(err.strip().splitlines()) == 1
    with pytest.warns(UserWarning, match="--force"):
        assert main([*args, "--force"]) == 0  # the user knows better: the dry run goes on
    tally()


def test_the_estimate_is_refused_by_the_sweep_pre_flight(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("preset: tiny\noverrides: {model.n_layer: 100000000}\ngrid: {seed: [1]}\n")
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert "this training needs about" in capsys.readouterr().err
    tally()


def test_parameter_count_matches_built_models():
    """The estimate's parameter count against ``numel`` of real models (biases and norms are what it leaves out)."""
    for fields in [
        dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=97),
        dict(
            n_layer=3,
            n_head=4,
            n_kv_head=2,
            n_embd=64,
            block_size=16,
            vocab_size=50,
            position="rope",
            mlp="swiglu",
            tie_embeddings=False,
            norm="rmsnorm",
            bias=False,
        ),
    ]:
        with torch.random.fork_rng():
            model = GPT(GPTConfig(**fields))
        actual = sum(p.numel() for p in model.parameters())
        estimated = footprint.parameter_count(fields)
        assert abs(estimated - actual) / actual < 0.03, (fields, estimated, actual)


def test_eval_iters_past_any_real_use_is_refused(tmp_path, capsys):
    """``--eval_iters 10000000000000`` would start, then evaluate for ever: refused at the pre-flight."""
    assert (
        main(["train", "--preset", "tiny", "--dry-run", "--out_dir", str(tmp_path), "--eval_iters", "10000000000000"])
        == 2
    )
    err = capsys.readouterr().err
    assert "eval_iters 10,000,000,000,000 is more than 100,000" in err
    tally()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--grad_accum", "9223372036854775807"], "tokens per step"),
        (["--batch_size", "100000000"], "= 3,200,000,000 tokens per step"),
        (["--max_steps", "1000000000000"], "x max_steps 1,000,000,000,000"),
        (["--max_steps", "4000000000", "--batch_size", "10000000"], "tokens in all"),
    ],
)
def test_a_training_past_any_real_size_is_refused_by_dry_run(tmp_path, capsys, extra, needle):
    """``--grad_accum 9223372036854775807`` passed ``--dry-run`` and then ran for ever with no estimate: a
    training of more than 2**30 tokens per step, 1e9 steps or 1e15 tokens is refused, naming the rule."""
    assert main(["train", "--preset", "tiny", "--dry-run", "--out_dir", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "a training is limited to 1,073,741,824 tokens per step, 1e+09 steps" in err
    tally()


def test_dry_run_prints_the_cost_before_it_is_paid(tmp_path, capsys):
    argv = ["train", "--preset", "tiny", "--dry-run", "--out_dir", str(tmp_path), "--grad_accum", "3"]
    assert main([*argv, "--max_steps", "10", "--batch_size", "4", "--model.block_size", "16"]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert cost["tokens_per_step"] == 4 * 3 * 16 and cost["tokens"] == 10 * 4 * 3 * 16
    assert cost["flops_estimate"] == 6 * cost["parameters_estimate"] * cost["tokens"]
    tally(1, refused=0)


def test_eager_attention_refuses_scores_past_the_ram_fraction(monkeypatch):
    """The issue's case (ALiBi, T=20000, eager: ~23 GB, killed by the kernel) on a machine made small."""
    with pytest.raises(ValueError, match=r"eager attention at B=1, h=8, 20000x20000 would allocate about 47.7 GiB"):
        footprint.check_eager_scores(1, 8, 20000, 20000, available=64 * 2**30)
    monkeypatch.setattr(footprint, "available_bytes", lambda: 512 * 2**20)  # 537 MB of scores > half of 512 MiB
    with torch.random.fork_rng():
        model = GPT(
            GPTConfig(vocab_size=8, n_layer=1, n_head=8, n_embd=64, block_size=2048, position="alibi", backend="eager")
        ).eval()
    with torch.no_grad(), pytest.raises(ValueError, match="use the sdpa backend"):
        model(torch.zeros(1, 2048, dtype=torch.long))
    with torch.no_grad():
        assert model(torch.zeros(1, 64, dtype=torch.long)).shape == (1, 64, 8)  # small inputs: no check at all
    tally(2)


# ------------------------------------------------------------------------------------------ corpus sniffing
def test_a_huge_sparse_corpus_is_refused_without_reading_it(tmp_path):
    """Refused from a sniff of the file, not after reading the whole 1 GiB (1.28 GB RSS)."""
    path = tmp_path / "sparse.txt"
    with open(path, "wb") as handle:
        handle.truncate(2**30)  # a sparse GiB of NUL bytes: no disk used
    code = (
        "import resource, sys\nfrom poslab.data import load_text\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    load_text(sys.argv[1])\nexcept ValueError as err:\n    print(err)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    message, grown_mib = done.stdout.strip().splitlines()
    assert "looks binary (contains NUL bytes)" in message
    assert int(grown_mib) < 256, grown_mib  # MiB the process grew by; the whole file is 1024
    tally()
    FIGURES["max_mib_grown_reading_1gib_binary_corpus"] = int(grown_mib)


def test_sniffing_keeps_a_character_cut_at_the_sniff_boundary(tmp_path):
    from poslab.data import SNIFF_BYTES, load_text

    text = "a" * (SNIFF_BYTES - 1) + "白日依山尽\n"  # 白 straddles the end of the sniffed bytes
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    assert load_text(path) == text
    path.write_bytes(b"ok\xff" + b"a" * 10)
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 2\)"):
        load_text(path)


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
            model.make_cache(1, capacity=bad)
    assert len(model.make_cache(1, capacity=4)) == 1 and len(model.make_cache(1)) == 1
    tally(4)
