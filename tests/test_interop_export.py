"""``poslab.to_hf`` over every option ``GPTConfig`` offers: an exact export or a one-line refusal, never a silent
difference.

Each case builds a small random-weight :class:`poslab.GPT` (2 layers, width 32, T = 40), exports it
with ``poslab.to_hf(model, folder)``, loads the folder with ``AutoModelForCausalLM.from_pretrained``
and compares logits with ``torch.testing.assert_close``; or sees a ``ValueError`` of one line. The
options come from ``dataclasses.fields(GPTConfig)``: a field without test values here fails
:func:`test_every_gptconfig_field_has_export_cases`, so a new option cannot be skipped.

Cases: every option value alone on a GPT-2 base and on a Llama base, and the combinations each
family uses (its base), in the default run; every pair of option values on the Llama base and every
option on every family base under ``-m slow``. Also: ``to_hf(from_hf(hf))`` gives back the
transformers model weight for weight; an exported folder loads with ``from_pretrained``; layouts
transformers has no class for are refused naming the option.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from test_interop import _LONGROPE, TOL, gpt2, hf_model, llama, mistral, randomize  # noqa: E402

import poslab  # noqa: E402
from poslab.nn import positions  # noqa: E402
from poslab.nn.gpt_config import GROUPS, MLPConfig, NormConfig  # noqa: E402
from poslab.nn.model import ACTIVATIONS, RESIDUALS, GPTConfig  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("single_thread")]

V, T, D = 97, 40, 32
#: fields the bases set (model sizes): not options
SIZES = {"vocab_size": V, "n_layer": 2, "n_head": 4, "n_embd": D, "block_size": T}
_MLA = {"kv_lora_rank": 16, "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
#: GPTConfig field -> values other than its default, each one a case
OPTIONS: dict[str, list[Any]] = {
    "dropout": [0.1],
    "bias": [False],
    "n_kv_head": [2, 1],
    "position": [name for name in positions.names() if name != "learned"],
    "position_config": [
        {"scaling": "yarn", "factor": 2.0, "original_max_len": 16},
        {"scaling": "linear", "factor": 2.0},
        {"scaling": "ntk", "factor": 2.0},
        {"layout": "interleaved"},
        {"rotary_dim": 4},
        {"base": 500.0},
        {"max_len": 64},
    ],
    "tie_embeddings": [False],
    "lm_head_bias": [True],
    "residual": [r for r in RESIDUALS if r != "sequential"],
    "final_softcap": [3.0],
    "embed_scale": [D**0.5, 2.0],
    "layer_pattern": [
        [{"window": 8}, {}],
        [{"window": 8}, {"window": 4}],
        [{"position": "none"}, {}],
        [{"chunk": 8}, {}],
        [{"qk_norm": True}, {}],
    ],
    "mla": [_MLA],
    "norm.kind": ["rmsnorm"],
    "norm.eps": [1e-6],
    "norm.bias": [True, False],
    "norm.embed": [True],
    "mlp.kind": ["swiglu", "gelu"],
    "mlp.hidden": [48],
    "mlp.bias": [True, False],
    "mlp.activation": list(ACTIVATIONS),
    "attention.backend": ["eager", "sdpa"],
    "attention.window": [8],
    "attention.causal": [False],
    "attention.bias": [True, False],
    "attention.scale": [0.5, 1.0],
    "attention.clip_qkv": [0.5],
    "attention.head_dim": [16],
    "attention.softcap": [5.0],
    "attention.qk_norm": [True],
    "attention.qk_norm_affine": [False],
    "attention.sinks": [True],
    "attention.chunk": [8],
    "attention.temperature_tuning": [[4.0, 0.1]],
    "attention.dropout": [0.1],
    "attention.qk_norm_eps": [1e-3],
    "attention.query_chunk": [8],
    "attention.recompute_threshold": [8],
}
LLAMA = dict(position="rope", bias=False, norm={"kind": "rmsnorm"}, mlp={"kind": "swiglu"})
SANDWICH = dict(LLAMA, residual="sandwich", embed_scale=D**0.5)
#: base name -> (config, the transformers class it must export to; None: refused)
BASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "gpt2": ({}, "GPT2LMHeadModel"),
    "llama": (LLAMA, "LlamaForCausalLM"),
    "llama-gqa-bias-interleaved": (
        dict(LLAMA, n_kv_head=2, position_config={"layout": "interleaved"}, attention={"bias": True}),
        "LlamaForCausalLM",
    ),
    "mistral": (dict(LLAMA, attention={"window": 8}), "MistralForCausalLM"),
    "qwen3": (
        dict(LLAMA, layer_pattern=[{"window": 8}, {}], attention={"qk_norm": True, "head_dim": 16}),
        "Qwen3ForCausalLM",
    ),
    "gemma2": (
        dict(SANDWICH, final_softcap=3.0, layer_pattern=[{"window": 8}, {}], attention={"softcap": 5.0, "scale": 0.25}),
        "Gemma2ForCausalLM",
    ),
    "gemma3": (
        dict(
            SANDWICH,
            position_config={"base": 1e6},
            layer_pattern=[{"window": 8, "position_config": {"base": 1e4}}, {}],
            attention={"qk_norm": True},
        ),
        "Gemma3ForCausalLM",
    ),
    "llama4": (
        dict(
            LLAMA,
            position_config={"layout": "interleaved"},
            layer_pattern=[
                {"chunk": 8, "qk_norm": True},
                {"position": "none", "temperature_tuning": [4.0, 0.1]},
            ],
            attention={"qk_norm_affine": False},
        ),
        "Llama4ForCausalLM",
    ),
    "deepseek": (dict(LLAMA, mla=_MLA, attention={"scale": (8 + 4) ** -0.5}), "DeepseekV3ForCausalLM"),
    "gpt-oss-attention": (
        dict(LLAMA, n_kv_head=2, layer_pattern=[{"window": 8}, {}], attention={"bias": True, "sinks": True}),
        None,
    ),
}


def test_every_gptconfig_field_has_export_cases() -> None:
    """A ``GPTConfig`` field (a group's as ``GROUP.FIELD``) that is neither a size nor listed in
    :data:`OPTIONS` would go untested here."""
    fields = {f.name for f in dataclasses.fields(GPTConfig) if f.name not in GROUPS}
    fields |= {f"{name}.{f.name}" for name, group in GROUPS.items() for f in dataclasses.fields(group)}
    assert fields - set(SIZES) - set(OPTIONS) == set(), "add export cases for the new GPTConfig option"
    assert set(OPTIONS) <= fields


def _with(values: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """``values`` with ``field`` (``GROUP.FIELD`` for a group's) set to ``value``, the group's other fields kept."""
    if "." not in field:
        return {**values, field: value}
    group, name = field.split(".")
    return {**values, group: {**values.get(group, {}), name: value}}


def _model(values: dict[str, Any]) -> poslab.GPT | None:
    try:
        config = GPTConfig(**{**SIZES, **values})
    except (ValueError, TypeError):
        return None  # a combination GPTConfig refuses is not one the library offers
    torch.manual_seed(0)
    model = poslab.GPT(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # every gain, bias and sink random: a dropped one changes the logits
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.5))
    return model.eval()


FIGURES: dict[str, int] = {}


def _record(request) -> None:
    """A passing test's outcomes go to ``test-artifacts/reliability.json`` (docs/reliability.md's table):
    reached only after every export of the test compared equal, so its silent differences are 0."""
    from test_reliability_artifacts import mode, record

    record("export", mode(request), {"cases": sum(FIGURES.values()), "silent_differences": 0, **FIGURES})
    FIGURES.clear()


def check_export(values: dict[str, Any], folder, expect: str | None = "any") -> str:
    """Export ``values``'s model through ``poslab.to_hf``: ``"exact"``, ``"refused"`` or ``"not offered"``.

    An export must load from its folder with the same logits; a refusal must be one ``ValueError`` line.
    ``expect``: the transformers class name the export must have (``None``: it must be refused).
    """
    model = _model(values)
    if model is None:
        return _tally("not_offered")
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    try:
        with torch.no_grad():
            want = model(idx)
    except ValueError:
        return _tally("not_offered")  # a combination the model refuses to run (soft-capping in the sdpa backend)
    try:
        poslab.to_hf(model, folder)
    except ValueError as err:
        message = str(err)
        assert "\n" not in message and message.startswith("to_hf"), message
        assert expect in (None, "any"), f"{values} refused: {message}"
        return _tally("refused")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    assert expect is not None, f"{values} exported as {type(loaded).__name__}, expected a refusal"
    if expect != "any":
        assert type(loaded).__name__ == expect, (values, type(loaded).__name__)
    with torch.no_grad():
        got = loaded(idx).logits
    assert want.abs().max() > 0.5  # logits far from zero: the comparison can fail
    assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"silent difference for {values}: {m}")
    return _tally("exact")


def _tally(outcome: str) -> str:
    FIGURES[outcome] = FIGURES.get(outcome, 0) + 1
    return outcome


SINGLES = [(base, field, value) for base in ("gpt2", "llama") for field, values in OPTIONS.items() for value in values]


@pytest.mark.parametrize(
    ("base", "field", "value"), SINGLES, ids=[f"{b}-{f}-{i}" for i, (b, f, _) in enumerate(SINGLES)]
)
def test_each_option_alone_exports_exactly_or_is_refused(base: str, field: str, value: Any, tmp_path, request) -> None:
    FIGURES.clear()
    check_export(_with(BASES[base][0], field, value), tmp_path / "export")
    _record(request)


@pytest.mark.parametrize("base", list(BASES))
def test_each_family_combination_exports_to_its_family(base: str, tmp_path, request) -> None:
    FIGURES.clear()
    values, expect = BASES[base]
    assert check_export(values, tmp_path / "export", expect) == ("refused" if expect is None else "exact")
    _record(request)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        (dict(LLAMA, attention={"sinks": True}), "attention.sinks=True.*gpt_oss"),
        (
            dict(LLAMA, attention={"chunk": 8}),
            "attention.chunk=8; llama4_text carries attention.chunk but not RoPE layout 'half'",
        ),
        (dict(LLAMA, layer_pattern=[{"window": 8}, {}]), "layer_pattern"),
        (dict(LLAMA, attention={"qk_norm": True, "chunk": 8}), "attention.chunk=8"),
        ({"norm": {"embed": True}}, "norm.embed=True"),
        ({"position": "alibi"}, "position='alibi'"),
    ],
)
def test_refusals_name_the_option(values: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as err:
        poslab.to_hf(_model(values))
    assert "\n" not in str(err.value)


def test_a_new_option_is_refused_by_every_family(monkeypatch) -> None:
    """An option no family declares (here ``attention.qk_norm`` made undeclared everywhere) is refused, not exported."""
    from poslab.interop import hf

    stripped = tuple(
        dataclasses.replace(
            w,
            carries=w.carries - {"attention.qk_norm"},
            requires={k: v for k, v in w.requires.items() if k != "attention.qk_norm"},
        )
        for w in hf.WRITERS
    )
    monkeypatch.setattr(hf, "WRITERS", stripped)
    with pytest.raises(ValueError, match="no family poslab writes carries attention.qk_norm=True"):
        poslab.to_hf(_model(dict(LLAMA, attention={"qk_norm": True})))


@pytest.mark.slow
def test_every_pair_of_options_exports_exactly_or_is_refused(tmp_path, request) -> None:
    """Every pair of option values on the Llama base, and every option value on every family base."""
    flat = [(field, value) for field, values in OPTIONS.items() for value in values]
    cases = [{**LLAMA, f1: v1, f2: v2} for (f1, v1), (f2, v2) in itertools.combinations(flat, 2) if f1 != f2]
    cases += [{**values, field: value} for values, _ in BASES.values() for field, value in flat]
    FIGURES.clear()
    for i, values in enumerate(cases):
        check_export(values, tmp_path / f"e{i}")
    assert FIGURES.get("exact", 0) > 50, FIGURES
    _record(request)


@pytest.mark.parametrize("target", ["/proc/self/x", "/proc/self/x/y"])
def test_an_export_that_cannot_be_written_names_the_target_not_its_temporary_folder(target: str) -> None:
    """``to_hf(model, "/proc/self/x")`` failed on the temporary folder ``.x.tmpXXXX`` and named it."""
    model = poslab.GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, n_embd=16, block_size=16, position="learned"))
    with pytest.raises(OSError) as info:
        poslab.to_hf(model, target)
    # the target, or the folder above it that cannot be made
    assert target.startswith(info.value.filename) and ".tmp" not in str(info.value), info.value


# ------------------------------------------------------------------------------ round trips, folders, refusals
ROUND_TRIP = {
    "gpt2": gpt2(),
    "gpt2-untied-noscale": gpt2(tie_word_embeddings=False, scale_attn_weights=False, activation_function="gelu"),
    "llama-gqa2": llama(),
    "llama-bias-tied": llama(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "llama-dynamic": llama({"rope_type": "dynamic", "factor": 4.0}),
    "llama-yarn": llama(
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, max_position_embeddings=64
    ),
    "llama-llama3": llama(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        max_position_embeddings=512,
    ),
    "llama-longrope": llama(
        {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 16, **_LONGROPE},
        max_position_embeddings=64,
    ),
    "mistral": mistral(),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_round_trip_to_hf_from_hf_equals_original(case: str) -> None:
    hf = hf_model(ROUND_TRIP[case])
    back = poslab.to_hf(poslab.from_hf(hf))
    assert type(back) is type(hf)
    want, got = hf.state_dict(), back.state_dict()
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    idx = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert_close(back(idx).logits, hf(idx).logits, rtol=0, atol=1e-5)


def test_to_hf_folder_loads_with_from_pretrained_and_gives_same_logits(tmp_path) -> None:
    torch.manual_seed(0)
    ours = poslab.GPT(
        poslab.GPTConfig(
            vocab_size=V,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            n_embd=64,
            block_size=64,
            position="rope",
            position_config={"scaling": "yarn", "factor": 4.0, "original_max_len": 16},
            bias=False,
            tie_embeddings=False,
            norm=NormConfig(kind="rmsnorm"),
            mlp=MLPConfig(kind="swiglu"),
        )
    ).eval()
    randomize(ours, seed=3)
    poslab.to_hf(ours, tmp_path / "export")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", local_files_only=True).eval()
    idx = torch.randint(0, V, (2, 50))
    with torch.no_grad():
        assert_close(loaded(idx).logits, ours(idx), **TOL)
    with pytest.raises(FileExistsError, match="not an empty folder"):
        poslab.to_hf(ours, tmp_path / "export")  # never overwrites


def test_to_hf_gpt2_layout_from_a_native_poslab_model(tmp_path) -> None:
    torch.manual_seed(0)
    ours = randomize(poslab.GPT(poslab.GPTConfig(vocab_size=V, n_layer=2, n_head=4, n_embd=64, block_size=48)), seed=5)
    hf = poslab.to_hf(ours)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    idx = torch.randint(0, V, (2, 48))
    with torch.no_grad():
        assert_close(hf(idx).logits, ours(idx), **TOL)
    again = poslab.from_hf(hf)
    for key, value in ours.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"position": "alibi"}, "position='alibi'"),
        (
            {
                "position": "rope",
                "position_config": {"scaling": "ntk", "factor": 2.0},
                "norm": {"kind": "rmsnorm"},
                "mlp": {"kind": "swiglu"},
            },
            "ntk",
        ),
        (
            {
                "position": "rope",
                "position_config": {"rotary_dim": 8},
                "norm": {"kind": "rmsnorm"},
                "mlp": {"kind": "swiglu"},
            },
            "rotary_dim=8",
        ),
        ({"residual": "parallel"}, "residual='parallel'"),
    ],
)
def test_to_hf_rejects_other_layouts_naming_the_option(overrides: dict, needle: str) -> None:
    model = poslab.GPT(poslab.GPTConfig(vocab_size=V, n_layer=1, n_head=4, n_embd=64, block_size=32, **overrides))
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        poslab.to_hf(model)
