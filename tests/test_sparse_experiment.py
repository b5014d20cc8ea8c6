"""``poslab experiment sparse``: the task, the five attentions behind one interface, the cost readings."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest
import torch

from poslab.cli.app import main
from poslab.lab.experiments import sparse, sparse_model
from poslab.lab.plan import Test as StatTest
from poslab.lab.premises import attach
from poslab.lab.verdicts import HELD, INCONCLUSIVE, check_records, missing_premises


def test_delayed_copy_repeats_its_first_half_and_the_loss_reads_only_the_second():
    tokens = sparse_model.delayed_copy(3, 16, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 16)
    assert torch.equal(tokens[:, :8], tokens[:, 8:])
    logits = torch.randn(3, 16, sparse_model.VOCAB)
    changed = logits.clone()
    changed[:, :7] += 5.0  # predictions of the unpredictable first half
    assert sparse_model.copy_loss(changed, tokens) == sparse_model.copy_loss(logits, tokens)
    changed[:, 7] += torch.randn(3, sparse_model.VOCAB)  # the first predictable target
    assert sparse_model.copy_loss(changed, tokens) != sparse_model.copy_loss(logits, tokens)


@pytest.mark.parametrize("kind", ["full", "window", "axial", "adaptive"])
def test_every_kind_is_causal(kind):
    torch.manual_seed(0)
    model = sparse_model.CopyModel(kind, 64)
    x = sparse_model.delayed_copy(1, 64, torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, 40:] = (y[0, 40:] + 1) % sparse_model.VOCAB  # change only the future of position 39
    assert torch.allclose(model(x)[0, :40], model(y)[0, :40], atol=1e-5)
    assert not torch.allclose(model(x)[0, 40:], model(y)[0, 40:], atol=1e-5)


def test_lsh_kind_runs_and_keeps_the_shape():
    model = sparse_model.CopyModel("lsh", 64)
    assert model(sparse_model.delayed_copy(2, 64, torch.Generator().manual_seed(0))).shape == (
        2,
        64,
        sparse_model.VOCAB,
    )


def test_window_model_cannot_reach_the_copy_distance_but_full_can():
    T = 64
    for kind, reaches in (("window", False), ("full", True)):
        torch.manual_seed(0)
        model = sparse_model.CopyModel(kind, T)
        emb = model.tok(sparse_model.delayed_copy(1, T, torch.Generator().manual_seed(2))).detach().requires_grad_(True)
        x = emb + model.pos(torch.arange(T))[None]
        for block in model.blocks:
            x = block(x)
        model.head(model.ln(x))[0, T - 1].sum().backward()
        source = T - 1 - (T // 2 - 1)  # the token the last prediction copies
        assert bool(emb.grad[0, source].abs().sum() > 0) is reaches, kind


def test_attended_fraction():
    T = 100
    assert sparse_model.attended_fraction([T + 10.0], T) == pytest.approx(1.0)
    reach = 0.0 + sparse_model.SPAN_RAMP
    expected = sum(min(i + 1, reach) for i in range(T)) / (T * (T + 1) / 2)
    assert sparse_model.attended_fraction([0.0, 0.0], T) == pytest.approx(expected)
    assert sparse_model.attended_fraction([0.0], T) < sparse_model.attended_fraction([50.0], T) < 1


def test_peak_memory_grows_with_T_for_full_attention():
    small = sparse_model.peak_step_mib(
        sparse_model.CopyModel("full", 64), sparse_model.delayed_copy(8, 64, torch.Generator().manual_seed(0))
    )
    large = sparse_model.peak_step_mib(
        sparse_model.CopyModel("full", 256), sparse_model.delayed_copy(8, 256, torch.Generator().manual_seed(0))
    )
    assert 0 < small < large


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown attention kind 'dense'"):
        sparse_model.Attention("dense", 64)


def _run_cli(out, quick: bool = True):
    buffer = io.StringIO()
    args = ["experiment", "sparse", "--out", str(out)] + (["--quick"] if quick else [])
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    return json.loads((out / "results.json").read_text()), buffer.getvalue()


def _check(results, stdout, out, n_seeds):
    assert not check_records(results["claims"])
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert len(results["claims"]) == len(sparse.KINDS)
    # every kind trains from each seed on the same batches: paired by seed; the timing has a family of its own
    assert all(c["design"]["test"] == StatTest.PAIRED.value for c in results["claims"])
    assert all(c["details"]["seeds"] == list(results["config"]["seeds"]) for c in results["claims"])
    assert results["claims"][-1]["design"]["family"] == sparse.TIMING_FAMILY
    if n_seeds < 3:
        assert {c["verdict"] for c in results["claims"]} == {"inconclusive"}  # one seed decides nothing
    lengths = results["config"]["lengths"]
    assert len(results["runs"]) == len(sparse.KINDS) * len(lengths) * n_seeds
    for r in results["runs"]:
        assert r["step_ms"] > 0 and r["peak_mib"] > 0 and 0 <= r["accuracy"] <= 1
        if r["kind"] == "adaptive":
            assert len(r["spans"]) == sparse_model.N_LAYERS and all(len(s) == sparse_model.N_HEADS for s in r["spans"])
            assert all(0 <= z <= r["T"] for layer in r["spans"] for z in layer)
    assert 0 <= results["adaptive_span"]["key_pairs_saved"] < 1
    assert (out / "sparse.png").stat().st_size > 10_000
    assert "delayed copy" in stdout


def _run(kind: str, seed: int, loss: float, accuracy: float = 1.0, step_ms: float = 10.0) -> sparse_model.SparseRun:
    return sparse_model.SparseRun(kind, 64, seed, loss, accuracy, step_ms, peak_mib=1.0, spans=[])


def test_claims_are_paired_by_seed_and_premised_on_every_seed():
    # the seeds' tasks differ by 0.5 nats, full beats every sparse kind by 0.10 at each seed: only pairing sees it
    runs = [
        _run(kind, seed, base + (0.0 if kind == "full" else 0.10 + 0.002 * seed))
        for seed, base in ((2, 0.2), (0, 0.7), (1, 1.2))
        for kind in sparse.KINDS
    ]
    records = sparse.sparse_claims(runs, 64)
    assert all(r.verdict == HELD and r.details["seeds"] == [0, 1, 2] for r in records[:-1])
    assert records[0].details["better"] == [0.7, 1.2, 0.2]  # in the order of the seeds
    assert sparse.sparse_premise(records[0], runs, 64).met
    # one seed's full model that does not solve the task leaves the claim untestable, whatever the mean
    runs[0] = dataclasses.replace(runs[0], accuracy=0.75)  # the mean over seeds stays above 0.9
    premise = sparse.sparse_premise(records[0], runs, 64)
    assert not premise.met
    attached = attach(records, lambda r: sparse.sparse_premise(r, runs, 64))
    assert all(c["verdict"] == INCONCLUSIVE for c in attached)
    assert check_records(attached) == []


def test_small_form(tmp_path, capsys):
    """The quick form's code path at one length and 40 steps: the fast version of ``test_quick_form``."""
    results = sparse.run(tmp_path, quick=True, config={"lengths": (64,), "steps": 40})
    _check(json.loads(json.dumps(results)), capsys.readouterr().out, tmp_path, n_seeds=1)


@pytest.mark.slow  # 55 s: the quick form as a user runs it; test_small_form runs its code in the default suite
def test_quick_form(tmp_path):
    results, stdout = _run_cli(tmp_path)
    _check(results, stdout, tmp_path, n_seeds=1)


@pytest.mark.slow
def test_full_form(tmp_path):
    results, stdout = _run_cli(tmp_path, quick=False)
    _check(results, stdout, tmp_path, n_seeds=3)
    full = results["summary"]["full"][str(max(results["config"]["lengths"]))]
    assert full["eval_loss"] < 1.0  # full attention learns the copy
