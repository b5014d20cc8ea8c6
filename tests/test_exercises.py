"""``poslab check``: the exercises tell a correct solution from a planted-wrong one.

Every solution below is written here, independently of poslab's reference (a test that compared the
reference with itself could not fail): the correct ones follow the lessons' code with the lessons'
mistakes corrected, the wrong ones plant a mistake a student makes (pairs interleaved, the ALiBi
sign flipped, the window off by one, heads merged in the wrong order, a leak experiment without
the mask).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from poslab.cli.app import main
from poslab.lab.exercises import EXERCISES, SolutionError, check, get

ROPE = """
import torch

def apply_rope(x, pos, base=10000):
    d = x.shape[-1] // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, d).float() / d))
    angles = pos[:, None].float() * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
"""
ROPE_INTERLEAVED = ROPE.replace("x[..., :d], x[..., d:]", "x[..., 0::2], x[..., 1::2]")

ALIBI = """
import torch

def alibi_bias(n_head, seq_len):
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / n_head) for h in range(n_head)])
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    return -slopes[:, None, None] * (i - j).float()
"""
ALIBI_SIGN_FLIPPED = ALIBI.replace("return -slopes", "return slopes")
# the lesson's own formula: 0 on past keys, -alpha (i - j) on future keys
ALIBI_LESSON = ALIBI.replace(
    "return -slopes[:, None, None] * (i - j).float()",
    "return torch.where(j <= i, 0.0, -slopes[:, None, None] * (i - j).float())",
)

LOCAL = """
import torch

def local_mask(L, window_size, causal):
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    if causal:
        return (j <= i) & (j > i - window_size)
    return ((i - j).abs() < window_size).int()
"""
LOCAL_OFF_BY_ONE = LOCAL.replace("(j > i - window_size)", "(j >= i - window_size)")
LOCAL_WIDE = LOCAL.replace("abs() < window_size", "abs() <= window_size")
LOCAL_NOT_CAUSAL = LOCAL.replace("if causal:", "if False:")
LOCAL_LESSON = """
import torch

def local_mask(L, window_size, causal):
    return torch.ones(L, L).tril(-window_size) + torch.ones(L, L).triu(window_size)
"""

SPLIT = """
def split_heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).permute(0, 2, 1, 3)
"""
SPLIT_NO_TRANSPOSE = """
def split_heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, n_head, T, C // n_head)
"""

MERGE = """
import torch

def merge_heads(x):
    return torch.cat([x[:, h] for h in range(x.shape[1])], dim=-1)
"""
MERGE_WRONG_ORDER = """
def merge_heads(x):
    B, h, T, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, h * d)
"""

LEAK = """
import torch

def causal_leak(x, perm, weights):
    def run(h):
        T, d = h.shape
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        for wq, wk, wv in weights:
            q, k, v = h @ wq, h @ wk, h @ wv
            scores = (q @ k.T / d ** 0.5).masked_fill(future, float("-inf"))
            h = scores.softmax(-1) @ v
        return h
    return (run(x)[-1] - run(x[perm])[-1]).abs().max()
"""
LEAK_NO_MASK = LEAK.replace('.masked_fill(future, float("-inf"))', "")

CORRECT = {
    "apply-rope": ROPE,
    "alibi-bias": ALIBI,
    "local-mask": LOCAL,
    "split-heads": SPLIT,
    "merge-heads": MERGE,
    "causal-leak": LEAK,
}
WRONG = [
    ("apply-rope", ROPE_INTERLEAVED),
    ("alibi-bias", ALIBI_SIGN_FLIPPED),
    ("alibi-bias", ALIBI_LESSON),
    ("local-mask", LOCAL_OFF_BY_ONE),
    ("local-mask", LOCAL_WIDE),
    ("local-mask", LOCAL_LESSON),
    ("local-mask", LOCAL_NOT_CAUSAL),
    ("split-heads", SPLIT_NO_TRANSPOSE),
    ("merge-heads", MERGE_WRONG_ORDER),
    ("causal-leak", LEAK_NO_MASK),
]


def _write(tmp_path: Path, source: str, name: str = "solution.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_every_exercise_has_a_correct_and_a_planted_wrong_solution_here() -> None:
    assert set(CORRECT) == set(EXERCISES) == {name for name, _ in WRONG}
    assert len(EXERCISES) >= 5


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_solution_passes(tmp_path: Path, name: str) -> None:
    result = check(get(name), _write(tmp_path, CORRECT[name]))
    assert result.right, result.message
    assert result.cases == len(get(name).cases(0)) >= 5


@pytest.mark.parametrize(("name", "source"), WRONG, ids=[f"{n}-{i}" for i, (n, _) in enumerate(WRONG)])
def test_a_planted_wrong_solution_fails_naming_the_case(tmp_path: Path, name: str, source: str) -> None:
    result = check(get(name), _write(tmp_path, source))
    assert not result.right
    assert re.match(r"case \d+ \(.+\): max \|diff\| ", result.message), result.message
    assert "first differs" in result.message and "\n" not in result.message


def test_the_interleaved_rope_fails_on_the_first_case_with_more_than_one_pair(tmp_path: Path) -> None:
    """d = 2 has one pair, which both layouts rotate alike; case 2 (d = 16) tells them apart."""
    result = check(get("apply-rope"), _write(tmp_path, ROPE_INTERLEAVED))
    assert result.message.startswith("case 2 (x [1, 16], pos 7..7, base 10000): max |diff| "), result.message
    assert result.message.endswith("[seed 0]")


def test_a_wrong_shape_is_wrong_and_named(tmp_path: Path) -> None:
    source = SPLIT.replace(".permute(0, 2, 1, 3)", "")
    result = check(get("split-heads"), _write(tmp_path, source))
    assert not result.right
    # case 1 (T = 1, one head) has the right shape either way; case 2 does not
    assert result.message == "case 2 (x [2, 5, 32], n_head 4): shape [2, 5, 4, 8], expected [2, 4, 5, 8] [seed 0]"


@pytest.mark.parametrize(
    ("source", "pattern"),
    [
        (
            "def apply_rope(x, pos, base=10000):\n    raise ValueError('not yet\\nsecond line')\n",
            r"^case 1 \(.+\): apply_rope raised ValueError: not yet$",
        ),
        ("def apply_rope(x):\n    return x\n", r"^apply_rope cannot take case 1's 3 arguments: "),
        ("def rope(x, pos, base=10000):\n    return x\n", r"^solution\.py defines no function 'apply_rope'$"),
        ("apply_rope = 3\n", r"^'apply_rope' in solution\.py is a int, not a function$"),
        ("def apply_rope(x, pos, base=10000)\n    return x\n", r"^solution\.py does not load \(line 1\): SyntaxError"),
        ("import no_such_module_here\n", r"^solution\.py does not load: ModuleNotFoundError: "),
        (
            "def apply_rope(x, pos, base=10000):\n    return object()\n",
            r"^case 1 \(.+\): apply_rope returned object, not a tensor",
        ),
    ],
)
def test_a_solution_that_cannot_run_gets_one_line(tmp_path: Path, source: str, pattern: str) -> None:
    with pytest.raises(SolutionError) as err:
        check(get("apply-rope"), _write(tmp_path, source))
    assert re.search(pattern, str(err.value)), str(err.value)
    assert "\n" not in str(err.value)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    right = _write(tmp_path, ALIBI, "right.py")
    wrong = _write(tmp_path, ALIBI_SIGN_FLIPPED, "wrong.py")
    raises = _write(tmp_path, "def alibi_bias(n_head, seq_len):\n    return 1 / 0\n", "raises.py")

    assert main(["check", "alibi-bias", str(right)]) == 0
    assert capsys.readouterr().out == "正确 / right: 6 cases\n"

    assert main(["check", "alibi-bias", str(wrong)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("错误 / wrong: case 2 (n_head 2, seq_len 2): max |diff| ") and out.count("\n") == 1

    assert main(["check", "alibi-bias", str(raises)]) == 2
    err = capsys.readouterr().err
    assert err == "poslab: error: case 1 (n_head 1, seq_len 1): alibi_bias raised ZeroDivisionError: division by zero\n"

    assert main(["check", "alibi-bias", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["check", "no-such-exercise", str(right)]) == 2
    assert "unknown exercise 'no-such-exercise'" in capsys.readouterr().err
    assert main(["check", "alibi-bias"]) == 2
    assert "--template" in capsys.readouterr().err


def test_a_nan_output_is_wrong_not_right(tmp_path: Path) -> None:
    result = check(
        get("apply-rope"), _write(tmp_path, ROPE.replace("return torch.cat", "return float('nan') * torch.cat"))
    )
    assert not result.right
    assert result.message.startswith("case 1 (x [1, 2], pos 0..0, base 10000): max |diff| nan; ")
    assert "got nan" in result.message


def test_sys_exit_inside_the_function_is_one_line(tmp_path: Path) -> None:
    source = "import sys\n\ndef merge_heads(x):\n    sys.exit(3)\n"
    with pytest.raises(SolutionError, match=r"^case 1 \(x \[1, 1, 1, 4\]\): merge_heads raised SystemExit: 3$"):
        check(get("merge-heads"), _write(tmp_path, source))


def test_the_command_as_a_student_runs_it(tmp_path: Path) -> None:
    """``python -m poslab check``: the verdict on stdout, exit 0 / 1 / 2, and no traceback for a raising solution."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))

    def run(source: str) -> subprocess.CompletedProcess:
        path = _write(tmp_path, source, "mine.py")
        return subprocess.run(
            [sys.executable, "-m", "poslab", "check", "merge-heads", str(path)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=env,
            timeout=120,
        )

    done = run(MERGE)
    assert (done.returncode, done.stdout) == (0, "正确 / right: 5 cases\n"), done.stderr
    done = run(MERGE_WRONG_ORDER)
    assert done.returncode == 1 and done.stdout.startswith("错误 / wrong: case 2 (x [2, 4, 5, 8]): max |diff| ")
    done = run("def merge_heads(x):\n    return x.view(-1, 7)\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("poslab: error: case 1 (x [1, 1, 1, 4]): merge_heads raised RuntimeError: ")
    assert done.stderr.count("\n") == 1


def test_cli_list_names_every_exercise(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "list"]) == 0
    out = capsys.readouterr().out
    for e in EXERCISES.values():
        assert e.name in out and f"{e.function}({e.signature})" in out and e.lesson in out


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_template_completed_with_a_correct_body_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["check", name, "--template"]) == 0
    template = capsys.readouterr().out
    exercise = get(name)
    assert f"def {exercise.function}({exercise.signature}):" in template
    assert f"poslab check {name} " in template
    assert re.search(r"[\u4e00-\u9fff]", template)  # the task is described in Chinese
    # as printed, the template runs but does not pass
    with pytest.raises(SolutionError, match="NotImplementedError"):
        check(exercise, _write(tmp_path, template, "template.py"))
    body = textwrap.dedent(CORRECT[name]).split(f"def {exercise.function}(", 1)[1].split("):\n", 1)[1]
    helpers = textwrap.dedent(CORRECT[name]).split(f"def {exercise.function}(", 1)[0]
    completed = template.replace('    raise NotImplementedError("在这里写你的代码")\n', body) + "\n" + helpers
    assert check(exercise, _write(tmp_path, completed, "done.py")).right


ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "zh").glob("lesson_*.md")) + sorted((ROOT / "notebooks").glob("lesson_*.py"))


def test_the_guides_and_notebooks_name_existing_exercises_and_every_exercise_is_named() -> None:
    named: dict[str, set[str]] = {}
    for path in GUIDES:
        for name in re.findall(r"poslab check ([a-z][a-z0-9-]*)", path.read_text(encoding="utf-8")):
            named.setdefault(name, set()).add(path.name)
    assert set(named) - {"list"} <= set(EXERCISES), sorted(set(named) - set(EXERCISES) - {"list"})
    assert set(EXERCISES) <= set(named), sorted(set(EXERCISES) - set(named))
    for path in GUIDES:  # each lesson's guide and notebook point at the checker
        assert "poslab check " in path.read_text(encoding="utf-8"), path.name
