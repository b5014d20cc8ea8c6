"""``poslab bench``'s case table: typed specs built by :data:`poslab.lab.bench.BUILDERS`, names parsed once."""

from __future__ import annotations

import pytest
import torch

from poslab.lab import bench
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
