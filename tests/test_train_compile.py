"""``TrainConfig.compile``: the training step through ``torch.compile``, checkpoints and evaluation untouched.

The fast tests check the wiring (the key, what gets compiled, clean checkpoint names) with
``torch.compile`` replaced by a recording wrapper, and that the model traces as one graph
(``torch._dynamo.explain``: no inductor compilation). The real compilation is the slow test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import tiny_preset
from torch import nn

from poslab import GPT, GPTConfig
from poslab.config import parse_overrides
from poslab.runs import load_run
from poslab.session import train
from poslab.training import loop
from poslab.training.config import RESUME_FREE_KEYS, TrainConfig
from poslab.training.data import prepare_data
from poslab.training.evaluation import evaluate_loss

pytestmark = pytest.mark.usefixtures("single_thread")


def _tiny(tmp_path: Path, corpus: str, **overrides) -> TrainConfig:
    """:func:`run_helpers.tiny_preset` of 2 steps, evaluated at the end, no checkpoint before it."""
    values = dict(max_steps=2, eval_interval=2, eval_iters=2, ckpt_interval=0, lr_decay_steps=2, warmup_steps=0)
    return tiny_preset(tmp_path, corpus, **{**values, **overrides})


def test_compile_key_parses_validates_and_is_resume_free() -> None:
    assert parse_overrides(["--compile", "true"]) == {"compile": True}
    with pytest.raises(ValueError, match="compile"):
        parse_overrides(["--compile", "maybe"])
    assert TrainConfig(name="a", compile=True).compile is True
    assert TrainConfig(name="a").compile is False
    with pytest.raises((TypeError, ValueError), match="compile"):
        TrainConfig(name="a", compile="yes")  # text is parsed by the CLI only
    assert "compile" in RESUME_FREE_KEYS  # how a step runs, not what it computes: a resume may switch it


class _Recorded(nn.Module):
    """Stands in for ``torch.compile``'s wrapper: holds the module as ``_orig_mod`` and counts calls."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._orig_mod = module
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self._orig_mod(*args, **kwargs)


def test_compile_wraps_only_the_training_calls(tmp_path: Path, corpus: str, monkeypatch) -> None:
    made: list[tuple[nn.Module, dict, _Recorded]] = []

    def fake_compile(module: nn.Module, **kwargs) -> _Recorded:
        wrapper = _Recorded(module)
        made.append((module, kwargs, wrapper))
        return wrapper

    monkeypatch.setattr(loop.torch, "compile", fake_compile)
    compiled = train(_tiny(tmp_path, corpus, name="compiled", compile=True), progress=False)
    monkeypatch.undo()
    eager = train(_tiny(tmp_path, corpus, name="eager"), progress=False)
    assert len(made) == 1
    module, kwargs, wrapper = made[0]
    assert isinstance(module, GPT) and kwargs == {"dynamic": False}
    assert wrapper.calls == 2  # the two training steps; the evaluations ran on the plain model
    assert compiled["final_val_loss"] == eager["final_val_loss"]  # the wrapper computes what the model does
    assert 0 < compiled["compile_first_step_s"] <= compiled["train_time_s"] and "compile_first_step_s" not in eager
    model, _, config = load_run(tmp_path / "compiled")  # plain parameter names: loads like any run
    assert config["train"]["compile"] is True
    assert not any("_orig_mod" in key for key in model.state_dict())
    reference, _, _ = load_run(tmp_path / "eager")
    assert model.state_dict().keys() == reference.state_dict().keys()


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_training_forward_traces_as_one_graph(position: str) -> None:
    """No data-dependent branch or host sync left in the training forward: dynamo sees one graph."""
    import torch._dynamo

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16, position=position))
    idx = torch.randint(65, (2, 16))
    explained = torch._dynamo.explain(model)(idx, idx)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(r.reason)[:120] for r in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.slow
def test_compiled_training_matches_eager_and_checkpoint_loads(tmp_path: Path, corpus: str) -> None:
    """Real inductor compilation (tens of seconds on CPU): 2 steps, the same losses as eager to fp32 rounding."""
    torch._dynamo.reset()
    eager = train(_tiny(tmp_path, corpus, name="eager"), progress=False)
    compiled = train(_tiny(tmp_path, corpus, name="compiled", compile=True), progress=False)
    torch._dynamo.reset()
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=1e-4)
    assert compiled["final_train_loss"] == pytest.approx(eager["final_train_loss"], rel=1e-4)
    model, _, _ = load_run(tmp_path / "compiled")
    reference, _, _ = load_run(tmp_path / "eager")
    assert model.state_dict().keys() == reference.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[key], rtol=1e-4, atol=1e-5)
    cfg = _tiny(tmp_path, corpus, name="compiled")
    val = evaluate_loss(model, prepare_data(cfg).val, cfg.model.block_size, 8, 2, seed=cfg.seed + 1)
    assert val == pytest.approx(compiled["final_val_loss"], abs=1e-6)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_increasing_hint_changes_nothing(position: str) -> None:
    """The model's own ``arange`` positions (hinted increasing) give what explicit positions (checked) give."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16, position=position)).eval()
    idx = torch.randint(65, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(idx), model(idx, pos=torch.arange(16)))
