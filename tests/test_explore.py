"""The explorer's HTTP API (``poslab explore``), without a browser."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch
from lab_helpers import PROMPT, one_thread, tiny_run

from poslab import positions
from poslab.analysis.heads import attention_weights
from poslab.cli.app import main
from poslab.explore.server import COLORMAP, ModelStore, asset, colormap_rgb, make_server
from poslab.runs import load_run


@pytest.fixture(scope="module")
def server():
    with one_thread():
        runs = [tiny_run("rope"), tiny_run("alibi")]
    store = ModelStore(runs)  # and an untrained model of every registered scheme
    httpd = make_server(store, 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", runs
    httpd.shutdown()
    httpd.server_close()


def request(url: str, body: object | None = None, raw: bytes | None = None) -> tuple[int, dict | bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"} if data is not None else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            payload = response.read()
            status = response.status
            kind = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        payload, status, kind = err.read(), err.code, err.headers.get("Content-Type", "")
    return status, json.loads(
        payload, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")
    ) if "json" in kind else payload


def test_page_and_font_are_served_locally(server):
    url, _ = server
    status, page = request(url + "/")
    assert status == 200 and b"<canvas" not in page and b"poslab explore" in page
    assert b'src="/explore.js"' in page and b'href="/explore.css"' in page
    for name in ("explore.js", "explore.css"):
        status, text = request(url + "/" + name)
        assert status == 200 and text == asset(name) and len(text) > 500
        page += text
    for ref in (b"http://", b"https://", b"//cdn"):
        assert ref not in page
    status, font = request(url + "/font.otf")
    assert status == 200 and font[:4] == b"OTTO"
    status, body = request(url + "/nope")
    assert status == 404 and "no such page" in body["error"]


def test_models_lists_runs_and_schemes(server):
    url, runs = server
    status, body = request(url + "/api/models")
    assert status == 200
    ids = [m["id"] for m in body["models"]]
    assert ids[:2] == ["run:tiny-rope", "run:tiny-alibi"] and "scheme:t5" in ids
    run = body["models"][0]
    assert run["position"] == "rope" and run["n_layer"] == 2 and run["block_size"] == 32
    assert body["colormap"] == [list(c) for c in COLORMAP]


@pytest.mark.parametrize("model_id, run_index", [("run:tiny-rope", 0), ("run:tiny-alibi", 1)])
def test_attention_matches_the_models_weights(server, model_id, run_index):
    url, runs = server
    status, body = request(url + "/api/attention", {"model": model_id, "prompt": PROMPT})
    assert status == 200 and body["tokens"] == list(PROMPT)
    model, tokenizer, _ = load_run(runs[run_index])
    expected = torch.cat(attention_weights(model, torch.tensor([tokenizer.encode(PROMPT)])))  # [L, h, T, T]
    torch.testing.assert_close(torch.tensor(body["weights"]), expected, atol=2e-6, rtol=0)


def test_scheme_views(server):
    url, _ = server
    views = {}
    for scheme in positions.names():
        status, body = request(url + "/api/attention", {"model": f"scheme:{scheme}", "prompt": "白日依山尽"})
        assert status == 200, body
        views[scheme] = [v["title"] for v in body["views"]]
    assert views["rope"] == ["RoPE rotation cos(m·θ_i)"]
    assert views["alibi"] == [f"alibi bias, head {h}" for h in range(4)]
    assert views["t5"][-1] == "T5 bucket of each (query, key)" and len(views["t5"]) == 5
    assert views["learned"] == ["learned: position vector added to each token"]
    assert views["none"] == []
    assert views["xl"][0] == "xl bias, head 0"
    status, body = request(url + "/api/attention", {"model": "scheme:alibi", "prompt": "白日依山尽"})
    bias = body["views"][0]
    assert bias["data"][0][1] is None  # future keys are masked
    assert bias["data"][4][0] == pytest.approx(
        -4 * 2**-2, abs=1e-5
    )  # ALiBi: -slope * distance, head 0 slope 2^-2 (4 heads)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("hello", "'helo'"),
        ("白" * 33, "at most 32"),
        ("白" * 5000, "at most 1024"),
    ],
)
def test_bad_prompts_get_a_message_not_a_server_error(server, prompt, message):
    url, _ = server
    status, body = request(url + "/api/attention", {"model": "run:tiny-rope", "prompt": prompt})
    assert status == 400 and message in body["error"]


def test_bad_requests(server):
    url, _ = server
    for payload, message in [
        ({"model": "run:nope", "prompt": "白"}, "unknown model"),
        ({"prompt": "白"}, "unknown model"),
        ({"model": "run:tiny-rope", "prompt": 5}, "must be a string"),
        ([1, 2], "JSON object"),
    ]:
        status, body = request(url + "/api/attention", payload)
        assert status == 400 and message in body["error"], body
    status, body = request(url + "/api/attention", raw=b"{not json")
    assert status == 400
    status, body = request(url + "/api/attention", raw=b"x" * (70 * 1024))
    assert status == 400 and "larger than" in body["error"]
    status, body = request(url + "/api/other", {})
    assert status == 404


def test_colormap_matches_the_page():
    assert colormap_rgb(0.0) == COLORMAP[0] and colormap_rgb(1.0) == COLORMAP[-1]
    assert colormap_rgb(0.5) == COLORMAP[4] and colormap_rgb(2.0) == COLORMAP[-1] and colormap_rgb(-1) == COLORMAP[0]
    assert "Math.floor(a + (COLORMAP[i + 1][k] - a) * t + 0.5)" in asset("explore.js").decode()


def test_explore_cli_errors(tmp_path, capsys):
    assert main(["explore", str(tmp_path)]) == 2
    assert "not a poslab run folder" in capsys.readouterr().err
    assert main(["explore", "--port", "70000"]) == 2
    assert "0..65535" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown position scheme"):
        ModelStore([], ["nope"])


def test_concurrent_attention_requests_to_one_model_each_get_their_own_answer(server):
    """24 requests at once (loopback, 24 threads) to one run, over 4 prompts: all 200, each equal to the
    answer the same request gets alone (the capture of a model's attention is one request's at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    url, _ = server
    prompts = [PROMPT, PROMPT[:5], "床前明月光", PROMPT[2:9]]
    alone = {p: request(url + "/api/attention", {"model": "run:tiny-rope", "prompt": p}) for p in prompts}
    assert all(status == 200 for status, _ in alone.values())
    barrier = threading.Barrier(24)

    def ask(i: int) -> tuple[str, tuple[int, dict]]:
        prompt = prompts[i % len(prompts)]
        barrier.wait(timeout=60)
        return prompt, request(url + "/api/attention", {"model": "run:tiny-rope", "prompt": prompt})

    with one_thread(), ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(ask, range(24)))
    failed = [(status, body) for _, (status, body) in answers if status != 200]
    assert not failed, f"{len(failed)} of 24 failed: {failed[0]}"
    for prompt, answer in answers:
        assert answer == alone[prompt]
