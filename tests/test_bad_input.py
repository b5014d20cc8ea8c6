"""Bad input gets a clear ``ValueError``/``TypeError`` naming the bad value and the rule.

Every row of ``docs/bad_input.md`` is a :data:`CASES` entry here; ``test_docs_table_matches_the_code``
checks that each example message in the doc is what the code really prints (a long message may be
cut with "…" in the doc: the doc text must then be a prefix of the real one). Regenerate the table
with ``.venv/bin/python tests/test_bad_input.py``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from poslab import GPT, GPTConfig, MultiHeadAttention, positions
from poslab.nn.caches import DecodeSpec, StreamingSpec

pytestmark = pytest.mark.usefixtures("single_thread")

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad_input.md"
MAX_DOC_MESSAGE = 100  # longer messages are cut with "…" in the doc (lists of names grow)


@dataclass(frozen=True)
class Case:
    """One wrong input.

    Attributes:
        id: pytest id and the doc's ``Test`` column.
        input: what the user did (doc column).
        call: runs the wrong input.
        error: the exception type raised.
        pattern: regex the message must match: the bad value and the rule.
    """

    id: str
    input: str
    call: Callable[[], object]
    error: type[Exception]
    pattern: str


def _tiny_gpt(**cfg: object) -> GPT:
    return GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=4, n_embd=32, block_size=16, **cfg))


def _attention(**kwargs: object) -> MultiHeadAttention:
    return MultiHeadAttention(32, 4, **kwargs)


CASES = [
    Case(
        "unknown-scheme",
        '`positions.build("rotary")`',
        lambda: positions.build("rotary"),
        ValueError,
        r"unknown position scheme 'rotary'.*known: none, learned, sinusoidal, rope, .*alibi",
    ),
    Case(
        "unknown-scheme-typo",
        '`GPTConfig(position="alibii")`',
        lambda: GPTConfig(position="alibii"),
        ValueError,
        r"'alibii' \(did you mean 'alibi'\?\); known: .*rope",
    ),
    Case(
        "unknown-gpt-key",
        '`GPTConfig.from_dict({"n_heads": 4})`',
        lambda: GPTConfig.from_dict({"n_heads": 4}),
        ValueError,
        r"unknown GPTConfig key 'n_heads' \(did you mean 'n_head'\?\); allowed: .*n_head",
    ),
    Case(
        "unknown-scheme-key",
        '`positions.build("rope", bsae=1e4)`',
        lambda: positions.build("rope", bsae=1e4),
        ValueError,
        r"unknown config key 'bsae' for position scheme 'rope' \(did you mean 'base'\?\); allowed: .*base",
    ),
    Case(
        "unknown-position-config-key",
        '`GPTConfig(position="alibi", position_config={"slope": 1})`',
        lambda: GPTConfig(position="alibi", position_config={"slope": 1}),
        ValueError,
        r"unknown config key 'slope' for position scheme 'alibi'.*allowed: .*n_heads",
    ),
    Case(
        "d-model-not-divisible",
        "`MultiHeadAttention(100, 3)`",
        lambda: MultiHeadAttention(100, 3),
        ValueError,
        r"d_model=100 is not divisible by n_heads=3",
    ),
    Case(
        "n-embd-not-divisible",
        "`GPTConfig(n_embd=100, n_head=3)`",
        lambda: GPTConfig(n_embd=100, n_head=3),
        ValueError,
        r"d_model=100 is not divisible by n_heads=3",
    ),
    Case(
        "odd-rotary-dim",
        '`positions.build("rope", head_dim=16, rotary_dim=7)`',
        lambda: positions.build("rope", head_dim=16, rotary_dim=7),
        ValueError,
        r"rotary dim must be even.*rotary_dim=7",
    ),
    Case(
        "odd-head-dim-rope",
        '`GPTConfig(n_embd=36, n_head=4, position="rope")` (head_dim 9)',
        lambda: GPTConfig(n_embd=36, n_head=4, position="rope"),
        ValueError,
        r"rotary dim must be even.*head_dim=9",
    ),
    Case(
        "n-kv-heads-not-dividing",
        "`MultiHeadAttention(64, 8, n_kv_heads=3)`",
        lambda: MultiHeadAttention(64, 8, 3),
        ValueError,
        r"n_heads=8 is not divisible by n_kv_heads=3",
    ),
    Case(
        "n-kv-head-gpt",
        "`GPTConfig(n_head=4, n_kv_head=3)`",
        lambda: GPTConfig(n_head=4, n_kv_head=3),
        ValueError,
        r"n_heads=4 is not divisible by n_kv_heads=3",
    ),
    Case(
        "zero-scaling-factor",
        '`positions.build("rope", scaling="linear", factor=0.0)`',
        lambda: positions.build("rope", scaling="linear", factor=0.0),
        ValueError,
        r"factor must be > 0, got 0\.0",
    ),
    Case(
        "negative-scaling-factor",
        '`positions.build("rope", scaling="yarn", factor=-2.0)`',
        lambda: positions.build("rope", scaling="yarn", factor=-2.0),
        ValueError,
        r"factor must be > 0, got -2\.0",
    ),
    Case(
        "unknown-scaling",
        '`positions.build("rope", scaling="yarnn")`',
        lambda: positions.build("rope", scaling="yarnn"),
        ValueError,
        r"scaling='yarnn' is not allowed; choose one of \[None, 'linear', 'ntk', 'dynamic', 'yarn'",
    ),
    Case(
        "past-learned-table",
        "`GPT(block_size=16, position='learned')(idx)` with 17 tokens",
        lambda: _tiny_gpt(position="learned")(torch.zeros(1, 17, dtype=torch.long)),
        ValueError,
        r"position 16 is outside the learned position table.*max_len=16.*\[0, 16\)",
    ),
    Case(
        "mask-wrong-shape",
        "`attn(x [2, 5, 32], mask=torch.ones(5, 6, dtype=torch.bool))`",
        lambda: _attention()(torch.randn(2, 5, 32), mask=torch.ones(5, 6, dtype=torch.bool)),
        ValueError,
        r"attn_mask of shape \[5, 6\] does not fit: expected \[5, 5\]",
    ),
    Case(
        "idx-float",
        "`model(torch.zeros(1, 5))` (float token ids)",
        lambda: _tiny_gpt()(torch.zeros(1, 5)),
        TypeError,
        r"idx must hold integer token ids, got dtype torch\.float32",
    ),
    Case(
        "mask-int",
        "`attn(x, mask=torch.ones(5, 5, dtype=torch.int64))`",
        lambda: _attention()(torch.randn(2, 5, 32), mask=torch.ones(5, 5, dtype=torch.int64)),
        TypeError,
        r"attn_mask must be bool .*or floating point .*got torch\.int64",
    ),
    Case(
        "x-int",
        "`attn(torch.ones(2, 5, 32, dtype=torch.long))`",
        lambda: _attention()(torch.ones(2, 5, 32, dtype=torch.long)),
        TypeError,
        r"floating-point.*got torch\.int64",
    ),
    Case(
        "pos-float-attention",
        "`attn(x, pos=torch.arange(5.0))` (rope)",
        lambda: _attention(position=positions.build("rope", head_dim=8))(torch.randn(1, 5, 32), torch.arange(5.0)),
        TypeError,
        r"positions must be integer.*torch\.float32",
    ),
    Case(
        "pos-float-model",
        "`model(idx, pos=torch.arange(5.0))` (learned)",
        lambda: _tiny_gpt(position="learned")(torch.zeros(1, 5, dtype=torch.long), pos=torch.arange(5.0)),
        TypeError,
        r"positions must be an integer tensor.*got dtype torch\.float32",
    ),
    Case(
        "pos-wrong-shape",
        "`model(idx [1, 5], pos=torch.arange(6))` (sinusoidal)",
        lambda: _tiny_gpt(position="sinusoidal")(torch.zeros(1, 5, dtype=torch.long), pos=torch.arange(6)),
        ValueError,
        r"positions must have shape \[5\].*got \[6\]",
    ),
    Case(
        "x-wrong-width",
        "`attn(torch.randn(2, 5, 31))` (d_model 32)",
        lambda: _attention()(torch.randn(2, 5, 31)),
        ValueError,
        r"\[B, T, 32\], got \[2, 5, 31\]",
    ),
    Case(
        "longrope-factors",
        '`positions.build("rope", head_dim=8, scaling="longrope", factor=2.0)`',
        lambda: positions.build("rope", head_dim=8, scaling="longrope", factor=2.0),
        ValueError,
        r"longrope short_factor needs rotary_dim/2=4 values, got None",
    ),
    Case(
        "factor-not-a-number",
        '`positions.build("rope", factor="2")`',
        lambda: positions.build("rope", factor="2"),
        TypeError,
        r"factor must be a number, got '2' \(str\)",
    ),
    Case(
        "scaling-foreign-key",
        '`positions.build("rope", scaling="linear", factor=2.0, beta_fast=3)`',
        lambda: positions.build("rope", scaling="linear", factor=2.0, beta_fast=3),
        ValueError,
        r"'linear' does not use beta_fast=3; it accepts: factor",
    ),
    Case(
        "scaling-missing-key",
        '`positions.build("rope", scaling="yarn")`',
        lambda: positions.build("rope", scaling="yarn"),
        ValueError,
        r"'yarn' needs factor; it accepts: factor, ",
    ),
    Case(
        "scheme-head-dim-mismatch",
        '`MultiHeadAttention(512, 4, position=positions.build("rope"))`',
        lambda: MultiHeadAttention(512, 4, position=positions.build("rope")),
        ValueError,
        r"head_dim=64 but the attention layer has head_dim=128",
    ),
    Case(
        "scheme-n-heads-mismatch",
        '`MultiHeadAttention(32, 4, position=positions.build("alibi"))`',
        lambda: MultiHeadAttention(32, 4, position=positions.build("alibi")),
        ValueError,
        r"n_heads=8 but the attention layer has n_heads=4",
    ),
    Case(
        "t5-bidirectional-in-causal-layer",
        '`MultiHeadAttention(32, 4, position=positions.build("t5", n_heads=4, bidirectional=True))`',
        lambda: MultiHeadAttention(32, 4, position=positions.build("t5", n_heads=4, bidirectional=True)),
        ValueError,
        r"t5 bidirectional=True in a causal attention layer",
    ),
    Case(
        "xpos-span-fp16",
        '`positions.build("xpos", head_dim=16).rotate(q.half(), k.half(), tensor([9000]), tensor([0]))`',
        lambda: positions.build("xpos", head_dim=16).rotate(
            torch.ones(1, 1, 1, 16).half(), torch.ones(1, 1, 1, 16).half(), torch.tensor([9000]), torch.tensor([0])
        ),
        ValueError,
        r"xpos cannot scale positions 0\.\.9000 in one call in torch\.float16",
    ),
    Case(
        "targets-float",
        "`model(idx, targets=idx.float())`",
        lambda: _tiny_gpt()(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5)),
        TypeError,
        r"targets must hold integer token ids \(-1 = ignored\), got torch\.float32",
    ),
    Case(
        "targets-out-of-range",
        "`model(idx, targets)` with a target id 20 (vocab 20)",
        lambda: _tiny_gpt()(torch.zeros(1, 5, dtype=torch.long), torch.full((1, 5), 20)),
        ValueError,
        r"target id 20 is outside the vocabulary: targets must lie in \[0, 20\) or be -1",
    ),
    Case(
        "cache-capacity-0",
        "`model.make_cache(1, DecodeSpec(capacity=0))`",
        lambda: _tiny_gpt().make_cache(1, DecodeSpec(capacity=0)),
        ValueError,
        r"capacity must be a positive integer \(or None = block_size\), got 0",
    ),
    Case(
        "cache-spec-int",
        "`model.make_cache(1, 64)` (a capacity where the cache spec goes)",
        lambda: _tiny_gpt().make_cache(1, 64),  # type: ignore[arg-type]
        TypeError,
        r"spec must be one of DecodeSpec, StreamingSpec, SegmentMemorySpec, got int 64",
    ),
    Case(
        "streaming-sinks-without-window",
        "`StreamingSpec(sinks=4)`",
        lambda: StreamingSpec(sinks=4),
        ValueError,
        r"sinks=4 needs window=W \(the StreamingLLM cache keeps the first sinks plus the last W tokens\)",
    ),
    Case(
        "segment-memory-length",
        "`SegmentMemory(0)`",
        lambda: __import__("poslab.nn.memory", fromlist=["x"]).SegmentMemory(0),
        ValueError,
        r"mem_len \(the segment memory's length M\) must be a positive integer, got 0",
    ),
    Case(
        "average-shape-mismatch",
        '`average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])`',
        lambda: __import__("poslab.training.averaging", fromlist=["x"]).average_state_dicts(
            [{"w": torch.zeros(2)}, {"w": torch.zeros(3)}]
        ),
        ValueError,
        r"key 'w': shape \[3\] in state dict 1 differs from \[2\] in state dict 0",
    ),
    Case(
        "average-negative-weight",
        "`average_state_dicts([sd, sd], weights=[1.0, -1.0])`",
        lambda: __import__("poslab.training.averaging", fromlist=["x"]).average_state_dicts(
            [{"w": torch.zeros(2)}, {"w": torch.zeros(2)}], weights=[1.0, -1.0]
        ),
        ValueError,
        r"weights\[1\] = -1\.0: each weight must be a finite number >= 0",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case) -> None:
    with pytest.raises(case.error) as info:
        case.call()
    message = str(info.value)
    assert re.search(case.pattern, message), message
    assert "\n" not in message


def _message(case: Case) -> str:
    try:
        case.call()
    except case.error as err:
        return str(err)
    raise AssertionError(f"{case.id}: no {case.error.__name__}")


def _doc_message(message: str) -> str:
    return message if len(message) <= MAX_DOC_MESSAGE else message[: MAX_DOC_MESSAGE - 1] + "…"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


CLI_CASES = [
    ("cli-unknown-experiment", ["experiment", "nonexistent"], r"unknown experiment 'nonexistent'; known: .*params"),
    (
        "cli-unknown-scheme",
        ["train", "--preset", "tiny", "--quick", "--model.position", "alibii"],
        r"unknown position scheme 'alibii' \(did you mean 'alibi'\?\)",
    ),
    (
        "cli-model-too-big",
        ["train", "--preset", "tiny", "--dry-run", "--model.n_layer", "100000000"],
        r"this training needs about [\d,.]+ GiB \(1,228,800,0\d\d,\d\d\d parameters.*available.*--force",
    ),
    (
        "cli-eval-iters-huge",
        ["train", "--preset", "tiny", "--dry-run", "--eval_iters", "10000000000000"],
        r"eval_iters 10,000,000,000,000 is more than 100,000 validation batches",
    ),
    ("cli-empty-name", ["train", "--preset", "tiny", "--dry-run", "--name", ""], r"--name must not be empty"),
    (
        "cli-out-dir-file",
        ["train", "--preset", "tiny", "--dry-run", "--out_dir", "/etc/passwd"],
        r"--out_dir '/etc/passwd' is a file, not a folder",
    ),
]


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poslab", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("case_id", "args", "pattern"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_prints_one_line_and_exits_2(case_id: str, args: list[str], pattern: str, tmp_path: Path) -> None:
    result = _run_cli(args, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("poslab: error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.stderr
    error, doc_message = _table_rows()[case_id]  # the doc's example is what the CLI prints
    assert error == "exit 2"
    assert _matches_doc(lines[0], doc_message), (lines[0], doc_message)


def _table_rows(doc: Path = DOC) -> dict[str, tuple[str, str]]:
    """``{test id: (error type, message)}`` read from the doc's table."""
    rows = {}
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 4 or not cells[3].startswith("`test_"):
            continue
        test_id = re.search(r"\[([^\]]+)\]`$", cells[3]).group(1)
        message = cells[2].strip("`").replace("\\|", "|")
        rows[test_id] = (cells[1].strip("`"), message)
    return rows


@pytest.mark.parametrize("doc", [DOC], ids=["docs"])
def test_docs_table_matches_the_code(doc: Path) -> None:
    rows = _table_rows(doc)
    assert set(rows) == {c.id for c in CASES} | {c[0] for c in CLI_CASES}
    for case in CASES:
        error, doc_message = rows[case.id]
        assert error == case.error.__name__, case.id
        real = _message(case)
        assert _matches_doc(real, doc_message), (case.id, real, doc_message)


def _matches_doc(real: str, doc_message: str) -> bool:
    """The doc shows the message, or its beginning followed by "…"."""
    return real.startswith(doc_message[:-1]) if doc_message.endswith("…") else real == doc_message


def render_table(cli_messages: dict[str, str]) -> str:
    """The markdown table of ``docs/bad_input.md`` from what the code prints now."""
    lines = ["| Input | Error | Message (example) | Test |", "|---|---|---|---|"]
    for case in CASES:
        message = _escape(_doc_message(_message(case)))
        lines.append(
            f"| {_escape(case.input)} | `{case.error.__name__}` | `{message}` | "
            f"`test_bad_input.py::test_bad_input[{case.id}]` |"
        )
    for case_id, args, _ in CLI_CASES:
        message = _escape(_doc_message(cli_messages[case_id]))
        lines.append(
            f"| `poslab {shlex.join(args)}` | exit 2 | `{message}` | "
            f"`test_bad_input.py::test_cli_prints_one_line_and_exits_2[{case_id}]` |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # regenerate the table: .venv/bin/python tests/test_bad_input.py
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cli = {case_id: _run_cli(args, Path(tmp)).stderr.strip() for case_id, args, _ in CLI_CASES}
    print(render_table(cli))
