"""Costs refused before they are paid: a model or training past this machine, evaluations and samples
past any real use, eager attention past the RAM, huge or binary corpora read in bounded chunks. Each
is one line naming the value, the estimate and the rule (``--force`` overrides where it is a guess).

The figures go to ``test-artifacts/reliability.json`` under ``inputs`` and ``hostile_inputs``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import HOSTILE, INPUTS, answered, refused, tally

from poslab.cli.app import main
from poslab.nn import footprint
from poslab.nn.attention import AttentionConfig
from poslab.nn.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("hostile_figures", "input_figures")


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
            tie_embeddings=False,
            bias=False,
            mlp={"kind": "swiglu"},
            norm={"kind": "rmsnorm"},
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
            GPTConfig(
                vocab_size=8,
                n_layer=1,
                n_head=8,
                n_embd=64,
                block_size=2048,
                position="alibi",
                attention=AttentionConfig(backend="eager"),
            )
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
    INPUTS["max_mib_grown_reading_1gib_binary_corpus"] = int(grown_mib)


def test_sniffing_keeps_a_character_cut_at_the_sniff_boundary(tmp_path):
    from poslab.data import SNIFF_BYTES, load_text

    text = "a" * (SNIFF_BYTES - 1) + "白日依山尽\n"  # 白 straddles the end of the sniffed bytes
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    assert load_text(path) == text
    path.write_bytes(b"ok\xff" + b"a" * 10)
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 2\)"):
        load_text(path)


# ---------------------------------------------------------------------- costs estimated before they are paid
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
    HOSTILE["cases"] += 1
    HOSTILE["refused_one_line"] += 1


def test_a_huge_num_samples_is_refused_before_any_memory_is_spent(run, capsys):
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


def test_eval_prints_its_cost_before_scoring(run, capsys, monkeypatch):
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
