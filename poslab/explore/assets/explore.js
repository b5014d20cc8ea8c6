// poslab explore: the page's script (served as /explore.js; no external code)
"use strict";
let COLORMAP = [];  // from /api/models (poslab.explore.server.COLORMAP)
let DEFAULT_PROMPT = "";
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
  const models = await response.json();
  MODELS = models.models; COLORMAP = models.colormap; DEFAULT_PROMPT = models.default_prompt;
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
