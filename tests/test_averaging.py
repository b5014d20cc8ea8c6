"""``average_state_dicts`` (poslab/training/averaging.py): the weighted mean of state dicts, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from poslab.training.averaging import average_state_dicts


def two() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    a = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.0, 10.0]), "step": torch.tensor(7)}
    b = {"w": torch.tensor([[3.0, 2.0], [1.0, 0.0]]), "b": torch.tensor([4.0, -10.0]), "step": torch.tensor(7)}
    return a, b


def test_mean_of_two_known_dicts():
    a, b = two()
    out = average_state_dicts([a, b])
    assert list(out) == ["w", "b", "step"]
    assert torch.equal(out["w"], torch.tensor([[2.0, 2.0], [2.0, 2.0]])) and torch.equal(
        out["b"], torch.tensor([2.0, 0.0])
    )
    assert torch.equal(out["step"], torch.tensor(7))  # integer buffers are copied, not averaged
    weighted = average_state_dicts([a, b], weights=[3, 1])  # normalised to 0.75 / 0.25
    assert torch.equal(weighted["w"], torch.tensor([[1.5, 2.0], [2.5, 3.0]]))
    assert torch.equal(average_state_dicts([a, b], weights=[0.0, 2.0])["b"], b["b"])
    assert out["w"] is not a["w"] and out["step"] is not a["step"]  # fresh tensors
    out["w"].add_(1)
    assert torch.equal(a["w"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))  # the inputs are untouched
    assert torch.equal(average_state_dicts([a])["w"], a["w"])


def test_mismatches_are_refused_naming_the_key():
    a, b = two()
    with pytest.raises(ValueError, match=r"state dict 1 has other keys.*missing \['b'\], extra \['bias'\]"):
        average_state_dicts([a, {**{k: v for k, v in b.items() if k != "b"}, "bias": b["b"]}])
    with pytest.raises(ValueError, match=r"key 'w': shape \[4\] in state dict 1 differs from \[2, 2\]"):
        average_state_dicts([a, {**b, "w": b["w"].reshape(4)}])
    with pytest.raises(ValueError, match=r"key 'b': dtype torch.float64 in state dict 1 differs from torch.float32"):
        average_state_dicts([a, {**b, "b": b["b"].double()}])
    with pytest.raises(ValueError, match=r"key 'step': the torch.int64 tensor differs .* must be equal"):
        average_state_dicts([a, {**b, "step": torch.tensor(8)}])
    with pytest.raises(ValueError, match=r"key 'w': state dict 1 holds a list"):
        average_state_dicts([a, {**b, "w": [1.0]}])
    with pytest.raises(ValueError, match="at least one state dict"):
        average_state_dicts([])


@pytest.mark.parametrize(
    "weights, match",
    [
        ([1.0], "weights has 1 values for 2 state dicts"),
        ([1.0, -0.5], r"weights\[1\] = -0.5"),
        ([math.nan, 1.0], r"weights\[0\] = nan"),
        ([math.inf, 1.0], r"weights\[0\] = inf"),
        ([True, 1.0], r"weights\[0\] = True"),
        (["1", 1.0], r"weights\[0\] = '1'"),
        ([0.0, 0.0], "sum to 0.0"),
    ],
)
def test_weights_are_validated(weights, match):
    with pytest.raises(ValueError, match=match):
        average_state_dicts(list(two()), weights=weights)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dtype_is_preserved_and_the_sum_is_taken_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    dicts = [{"w": torch.randn(64, generator=g).to(dtype), "mask": torch.tensor([True, False])} for _ in range(5)]
    out = average_state_dicts(dicts)
    assert out["w"].dtype == dtype and out["mask"].dtype == torch.bool
    exact = sum(d["w"].double() for d in dicts) / 5
    assert torch.equal(out["w"], exact.to(dtype)) or dtype in (torch.float32, torch.float64)  # one rounding, at the end
    torch.testing.assert_close(
        out["w"].double(), exact, rtol=0, atol=1e-6 if dtype in (torch.float32, torch.float64) else 0.01
    )
    if dtype == torch.bfloat16:  # summing in bf16 rounds at every partial sum: a larger error
        in_bf16 = dicts[0]["w"] * 0.2
        for d in dicts[1:]:
            in_bf16 = in_bf16 + d["w"] * 0.2
        assert (in_bf16.double() - exact).abs().max() > (out["w"].double() - exact).abs().max()
