"""The report and the explorer as a user sees them: rendered in headless Chromium.

Uses Debian's ``chromium`` (``.ci/run`` installs it) driven over the DevTools protocol
(``tests/cdp.py``). Screenshots go to ``test-artifacts/``. Skipped, with the reason, only when no
Chromium binary is installed.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch
from cdp import Browser, find_chromium
from lab_helpers import PROMPT, TANG_HEADS, copy_lab, tiny_run

from poslab.analysis.heads import attention_weights
from poslab.display.fonts import FAMILY
from poslab.explore.server import ModelStore, colormap_rgb, make_server
from poslab.lab.report import build_report
from poslab.runs import load_run

pytestmark = [
    pytest.mark.skipif(
        find_chromium() is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run does it)"
    ),
    pytest.mark.usefixtures("single_thread"),  # tiny models: one thread (conftest)
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

GLYPHS_DIFFER = """(() => {
  const draw = (ch) => { const c = document.createElement('canvas'); c.width = c.height = 40;
    const x = c.getContext('2d'); x.font = "32px 'Poslab CJK'"; x.fillText(ch, 2, 34);
    return Array.from(x.getImageData(0, 0, 40, 40).data); };
  const a = draw('白'), b = draw('黄'), blank = draw(' ');
  const inked = (d) => d.some((v, i) => i % 4 === 3 && v > 0);
  return [inked(a), inked(b), a.join() !== b.join(), inked(blank)];
})()"""


def test_report_renders_in_chromium(tmp_path):
    lab_dir = copy_lab(tmp_path / "lab")
    shutil.copy(lab_dir / TANG_HEADS / "attention.png", lab_dir / "experiments" / "params" / "copy.png")
    report = build_report(lab_dir)
    with Browser(width=1280, height=900) as browser:
        browser.goto(report.as_uri())
        browser.wait_for("document.fonts.status === 'loaded'")
        images = browser.eval(
            "[...document.images].map(i => "
            "[i.complete, i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width])"
        )
        fonts = browser.eval(f"[...document.fonts].filter(f => f.family.includes('{FAMILY}')).map(f => f.status)")
        checked = browser.eval(f"document.fonts.check(\"16px '{FAMILY}'\", '{PROMPT}')")
        glyphs = browser.eval(GLYPHS_DIFFER)
        claim_fonts = browser.fonts_used("#order .claim p")
        nav_links = browser.eval(
            "[...document.querySelectorAll('nav a')].map(a => document.querySelector(a.getAttribute('href')) !== null)"
        )
        ARTIFACTS.mkdir(exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "report.png")
        errors, requests = browser.console_errors, browser.requests
    assert errors == []
    assert all(url.startswith(("file://", "data:")) for url in requests), [u[:80] for u in requests]
    assert len(images) == 3 and all(done and w > 0 and h > 0 and shown > 0 for done, w, h, shown in images), images
    assert fonts == ["loaded"] and checked is True
    assert glyphs == [True, True, True, False]  # two different glyphs, not the same box twice
    assert claim_fonts.get(FAMILY, 0) >= 10, claim_fonts  # the lesson's Chinese is drawn with the embedded font
    assert all(nav_links) and len(nav_links) >= 10
    assert shot.stat().st_size > 50_000


def test_chinese_report_renders_in_chromium(tmp_path):
    lab_dir = copy_lab(tmp_path / "lab")
    report = build_report(lab_dir, lang="zh")
    with Browser(width=1280, height=900) as browser:
        browser.goto(report.as_uri())
        browser.wait_for("document.fonts.status === 'loaded'")
        fonts = browser.eval(f"[...document.fonts].filter(f => f.family.includes('{FAMILY}')).map(f => f.status)")
        text = browser.eval("document.body.innerText")
        title = browser.eval("document.querySelector('header h1').innerText")
        legend_fonts = browser.fonts_used("header .legend li")
        traditional = browser.eval("document.querySelector('#guide h3:nth-of-type(2)').innerText")
        heading_fonts = browser.fonts_used("#guide h3:nth-of-type(2)")
        claims_fonts = browser.fonts_used("#claims table.claims tbody .crit span")
        checked = browser.eval(f"document.fonts.check(\"16px '{FAMILY}'\", '{traditional}')")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "report-zh.png")
        errors = browser.console_errors
    assert errors == [] and fonts == ["loaded"]
    assert title == "poslab 实验报告" and "课文有误" in text and "此规模无法检验" in text
    assert legend_fonts.get(FAMILY, 0) >= 20, legend_fonts  # the Chinese UI is drawn with the embedded font
    assert traditional == "「多頭注意力和位置編碼」"  # the lesson in traditional characters, by its title
    assert heading_fonts == {FAMILY: len(traditional)}, heading_fonts  # every glyph from the embedded font
    assert claims_fonts.get(FAMILY, 0) >= 20, claims_fonts  # a criterion an experiment wrote, in Chinese
    assert checked is True
    assert shot.stat().st_size > 50_000


def cell_colours(browser: Browser, side: str) -> dict[tuple[int, int], list[list[list[int]]]]:
    """(layer, head) -> [T][T] RGB read back from each heatmap canvas of a panel, at each cell's centre."""
    found = browser.eval(f"""[...document.querySelectorAll('#panel-{side} canvas.heatmap')].map(c => {{
        const d = c.dataset, cell = +d.cell, left = +d.left, top = +d.top, T = +d.tokens, x = c.getContext('2d');
        const rows = [];
        for (let i = 0; i < T; i++) {{ const row = [];
          for (let j = 0; j < T; j++) {{ const p = x.getImageData(left + j * cell + Math.floor(cell / 2), \
top + i * cell + Math.floor(cell / 2), 1, 1).data;
            row.push([p[0], p[1], p[2]]); }}
          rows.push(row); }}
        return [+d.layer, +d.head, rows]; }})""")
    return {(layer, head): rows for layer, head, rows in found}


def assert_matches(colours: dict, weights: torch.Tensor, layers: list[int]) -> None:
    """Every drawn cell has the colour of the model's attention weight (within rounding)."""
    assert sorted(colours) == [(layer, head) for layer in layers for head in range(weights.shape[1])]
    for (layer, head), rows in colours.items():
        T = weights.shape[-1]
        assert len(rows) == T
        for i in range(T):
            for j in range(T):
                expected = colormap_rgb(float(weights[layer, head, i, j]))
                assert all(abs(a - b) <= 2 for a, b in zip(rows[i][j], expected)), (
                    layer,
                    head,
                    i,
                    j,
                    rows[i][j],
                    expected,
                )


def model_weights(run: Path, prompt: str) -> torch.Tensor:
    model, tokenizer, _ = load_run(run)
    return torch.cat(attention_weights(model, torch.tensor([tokenizer.encode(prompt)])))  # [L, h, T, T]


def wait_ready(browser: Browser, side: str, model: str, prompt: str) -> None:
    browser.wait_for(
        f"(() => {{ const p = document.querySelector('#panel-{side}'); return p.dataset.status === 'ready'"
        f" && p.dataset.model === '{model}' && p.dataset.prompt === '{prompt}'; }})()",
        timeout=60,
    )


def select(browser: Browser, selector: str, value: str) -> None:
    browser.eval(
        f"(() => {{ const s = document.querySelector('{selector}'); s.value = '{value}';"
        " s.dispatchEvent(new Event('change')); })()"
    )


def test_explorer_in_chromium():
    rope_run, alibi_run = tiny_run("rope"), tiny_run("alibi")
    store = ModelStore([rope_run, alibi_run], ["rope", "alibi", "t5"])
    server = make_server(store, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    prompt = "春风白日依山尽"
    try:
        with Browser(width=1400, height=1000) as browser:
            browser.goto(url)
            browser.wait_for("document.body.dataset.ready === '1'", timeout=60)
            # type a prompt and submit it like a user
            browser.type_text("#prompt", prompt)
            browser.click("#go")
            wait_ready(browser, "a", "run:tiny-rope", prompt)
            wait_ready(browser, "b", "run:tiny-alibi", prompt)
            rope = model_weights(rope_run, prompt)
            alibi = model_weights(alibi_run, prompt)
            before = cell_colours(browser, "a")
            assert_matches(before, rope, [0, 1])
            assert_matches(cell_colours(browser, "b"), alibi, [0, 1])
            assert browser.eval("document.querySelectorAll('#panel-a .scheme-view').length") == 1  # RoPE rotation
            assert (
                browser.eval("document.querySelectorAll('#panel-b .scheme-view').length") == 2
            )  # ALiBi bias of 2 heads

            # switch the left panel to the other run: the heatmaps change and follow that model
            select(browser, "#panel-a .model-select", "run:tiny-alibi")
            wait_ready(browser, "a", "run:tiny-alibi", prompt)
            after = cell_colours(browser, "a")
            assert after != before
            assert_matches(after, alibi, [0, 1])

            # one layer only: that layer's heads, the same weights
            select(browser, "#panel-a .layer-select", "1")
            browser.wait_for("document.querySelectorAll('#panel-a canvas.heatmap').length === 2")
            assert_matches(cell_colours(browser, "a"), alibi, [1])
            assert (
                browser.eval("[...document.querySelectorAll('#panel-a .layer h3')].map(h => h.textContent)")[0]
                == "layer 1"
            )
            # an untrained scheme with its bucket picture
            select(browser, "#panel-b .model-select", "scheme:t5")
            wait_ready(browser, "b", "scheme:t5", prompt)
            assert (
                browser.eval("document.querySelectorAll('#panel-b .scheme-view').length") == 5
            )  # 4 bias heads + buckets
            ARTIFACTS.mkdir(exist_ok=True)
            browser.screenshot(ARTIFACTS / "explore.png", full_page=False)

            # bad prompts: a message on the page, never a server error
            for bad, message in [("", "empty"), ("hello", "vocabulary"), ("白" * 40, "at most 32")]:
                browser.eval("document.getElementById('message').textContent = ''")
                browser.type_text("#prompt", bad)
                browser.press_enter()
                shown = browser.wait_for("document.getElementById('message').textContent")
                assert message in shown, shown
                assert browser.eval("getComputedStyle(document.getElementById('message')).display") == "block"
            browser.type_text("#prompt", PROMPT)
            browser.click("#go")
            wait_ready(browser, "a", "run:tiny-alibi", PROMPT)
            assert browser.eval("document.getElementById('message').textContent") == ""
            errors, requests = browser.console_errors, browser.requests
    finally:
        server.shutdown()
        server.server_close()
    # the only console errors are Chromium's notes on the rejected requests (HTTP 400), none is a 5xx
    assert errors and all("status of 400" in e for e in errors), errors
    assert all(u.startswith(url) for u in requests), requests
