"""A minimal headless-Chromium driver over the DevTools protocol, for the browser tests.

Uses Debian's ``chromium`` (no browser download) and the ``websocket-client`` package. Records
console errors, uncaught exceptions, log errors and every network request of the page.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = (
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "chromium",
    "chromium-browser",
    "google-chrome",
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--no-default-browser-check",
    "--font-render-hinting=none",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary, or ``None``."""
    for candidate in CHROMIUM_CANDIDATES:
        found = (
            shutil.which(candidate)
            if not candidate.startswith("/")
            else (candidate if Path(candidate).exists() else None)
        )
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page, driven over CDP.

    Attributes:
        console_errors: console ``error`` messages, uncaught exceptions and log errors, as strings.
        requests: URLs the page requested.
    """

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0) -> None:
        import websocket

        binary = find_chromium()
        if binary is None:
            raise RuntimeError("chromium not found")
        self.profile = tempfile.mkdtemp(prefix="poslab-chromium-")
        self.process = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start (no DevToolsActivePort)")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        pages = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
                pages = [t for t in json.load(response) if t.get("type") == "page"]
            if not pages:
                time.sleep(0.05)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        self.timeout = timeout
        self._next_id = 0
        self.events: list[dict] = []
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    # ----------------------------------------------------------------------------------- protocol
    def _handle_event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        self.events.append(message)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            )
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.console_errors.append(
                details.get("exception", {}).get("description") or details.get("text", "exception")
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.console_errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))

    def call(self, method: str, **params: Any) -> dict:
        """Send a command and return its result (events arriving meanwhile are recorded)."""
        self._next_id += 1
        mine = self._next_id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == mine:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self._handle_event(message)

    def wait_event(self, method: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        seen = len(self.events)
        while time.monotonic() < deadline:
            for message in self.events[seen:]:
                if message.get("method") == method:
                    return message
            seen = len(self.events)
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                message = json.loads(self.ws.recv())
            except Exception:  # timeout
                break
            if "method" in message:
                self._handle_event(message)
        raise TimeoutError(f"no {method} within {timeout or self.timeout}s")

    # ----------------------------------------------------------------------------------- actions
    def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """Evaluate JavaScript in the page (promises awaited) and return the value."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"{expression!r} stayed falsy for {timeout or self.timeout}s")

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the element."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block:'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width/2, r.y + r.height/2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type_text(self, selector: str, text: str, clear: bool = True) -> None:
        """Focus an input and type ``text`` as keyboard input."""
        self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus();"
            f" {'e.select();' if clear else ''} }})()"
        )
        if clear:
            self.call(
                "Input.dispatchKeyEvent", type="keyDown", key="Backspace", code="Backspace", windowsVirtualKeyCode=8
            )
            self.call(
                "Input.dispatchKeyEvent", type="keyUp", key="Backspace", code="Backspace", windowsVirtualKeyCode=8
            )
        if text:
            self.call("Input.insertText", text=text)

    def press_enter(self) -> None:
        self.call(
            "Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13, text="\r"
        )
        self.call("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter", windowsVirtualKeyCode=13)

    def fonts_used(self, selector: str) -> dict[str, int]:
        """Fonts Chromium actually rendered the element's text with: family -> glyph count."""
        before = len(self.console_errors)
        self.call("DOM.enable")
        self.call("CSS.enable")
        # Chromium >= 150: enabling the CSS domain makes DevTools itself re-fetch a file: page's
        # stylesheet source, which it logs as a 'security' error about the page's own URL. That entry
        # comes from the inspector, not from the page: drop exactly that one, keep everything else.
        root = self.call("DOM.getDocument", depth=-1)["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        if not node:
            raise ValueError(f"no element matches {selector!r}")
        fonts = self.call("CSS.getPlatformFontsForNode", nodeId=node)["fonts"]
        self.console_errors[before:] = [
            e for e in self.console_errors[before:] if not e.startswith("security: Unsafe attempt to load URL file:")
        ]
        return {f["familyName"]: f["glyphCount"] for f in fonts}

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG screenshot (the whole page by default)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000), "scale": 1},
            )
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
