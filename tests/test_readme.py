"""The README's examples run as written, its links and commands point at what exists, and the English pages
(README, docs/, benchmarks/README.md) describe what is, in present tense, without their own history."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

from poslab.lab.experiments import registry
from poslab.training.presets import PRESETS, preset_config

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: the English pages (docs/zh/ holds the Chinese guides)
BENCHMARKS = ROOT / "benchmarks"
PAGES = [ROOT / "README.md", BENCHMARKS / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: phrases that narrate a page's history instead of describing what is (an issue number is history too;
#: ``transformers#39408``, an upstream reference, is not)
HISTORY = re.compile(
    r"\b(?:at the time of writing|when this was written|as before|re-?measured|no longer|previously|formerly"
    r"|used to be|now|nowadays|today(?:'s)?|anymore|until recently|originally|the (?:old|new) tree"
    r"|(?:old|previous|earlier) (?:code|version|implementation)|(?:after|since) the fix|(?:has|have) been fixed"
    r"|was fixed in|issue \d+)\b|(?<![\w/])#\d+\b",
    re.IGNORECASE,
)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_python_example_runs() -> None:
    blocks = _blocks("python")
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102


def test_the_two_commands_are_there() -> None:
    """CI and newcomers rely on these two lines."""
    assert re.search(r"^make demo\b", README, flags=re.M)
    assert re.search(r"^make test\b", README, flags=re.M)


def test_every_experiment_named_exists() -> None:
    names = re.findall(r"poslab experiment ([a-z][a-z0-9-]*)", README)
    assert names
    known = set(registry()) | {"all", "list"}
    assert set(names) <= known, set(names) - known


def test_lab_command_options_exist() -> None:
    """The lab example's options are the CLI's (``poslab lab --help`` lists them)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "poslab", "lab", "--help"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    for line in (b for block in _blocks("bash") for b in block.splitlines() if b.startswith("poslab lab")):
        for option in re.findall(r"(--[a-z-]+)", line.split("#")[0]):
            assert option in help_text, (line, option)


def test_every_local_link_exists() -> None:
    links = [target for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) if "://" not in target]
    assert links
    missing = [target for target in links if not (ROOT / target).exists()]
    assert not missing, missing


def test_reliability_bad_input_scaling_are_one_link_each() -> None:
    for doc in ("docs/reliability.md", "docs/bad_input.md", "docs/scaling.md", "docs/positions.md"):
        assert f"]({doc})" in README, doc


def preset_rows(page: str) -> dict[str, str]:
    """The rows of a page's presets table, by preset name."""
    section = page.split("## Presets", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([\w-]+)` \|(.*)$", section, flags=re.M))


def test_the_presets_table_gives_each_presets_steps() -> None:
    """docs/training.md lists every preset with the steps its config and its ``--quick`` form train."""
    rows = preset_rows((ROOT / "docs" / "training.md").read_text(encoding="utf-8"))
    assert set(rows) == set(PRESETS)
    for name, row in rows.items():
        steps, quick = preset_config(name)["max_steps"], preset_config(name, quick=True)["max_steps"]
        assert re.search(rf"\b{steps} (?:steps|iters)\b", row), (name, steps, row)
        assert f"`--quick`: {quick} steps" in row, (name, quick, row)


def history_phrases(text: str) -> list[str]:
    """The history phrases of a page's prose; code blocks and `code` spans (quoted output, commands) are left out."""
    prose = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    return [match.group(0) for match in HISTORY.finditer(prose)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_pages_describe_what_is_without_history(page: Path) -> None:
    found = history_phrases(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} narrates its history: {found}"


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("Re-measured on quiet cores: 3 s.", True),
        ("The loop is now faster.", True),
        ("Three seeds (as before).", True),
        ("No GPU at the time of writing.", True),
        ("The copies of the old tree differ by 7%.", True),
        ("The window check follows #34.", True),
        ("The files that define today's schemes.", True),
        ("Today the loop takes 3 s.", True),
        ("The off-by-one was fixed in the decoder.", True),
        ("Slower than the previous implementation.", True),
        ("Originally a copy of nanoGPT.", True),
        ("Since the fix the loop takes 3 s.", True),
        ("Each run uses fixed batches.", False),
        ("The criteria were fixed before the first run.", False),
        ("A label `today` in the file.", False),
        ("refused: `model.n_head: 4 (checkpoint) vs 2 (now)`", False),
        ("the off-by-one of transformers#39408", False),
        ("The loop takes 3 s on two cores.", False),
    ],
)
def test_the_history_check_can_fail(text: str, flagged: bool) -> None:
    assert bool(history_phrases(text)) is flagged


def unreferenced(page: str, files: list[str]) -> list[str]:
    """The result files (paths under ``benchmarks/``) that ``page`` names neither by path (a path's tail such as
    ``time_to_loss_levers/fast.json`` counts, ``*`` globs too) nor by a folder above them (``results/two-threads/``)."""
    names = {name for name in re.findall(r"[\w.*-]+(?:/[\w.*-]+)+/?|[\w.*-]+/", page) if not name.endswith("results/")}
    folders = [name for name in names if name.endswith("/")]
    paths = [name for name in names if not name.endswith("/")]
    return [
        file
        for file in files
        if not any(f"/benchmarks/{file}".find(f"/{folder}") >= 0 for folder in folders)
        and not any(fnmatch.fnmatch(f"benchmarks/{file}", pattern) for path in paths for pattern in (path, f"*/{path}"))
    ]


def test_the_benchmarks_page_holds_current_tables_and_commands_only() -> None:
    """At most 300 lines: the tables, their commands and files, no narration."""
    lines = (BENCHMARKS / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"benchmarks/README.md has {len(lines)} lines"


def test_every_result_file_is_named_by_the_benchmarks_page() -> None:
    """A result file no page points at is a figure nobody reads: the page names each file or a folder above it."""
    files = sorted(str(path.relative_to(BENCHMARKS)) for path in (BENCHMARKS / "results").rglob("*") if path.is_file())
    assert files
    assert not unreferenced((BENCHMARKS / "README.md").read_text(encoding="utf-8"), files)


@pytest.mark.parametrize(
    ("page", "referenced"),
    [
        ("files `results/a.json`", False),
        ("files `results/sub/a.json`", True),
        ("`--out benchmarks/results/sub/a.json`", True),
        ("files `results/sub/` hold it", True),
        ("files under `results` in the last column: `sub/a.json`", True),
        ("`results/other/sub/a.json`", False),
        ("the runs `sub/a*.json`", True),
        ("files `results/b.json`", False),
        ("every file in `results/`", False),
        ("every file in `benchmarks/results/`", False),
        ("the folder `results/sub` (no slash: not a folder reference)", False),
        ("`a.json` alone (no folder: too loose)", False),
    ],
)
def test_the_result_reference_check_can_fail(page: str, referenced: bool) -> None:
    assert (not unreferenced(page, ["results/sub/a.json"])) is referenced
