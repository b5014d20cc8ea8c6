"""``poslab explore [RUN ...] [--port P]``: a local web page to watch attention heads read a prompt.

Served on 127.0.0.1 by the standard library's ``http.server`` (no external assets: the page, its
script and the CJK font all come from this process). Pick a trained run or a position scheme (an
untrained GPT of that scheme, when no run is given), type a prompt, and every head of every layer is
drawn as a heatmap, beside the scheme's own picture: the RoPE rotation ``cos(m·θ_i)``, the ALiBi / T5 /
KERPLE / FIRE / Transformer-XL bias, T5's buckets, or the absolute position vectors. Two panels
compare two models on the same prompt.

JSON API (used by the page):

* ``GET /api/models`` -> ``{"models": [{"id", "label", "kind", "position", "n_layer", "n_head", "block_size"}], ...}``
* ``POST /api/attention`` ``{"model": ID, "prompt": TEXT}`` -> ``{"tokens", "weights" [L][h][T][T], "views"}``;
  a prompt the model cannot read (empty, unknown characters, too long) -> HTTP 400 ``{"error": MESSAGE}``.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.attention_map import DEFAULT_PROMPT, prompt_attention
from poslab.nn.model import GPT, GPTConfig

MAX_BODY_BYTES = 64 * 1024
MAX_PROMPT_CHARS = 1024
UNTRAINED = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64}
# viridis at 9 stops; the page interpolates linearly between them (the tests use colormap_rgb)
COLORMAP = [(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
            (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37)]


def colormap_rgb(value: float) -> tuple[int, int, int]:
    """The colour the page paints for a weight in [0, 1] (same arithmetic as the page's ``color``)."""
    x = min(max(value, 0.0), 1.0) * (len(COLORMAP) - 1)
    i = min(int(math.floor(x)), len(COLORMAP) - 2)
    t = x - i
    return tuple(int(math.floor(a + (b - a) * t + 0.5)) for a, b in zip(COLORMAP[i], COLORMAP[i + 1]))  # type: ignore[return-value]


@dataclass
class Entry:
    """A model the page can pick: a trained run folder or an untrained model of one scheme."""

    id: str
    label: str
    kind: str  # "run" or "scheme"
    source: str  # run folder or scheme name
    model: GPT | None = None
    tokenizer: Any = None


class ModelStore:
    """The models on offer, loaded on first use (thread-safe)."""

    def __init__(self, runs: list[Path], schemes: list[str] | None = None) -> None:
        from poslab.nn import positions

        self.entries: dict[str, Entry] = {}
        for run in runs:
            run = Path(run)
            if not (run / "config.json").is_file():
                raise ValueError(f"{str(run)!r} is not a poslab run folder (no config.json)")
            key = f"run:{run.name}"
            if key in self.entries:
                key = f"run:{run}"
            self.entries[key] = Entry(key, f"run {run.name}", "run", str(run))
        for name in schemes if schemes is not None else positions.names():
            positions.get(name)  # unknown names fail here, listing the known ones
            self.entries[f"scheme:{name}"] = Entry(f"scheme:{name}", f"untrained {name}", "scheme", name)
        self.lock = threading.Lock()
        self._scheme_tokenizer = None

    def get(self, key: str) -> Entry:
        if not isinstance(key, str) or key not in self.entries:
            raise ValueError(f"unknown model {key!r}; choose one of {', '.join(self.entries)}")
        entry = self.entries[key]
        with self.lock:
            if entry.model is None:
                entry.model, entry.tokenizer = self._load(entry)
        return entry

    def _load(self, entry: Entry) -> tuple[GPT, Any]:
        if entry.kind == "run":
            from poslab.training.loop import load_run

            model, tokenizer, _ = load_run(entry.source)
            return model.eval(), tokenizer
        if self._scheme_tokenizer is None:
            from poslab.data import CharTokenizer, load_corpus

            self._scheme_tokenizer = CharTokenizer.from_text(load_corpus("tang5"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = GPT(GPTConfig(vocab_size=self._scheme_tokenizer.vocab_size, position=entry.source, **UNTRAINED))
        return model.eval(), self._scheme_tokenizer

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.entries.values():
            item: dict[str, Any] = {"id": entry.id, "label": entry.label, "kind": entry.kind}
            if entry.kind == "run":
                try:
                    config = json.loads((Path(entry.source) / "config.json").read_text(encoding="utf-8"))["model"]
                except (OSError, ValueError, KeyError):
                    config = {}
                item.update(position=config.get("position"), n_layer=config.get("n_layer"), n_head=config.get("n_head"),
                            block_size=config.get("block_size"))
            else:
                item.update(position=entry.source, **{k: UNTRAINED[k] for k in ("n_layer", "n_head", "block_size")})
            out.append(item)
        return out


# ------------------------------------------------------------------------------------------ scheme pictures
def _matrix(title: str, data: torch.Tensor, row_label: str, col_label: str, diverging: bool, note: str = "") -> dict[str, Any]:
    data = data.detach().float()
    finite = data[torch.isfinite(data)]
    limit = float(finite.abs().max()) if finite.numel() else 1.0
    return {
        "title": title, "note": note, "row_label": row_label, "col_label": col_label, "diverging": diverging,
        "vmin": -limit if diverging else (float(finite.min()) if finite.numel() else 0.0),
        "vmax": limit if diverging else (float(finite.max()) if finite.numel() else 1.0),
        "data": [[round(float(v), 5) if math.isfinite(float(v)) else None for v in row] for row in data],
    }


@torch.no_grad()
def scheme_views(model: GPT, T: int) -> list[dict[str, Any]]:
    """Pictures of how the model's position scheme injects position for ``T`` tokens."""
    from poslab.nn.positions.rope import RoPE

    scheme, cfg = model.position, model.config
    pos = torch.arange(T)
    views = []
    if isinstance(scheme, RoPE):
        inv_freq, _ = scheme.frequencies(T)
        angles = pos[:, None].float() * inv_freq[None, :].float()  # [T, d/2]
        views.append(_matrix("RoPE rotation cos(m·θ_i)", angles.cos(), "position m", "frequency pair i", True,
                             "each pair of q/k dimensions turns by m·θ_i; low pairs turn fast, high pairs slowly"))
    embedded = scheme.embed(torch.zeros(1, T, cfg.n_embd), pos)[0]  # [T, d]
    if embedded.abs().max() > 0:
        views.append(_matrix(f"{cfg.position}: position vector added to each token", embedded, "position", "dimension", True))
    if scheme.has_bias:
        dk = cfg.n_embd // cfg.n_head
        zeros = torch.zeros(1, cfg.n_head, T, dk)
        bias = scheme.score_bias(zeros, zeros[:, : cfg.kv_heads], pos, pos, 1.0 / math.sqrt(dk))
        if bias is not None:
            bias = bias[0].float()  # [h, T, T]
            keep = pos[None, :] <= pos[:, None] if cfg.causal else torch.ones(T, T, dtype=torch.bool)
            bias = bias.masked_fill(~keep, float("nan"))
            for head in range(min(cfg.n_head, 4)):
                views.append(_matrix(f"{cfg.position} bias, head {head}", bias[head], "query", "key", True,
                                     "added to q·k/√d_k before the softmax" + (" (with q = 0)" if cfg.position == "xl" else "")))
        if hasattr(scheme, "buckets"):
            views.append(_matrix("T5 bucket of each (query, key)", scheme.buckets(pos, pos).float(), "query", "key", False,
                                 "nearby offsets get their own bucket, far ones share log-spaced buckets"))
    return views


def attention_payload(store: ModelStore, key: str, prompt: str) -> dict[str, Any]:
    """The page's data for one model and prompt; ``ValueError`` for a prompt the model cannot read."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt has {len(prompt)} characters; the explorer takes at most {MAX_PROMPT_CHARS}")
    entry = store.get(key)
    tokens, weights = prompt_attention(entry.model, entry.tokenizer, prompt)  # [L, h, T, T]
    cfg = entry.model.config
    return {
        "model": entry.id, "label": entry.label, "position": cfg.position, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "block_size": cfg.block_size, "tokens": tokens,
        "weights": [[[[round(float(v), 6) for v in row] for row in head] for head in layer] for layer in weights],
        "views": scheme_views(entry.model, len(tokens)),
    }


# ------------------------------------------------------------------------------------------ server
class Handler(BaseHTTPRequestHandler):
    """Routes: ``/``, ``/font.otf``, ``/api/models``, ``/api/attention``."""

    store: ModelStore
    server_version = "poslab-explore"
    quiet = True

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8"), "application/json; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, page_html().encode("utf-8"), "text/html; charset=utf-8")
        elif path == "/font.otf":
            from poslab.display.fonts import font_path

            self._send(200, font_path().read_bytes(), "font/otf")
        elif path == "/api/models":
            self._json(200, {"models": self.store.describe(), "default_prompt": DEFAULT_PROMPT, "colormap": COLORMAP})
        elif path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
        else:
            self._json(404, {"error": f"no such page: {path}"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] != "/api/attention":
            self._json(404, {"error": f"no such endpoint: {self.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise ValueError(f"request of {length} bytes is larger than {MAX_BODY_BYTES}")
            request = json.loads(self.rfile.read(length).decode("utf-8") or "{}")
            if not isinstance(request, dict):
                raise ValueError("the request must be a JSON object {model, prompt}")
            self._json(200, attention_payload(self.store, request.get("model"), request.get("prompt", "")))
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            self._json(400, {"error": str(err).splitlines()[0] if str(err) else type(err).__name__})
        except Exception as err:  # never a bare traceback: the page shows the message
            self._json(500, {"error": f"internal error: {type(err).__name__}: {err}"})


def make_server(store: ModelStore, port: int = 8765, host: str = "127.0.0.1", quiet: bool = True) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (``port=0`` picks a free port: see ``server.server_address``)."""
    handler = type("BoundHandler", (Handler,), {"store": store, "quiet": quiet})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def page_html() -> str:
    """The explorer page (HTML + CSS + vanilla JS, no external assets)."""
    return PAGE.replace("__COLORMAP__", json.dumps(COLORMAP)).replace("__PROMPT__", json.dumps(DEFAULT_PROMPT))


PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>poslab explore</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
@font-face { font-family: 'Poslab CJK'; src: url(/font.otf) format('opentype'); }
body { margin:0; font-family: "DejaVu Sans", "Segoe UI", Arial, 'Poslab CJK', sans-serif; color:#1d2330; background:#f6f7f9; }
header { background:#111827; color:#f3f4f6; padding:16px 28px; }
header h1 { font-size:20px; margin:0 0 10px; }
form { display:flex; gap:10px; align-items:center; flex-wrap:wrap; }
#prompt { font-size:18px; padding:6px 10px; width:420px; font-family:'Poslab CJK', sans-serif; border-radius:6px; border:1px solid #9aa3b5; }
button { font-size:15px; padding:7px 16px; border-radius:6px; border:0; background:#3057d5; color:#fff; cursor:pointer; }
#message { margin:10px 28px 0; padding:8px 12px; border-radius:6px; display:none; }
#message.error { display:block; background:#fdf0e1; color:#a35200; }
#message.info { display:block; background:#e3f4ea; color:#1e7d46; }
main { display:flex; gap:18px; padding:14px 28px; align-items:flex-start; }
.panel { flex:1; min-width:0; background:#fff; border:1px solid #e3e6ec; border-radius:10px; padding:14px 16px; }
.panel .controls { display:flex; gap:10px; align-items:center; margin-bottom:8px; flex-wrap:wrap; }
.panel h2 { font-size:16px; margin:0; }
select { font-size:14px; padding:4px 6px; }
.layer h3 { font-size:13px; color:#5b6475; margin:10px 0 4px; }
.heads, .views { display:flex; flex-wrap:wrap; gap:10px; }
.head { font-size:12px; color:#5b6475; }
canvas { display:block; }
.views h4 { font-size:12px; margin:4px 0; color:#5b6475; max-width:280px; }
.view-note { font-size:11px; color:#8a92a3; max-width:280px; }
.legend { font-size:12px; color:#5b6475; }
</style></head>
<body>
<header><h1>poslab explore — attention heads and position encodings</h1>
<form id="form"><input id="prompt" autocomplete="off" placeholder="type a prompt, e.g. 白日依山尽"><button id="go" type="submit">Show attention</button>
<span class="legend">colour = attention weight, 0 (dark) … 1 (yellow); rows = query token, columns = key token</span></form></header>
<div id="message" role="status"></div>
<main><section class="panel" id="panel-a"></section><section class="panel" id="panel-b"></section></main>
<script>
"use strict";
const COLORMAP = __COLORMAP__;
const DEFAULT_PROMPT = __PROMPT__;
let MODELS = [];
const state = { a: { model: null, layer: "all", data: null }, b: { model: null, layer: "all", data: null } };

function color(v) {
  const x = Math.min(Math.max(v, 0), 1) * (COLORMAP.length - 1);
  const i = Math.min(Math.floor(x), COLORMAP.length - 2), t = x - i;
  const c = COLORMAP[i].map((a, k) => Math.floor(a + (COLORMAP[i + 1][k] - a) * t + 0.5));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
function diverging(v, lim) {  // blue (negative) - white - red (positive)
  const t = lim > 0 ? Math.max(-1, Math.min(1, v / lim)) : 0;
  const r = t < 0 ? Math.round(255 * (1 + t)) : 255, b = t > 0 ? Math.round(255 * (1 - t)) : 255;
  const g = Math.round(255 * (1 - Math.abs(t)));
  return `rgb(${r},${g},${b})`;
}
function showMessage(text, kind) {
  const m = document.getElementById("message");
  m.textContent = text; m.className = text ? kind : "";
}
function heatmap(weights, tokens, layer, head, width) {
  const T = tokens.length, cell = Math.max(3, Math.min(34, Math.floor((width - 22) / T))), font = Math.min(14, Math.max(9, cell - 4));
  const labels = T <= 48, left = labels ? font + 8 : 2, top = labels ? font + 8 : 2;
  const canvas = document.createElement("canvas");
  canvas.width = left + T * cell + 2; canvas.height = top + T * cell + 2;
  canvas.className = "heatmap";
  Object.assign(canvas.dataset, { layer, head, cell, left, top, tokens: T });
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
    ctx.fillStyle = color(weights[i][j]);
    ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
  }
  if (labels) {
    ctx.fillStyle = "#1d2330"; ctx.font = `${font}px 'Poslab CJK', sans-serif`; ctx.textAlign = "center"; ctx.textBaseline = "middle";
    tokens.forEach((t, k) => {
      ctx.fillText(t, left + k * cell + cell / 2, top / 2);
      ctx.fillText(t, left / 2, top + k * cell + cell / 2);
    });
  }
  return canvas;
}

function viewCanvas(view) {
  const rows = view.data.length, cols = rows ? view.data[0].length : 0;
  const cell = Math.max(2, Math.min(16, Math.floor(240 / Math.max(rows, cols, 1))));
  const canvas = document.createElement("canvas");
  canvas.width = cols * cell; canvas.height = rows * cell; canvas.className = "scheme-view";
  const ctx = canvas.getContext("2d");
  const span = view.vmax - view.vmin || 1;
  view.data.forEach((row, i) => row.forEach((v, j) => {
    if (v === null) { ctx.fillStyle = "#eceef2"; }
    else { ctx.fillStyle = view.diverging ? diverging(v, view.vmax) : color((v - view.vmin) / span); }
    ctx.fillRect(j * cell, i * cell, cell, cell);
  }));
  return canvas;
}

function renderPanel(side) {
  const s = state[side], root = document.getElementById(`panel-${side}`), body = root.querySelector(".body");
  body.innerHTML = "";
  if (!s.data) { return; }
  const d = s.data, layers = s.layer === "all" ? [...Array(d.n_layer).keys()] : [Number(s.layer)];
  const avail = Math.max(body.clientWidth, 240), perRow = s.layer === "all" ? Math.min(d.n_head, 4) : Math.min(d.n_head, 2);
  const width = Math.floor(avail / perRow) - 12;
  const info = document.createElement("p");
  info.className = "legend";
  info.textContent = `${d.label}: ${d.position} positions, ${d.n_layer} layers × ${d.n_head} heads, ${d.tokens.length} tokens (block size ${d.block_size})`;
  body.appendChild(info);
  for (const layer of layers) {
    const box = document.createElement("div"); box.className = "layer";
    box.innerHTML = `<h3>layer ${layer}</h3>`;
    const heads = document.createElement("div"); heads.className = "heads";
    d.weights[layer].forEach((w, head) => {
      const h = document.createElement("div"); h.className = "head";
      h.appendChild(heatmap(w, d.tokens, layer, head, width));
      h.appendChild(document.createTextNode(`head ${head}`));
      heads.appendChild(h);
    });
    box.appendChild(heads); body.appendChild(box);
  }
  const views = document.createElement("div"); views.className = "layer";
  views.innerHTML = `<h3>how ${d.position} injects position</h3>`;
  const grid = document.createElement("div"); grid.className = "views";
  if (!d.views.length) { grid.textContent = "no position information (NoPE): order comes only from the causal mask"; }
  d.views.forEach(v => {
    const item = document.createElement("div");
    const title = document.createElement("h4"); title.textContent = `${v.title} (rows: ${v.row_label}, columns: ${v.col_label})`;
    item.appendChild(title); item.appendChild(viewCanvas(v));
    if (v.note) { const n = document.createElement("div"); n.className = "view-note"; n.textContent = v.note; item.appendChild(n); }
    grid.appendChild(item);
  });
  views.appendChild(grid); body.appendChild(views);
}

function layerOptions(side) {
  const s = state[side], select = document.querySelector(`#panel-${side} .layer-select`);
  const model = MODELS.find(m => m.id === s.model);
  const n = s.data ? s.data.n_layer : (model && model.n_layer) || 0;
  const current = s.layer;
  select.innerHTML = `<option value="all">all layers</option>` + [...Array(n).keys()].map(l => `<option value="${l}">layer ${l}</option>`).join("");
  select.value = [...select.options].some(o => o.value === current) ? current : "all";
  s.layer = select.value;
}

async function load(side) {
  const s = state[side], prompt = document.getElementById("prompt").value;
  const root = document.getElementById(`panel-${side}`);
  if (!s.model) { s.data = null; renderPanel(side); return true; }
  if (!prompt.trim()) { showMessage("The prompt is empty: type at least one character.", "error"); return false; }
  root.dataset.status = "loading";
  let response, body;
  try {
    response = await fetch("/api/attention", { method: "POST", headers: { "Content-Type": "application/json" },
                                                body: JSON.stringify({ model: s.model, prompt }) });
    body = await response.json();
  } catch (err) {
    root.dataset.status = "error"; showMessage(`The server did not answer: ${err}`, "error"); return false;
  }
  if (!response.ok) {
    root.dataset.status = "error";
    const label = (MODELS.find(m => m.id === s.model) || {}).label || s.model;
    showMessage(`${label}: ${body.error}`, "error"); return false;
  }
  s.data = body; layerOptions(side); renderPanel(side);
  root.dataset.status = "ready"; root.dataset.prompt = prompt; root.dataset.model = s.model;
  return true;
}

async function refresh() {
  showMessage("", "");
  const ok = await Promise.all(["a", "b"].map(load));
  if (ok.every(Boolean)) { showMessage("", ""); }
}

function buildPanel(side, initial) {
  const root = document.getElementById(`panel-${side}`);
  root.innerHTML = `<div class="controls"><h2>${side === "a" ? "Left" : "Right"}</h2>
    <select class="model-select" aria-label="model"></select><select class="layer-select" aria-label="layer"></select></div><div class="body"></div>`;
  const select = root.querySelector(".model-select");
  const groups = { run: "trained runs", scheme: "untrained model of a scheme" };
  if (side === "b") { select.insertAdjacentHTML("beforeend", `<option value="">(none)</option>`); }
  for (const kind of ["run", "scheme"]) {
    const items = MODELS.filter(m => m.kind === kind);
    if (!items.length) continue;
    const group = document.createElement("optgroup"); group.label = groups[kind];
    items.forEach(m => { const o = document.createElement("option"); o.value = m.id; o.textContent = m.label; group.appendChild(o); });
    select.appendChild(group);
  }
  select.value = initial || "";
  state[side].model = select.value || null;
  select.addEventListener("change", async () => { state[side].model = select.value || null; state[side].data = null; layerOptions(side); await load(side); });
  const layer = root.querySelector(".layer-select");
  layer.addEventListener("change", () => { state[side].layer = layer.value; renderPanel(side); });
  layerOptions(side);
}

async function main() {
  await document.fonts.load("16px 'Poslab CJK'", "白日依山尽");
  const response = await fetch("/api/models");
  MODELS = (await response.json()).models;
  const runs = MODELS.filter(m => m.kind === "run"), schemes = MODELS.filter(m => m.kind === "scheme");
  const pick = (i, name) => (runs[i] || schemes.find(m => m.position === name) || MODELS[i] || {}).id;
  buildPanel("a", pick(0, "rope"));
  buildPanel("b", pick(1, "alibi"));
  document.getElementById("prompt").value = DEFAULT_PROMPT;
  document.getElementById("form").addEventListener("submit", ev => { ev.preventDefault(); refresh(); });
  await refresh();
  document.body.dataset.ready = "1";
}
main();
</script></body></html>
"""


def serve(runs: list[Path], port: int = 8765, schemes: list[str] | None = None) -> int:
    """Serve the explorer until Ctrl-C."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be an integer in 0..65535, got {port!r}")
    store = ModelStore(runs, schemes)
    try:
        server = make_server(store, port, quiet=False)
    except OSError as err:
        raise ValueError(f"cannot listen on 127.0.0.1:{port}: {err.strerror or err}; pick another --port") from None
    host, bound = server.server_address[:2]
    print(f"poslab explore: http://{host}:{bound}/  ({len(store.entries)} models; Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("poslab explore: stopped")
    finally:
        server.server_close()
    return 0
