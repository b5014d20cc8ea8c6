"""``poslab bench``: its case table (typed specs built by :data:`poslab.bench.BUILDERS`, names parsed once)
and the command on tiny sizes."""

from __future__ import annotations

import pytest
import torch

from poslab import bench
from poslab.nn import positions


def test_every_case_has_a_builder_and_survives_the_worker_round_trip():
    cases = bench.attention_cases()
    assert [c.name for c in cases[: len(positions.names())]] == [f"poslab:{n}" for n in positions.names()]
    for case in cases:
        assert case.builder in bench.BUILDERS, case
        assert bench.Case.from_json(case.to_json()) == case


def test_cases_build_and_run_with_their_typed_parameters(single_thread):
    torch.manual_seed(0)
    for case in bench.find_cases(["poslab:rope", "poslab:none-window256", "torch-mha-is_causal", "naive"]):
        bench.build_case(case, 16)()  # forward + backward
    window = bench.find_cases(["poslab:none-window256"])[0]
    assert dict(window.params) == {"scheme": "none", "window": 256} and window.window == 256


def test_unknown_names_and_builders_are_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown benchmark case 'poslab:nope'; known: poslab:none"):
        bench.find_cases(["naive", "poslab:nope"])
    with pytest.raises(ValueError, match="unknown benchmark builder 'nope'"):
        bench.build_case(bench.Case("x", "nope"), 8)


#: shrink what T=64 would not reach: windows, chunks, the temperature's floor_scale
_SMALL = {"sliding_window": 16, "attention_chunk_size": 16, "floor_scale": 8}


#: gpt-oss's global layer: poslab runs SDPA's fused (flash) kernel, transformers an eager softmax; at these
#: scaled-up logits the flash kernel's fp32 backward is ~1e-4..1e-3 from an fp64 reference with or
#: without sinks (eager: ~3e-5), so the gradients get 5e-4 here (outputs keep 1e-4)
_GRAD_ATOL = {"gptoss-sinks": 5e-4}


@pytest.mark.parametrize("variant", list(bench.HF_FAMILY_CASES))
def test_hf_family_case_and_its_poslab_twin_compute_the_same_function(variant, single_thread):
    """``hf-<variant>`` and ``poslab:<variant>`` (converted by poslab.interop from the same model):
    equal outputs and input gradients, so the benchmark compares like with like."""
    T = 64
    torch.manual_seed(0)
    _, _, settings = bench.HF_FAMILY_CASES[variant]
    overrides = {
        k: v
        for k, v in _SMALL.items()
        if k in settings or (k == "sliding_window" and "sliding_attention" in settings.get("layer_types", ()))
    }
    model = bench.hf_family_model(variant, T, **overrides)
    with torch.no_grad():  # outputs O(1), logits O(10): near enough the soft-cap; sinks that matter
        for name, p in model.named_parameters():
            query_or_key = any(part in name for part in ("q_proj", "k_proj", "q_a", "q_b", "kv_a_proj", "kv_b"))
            p.normal_(0.0, 3.0 if name.endswith("sinks") else 0.3 if query_or_key else bench.D_MODEL**-0.5)
    x = torch.randn(2, T, bench.D_MODEL, requires_grad=True)
    hf_module, hf_forward = bench.hf_family_attention(model, x, T)
    ours_module, ours_forward = bench.poslab_family_attention(model, x, T)
    assert sum(p.numel() for p in hf_module.parameters()) == sum(p.numel() for p in ours_module.parameters())
    probe = torch.randn(2, T, bench.D_MODEL)  # a fixed random loss direction
    theirs = hf_forward()
    (g_theirs,) = torch.autograd.grad((theirs * probe).sum(), x)
    ours = ours_forward()
    (g_ours,) = torch.autograd.grad((ours * probe).sum(), x)
    assert theirs.std() > 0.1  # not trivially close
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(g_ours, g_theirs, atol=_GRAD_ATOL.get(variant, 1e-4), rtol=1e-4)


def test_hf_family_cases_pair_up_and_name_their_implementation():
    cases = bench.hf_family_cases()
    names = [c.name for c in cases]
    assert names == [n for v in bench.HF_FAMILY_CASES for n in (f"poslab:{v}", f"hf-{v}")]
    assert bench.find_cases(["hf-gemma2-softcap"]) == [c for c in cases if c.name == "hf-gemma2-softcap"]
    for case in cases:
        assert bench.Case.from_json(case.to_json()) == case
    eager = {v for v, (_, impl, _) in bench.HF_FAMILY_CASES.items() if impl == "eager"}
    assert eager == {"gemma2-softcap", "gemma2-softcap-window256", "gptoss-sinks", "gptoss-sinks-window128"}
    with pytest.raises(ValueError, match="unknown transformers family case 'nope'"):
        bench.hf_family_model("nope", 8)


def test_bench_cli_smoke(tmp_path) -> None:
    """``poslab bench`` on tiny sizes writes its table, JSON and plot; bad sizes are one-line errors."""
    import json

    from poslab.cli.app import main

    out = tmp_path / "bench"
    args = [
        "bench",
        "--sizes",
        "32",
        "--contexts",
        "8",
        "--repeats",
        "1",
        "--cases",
        "poslab:none,naive",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["case"]: r for r in results["attention"]["rows"]}
    assert set(rows) == {"poslab:none", "naive"}
    assert all(r["ms"] > 0 and r["peak_mib"] is not None for r in rows.values())  # memory from a subprocess
    assert results["attention"]["roofline_gflops"] > 0
    assert {r["case"] for r in results["decode"]["rows"]} >= {"kv-cache:rope", "recompute:rope"}
    assert "| 32 | poslab:none |" in (out / "report.md").read_text()
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    again = tmp_path / "again"
    assert main(["bench", "--from-results", str(out / "results.json"), "--out", str(again)]) == 0  # no measuring
    assert (again / "report.md").read_text() == (out / "report.md").read_text()
    assert main(["bench", "--from-results", str(tmp_path / "missing.json")]) == 2
    assert main(["bench", "--sizes", "32,zero", "--out", str(out)]) == 2
    assert main(["bench", "--cases", "poslab:nope", "--out", str(out)]) == 2
