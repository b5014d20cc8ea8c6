"""No code execution from files: every loader refuses a planted malicious file, and none runs it.

Each case plants a file whose loading would run code (a pickle whose unpickling creates a marker
file, a Hugging Face folder whose ``auto_map`` points at its own Python module, a YAML document with
a ``!!python`` tag) where a poslab loader might look, runs the loader (in-process, and through the
CLI where there is a command), and checks that it was refused or ignored with a one-line error and
that the marker was never created. A source scan checks that the package never calls an unsafe
loader (``pickle.load``, ``torch.load`` without ``weights_only=True``, ``yaml.load``, ``eval``/``exec``,
``trust_remote_code=True``, ...).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from poslab.cli.app import main
from poslab.data import load_corpus
from poslab.runs import load_run
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


class Planted:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if anything unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps({"model.tok_emb.weight": Planted(marker)})


def torch_save_bytes(marker: Path, tmp: Path) -> bytes:
    path = tmp / "evil.pt"
    torch.save({"transformer.wte.weight": Planted(marker)}, path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("unsafe")
    corpus = root / "corpus.txt"
    corpus.write_text(load_corpus("shakespeare")[:5_000], encoding="utf-8")
    cfg = TrainConfig.from_dict(
        dict(
            name="run",
            out_dir=str(root / "runs"),
            corpus=str(corpus),
            max_steps=2,
            batch_size=2,
            eval_interval=2,
            eval_iters=1,
            log_interval=1,
            ckpt_interval=2,
            threads=1,
            model={"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        )
    )
    train(cfg, progress=False)
    return cfg.run_dir


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny random-weight GPT-2 folder (config.json + model.safetensors), built offline."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


class Cases:
    """Collects the outcome of each planted file."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.marker = tmp_path / "MARKER-code-ran"
        self.planted = self.refused = 0

    def check(self, load: Callable[[], object], expect: type[BaseException] | None, match: str = "") -> None:
        """Run ``load``: it must raise ``expect`` (or succeed when ``None``) and never create the marker."""
        self.planted += 1
        if expect is None:
            load()
        else:
            with pytest.raises(expect, match=match):
                load()
        assert not self.marker.exists(), "a planted file ran code"
        self.refused += 1

    def cli(self, argv: list[str], capsys, code: int = 2, match: str = "") -> None:
        """The command line refuses it in one line ``poslab: error: ...`` (exit 2), marker absent."""
        self.planted += 1
        capsys.readouterr()  # drop what earlier steps printed
        assert main(argv) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("poslab: error: ") and match in err[0], err
        assert not self.marker.exists(), "a planted file ran code"
        self.refused += 1


def test_planted_pickles_in_a_run_folder_are_never_unpickled(trained, tmp_path, capsys, request):
    cases = Cases(tmp_path)
    run = tmp_path / "run"
    folder = run / ckpt.CHECKPOINT_DIR
    for payload in (pickle_bytes(cases.marker), torch_save_bytes(cases.marker, tmp_path)):
        # the tensor file swapped for a pickle, its sha256 updated to match: not safetensors, refused
        shutil.copytree(trained, run)
        tensors = folder / "step_0000002.safetensors"
        tensors.write_bytes(payload)
        meta = json.loads((folder / "step_0000002.json").read_text())
        meta["sha256"] = hashlib.sha256(payload).hexdigest()
        (folder / "step_0000002.json").write_text(json.dumps(meta))
        cases.check(lambda: load_run(run), ckpt.CheckpointError, "not a readable safetensors file")
        cases.cli(["sample", str(run), "--tokens", "2"], capsys, match="not a readable safetensors file")
        shutil.rmtree(run)
    # pickles where another tool would look (model.pt, pytorch_model.bin, *.pt, a latest pointing at one)
    shutil.copytree(trained, run)
    payload = torch_save_bytes(cases.marker, tmp_path)
    for name in (
        "model.pt",
        "pytorch_model.bin",
        "checkpoint.pt",
        "checkpoints/step_0000009.pt",
        "checkpoints/optimizer.pt",
        "checkpoints/step_0000002.pt",
        "checkpoints/step_0000002.bin",
    ):
        (run / name).write_bytes(payload)
    (folder / "latest").write_text("step_0000009\n")
    cases.check(lambda: load_run(run), None)  # ignored: the real checkpoint of step 2 loads
    saved = json.loads((run / "config.json").read_text())["model"]
    cfg = TrainConfig.from_dict(
        {
            **json.loads((run / "config.json").read_text())["train"],
            "model": {k: v for k, v in saved.items() if k != "vocab_size"},
            "out_dir": str(tmp_path),
            "max_steps": 3,
        }
    )
    cases.check(lambda: train(cfg, resume=True, progress=False), None)  # resume ignores them too
    # a tokenizer.json / config.json that is a pickle: refused as not JSON
    for name in ("tokenizer.json", "config.json"):
        original = (run / name).read_bytes()
        (run / name).write_bytes(pickle_bytes(cases.marker))
        cases.check(lambda: load_run(run), ValueError, "JSON")
        cases.cli(
            ["sample", str(run), "--tokens", "2"], capsys, match="JSON" if name == "tokenizer.json" else "config.json"
        )
        (run / name).write_bytes(original)
    _record(request, cases)


def test_planted_files_in_a_hugging_face_folder_are_refused(hf_folder, tmp_path, capsys, request):
    from poslab.interop import from_hf

    cases = Cases(tmp_path)
    evil = tmp_path / "evil"

    def fresh() -> Path:
        if evil.exists():
            shutil.rmtree(evil)
        shutil.copytree(hf_folder, evil)
        return evil

    def convert(match: str) -> None:
        out = tmp_path / "converted"
        cases.cli(["convert", "--from-hf", str(evil), "--out", str(out)], capsys, match=match)
        assert not out.exists()

    # pytorch_model.bin (no safetensors) whose unpickling would run code: weights_only refuses it
    (fresh() / "model.safetensors").unlink()
    (evil / "pytorch_model.bin").write_bytes(torch_save_bytes(cases.marker, tmp_path))
    cases.check(lambda: from_hf(str(evil)), ValueError, "holds more than tensors")
    convert("holds more than tensors")
    # the same as a shard of a sharded .bin checkpoint
    (evil / "pytorch_model.bin").rename(evil / "pytorch_model-00001-of-00001.bin")
    (evil / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"x": "pytorch_model-00001-of-00001.bin"}})
    )
    cases.check(lambda: from_hf(str(evil)), ValueError, "holds more than tensors")
    # a plain pickle named model.safetensors
    (fresh() / "model.safetensors").write_bytes(pickle_bytes(cases.marker))
    cases.check(lambda: from_hf(str(evil)), ValueError, "not a readable safetensors file")
    convert("not a readable safetensors file")
    # config.json with auto_map: the folder's own configuration code must not be imported
    fresh()
    (evil / "configuration_evil.py").write_text(
        f"open({str(cases.marker)!r}, 'w')\nfrom transformers import PretrainedConfig\n\n\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    )
    (evil / "config.json").write_text(
        json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}})
    )
    cases.check(lambda: from_hf(str(evil)), ValueError, "trust_remote_code")
    convert("custom code")
    # a slow tokenizer with auto_map: its tokenization code must not be imported either
    fresh()
    (evil / "tokenization_evil.py").write_text(f"open({str(cases.marker)!r}, 'w')\n")
    (evil / "vocab.json").write_text("{}")
    (evil / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}})
    )
    convert("tokenizer")
    # tokenizer.json that is a pickle
    fresh()
    (evil / "tokenizer.json").write_bytes(pickle_bytes(cases.marker))
    convert("tokenizer.json")
    _record(request, cases)


def test_yaml_with_python_tags_is_refused(tmp_path, capsys, request):
    cases = Cases(tmp_path)
    tag = f"!!python/object/apply:builtins.open [{str(cases.marker)!r}, w]"
    preset = tmp_path / "evil.yaml"
    preset.write_text(f"config:\n  corpus: {tag}\n  max_steps: 2\n", encoding="utf-8")
    cases.cli(
        ["train", "--preset", str(preset), "--dry-run", "--out_dir", str(tmp_path)], capsys, match="not valid YAML"
    )
    preset.write_text(f"{tag}\n", encoding="utf-8")
    cases.cli(["train", "--preset", str(preset), "--dry-run", "--out_dir", str(tmp_path)], capsys, match="YAML")
    cases.cli(
        [
            "train",
            "--preset",
            "tiny",
            "--dry-run",
            "--out_dir",
            str(tmp_path),
            "--model.position",
            "rope",
            "--model.position_config",
            tag,
        ],
        capsys,
        match="--model.position_config expects a mapping",
    )
    cases.cli(
        [
            "train",
            "--preset",
            "tiny",
            "--dry-run",
            "--out_dir",
            str(tmp_path),
            "--model.position",
            "rope",
            "--model.position_config.base",
            tag,
        ],
        capsys,
        match="base",
    )
    _record(request, cases)


# ------------------------------------------------------------------------------------ source scan
#: (module, function) calls that execute code from data
_FORBIDDEN_CALLS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("pickle", "Unpickler"),
    ("cPickle", "load"),
    ("cPickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("marshal", "load"),
    ("marshal", "loads"),
    ("shelve", "open"),
    ("joblib", "load"),
    ("yaml", "load"),
    ("yaml", "load_all"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("yaml", "unsafe_load_all"),
    ("jit", "load"),
    ("torch.jit", "load"),
    ("serialization", "add_safe_globals"),
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def unsafe_calls(source: str, filename: str) -> list[str]:
    """Every call in ``source`` that could run code from a file (``file:line: what``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        parts = name.split(".")
        where = f"{filename}:{node.lineno}: {name}"
        keywords = {k.arg: k.value for k in node.keywords}
        if name in ("eval", "exec", "compile", "builtins.eval", "builtins.exec"):
            found.append(where)
        elif len(parts) >= 2 and (
            (parts[-2], parts[-1]) in _FORBIDDEN_CALLS or (".".join(parts[:-1]), parts[-1]) in _FORBIDDEN_CALLS
        ):
            found.append(where)
        elif parts[-1] == "load" and parts[0] == "torch" and len(parts) == 2:
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"{where} without weights_only=True")
        elif parts[-1] == "load" and parts[0] in ("np", "numpy"):
            allow = keywords.get("allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                found.append(f"{where} with allow_pickle")
        if "trust_remote_code" in keywords:
            value = keywords["trust_remote_code"]
            if not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{where} with trust_remote_code not False")
    return found


def test_the_scan_catches_what_it_looks_for():
    bad = """
import pickle, torch, yaml
pickle.load(f)
pickle.loads(b)
torch.load(p)
torch.load(p, weights_only=False)
yaml.load(t)
yaml.load(t, Loader=yaml.Loader)
eval(text)
exec(text)
torch.jit.load(p)
np.load(p, allow_pickle=True)
AutoConfig.from_pretrained(d, trust_remote_code=True)
"""
    good = """
torch.load(p, map_location="cpu", weights_only=True)
yaml.safe_load(t)
model.eval()
AutoConfig.from_pretrained(d, trust_remote_code=False)
json.load(f)
"""
    flagged = {int(hit.split(":")[1]) for hit in unsafe_calls(bad, "bad.py")}
    assert flagged == set(range(3, 14))  # every line after the import
    assert unsafe_calls(good, "good.py") == []


def test_the_package_never_calls_an_unsafe_loader(request):
    files = sorted((ROOT / "poslab").rglob("*.py"))
    found = [
        hit for path in files for hit in unsafe_calls(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == [], found
    assert len(files) > 30
    from test_reliability_artifacts import mode, record

    record("unsafe", mode(request), {"source_files_scanned": len(files)})


def _record(request, cases: Cases) -> None:
    from test_reliability_artifacts import mode, record

    record(
        "unsafe",
        mode(request),
        {
            "malicious_files_planted": cases.planted,
            "refused": cases.refused,
            "markers_created": int(cases.marker.exists()),
        },
    )
