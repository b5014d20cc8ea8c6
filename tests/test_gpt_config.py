"""``GPTConfig``'s groups: one attention config, the norm and MLP groups, the keys a user writes, and a
saved run's config in the flat form (one field per setting) loading as the identical model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from poslab.config import parse_overrides
from poslab.nn.attention import AttentionConfig
from poslab.nn.config_migration import migrate_model_config
from poslab.nn.model import GPT, GPTConfig, MLPConfig, NormConfig
from poslab.runs import RunFolder
from poslab.training.config import resume_identity

#: a model config as a run folder's ``config.json`` holds it in the flat form, with every setting that
#: moved into a group away from its default (written out here, not derived from the migration's table)
FLAT = {
    "vocab_size": 37,
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 32,
    "block_size": 16,
    "dropout": 0.0,
    "bias": False,
    "n_kv_head": 2,
    "position": "rope",
    "position_config": {"base": 500.0},
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "mlp_hidden": 48,
    "tie_embeddings": False,
    "backend": "eager",
    "window": None,
    "causal": True,
    "norm_eps": 1e-4,
    "attn_bias": True,
    "mlp_bias": None,
    "norm_bias": None,
    "lm_head_bias": False,
    "activation": "gelu_tanh",
    "residual": "sandwich",
    "embed_norm": True,
    "attn_scale": 0.3,
    "clip_qkv": 4.0,
    "attn_head_dim": 12,
    "attn_softcap": 20.0,
    "final_softcap": 30.0,
    "qk_norm": True,
    "qk_norm_affine": False,
    "attn_sinks": True,
    "attn_chunk": None,
    "attn_temperature": None,
    "embed_scale": 2.0,
    "layer_pattern": [{"window": 4, "attn_chunk": 8}, {"position": "none", "attn_temperature": [4.0, 0.1]}],
    "mla": None,
}
#: the same model in the grouped form, written by hand
GROUPED = GPTConfig(
    vocab_size=37,
    n_layer=2,
    n_head=4,
    n_embd=32,
    block_size=16,
    bias=False,
    n_kv_head=2,
    position="rope",
    position_config={"base": 500.0},
    attention=AttentionConfig(
        backend="eager",
        bias=True,
        scale=0.3,
        clip_qkv=4.0,
        head_dim=12,
        softcap=20.0,
        qk_norm=True,
        qk_norm_affine=False,
        sinks=True,
    ),
    norm=NormConfig(kind="rmsnorm", eps=1e-4, embed=True),
    mlp=MLPConfig(kind="swiglu", hidden=48, activation="gelu_tanh"),
    residual="sandwich",
    tie_embeddings=False,
    embed_scale=2.0,
    final_softcap=30.0,
    layer_pattern=[{"window": 4, "chunk": 8}, {"position": "none", "temperature_tuning": [4.0, 0.1]}],
)


def test_gptconfig_has_at_most_twenty_top_level_fields() -> None:
    assert len(dataclasses.fields(GPTConfig)) <= 20


def test_a_flat_saved_config_builds_the_identical_model() -> None:
    """Every flat key lands in its group with its value: the same config, parameters and logits."""
    saved = migrate_model_config(json.loads(json.dumps(FLAT)))
    assert saved == GROUPED.to_dict()  # the mapping itself: a lab reuses a finished run whose config equals it
    migrated = GPTConfig.from_dict(saved)
    assert migrated == GROUPED
    torch.manual_seed(0)
    ours = GPT(migrated).eval()
    torch.manual_seed(0)
    theirs = GPT(GROUPED).eval()
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in theirs.state_dict().items()
    ]
    # the settings that change the parameters or the numbers are all there
    block = ours.blocks[0]
    assert block.attn.qkv.clip == 4.0 and block.attn.head_dim == 12 and block.attn.sinks is not None
    assert block.attn.q_norm.weight is None and block.attn.q_norm.eps == 1e-4  # weightless, the norm eps
    assert block.mlp.up.out_features == 48 and hasattr(ours, "embed_norm") and block.attn.qkv.bias is not None
    assert (ours.blocks[0].attn.window, ours.blocks[0].attn.chunk, ours.blocks[1].attn.temperature_tuning) == (
        4,
        8,
        (4.0, 0.1),
    )
    idx = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(idx), theirs(idx))


def test_a_flat_run_folder_loads_and_resumes_as_the_grouped_one(run) -> None:
    """A run folder whose ``config.json`` (and a checkpoint's recorded config) has the flat model keys
    gives the same :class:`GPTConfig`, training config and resume identity as the grouped one."""
    folder = RunFolder(run)
    grouped_doc = json.loads((run / "config.json").read_text())
    model = grouped_doc["model"]
    attention, norm, mlp = model["attention"], model["norm"], model["mlp"]
    flat_model = {k: v for k, v in model.items() if k not in ("attention", "norm", "mlp")}
    flat_model.update(
        backend=attention["backend"],
        window=attention["window"],
        causal=attention["causal"],
        attn_bias=attention["bias"],
        attn_scale=attention["scale"],
        clip_qkv=attention["clip_qkv"],
        attn_head_dim=attention["head_dim"],
        attn_softcap=attention["softcap"],
        qk_norm=attention["qk_norm"],
        qk_norm_affine=attention["qk_norm_affine"],
        attn_sinks=attention["sinks"],
        attn_chunk=attention["chunk"],
        attn_temperature=attention["temperature_tuning"],
        norm=norm["kind"],
        norm_eps=norm["eps"],
        norm_bias=norm["bias"],
        embed_norm=norm["embed"],
        mlp=mlp["kind"],
        mlp_hidden=mlp["hidden"],
        mlp_bias=mlp["bias"],
        activation=mlp["activation"],
    )
    want_model, want_train = folder.model_config(), folder.train_config()
    want_identity = resume_identity(grouped_doc)
    (run / "config.json").write_text(json.dumps({**grouped_doc, "model": flat_model}))
    flat = RunFolder(run)
    assert flat.model_config() == want_model
    assert flat.train_config() == want_train
    assert flat.resume_identity() == want_identity
    assert resume_identity({**grouped_doc, "model": flat_model}) == want_identity  # a checkpoint's recorded config
    flat.load_checkpoint()  # the checkpoint written with the grouped config matches the flat folder


@pytest.mark.parametrize(
    ("token", "needle"),
    [
        ("--model.qk_norm=true", "--model.qk_norm is --model.attention.qk_norm"),
        ("--model.attn_chunk=8", "--model.attn_chunk is --model.attention.chunk"),
        ("--model.norm=rmsnorm", "--model.norm is --model.norm.kind"),
        ("--model.activation=relu", "--model.activation is --model.mlp.activation"),
        ("--model.attention=1", "model.attention is a group"),
    ],
)
def test_flat_keys_on_the_command_line_name_the_grouped_key(token: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle) as err:
        parse_overrides([token])
    assert "\n" not in str(err.value)


def test_grouped_keys_on_the_command_line_and_in_yaml() -> None:
    parsed = parse_overrides(
        ["--model.attention.qk_norm", "true", "--model.norm.kind=rmsnorm", "--model.mlp.hidden=24"]
    )
    assert parsed == {"model": {"attention": {"qk_norm": True}, "norm": {"kind": "rmsnorm"}, "mlp": {"hidden": 24}}}
    from poslab.config import nest

    nested = nest([("model", {"attention": {"window": 4}, "n_layer": 2})], where="sweep")
    assert nested == {"model": {"attention": {"window": 4}, "n_layer": 2}}
    with pytest.raises(ValueError, match="sweep: model.window is sweep: model.attention.window"):
        nest([("model", {"window": 4})], where="sweep")
    with pytest.raises(ValueError, match=r"unknown attention key 'model.attention.windw'.*'model.attention.window'"):
        from poslab.training.config import TrainConfig

        TrainConfig.from_dict({"name": "r", "model": {"attention": {"windw": 4}}})


def test_a_flat_key_in_python_names_its_group() -> None:
    with pytest.raises(ValueError, match="qk_norm is attention.qk_norm"):
        GPTConfig.from_dict({"qk_norm": True})
    with pytest.raises(ValueError, match="norm is norm.kind"):
        GPTConfig(norm="rmsnorm")
    with pytest.raises(ValueError, match=r"layer_pattern\[0\] key 'attn_chunk' is 'chunk'"):
        GPTConfig.from_dict({"n_layer": 2, "layer_pattern": [{"attn_chunk": 8}]})


def test_each_group_validates_its_fields_once() -> None:
    with pytest.raises(ValueError, match="norm.eps must be a positive number"):
        NormConfig(eps=0)
    with pytest.raises(ValueError, match="mlp.kind='geglu' is not allowed"):
        MLPConfig(kind="geglu")
    with pytest.raises(ValueError, match="clip_qkv must be a positive number"):
        AttentionConfig(clip_qkv=-1.0)
    assert MLPConfig(kind="swiglu").activation == "silu"  # resolved when made: a saved config names it
    # the model's dropout, norm epsilon and bias reach a layer whose group leaves them to the model
    cfg = GPTConfig(dropout=0.1, bias=False, norm=NormConfig(eps=1e-3), attention=AttentionConfig(qk_norm=True))
    layer = cfg.layer_attention(0)
    assert (layer.dropout, layer.qk_norm_eps, layer.bias) == (0.1, 1e-3, False)
    own = GPTConfig(dropout=0.1, attention=AttentionConfig(dropout=0.0, qk_norm_eps=1e-6, bias=True)).layer_attention(0)
    assert (own.dropout, own.qk_norm_eps, own.bias) == (0.0, 1e-6, True)
