"""``poslab convert --from-hf DIR --out RUN``: the run works with load_run, sample, eval and attention."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")

from poslab.cli.app import main  # noqa: E402
from poslab.runs import load_run  # noqa: E402

transformers.logging.set_verbosity_error()
V = 300


pytestmark = [
    pytest.mark.filterwarnings("ignore"),  # HF warns about tiny vocabularies / factor ratios on purpose
    pytest.mark.usefixtures("single_thread"),  # tiny models: one thread (conftest)
]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from poslab.data import load_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=V, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([load_corpus("shakespeare")[:20000]], trainer)
    return tok


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A Llama folder with a tokenizer.json and a GPT-2 folder without one; random weights everywhere."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=V,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            },
        )
    ).eval()
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    ).eval()
    for model in (llama, gpt2):
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2 if p.dim() > 1 else 0.5)
    llama.save_pretrained(root / "llama")
    _tokenizer().save(str(root / "llama" / "tokenizer.json"))
    gpt2.save_pretrained(root / "gpt2")
    return {"llama": (root / "llama", llama), "gpt2": (root / "gpt2", gpt2)}


def test_convert_then_load_run_equals_hf(hf_folders, tmp_path, capsys) -> None:
    folder, hf = hf_folders["llama"]
    run = tmp_path / "runs" / "llama"
    assert main(["convert", "--from-hf", str(folder), "--out", str(run)]) == 0
    assert "converted" in capsys.readouterr().out
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
        "results.json",
        "tokenizer.json",
    ]
    assert not list(run.parent.glob(".*"))  # no temporary folder left behind
    model, tokenizer, config = load_run(run)
    assert config["data"]["converted_from"]["model_type"] == "llama"
    assert json.loads((run / "results.json").read_text())["status"] == "converted"
    idx = torch.randint(0, V, (2, 100))  # past original_max_position_embeddings = 32
    with torch.no_grad():
        assert_close(model(idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
    assert tokenizer.decode(tokenizer.encode("ROMEO: Is the day so young?")) == "ROMEO: Is the day so young?"


def test_converted_run_samples_evaluates_and_draws(hf_folders, tmp_path, capsys) -> None:
    folder, _ = hf_folders["llama"]
    run = tmp_path / "llama"
    assert main(["convert", "--from-hf", str(folder), "--out", str(run), "--corpus", "shakespeare"]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "ROMEO:", "--tokens", "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")

    from poslab.analysis.attention_map import run_attention
    from poslab.analysis.eval import eval_run

    results = eval_run(run, [32, 64], n_targets=128)
    for cell in results["lengths"]:
        assert 1.0 < cell["nonoverlapping"]["ppl"] < 10 * V  # random weights: about the vocabulary size
    assert run_attention(run, "ROMEO: hello").is_file()


def test_converted_run_without_tokenizer_takes_token_ids(hf_folders, tmp_path, capsys) -> None:
    """Greedy ``poslab sample`` on the converted run == transformers' ``generate`` (token ids in, ids out)."""
    folder, hf = hf_folders["gpt2"]
    run = tmp_path / "gpt2"
    assert main(["convert", "--from-hf", str(folder), "--out", str(run)]) == 0
    assert "prompts are token ids" in capsys.readouterr().out
    assert main(["sample", str(run), "--prompt", "5 17 42", "--tokens", "12", "--temperature", "0"]) == 0
    sampled = [int(t) for t in capsys.readouterr().out.split()]
    prompt = torch.tensor([[5, 17, 42]])
    expected = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=12,
        min_new_tokens=12,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert sampled == expected[0].tolist()
    assert main(["sample", str(run), "--prompt", "hello", "--tokens", "4"]) == 2
    assert "give text as token ids" in capsys.readouterr().err


def test_convert_errors(hf_folders, tmp_path, capsys) -> None:
    folder, _ = hf_folders["gpt2"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    cases = [
        (["--from-hf", str(folder), "--out", str(tmp_path / "taken")], "never overwrites"),
        (["--from-hf", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r1")], "not a local folder"),
        (["--from-hf", str(folder), "--out", str(tmp_path / "r2"), "--corpus", "nope"], "corpus 'nope'"),
    ]
    for args, needle in cases:
        assert main(["convert", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("poslab: error:") and needle in err, err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_slow_tokenizer_files_are_converted_offline(hf_folders, tmp_path) -> None:
    """A folder with only vocab.json + merges.txt (no tokenizer.json) gets its fast tokenizer via AutoTokenizer."""
    import shutil

    from poslab.data.hf_tokenizer import HFTokenizer

    folder, _ = hf_folders["gpt2"]
    slow = tmp_path / "slow"
    shutil.copytree(folder, slow)
    bpe = _tokenizer()
    bpe.model.save(str(slow))  # vocab.json + merges.txt
    assert not (slow / "tokenizer.json").exists()
    tokenizer = HFTokenizer.from_folder(slow)
    text = "ROMEO: Is the day so young?"
    assert tokenizer.encode(text) == bpe.encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert HFTokenizer.from_folder(folder) is None  # no tokenizer files at all


def _malformed(kind: str, source, folder) -> str:
    """Copy ``source`` to ``folder`` and break it one way; returns the needle its one-line error must hold."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if kind in ("index-no-weight-map", "index-weight-map-list"):
        tensors = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").rename(folder / "shard-1.safetensors")
        index = {"metadata": {}} if kind == "index-no-weight-map" else {"weight_map": sorted(tensors)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return "weight_map" if kind == "index-weight-map-list" else "no weight_map"
    if kind == "linear-without-factor":
        config["rope_parameters"] = {"rope_type": "linear", "rope_theta": 10000.0}
        needle = "'factor'"
    elif kind == "llama3-without-frequency-factors":
        config["rope_parameters"] = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 32,
        }
        needle = "low_freq_factor"
    elif kind == "zero-heads":
        config["num_attention_heads"] = 0
        needle = "num_attention_heads=0 must be a positive integer"
    else:  # one weight of the wrong shape
        tensors = load_file(str(folder / "model.safetensors"))
        key = "model.layers.0.self_attn.k_proj.weight"
        tensors[key] = torch.zeros(tensors[key].shape[0] + 1, tensors[key].shape[1])
        save_file(tensors, str(folder / "model.safetensors"))
        needle = "'blocks.0.attn.qkv.weight' have shape [129, 64]; the config's sizes need [128, 64]"
    config_path.write_text(json.dumps(config))
    return needle


@pytest.mark.parametrize(
    "kind",
    [
        "index-no-weight-map",
        "index-weight-map-list",
        "linear-without-factor",
        "llama3-without-frequency-factors",
        "zero-heads",
        "wrong-shape",
    ],
)
def test_convert_of_a_malformed_folder_is_one_line(kind: str, hf_folders, tmp_path, capsys, request) -> None:
    """Each malformed Hugging Face folder is ``poslab: error: ...`` naming the file or field, exit 2, nothing
    written."""
    needle = _malformed(kind, hf_folders["llama"][0], tmp_path / "broken")
    assert main(["convert", "--from-hf", str(tmp_path / "broken"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("poslab: error:") and err.count("\n") == 1 and needle in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()
    from test_reliability_artifacts import mode, record

    record("hf_folders", mode(request), {"cases": 1, "refused_one_line": 1, "tracebacks": 0})


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("tie_word_embeddings", "yes", "'tie_word_embeddings' expected bool, got str (value: 'yes')"),
        ("attention_bias", "maybe", "'attention_bias' expected bool, got str (value: 'maybe')"),
        ("rms_norm_eps", "nan", "'rms_norm_eps' expected float, got str (value: 'nan')"),
        ("rope_scaling", "nope", "'rope_parameters' with value 'nope'"),
        ("num_attention_heads", 3, "not a multiple of the number of attention heads (3)"),
        ("num_attention_heads", None, "'num_attention_heads' expected int, got NoneType (value: None)"),
        ("head_dim", 7, "`head_dim`=7"),
    ],
)
def test_convert_turns_a_config_validation_error_into_one_line(
    field, value, needle, hf_folders, tmp_path, capsys, request
):
    """transformers' validation of a config value (huggingface_hub's strict dataclasses) is one line naming the
    field and the value, exit 2, nothing written."""
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(hf_folders["llama"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from-hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("poslab: error:") and err.count("\n") == 1 and needle in err, err
    assert "transformers refuses it" in err and not (tmp_path / "run").exists()
    from test_reliability_artifacts import mode, record

    record("hf_folders", mode(request), {"cases": 1, "refused_one_line": 1, "tracebacks": 0})
