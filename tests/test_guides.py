"""The Chinese guides (``docs/zh/``) point at what exists and quote what the code prints.

Each guide names commands (``poslab experiment NAME``), report sections (``report.html#KEY``) and
files; each must exist. The deterministic figures a guide quotes (parameter counts, the RoPE table,
the permutation and causal-leak differences, ALiBi's slopes) are recomputed here from the
experiments' results, so a guide that drifts from the code fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from poslab import GPT, GPTConfig, positions
from poslab.lab.experiments import registry, run_experiment
from poslab.lab.report.sections import SECTIONS

pytestmark = pytest.mark.usefixtures("single_thread")

ZH = Path(__file__).resolve().parents[1] / "docs" / "zh"
GUIDES = {p.name: p.read_text(encoding="utf-8") for p in sorted(ZH.glob("*.md"))}


def test_one_guide_per_lesson_under_its_title() -> None:
    titles = {
        "lesson_000.md": "「11 · 多头注意力与位置编码」",
        "lesson_001.md": "「多頭注意力和位置編碼」",
        "lesson_002.md": "「多头注意力机制与位置编码的深度解析」",
    }
    for name, title in titles.items():
        assert GUIDES[name].splitlines()[0].startswith(f"# {title}"), name


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_links_experiments_and_sections_exist(name: str) -> None:
    text = GUIDES[name]
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    missing = [t for t in links if not (ZH / t).exists()]
    assert not missing, missing
    experiments = set(re.findall(r"poslab experiment ([a-z][a-z0-9-]*)", text))
    assert experiments <= set(registry()) | {"all", "list"}, experiments - set(registry())
    anchors = set(re.findall(r"report\.html#([a-z-]+)", text))
    assert anchors <= {s.key for s in SECTIONS} | {"claims", "machine"}, anchors


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("guides")
    return {
        name: run_experiment(name, out=out / name) for name in ("params", "rope-relative", "permutation", "causal-leak")
    }


def test_lesson_000_quotes_the_experiments(results: dict[str, dict]) -> None:
    text = GUIDES["lesson_000.md"]
    params = results["params"]
    assert f"{params['seed000_one_linear_512']:,}" in text
    assert f"{params['seed000_four_linear_512']:,}" in text
    rope = results["rope-relative"]
    row = " | ".join(r["first_three_4dp"][0] for r in rope["lesson_table"])
    assert f"| {row} |" in text
    assert f"{rope['poslab_vs_lesson_apply_rope_max_abs_diff']:.1e}" in text
    perm = results["permutation"]
    assert f"{perm['lesson_raw_matrices']['max_abs_diff_after_unpermuting']:.2e}" in text
    none = next(s for s in perm["schemes"] if s["scheme"] == "none")
    assert f"{none['max_abs_diff_after_unpermuting']:.2e}" in text
    assert str(positions.build("alibi", n_heads=8).slopes.tolist()) in text


def test_lesson_001_quotes_the_causal_leak_table(results: dict[str, dict]) -> None:
    text = GUIDES["lesson_001.md"]
    diffs = results["causal-leak"]["max_abs_diff_last_logits"]
    for layers, label in (("1", "1 层"), ("2", "2 层"), ("3", "3 层")):
        cells = " | ".join(f"{diffs[layers][c]:.1e}" for c in ("none", "learned", "learned_zeroed", "rope", "alibi"))
        assert f"| {label} | {cells} |" in text, layers
    qkv = results["params"]["seed001_qkv_params_by_heads"]
    assert set(qkv.values()) == {3168} and "3168" in text


def test_position_table_sizes_quoted() -> None:
    sizes = {}
    for scheme in ("learned", "rope"):
        cfg = GPTConfig(vocab_size=7721, n_layer=4, n_head=4, n_embd=128, block_size=128, position=scheme)
        sizes[scheme] = f"{sum(p.numel() for p in GPT(cfg).parameters()):,}"
    for name in ("lesson_000.md", "lesson_001.md", "lesson_002.md"):
        assert sizes["learned"] in GUIDES[name] and sizes["rope"] in GUIDES[name], name
