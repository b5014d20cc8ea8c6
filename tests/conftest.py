"""Shared helpers of the test suite: scheme variants, tiny models, hypothesis profile.

Every contract test is parametrized over :func:`scheme_variants`: one variant per name in
``poslab.nn.positions.names()``, so registering a new scheme covers it automatically (with its default
config). The RoPE layouts and scalings and xPos's interleaved layout (:data:`ROTARY_VARIANTS`) change
only the rotation, so they run the contract checks a rotation can break (``test_contract.py::
test_rotary_variant_contract``) rather than being multiplied into every contract test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from poslab import GPT, AttentionConfig, GPTConfig, MultiHeadAttention, positions
from poslab.nn.attention import use_backend
from poslab.nn.positions.base import PositionScheme

# Bounded, deterministic property tests: a few seconds per property on 2 cores
# (POSLAB_HYPOTHESIS_EXAMPLES=400 for a deeper search).
settings.register_profile(
    "poslab",
    max_examples=int(os.environ.get("POSLAB_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("poslab")


def _one_thread_per_worker() -> None:
    """Under pytest-xdist (``make test`` runs 2 workers on 2 cores), each worker computes on one thread.

    Two workers of two threads each would oversubscribe the cores: tiny ops wait on each other
    (:func:`single_thread`). The subprocesses a test starts inherit ``OMP_NUM_THREADS=1`` unless the
    test passes its own. A serial run (``-n 0``, ``-p no:xdist``) keeps torch's default.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


_one_thread_per_worker()


def _seed_precision_cache() -> None:
    """The suite's ``dtype: auto`` resolves to fp32 on every machine (numerics the tests can compare).

    The cache of measured figures (``poslab.training.precision``) goes to a folder of this session's,
    seeded with figures that make bf16 the slower dtype for every thread count; CLI tests in
    subprocesses inherit the folder. ``tests/test_precision.py`` measures and stubs on its own paths.
    """
    import json
    import tempfile

    from poslab.training import precision

    folder = tempfile.mkdtemp(prefix="poslab-test-cache-")
    os.environ["POSLAB_CACHE_DIR"] = folder
    threads = torch.get_num_threads()
    entries = {}
    for n in range(1, max(os.cpu_count() or 1, threads) + 1):
        torch.set_num_threads(n)
        entries[precision.machine_key()] = {
            "fp32_step_s": 1.0,
            "bf16_step_s": 2.0,
            "fp32_matmul_flops": 1e10,
            "bf16_matmul_flops": 1e10,
        }
    torch.set_num_threads(threads)
    with open(os.path.join(folder, "precision.json"), "w", encoding="utf-8") as f:
        json.dump(entries, f)


_seed_precision_cache()


@dataclass(frozen=True)
class Variant:
    """One scheme configuration to run the contract on.

    Attributes:
        id: pytest id.
        name: registry name.
        config: ``position_config`` overrides (the model fills in its dimensions).
        window_len: positions must stay below it for the scheme to be length-independent
            (``dynamic``/``longrope`` recompute frequencies past the original window, ``logn`` scales
            queries past it, FIRE normalises by ``max(i, L)``); ``None`` means unbounded.
    """

    id: str
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    window_len: int | None = None

    @property
    def cls(self) -> type[PositionScheme]:
        return positions.get(self.name)


# head_dim 8 in the tiny models: rotary pairs = 4
_LONGROPE = {"short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}
ROTARY_VARIANTS = [
    Variant("rope-interleaved", "rope", {"layout": "interleaved"}),
    Variant("rope-partial", "rope", {"rotary_dim": 4}),
    Variant("rope-partial-interleaved", "rope", {"rotary_dim": 4, "layout": "interleaved"}),
    Variant("rope-linear", "rope", {"scaling": "linear", "factor": 2.0}),
    Variant("rope-ntk", "rope", {"scaling": "ntk", "factor": 4.0}),
    Variant("rope-dynamic", "rope", {"scaling": "dynamic", "factor": 4.0, "original_max_len": 128}, 128),
    Variant("rope-yarn", "rope", {"scaling": "yarn", "factor": 4.0, "original_max_len": 64}),
    Variant("rope-llama3", "rope", {"scaling": "llama3", "factor": 8.0, "original_max_len": 64}),
    Variant("rope-longrope", "rope", {"scaling": "longrope", "factor": 4.0, "original_max_len": 128, **_LONGROPE}, 128),
    Variant("rope-logn", "rope", {"logn_scaling": True, "original_max_len": 128}, 128),
    Variant("xpos-interleaved", "xpos", {"layout": "interleaved"}),
]
_WINDOW_LEN = {"fire": 512}  # FIRE's threshold L (threshold_init)


def scheme_variants() -> list[Variant]:
    """Every registered scheme, with its default config."""
    return [Variant(name, name, {}, _WINDOW_LEN.get(name)) for name in positions.names()]


VARIANTS = scheme_variants()
VARIANT_IDS = [v.id for v in VARIANTS]
#: every scheme plus every rotary layout/scaling (suites that sweep numerics over all configurations)
ALL_VARIANTS = VARIANTS + ROTARY_VARIANTS
BIAS_VARIANTS = [v for v in VARIANTS if v.cls.has_bias]  # derived from the overridden hooks
RELATIVE_VARIANTS = [v for v in VARIANTS if v.cls.relative]
ABSOLUTE_VARIANTS = [v for v in VARIANTS if not v.cls.relative]

# tiny geometry shared by the contract tests
D_MODEL, N_HEADS, VOCAB, BLOCK = 32, 4, 50, 64


def context(d_model: int = D_MODEL, n_heads: int = N_HEADS, max_len: int = BLOCK, causal: bool = True) -> dict:
    """The model dimensions ``build_for_model`` fills into a scheme config."""
    return {
        "n_embd": d_model,
        "n_heads": n_heads,
        "head_dim": d_model // n_heads,
        "max_len": max_len,
        "bidirectional": not causal,
    }


def make_scheme(variant: Variant, **ctx: Any) -> PositionScheme:
    """Build a variant's scheme for the given geometry (see :func:`context`)."""
    return positions.build_for_model(variant.name, dict(variant.config), context(**ctx))


def make_attention(
    variant: Variant | None,
    d_model: int = D_MODEL,
    n_heads: int = N_HEADS,
    n_kv_heads: int | None = None,
    *,
    max_len: int = BLOCK,
    seed: int = 0,
    **attention: Any,
) -> MultiHeadAttention:
    """A seeded bare :class:`MultiHeadAttention` with the variant's scheme attached (eval mode).

    ``attention``: :class:`AttentionConfig` fields (``causal``, ``window``, ``backend``, ...) over causal
    attention on the ``sdpa`` backend."""
    torch.manual_seed(seed)
    config = AttentionConfig(**{"causal": True, "backend": "sdpa", **attention})
    scheme = (
        None
        if variant is None
        else make_scheme(variant, d_model=d_model, n_heads=n_heads, max_len=max_len, causal=config.causal)
    )
    attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, config, scheme)
    _perturb(attn)
    return attn.eval()


def on_backend(module: torch.nn.Module, backend: str, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with every attention layer of ``module`` on ``backend`` (``use_backend``)."""
    with use_backend(module, backend):
        return module(*args, **kwargs)


def _perturb(module: torch.nn.Module) -> None:
    """Make learned position parameters non-trivial (inits are small); keeps tests sensitive."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "position" in name or name.startswith(("r1", "r2", "u", "v", "relative_attention_bias", "table")):
                p.add_(torch.randn_like(p) * 0.5)


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """GPTConfig keywords ``base`` with ``overrides`` applied; a group (``attention``, ``norm``, ``mlp``)
    given as a mapping in both merges field by field."""
    out = dict(base)
    for key, value in overrides.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict) and key in ("attention", "norm", "mlp")
        out[key] = {**out[key], **value} if both else value
    return out


def make_gpt(variant: Variant, n_layer: int = 2, n_kv_head: int | None = 2, seed: int = 0, **overrides: Any) -> GPT:
    """A seeded tiny GPT (2 layers, 4 heads, width 32) with the variant's scheme (eval mode)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        n_layer=n_layer,
        n_head=N_HEADS,
        n_embd=D_MODEL,
        block_size=BLOCK,
        n_kv_head=n_kv_head,
        position=variant.name,
        position_config=dict(variant.config),
        **overrides,
    )
    model = GPT(cfg)
    _perturb(model)
    return model.eval()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of tiny-tensor tests (restored after).

    On a busy 2-core machine, two threads per tiny op wait on each other: a 2-layer GPT forward took
    ~0.5 s with 2 threads and ~7 ms with 1 while other jobs were running.
    """
    from poslab.lab.experiments.common import one_thread

    with one_thread():
        yield


# ------------------------------------------------------------------------------------------ tiny trainings
def corpus_text_file(folder, chars: int = 20_000, name: str = "shakespeare"):
    """The first ``chars`` characters of a bundled corpus, written to ``folder/NAME_CHARS.txt``."""
    from poslab.data import load_corpus

    path = folder / f"{name}_{chars}.txt"
    path.write_text(load_corpus(name)[:chars], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """The suite's training corpus: 20,000 characters of tinyshakespeare, as a file path."""
    return str(corpus_text_file(tmp_path_factory.mktemp("corpus")))


def tiny_config(out, corpus, *forms: dict[str, Any], **overrides: Any):
    """A 1-layer, 2-head, width-16 ``TrainConfig`` of 4 steps on ``corpus`` writing to ``out`` (one thread).

    ``forms`` (such as :data:`TRAINING`), then ``overrides``, replace fields in order; their ``model=``
    entries update the model section.
    """
    from poslab.training.config import TrainConfig

    values: dict[str, Any] = dict(
        name="run",
        out_dir=str(out),
        corpus=str(corpus),
        model=dict(n_layer=1, n_head=2, n_embd=16, block_size=16),
        max_steps=4,
        batch_size=2,
        warmup_steps=1,
        eval_interval=2,
        eval_iters=1,
        log_interval=1,
        ckpt_interval=2,
        keep_checkpoints=0,
        seed=3,
        threads=1,
    )
    for change in (*forms, overrides):
        change = dict(change)
        values["model"] = {**values["model"], **change.pop("model", {})}
        values.update(change)
    return TrainConfig.from_dict(values)


#: the training tests' form of :func:`tiny_config`: 2 layers of width 32 with dropout, 24 steps, checkpoints every 10
TRAINING: dict[str, Any] = dict(
    model=dict(n_layer=2, n_embd=32, dropout=0.1),
    max_steps=24,
    batch_size=4,
    lr=3e-3,
    min_lr=3e-4,
    warmup_steps=4,
    eval_interval=8,
    eval_iters=2,
    ckpt_interval=10,
    seed=7,
)


@pytest.fixture
def make_config(tmp_path, corpus):
    """``make_config(*forms, **overrides)``: :func:`tiny_config` writing to ``tmp_path / "runs"``, on :func:`corpus`."""

    def make(*forms: dict[str, Any], **overrides: Any):
        return tiny_config(tmp_path / "runs", corpus, *forms, **overrides)

    return make


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> dict[str, Any]:
    """An experiment's ``base`` training values: 1 layer, 2 heads, width 16, 6 steps on 40,000 characters."""
    return {
        "corpus": str(corpus_text_file(tmp_path_factory.mktemp("corpus"), 40_000)),
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        "max_steps": 6,
        "batch_size": 4,
        "warmup_steps": 1,
        "lr_decay_steps": 6,
        "eval_interval": 3,
        "eval_iters": 2,
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "threads": 1,
        "seed": 3,
    }


@pytest.fixture(scope="module")
def tang_corpus(tmp_path_factory) -> str:
    """30,000 characters of Tang poems, the corpus of :func:`trained` (``白日`` is in its vocabulary)."""
    return str(corpus_text_file(tmp_path_factory.mktemp("tang"), 30_000, "tang5"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tang_corpus):
    """A finished tiny run named ``A`` on :func:`tang_corpus` (:func:`run_helpers.tiny`: one checkpoint, at step 4)."""
    from run_helpers import tiny

    from poslab.session import train

    cfg = tiny(tmp_path_factory.mktemp("runs"), tang_corpus)
    train(cfg, progress=False)
    return cfg.run_dir


@pytest.fixture
def run(trained, tmp_path):
    """A copy of :func:`trained` in ``tmp_path/runs/A``, free to damage."""
    import shutil

    copy = tmp_path / "runs" / "A"
    shutil.copytree(trained, copy)
    return copy


# ------------------------------------------------------------------------------------------ hostile values
def nested(depth: int, opener: str) -> str:
    """``depth`` levels of ``[`` / ``{a:`` (flow YAML) or ``{"a":`` (JSON), closed."""
    closer = {"[": "]", "{a: ": "}", '{"a": ': "}"}[opener]
    return opener * depth + ("1" if opener != "[" else "") + closer * depth


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Flow YAML of about ``35 * levels`` bytes (at most 26 levels) expanding to ``width ** levels`` values."""
    names = [chr(ord("a") + i) for i in range(levels)]
    parts = [f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    parts += [f"{n}: &{n} [{', '.join([f'*{names[i]}'] * width)}]" for i, n in enumerate(names[1:])]
    return "{" + ", ".join(parts) + "}"


@pytest.fixture
def hostile_figures(request):
    """Counts a test's refusals (:mod:`cli_helpers`) into ``test-artifacts/reliability.json``'s ``hostile_inputs``."""
    from cli_helpers import HOSTILE
    from test_reliability_artifacts import mode, record

    HOSTILE.clear()
    HOSTILE.update(cases=0, refused_one_line=0, right_answer=0)
    yield
    if HOSTILE["cases"]:
        record("hostile_inputs", mode(request), dict(HOSTILE))


@pytest.fixture
def input_figures(request):
    """Counts a test's refusals (:func:`cli_helpers.tally`) into the reliability table's ``inputs``."""
    from cli_helpers import INPUTS
    from test_reliability_artifacts import mode, record

    INPUTS.clear()
    INPUTS.update(cases=0, refused_one_line=0, tracebacks=0)
    yield
    if INPUTS["cases"]:
        record("inputs", mode(request), dict(INPUTS))
