"""The Chinese guides (``docs/zh/``) point at what exists and quote what the code prints.

Each guide names commands (``poslab experiment NAME``), report sections (``report.html#KEY``) and
files; each must exist. The deterministic figures a guide quotes (parameter counts, the RoPE table,
the permutation and causal-leak differences, ALiBi's slopes) are recomputed here from the
experiments' results, so a guide that drifts from the code fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest
import torch

from poslab import GPT, GPTConfig, positions
from poslab.cli.app import main
from poslab.data import CharTokenizer, load_corpus
from poslab.lab import zoo
from poslab.lab.experiments import causal_leak, head_count, registry, run_experiment
from poslab.lab.report.i18n import STRINGS
from poslab.lab.report.sections import SECTIONS
from poslab.lab.report.zh_claims import EXACT
from poslab.lab.report.zh_measured import MEASURED
from poslab.lab.report.zh_templates import TEMPLATES

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "docs" / "zh"
GUIDES = {p.name: p.read_text(encoding="utf-8") for p in sorted(ZH.glob("lesson_*.md"))}
#: every Chinese text of the docs: the guides, their README, the errata page
PAGES = {p.name: p.read_text(encoding="utf-8") for p in sorted(ZH.glob("*.md"))}
NOTEBOOKS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "notebooks").glob("*.py"))}
#: the lessons, where the workspace keeps them (POSLAB_SEEDS overrides); a checkout without them skips one check
SEEDS = Path(os.environ.get("POSLAB_SEEDS", "/work/shared/seeds"))
#: how lesson_001.md quotes the one-layer, no-position causal-leak difference: float noise whose digits depend on
#: the thread count (2.4e-07 with 2 threads, 3.6e-07 with 1 on the machine that wrote the guide)
NOISE_RANGE = "2e-07 – 4e-07"
#: traditional characters and their simplified forms (only characters never written in simplified Chinese)
TRADITIONAL = dict(
    pair
    for pair in (
        "個个 們们 這这 為为 說说 對对 會会 時时 從从 後后 與与 還还 關关 應应 點点 學学 實实 發发 經经 過过 讀读 寫写 "
        "長长 開开 間间 問问 題题 機机 體体 數数 據据 種种 類类 轉转 當当 樣样 結结 義义 練练 習习 測测 頭头 編编 碼码 "
        "順顺 課课 論论 驗验 變变 現现 語语 詞词 詩诗 訊讯 資资 訓训 試试 處处 層层 單单 兩两 觀观 覺觉 動动 態态 標标 "
        "邊边 區区 萬万 網网 絡络 記记 憶忆 聯联 錯错 誤误 確确 歸归 納纳 擴扩 圖图 畫画 構构 權权 視视 戰战 術术 氣气 "
        "參参 並并 來来 係系 備备 內内 別别 卻却 張张 幾几 廣广 換换 斷断 東东 沒没 洩泄 準准 無无 狀状 盡尽 積积 組组 "
        "絕绝 給给 維维 線线 總总 裡里 見见 規规 計计 訴诉 證证 讓让 質质 賴赖 較较 輸输 辦办 進进 遠远 門门 陣阵 際际 "
        "隻只 韻韵 須须 麼么 夠够 損损 嗎吗 專专 產产 頻频"
    ).split()
)


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
        name: run_experiment(name, out=out / name)
        for name in ("params", "rope-relative", "permutation", "causal-leak", "frequencies", "shapes")
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
    for layers, label in (("2", "2 层"), ("3", "3 层")):
        cells = " | ".join(f"{diffs[layers][c]:.1e}" for c in ("none", "learned", "learned_zeroed", "rope", "alibi"))
        assert f"| {label} | {cells} |" in text, layers
    one = diffs["1"]
    noise = NOISE_RANGE
    assert f"| 1 层 | {noise} | {one['learned']:.1e} | {noise} | {one['rope']:.1e} | {one['alibi']:.1e} |" in text
    qkv = results["params"]["seed001_qkv_params_by_heads"]
    assert set(qkv.values()) == {3168} and "3168" in text


def test_position_table_sizes_quoted() -> None:
    sizes = {}
    for scheme in ("learned", "rope"):
        cfg = GPTConfig(vocab_size=7721, n_layer=4, n_head=4, n_embd=128, block_size=128, position=scheme)
        sizes[scheme] = f"{sum(p.numel() for p in GPT(cfg).parameters()):,}"
    for name in ("lesson_000.md", "lesson_001.md", "lesson_002.md"):
        assert sizes["learned"] in GUIDES[name] and sizes["rope"] in GUIDES[name], name


def test_one_layer_noise_is_quoted_as_the_range_the_thread_counts_give() -> None:
    low, high = (float(x) for x in NOISE_RANGE.split(" – "))
    tok = CharTokenizer.from_text(load_corpus("tang5"))
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for column in ("none", "learned_zeroed"):
                value = causal_leak.last_logit_difference(tok, 1, column)
                assert low <= value <= high < causal_leak.NOISE_BELOW, (threads, column, value)
    finally:
        torch.set_num_threads(before)
    for name in ("lesson_001.md", "README.md"):
        assert "线程数" in PAGES[name], name  # the guide says why it is a range


def test_rope_spread_is_quoted_with_its_tolerance_and_largest_value(results: dict[str, dict]) -> None:
    rope = results["rope-relative"]
    rotary = [c for c in rope["scheme_checks"] if c["expected_offset_only"]]
    assert all(c["offset_only"] for c in rotary)
    largest = max(rotary, key=lambda c: c["max_spread_over_positions"])
    for name in ("lesson_000.md", "lesson_001.md"):
        text = GUIDES[name]
        assert (
            f"{largest['max_spread_over_positions']:.1e}" in text and largest["label"].split()[1].rstrip(",") in text
        ), name
        assert f"容差 {rope['offset_only_tolerance']:.0e}".replace("e-04", "e-4") in text, name
        assert "1e-5 以内" not in text, name  # the largest spread is above 1e-5


def test_xl_projection_shapes_are_explained() -> None:
    text = GUIDES["lesson_002.md"]
    alone = positions.build("xl", n_heads=4, head_dim=16)
    inside = positions.build("xl", n_heads=4, head_dim=16, n_embd=64)
    for scheme in (alone, inside):
        shapes = {name: list(p.shape) for name, p in scheme.named_parameters()}
        assert f"`r_proj.0.weight` 就是 `{shapes['r_proj.0.weight']}`" in text or (
            f"`r_proj.0.weight {shapes['r_proj.0.weight']}`" in text
        ), shapes


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(GUIDES))
def test_the_way_in_comes_first_and_its_commands_exist(name: str) -> None:
    text = GUIDES[name]
    first_section = text.index("\n## ")
    assert text.index("<!-- generated: zh-way-in -->") == text.index("\n## 从哪里开始") + len("\n## 从哪里开始\n\n")
    assert text.index("\n## 从哪里开始") == first_section, "the way in is the first section"
    for command in ("attention", "explore"):
        assert f"poslab {command} runs/lab/experiments/tang-heads/runs/tang-small-quick" in text, command
        flags = set(re.findall(r"--[a-z][a-z-]*", _help(command)))
        # a flag the guide names after `poslab COMMAND`, up to the next command or the end of the line
        after = re.findall(rf"poslab {command}\b(.*?)(?=poslab |\n|$)", text)
        used = {flag for segment in after for flag in re.findall(r"--[a-z][a-z-]*", segment)}
        assert used and used <= flags, (command, used - flags)
    for title in (s.title for s in SECTIONS):  # the zh page names its sections in Chinese
        assert title not in text, title


# ------------------------------------------------------------------------------ one script, one word per term
def _unquoted(text: str) -> str:
    """``text`` without its quotations (「…」, innermost first) and code spans: what the guide says in its own words."""
    while True:
        stripped = re.sub(r"「[^「」]*」", "", text)
        if stripped == text:
            return re.sub(r"`[^`\n]*`", "", text)
        text = stripped


def _glossary() -> list[tuple[str, str, list[str]]]:
    """(English, the word, the variants not to use) of the glossary table in docs/zh/README.md."""
    table = PAGES["README.md"].split("## 术语表", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| 英文")]
    out = []
    for row in rows:
        english, word, avoid = (cell.strip() for cell in row.strip("|").split("|"))
        variants = [re.sub(r"（「」外）$", "", v).strip() for v in avoid.split("、")]
        out.append((english, word, [v for v in variants if v]))
    return out


def _texts() -> dict[str, str]:
    """Every Chinese text the glossary governs: the docs/zh pages (README without its glossary), the notebooks,
    the zh page's string table and the Chinese of the texts experiments write (poslab/lab/report/zh_claims.py)."""
    readme = PAGES["README.md"].split("## 术语表", 1)[0]
    texts = {**{f"docs/zh/{n}": t for n, t in PAGES.items()}, "docs/zh/README.md": readme}
    texts.update({f"notebooks/{n}": t for n, t in NOTEBOOKS.items()})
    texts.update({f"i18n {key}": message["zh"] for key, message in STRINGS.items()})
    texts.update({f"zh catalogue {english[:40]!r}": chinese for english, chinese in EXACT.items()})
    texts.update({f"zh template {pattern[:40]!r}": form for pattern, form in (*TEMPLATES, *MEASURED)})
    return texts


def test_the_glossary_lists_the_page_words() -> None:
    words = {english: word for english, word, _ in _glossary()}
    for kind in ("held", "wrong", "inconclusive", "untestable", "withdrawn"):
        assert STRINGS[f"kind.{kind}"]["zh"] in words.values(), kind
    assert words["the lesson"] == "课文" and words["verdict"] == STRINGS["table.verdict"]["zh"]
    assert words["MQAR (multi-query associative recall)"] in STRINGS["section.probes.measured"]["zh"]


def test_no_variant_the_glossary_forbids() -> None:
    found = []
    for where, text in _texts().items():
        for english, _, variants in _glossary():
            for variant in variants:
                haystack = text if variant.startswith("`") else _unquoted(text)  # a code span is its own variant
                if variant in haystack:
                    found.append((where, english, variant))
    assert found == []


def test_traditional_characters_only_inside_quotes() -> None:
    found = {
        where: sorted({c for c in _unquoted(text) if c in TRADITIONAL})
        for where, text in _texts().items()
        if any(c in TRADITIONAL for c in _unquoted(text))
    }
    assert found == {}, {w: [f"{c}→{TRADITIONAL[c]}" for c in cs] for w, cs in found.items()}


def test_traditional_quotes_are_lesson_001_verbatim() -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"the lessons are not at {SEEDS}")
    lesson = next(SEEDS.glob("001_*.txt")).read_text(encoding="utf-8")
    title = lesson.splitlines()[0].strip()
    quotes = [q for text in _texts().values() for q in re.findall(r"「([^「」]*)」", text)]
    traditional = [q.replace("\n", "") for q in quotes if any(c in TRADITIONAL for c in q)]
    assert traditional and title in traditional
    assert [q for q in traditional if q not in lesson] == []
    # what lesson_001.md says the lesson says is the lesson's own text, in its own characters
    said = re.findall(r"课文(?:说|写)「([^「」]*)」", GUIDES["lesson_001.md"])
    assert said and [q for q in said if q not in lesson] == []


def test_the_heads_experiment_is_described_as_the_code_runs_it() -> None:
    quick = head_count.base_config(True, size=head_count.HEADS_QUICK)
    full = head_count.base_config(False)
    facts = (f"n_embd {quick['model']['n_embd']}", f"{quick['model']['n_layer']} 层", "tinyshakespeare")
    for text in (STRINGS["section.multihead.measured"]["zh"], GUIDES["lesson_001.md"]):
        assert all(fact in text for fact in facts), facts
        assert f"n_embd {full['model']['n_embd']}" in text and ("唐诗" in text or "五言诗" in text)
    assert quick["corpus"] == "shakespeare" and full["corpus"] == "tang5"


# ------------------------------------------------------------------------------ figures of the correction records
def test_correction_figures_are_quoted_from_the_records() -> None:
    """The figures the guides quote from ``poslab experiment corrections`` are the records' own (recomputed here)."""
    from poslab.lab.experiments.corrections import (  # noqa: PLC0415 (the corrections' helpers, this test only)
        all_corrections,
        lesson000_heads,
        lesson000_reasons,
        lesson000_rope,
        lesson002_code,
        lesson002_formulas,
        lesson002_sources,
    )

    g000, g002 = GUIDES["lesson_000.md"], GUIDES["lesson_002.md"]
    mats = lesson000_heads.alibi_matrices()
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    lesson_err = (mats["poslab"] - mats["lesson"])[:, causal].abs().max().item()
    future = mats["lesson"][:, ~causal]
    assert f"最大差 {lesson_err:.3f}" in g000 and f"从 {future.min():.4f} 到 {future.max():.2f}" in g000
    ntk = lesson000_rope.ntk_ratios()
    assert f"拉伸 {ntk['highest']:.4f}" in g000 and f"除以 {1 / ntk['lowest']:.2f}" in g000
    assert f"增大**到 {ntk['new_base']:.0f}" in g000
    shares = lesson000_heads.position_coordinates()
    assert f"（{shares['sinusoidal']:.0%}）" in g000 and f"（{shares['rope']:.0%}）" in g000
    peaks = lesson000_reasons.distance_profiles()
    assert "、".join(str(v) for v in peaks["rope_peaks"].values()) + " 处达到最大" in g000
    assert f"8 个头 {peaks['parameters']['t5']} 个参数" in g000
    o = lesson000_reasons.rotation_orthogonality()
    assert o["orthogonality"] < 1e-6 and o["same_position"] < 1e-5 and f"变化可达 {o['cross_position']:.2f}" in g000
    ranks = lesson000_reasons.head_ranks()
    assert "（1 个头 64、4 个头 16、16 个头 4）" in g000 and [v["rank"] for v in ranks.values()] == [64, 16, 4]
    assert f"都是 {ranks[1]['parameters']:,}" in g000
    tensor = next(c for c in all_corrections() if "tensor core" in c["details"]["sentence"])
    dks = tensor["details"]["zoo_d_k"]
    assert f"{len(dks)} 种 d_k（{'、'.join(map(str, dks))}）" in g000
    forms = lesson002_formulas.rope_complex_forms()
    assert f"都是 {forms['score']:.4f}" in g002 and forms["correct_vs_score"] < 1e-5
    assert (
        f"最多差 {forms['lesson_lhs_vs_score']:.2f}" in g002
        and f"最大 {forms['lesson_rhs_imaginary']:.2f} 的虚部" in g002
    )
    assert lesson002_formulas.FIXED_PE_LATEX in g002
    seven = lesson002_sources.seven_b_counts()
    saved = seven["learned"] - seven["rope"]
    assert f"learned {seven['learned']:,} 个参数、rope {seven['rope']:,} 个" in g002
    assert f"{saved:,} = {saved / seven['learned']:.2%}" in g002 and f"只有 {seven['rope_buffers']} 个浮点数" in g002
    n = lesson002_code.clipping_norms()
    assert f"fp32 的梯度范数 {n['fp32']:.5f}；fp16 autocast + GradScaler" in g002
    assert f"（scale {n['scale']:.0f}）时 `unscale_` 之前是 {n['scaled']:.1f}，之后 {n['unscaled']:.5f}" in g002
    assert (
        f"（相对差 {n['relative_gap']:.1e}）；裁剪到 max_norm {n['max_norm']} 后梯度相差 {n['clipped_grad_gap']:.1e}"
        in g002
    )
    assert f"波动到 {max(lesson000_rope.LESSON_SPREADS.values()):.1e}" in g000
    wrong = int((lesson002_code.lesson_local_keep(8, 3) != torch.ones(8, 8, dtype=torch.bool).tril().triu(-2)).sum())
    assert f"64 对里有 {wrong} 对不一致" in g002


def test_model_zoo_figures_are_quoted_from_its_records(tmp_path: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        zoo = run_experiment("model-zoo", out=tmp_path / "zoo")
    measured = {c["claim"].split(" (")[0]: c["measured"] for c in zoo["claims"]}
    dk = measured["d_k does not grow with the model size"]
    for figure in re.findall(r"\d[\d.]*%?", dk.split("; the others")[0].split(". ")[0] + dk.split(". ")[1][:12]):
        assert figure in GUIDES["lesson_000.md"], figure
    assert f"39 个开源模型中 {dk.split('. ')[1].split('%')[0]}%" in GUIDES["lesson_001.md"]
    width = measured["d_model = h × d_k: the width is set by the number of heads at a fixed d_k"]
    differ, total = re.match(r"(\d+) of (\d+) differ", width).groups()
    assert f"{total} 个中有 {differ} 个不相等" in GUIDES["lesson_000.md"]
    rule = next(m for c, m in measured.items() if c.startswith("optimal number of heads"))
    for figure in re.findall(r"\d[\d.]*%?", rule.replace("d_model^", "d^")):
        assert figure in GUIDES["lesson_002.md"], figure


def test_the_other_deterministic_figures_are_the_experiments(results: dict[str, dict]) -> None:
    """Figures of params, permutation, rope-relative and frequencies that the guides quote beside their tables."""
    g000, g001, g002 = GUIDES["lesson_000.md"], GUIDES["lesson_001.md"], GUIDES["lesson_002.md"]
    gqa = results["params"]["gqa_counterpoint_32"]
    assert f"{gqa['n_kv_heads']} 个 kv 头时 qkv {gqa['qkv']}" in g000
    broken = [s["max_abs_diff_after_unpermuting"] for s in results["permutation"]["schemes"] if s["scheme"] != "none"]
    assert f"其余 {len(broken)} 种位置编码全部 `broken`（差异 {min(broken):.1e} 到 {max(broken):.1e}）" in g000
    spread = {
        c["label"].split(" (")[0]: c["max_spread_over_positions"] for c in results["rope-relative"]["scheme_checks"]
    }
    assert f"`learned`（波动 {spread['learned table']:.2f}）" in g000
    assert f"`sinusoidal`（波动 {spread['sinusoidal']:.0f}）" in g000 and f"波动 {spread['sinusoidal']:.1e}" in g002
    assert f"longrope {max(v for k, v in spread.items() if 'longrope' in k):.1e}" in g001
    assert f"最大 {spread['rope half']:.1e}" in g000  # the lesson's layout: poslab's spread column
    table = results["frequencies"]["lesson_table_d8_base10000"]
    first, last = table[0], table[-1]
    assert f"inv_freq 从 {first['inv_freq']:.4f} 到 {last['inv_freq']:.4f}" in g000
    assert f"周期从 {first['period_positions']:.1f} 到 {last['period_positions']:.1f}" in g000
    assert f"最大差 {results['frequencies']['poslab_rope_head16_vs_lesson_max_abs_diff']:.1e}" in g000
    unturned = [row for row in table if row["period_positions"] > 128 - 1]  # L = 128: less than one turn inside L
    assert f"周期 {unturned[0]['period_positions']:.1f} 及以上的维度（i ≥ {unturned[0]['dim']}）" in g000


def test_the_variance_command_prints_what_the_guide_says() -> None:
    """lesson_000.md §1.4's one-line command, run here: the printed variances, to two decimals."""
    torch.manual_seed(0)
    values = [(torch.randn(20000, d) * torch.randn(20000, d)).sum(-1).div(d**0.5).var().item() for d in (16, 64, 256)]
    assert "输出约 " + "、".join(f"{v:.2f}" for v in values) in GUIDES["lesson_000.md"]


def test_lesson_001_quotes_its_lessons_figures_and_the_proj_count(results: dict[str, dict]) -> None:
    """The causal-leak table's last two columns are lesson 001's own printout; proj is the params experiment's."""
    text = GUIDES["lesson_001.md"]
    lesson = {"1": ("3.7e-08", "2.8e-03"), "2": ("1.9e-02", "1.5e-02")}
    if SEEDS.is_dir():
        seed = next(SEEDS.glob("001_*.txt")).read_text(encoding="utf-8")
        for layers, (none, learned) in lesson.items():
            assert f"{layers} 层：没有位置嵌入 {none}，有位置嵌入 {learned}" in seed, layers
    for layers, (none, learned) in lesson.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {layers} 层 |"))
        assert row.endswith(f"| {none} | {learned} |"), row
    assert lesson == {str(k): (f"{v['none']:.1e}", f"{v['learned']:.1e}") for k, v in causal_leak.LESSON.items()}
    assert f"1 层无位置 < {causal_leak.NOISE_BELOW:.0e}（浮点误差）" in text
    assert f"2 层和 3 层无位置 > {causal_leak.LEAK_ABOVE:.0e}".replace("e-04", "e-4") in text
    proj = set(results["params"]["seed001_proj_params_by_heads"].values())
    assert len(proj) == 1 and f"proj 都是 {proj.pop()}" in text


def test_the_zoo_years_and_theta_the_guide_quotes() -> None:
    rows = {r["name"]: r for r in zoo.load_zoo()}
    modern = [r for r in rows.values() if r["year"] >= 2024]
    text = GUIDES["lesson_000.md"]
    assert f"2024–{max(r['year'] for r in modern)} 年的 {len(modern)} 个模型全部用 RoPE" in text
    assert f"Llama 3 8B theta {float(rows['Llama 3 8B']['rope_theta'])}" in text


def test_the_shape_walk_and_the_zoo_head_range(results: dict[str, dict]) -> None:
    walk = results["shapes"]["seed000_walk"]
    assert all(step["matches_lesson"] for step in walk)
    assert (
        f"你应该看到 {len(walk)} 行" in GUIDES["lesson_000.md"]
        and f"{len(walk)} 步全部 `match yes`" in GUIDES["lesson_002.md"]
    )
    shapes = {str(step["shape"]) for step in walk}
    quoted = re.findall(r"`(\[[\d, ]+\])`", GUIDES["lesson_000.md"].split("### 1.2")[1].split("###")[0])
    assert quoted and set(quoted) <= shapes, set(quoted) - shapes
    heads = [r["n_heads"] for r in zoo.load_zoo()]
    assert f"{len(heads)} 个模型的头数从 {min(heads)} 到 {max(heads)}" in GUIDES["lesson_002.md"]


def test_the_ntk_stretch_the_guide_quotes_is_the_frequencies_table(results: dict[str, dict]) -> None:
    """lesson_000.md's "i=0 是 1.00，i=63 是 4.00" is the `ntk (static)` row of the frequencies experiment."""
    ntk = next(s for s in results["frequencies"]["scalings"] if s["label"] == "ntk (static)")
    first, last = 0, len(ntk["stretch"]) - 1
    quoted = f"i={first} 是 {ntk['stretch'][first]:.2f}，i={last} 是 {ntk['stretch'][last]:.2f}"
    assert quoted in GUIDES["lesson_000.md"]


def test_the_zoo_d_k_exceptions_the_guide_names_are_the_table() -> None:
    """lesson_000.md §1.4 names every model whose d_k is not 64 or 128, with its d_k (MLA rows counted as 128)."""
    text = GUIDES["lesson_000.md"]
    sentence = re.sub(r"\s+", " ", text).split("其余是", 1)[1].split("按 128 计", 1)[0]
    others = [r for r in zoo.load_zoo() if r["head_dim"] not in (64, 128) and r["attention"] != "MLA"]
    assert others, "the zoo has models outside 64 and 128"
    for row in others:
        assert row["name"].split(" (")[0] in sentence or row["family"] in sentence, row["name"]
        assert str(row["head_dim"]) in sentence, (row["name"], row["head_dim"])
    mla = {r["head_dim"] for r in zoo.load_zoo() if r["attention"] == "MLA"}
    assert all(f"的 {d} 是 128 维内容加 64 维 RoPE" in text for d in mla), mla


def test_the_llama_equality_the_guides_quote_is_the_oracle_tolerance() -> None:
    """The "相等到 1e-5" of lesson_001.md and lesson_002.md is tests/test_oracle_hf.py's Llama-layer tolerance."""
    from test_oracle_hf import LLAMA_LAYER_TOL

    quoted = f"{LLAMA_LAYER_TOL:.0e}".replace("e-0", "e-")
    for name in ("lesson_001.md", "lesson_002.md"):
        assert re.search(rf"Llama[^。|]*相等到 {re.escape(quoted)}", GUIDES[name]), name
