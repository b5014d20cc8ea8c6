"""Legal config values at the edge of fp32 (``base=1e-300``, ``attention.scale=1e300``, positions past
2^24, ...): refused at config time with the rule in the message where the fp32 math would not stay
finite; finite extremes still train to finite numbers.

The figures go to ``test-artifacts/reliability.json`` under ``hostile_inputs``.
"""

from __future__ import annotations

import pytest
import torch
from cli_helpers import HOSTILE, answered

pytestmark = pytest.mark.usefixtures("single_thread", "hostile_figures")


# ---------------------------------------------------------------------- extreme legal values: refused, not NaN
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
    HOSTILE["cases"] += 1
    HOSTILE["refused_one_line"] += 1


@pytest.mark.parametrize("value", [1e300, 3.4028235677973366e38, 5e-324])  # the last two found by the fuzzer
@pytest.mark.parametrize("key", ["attention.scale", "embed_scale", "attention.softcap", "final_softcap"])
def test_extreme_model_scales_are_refused(key, value):
    from poslab.nn.model import GPTConfig

    group, _, name = key.rpartition(".")
    given = {group: {name: value}} if group else {key: value}
    with pytest.raises(ValueError, match=f"{key} must be at most 1e\\+06 and at least 1e-06"):
        GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, **given)
    HOSTILE["cases"] += 1
    HOSTILE["refused_one_line"] += 1


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


def test_sinusoidal_positions_past_fp32_integers_are_refused():
    from poslab.nn.model import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=11, position="sinusoidal"))
    with pytest.raises(ValueError, match=r"sinusoidal positions must be < 2\^24"):
        model(torch.zeros(1, 3, dtype=torch.long), pos=torch.tensor([0, 1, 2**62]))
    HOSTILE["cases"] += 1
    HOSTILE["refused_one_line"] += 1
