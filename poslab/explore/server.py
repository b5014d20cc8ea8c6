"""``poslab explore [RUN ...] [--port P]``: a local web page to watch attention heads read a prompt.

Served on 127.0.0.1 by the standard library's ``http.server`` (no external assets: the page
``poslab/explore/assets/explore.html``, its script ``explore.js`` and style ``explore.css``, shipped as
package data, and the CJK font all come from this process). Pick a trained run or a position scheme (an
untrained GPT of that scheme, when no run is given), type a prompt, and every head of every layer is
drawn as a heatmap, beside the scheme's own picture: the RoPE rotation ``cos(m·θ_i)``, the ALiBi / T5 /
KERPLE / FIRE / Transformer-XL bias, T5's buckets, or the absolute position vectors. Two panels
compare two models on the same prompt.

JSON API (used by the page):

* ``GET /api/models`` -> ``{"models": [{"id", "label", "kind", "position", "n_layer", "n_head", "block_size"}], ...}``
* ``POST /api/attention`` ``{"model": ID, "prompt": TEXT}`` -> ``{"tokens", "weights" [L][h][T][T], "views"}``;
  a prompt the model cannot read (empty, unknown characters, too long) -> HTTP 400 ``{"error": MESSAGE}``.

Requests are checked (:class:`Handler`): a loopback ``Host`` at this port, same origin, a bounded
``Content-Length``; anything else is HTTP 403/400 with ``{"error": MESSAGE}``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.attention_map import DEFAULT_PROMPT, prompt_attention
from poslab.checks import non_negative_int
from poslab.nn.model import GPT, GPTConfig

MAX_BODY_BYTES = 64 * 1024
#: the page's files (``poslab/explore/assets/``) -> their content type
ASSETS = {
    "explore.html": "text/html; charset=utf-8",
    "explore.js": "text/javascript; charset=utf-8",
    "explore.css": "text/css; charset=utf-8",
}
MAX_PROMPT_CHARS = 1024
#: connections the listening socket queues before the server accepts them (http.server's default is 5)
REQUEST_QUEUE = 128
UNTRAINED = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64}
# viridis at 9 stops; the page interpolates linearly between them (the tests use colormap_rgb)
COLORMAP = [
    (68, 1, 84),
    (71, 44, 122),
    (59, 81, 139),
    (44, 113, 142),
    (33, 144, 141),
    (39, 173, 129),
    (92, 200, 99),
    (170, 220, 50),
    (253, 231, 37),
]


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
            from poslab.runs import load_run

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
                from poslab.runs import RunFolder

                try:
                    config = RunFolder(entry.source).config()["model"]
                except (OSError, ValueError):
                    config = {}
                item.update(
                    position=config.get("position"),
                    n_layer=config.get("n_layer"),
                    n_head=config.get("n_head"),
                    block_size=config.get("block_size"),
                )
            else:
                item.update(position=entry.source, **{k: UNTRAINED[k] for k in ("n_layer", "n_head", "block_size")})
            out.append(item)
        return out


# ------------------------------------------------------------------------------------------ scheme pictures
def _matrix(
    title: str, data: torch.Tensor, row_label: str, col_label: str, diverging: bool, note: str = ""
) -> dict[str, Any]:
    data = data.detach().float()
    finite = data[torch.isfinite(data)]
    limit = float(finite.abs().max()) if finite.numel() else 1.0
    return {
        "title": title,
        "note": note,
        "row_label": row_label,
        "col_label": col_label,
        "diverging": diverging,
        "vmin": -limit if diverging else (float(finite.min()) if finite.numel() else 0.0),
        "vmax": limit if diverging else (float(finite.max()) if finite.numel() else 1.0),
        "data": [[round(float(v), 5) if math.isfinite(float(v)) else None for v in row] for row in data],
    }


@torch.no_grad()
def scheme_views(model: GPT, T: int) -> list[dict[str, Any]]:
    """Pictures of how the model's position scheme injects position for ``T`` tokens.

    The scheme describes itself (``PositionScheme.describe``: RoPE's angles, an absolute table, a
    bias per head, T5's buckets, ...); this only lays the matrices out for the page.
    """
    cfg = model.config
    return [
        _matrix(v["title"], v["data"], v["rows"], v["cols"], v["diverging"], v["note"])
        for v in model.layer_position(0).describe(T, n_heads=cfg.n_head, causal=cfg.attention.causal)
    ]


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
        "model": entry.id,
        "label": entry.label,
        "position": cfg.position,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "block_size": cfg.block_size,
        "tokens": tokens,
        "weights": [[[[round(float(v), 6) for v in row] for row in head] for head in layer] for layer in weights],
        "views": scheme_views(entry.model, len(tokens)),
    }


# ------------------------------------------------------------------------------------------ server
#: the names a loopback server may be reached by (``Host`` values without the port)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?$")


class RequestRefused(Exception):
    """A request the explorer does not serve: HTTP ``status`` and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Handler(BaseHTTPRequestHandler):
    """Routes: ``/``, the page's assets, ``/font.otf``, ``/api/models``, ``/api/attention``.

    Every request must name a loopback ``Host`` (``127.0.0.1``, ``localhost`` or ``[::1]``, at this
    server's port: a DNS-rebinding page reaches the server under its own host name) and, when it
    carries an ``Origin``, come from this server's own origin (a page elsewhere cannot make it
    compute). A ``POST`` body needs a decimal ``Content-Length`` of at most :data:`MAX_BODY_BYTES`.
    A client that goes away before its answer is sent is logged in one line.
    """

    store: ModelStore
    server_version = "poslab-explore"
    quiet = True
    timeout = 60  # seconds a client may take to send its request

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError) as err:  # the client went away (or stalled): one line, no traceback
            what = getattr(self, "requestline", "") or "before sending a request"
            host, port = self.client_address[:2]
            sys.stderr.write(f"poslab explore: client {host}:{port} disconnected ({what}): {type(err).__name__}\n")
            self.close_connection = True

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(
            status,
            json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8"),
            "application/json; charset=utf-8",
        )

    def _check_origin(self) -> None:
        """Refuse (403) a non-loopback ``Host`` or a cross-origin request; (400) more than one ``Host``."""
        port = self.server.server_address[1]
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:  # RFC 7230 section 5.4: more than one Host field is a bad request
            self.close_connection = True
            raise RequestRefused(
                400, f"the request has {len(hosts)} Host headers ({', '.join(map(repr, hosts))}); HTTP/1.1 allows one"
            )
        host = self.headers.get("Host")
        match = _HOST_RE.match(host.strip()) if host else None
        if (
            match is None
            or match.group(1).lower() not in LOOPBACK_HOSTS
            or (match.group(2) and int(match.group(2)) != port)
        ):
            raise RequestRefused(403, f"Host {host!r} is not this server; use http://127.0.0.1:{port}/")
        origin = self.headers.get("Origin")
        if origin is not None and origin.rstrip("/").lower() not in {f"http://{h}:{port}" for h in LOOPBACK_HOSTS}:
            raise RequestRefused(403, f"cross-origin request from {origin!r} refused; open http://127.0.0.1:{port}/")
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise RequestRefused(403, f"cross-site request (Sec-Fetch-Site: {site}) refused")

    def _body(self) -> bytes:
        """The request body, after checking its length (no chunked bodies)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise RequestRefused(411, "send the body with a Content-Length (no Transfer-Encoding)")
        text = self.headers.get("Content-Length")
        if text is None:
            return b""
        if not re.fullmatch(r"\d{1,20}", text.strip()):
            self.close_connection = True  # the body's end is unknown: this connection cannot be reused
            raise RequestRefused(400, f"Content-Length must be a non-negative integer, got {text!r}")
        length = int(text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read
            raise RequestRefused(400, f"request of {length} bytes is larger than {MAX_BODY_BYTES}")
        body = self.rfile.read(length)
        if len(body) < length:
            raise ConnectionResetError(f"body ended after {len(body)} of {length} bytes")
        return body

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        try:
            self._check_origin()
        except RequestRefused as err:
            self._json(err.status, {"error": str(err)})
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, asset("explore.html"), ASSETS["explore.html"])
        elif path.lstrip("/") in ASSETS:
            self._send(200, asset(path.lstrip("/")), ASSETS[path.lstrip("/")])
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
        try:
            self._check_origin()
            if self.path.split("?", 1)[0] != "/api/attention":
                self.close_connection = True  # the body is not read
                raise RequestRefused(404, f"no such endpoint: {self.path}")
            request = json.loads(self._body().decode("utf-8") or "{}")
            if not isinstance(request, dict):
                raise ValueError("the request must be a JSON object {model, prompt}")
            payload = attention_payload(self.store, request.get("model"), request.get("prompt", ""))
            try:
                body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
            except ValueError:  # NaN or inf in the weights: JSON cannot carry them, and they are no answer
                raise RequestRefused(
                    422,
                    f"the attention of model {request.get('model')!r} is not finite (NaN or "
                    "inf): its weights are damaged or overflow fp32",
                ) from None
        except RequestRefused as err:
            self._json(err.status, {"error": str(err)})
        except (ConnectionError, TimeoutError):
            raise  # the client is gone: handle() logs it
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            self._json(400, {"error": str(err).splitlines()[0] if str(err) else type(err).__name__})
        except Exception as err:  # never a bare traceback: the page shows the message
            self._json(500, {"error": f"internal error: {type(err).__name__}: {err}"})
        else:
            self._send(200, body, "application/json; charset=utf-8")


def make_server(
    store: ModelStore, port: int = 8765, host: str = "127.0.0.1", quiet: bool = True
) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (``port=0`` picks a free port: see ``server.server_address``)."""
    handler = type("BoundHandler", (Handler,), {"store": store, "quiet": quiet})
    # a page (or a script) may send a burst of requests at once: the listen queue holds them all
    server_class = type("ExplorerServer", (ThreadingHTTPServer,), {"request_queue_size": REQUEST_QUEUE})
    server = server_class((host, port), handler)
    server.daemon_threads = True
    return server


def asset(name: str) -> bytes:
    """A file of the page (``explore.html``, ``explore.js``, ``explore.css``), shipped as package data."""
    if name not in ASSETS:
        raise ValueError(f"unknown explorer asset {name!r}; known: {', '.join(ASSETS)}")
    return resources.files("poslab.explore").joinpath("assets", name).read_bytes()


def serve(runs: list[Path], port: int = 8765, schemes: list[str] | None = None) -> int:
    """Serve the explorer until Ctrl-C."""
    non_negative_int("--port", port, maximum=65535, rule="an integer in 0..65535")
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
