"""The explorer's request checks: body length, Host, Origin, client disconnects.

Raw sockets, so that headers a browser or urllib would never send (``Content-Length: -1``, a foreign
``Host``) reach the server as written.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poslab.explore.server import MAX_BODY_BYTES, ModelStore, make_server


@pytest.fixture(scope="module")
def server():
    httpd = make_server(ModelStore([], ["rope"]), 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


FIGURES: dict[str, int] = {
    "requests": 0,
    "refused": 0,
    "served_anyway": 0,
    "disconnects_logged_in_one_line": 0,
    "tracebacks": 0,
    "concurrent_requests": 0,
    "concurrent_answers_differing": 0,
}


@pytest.fixture(autouse=True)
def _record(request):
    """Each test's counts go to ``test-artifacts/reliability.json`` (the reliability table)."""
    from test_reliability_artifacts import mode, record

    for key in FIGURES:
        FIGURES[key] = 0
    yield
    record("explorer", mode(request), dict(FIGURES))


def raw(port: int, head: str, body: bytes = b"", timeout: float = 20) -> tuple[int, dict]:
    """Send ``head`` (request line + headers, ``\\r\\n``-joined, without the blank line) and ``body``.

    The connection stays open for writing: a server that waits for more body than was sent times out here.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    header, _, payload = data.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    FIGURES["requests"] += 1
    FIGURES["refused" if status >= 400 else "served_anyway"] += 1
    return status, json.loads(payload) if payload.startswith(b"{") else {}


def post(port: int, body: bytes, *headers: str, host: str | None = None) -> tuple[int, dict]:
    lines = [
        "POST /api/attention HTTP/1.1",
        f"Host: {host if host is not None else f'127.0.0.1:{port}'}",
        "Content-Type: application/json",
        *headers,
    ]
    return raw(port, "\r\n".join(lines), body)


PROMPT = json.dumps({"model": "scheme:rope", "prompt": "白日"}).encode()


def test_a_good_request_still_works(server):
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}", f"Origin: http://127.0.0.1:{server}")
    assert status == 200 and body["tokens"] == ["白", "日"]
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}", host=f"localhost:{server}")
    assert status == 200
    for key in FIGURES:  # good requests are not part of the bad-request figures
        FIGURES[key] = 0


@pytest.mark.parametrize("length", ["-1", "+5", "1e3", "0x10", "abc", "99999999999999999999999"])
def test_bad_content_length_is_refused_without_reading_the_body(server, length):
    """Refused before reading: ``Content-Length: -1`` taken as given reads to the end of the stream (past the 64 KiB
    limit)."""
    status, body = post(server, b"", f"Content-Length: {length}")
    assert status == 400, body
    assert f"Content-Length must be a non-negative integer, got {length!r}" in body["error"] or (
        len(length) > 20 and "larger than" not in body["error"]
    ), body


def test_huge_content_length_is_refused(server):
    status, body = post(server, b"", f"Content-Length: {10 * MAX_BODY_BYTES}")
    assert status == 400 and "larger than" in body["error"]


@pytest.mark.parametrize(
    "host",
    ["evil.example:{port}", "evil.example", "127.0.0.1.nip.io:{port}", "127.0.0.1:1", "", "127.0.0.1:{port}@evil"],
)
def test_foreign_host_is_refused(server, host):
    host = host.format(port=server)
    for method in ("GET /api/models", "GET /"):
        status, body = raw(server, f"{method} HTTP/1.1\r\nHost: {host}")
        assert status == 403 and "is not this server" in body["error"], (host, body)
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}", host=host)
    assert status == 403


def test_missing_host_is_refused(server):
    status, body = raw(server, "GET /api/models HTTP/1.0")
    assert status == 403 and "None" in body["error"]


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}"])
def test_cross_origin_requests_are_refused(server, origin):
    origin = origin.format(port=server)
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}", f"Origin: {origin}")
    assert status == 403 and "cross-origin" in body["error"] and origin in body["error"]
    status, body = raw(server, f"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\nOrigin: {origin}")
    assert status == 403


def test_cross_site_fetch_metadata_is_refused(server):
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}", "Sec-Fetch-Site: cross-site")
    assert status == 403 and "cross-site" in body["error"]


def test_chunked_body_is_refused(server):
    status, body = post(server, b"", "Transfer-Encoding: chunked")
    assert status == 411


def test_client_disconnect_is_one_line(server, capfd):
    """A client that resets the connection mid-request: one log line, no traceback."""
    capfd.readouterr()
    sock = socket.create_connection(("127.0.0.1", server), timeout=30)
    head = f"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\nContent-Length: 1000\r\n\r\n"
    sock.sendall(head.encode() + b'{"model": ')  # 10 of the 1000 announced bytes
    time.sleep(0.5)  # the server is now waiting for the rest of the body
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST
    err = ""
    for _ in range(100):
        err += capfd.readouterr().err
        if "disconnected" in err:
            break
        time.sleep(0.1)
    lines = [line for line in err.splitlines() if line.strip()]
    FIGURES["requests"] += 1
    FIGURES["tracebacks"] += "Traceback" in err
    assert len(lines) == 1 and "poslab explore: client 127.0.0.1:" in lines[0], err
    assert "disconnected (POST /api/attention HTTP/1.1)" in lines[0] and "Traceback" not in err
    FIGURES["disconnects_logged_in_one_line"] += 1


def test_two_host_headers_are_a_bad_request(server):
    """RFC 7230 5.4: a request with more than one Host field gets 400 (a proxy and the server could
    otherwise read different hosts)."""
    lines = ["GET /api/models HTTP/1.1", f"Host: 127.0.0.1:{server}", "Host: evil.example"]
    status, body = raw(server, "\r\n".join(lines))
    assert status == 400 and "2 Host headers" in body["error"]


def test_non_finite_attention_is_one_json_error(server, monkeypatch):
    """A model whose attention is NaN: a 422 with the reason, not an exception after the handler."""
    import poslab.explore.server as explore

    monkeypatch.setattr(explore, "attention_payload", lambda store, model, prompt: {"weights": [[float("nan")]]})
    status, body = post(server, PROMPT, f"Content-Length: {len(PROMPT)}")
    assert status == 422 and "not finite" in body["error"]


# ------------------------------------------------------------------------------------ concurrent requests
def _concurrent_batches(slow: bool):
    """A fuzzer of bursts: 8 to 32 requests sent at once to one model, with prompts of the model's
    characters, characters it does not know, and empty ones; each answer (status and body) must equal the
    one the same request gets alone."""
    letters = st.sampled_from(list("白日依山尽黄河入海流。，") + ["€", "x"])
    prompts = st.lists(st.text(letters, min_size=0, max_size=12), min_size=8, max_size=32)

    @settings(max_examples=40 if slow else 4, deadline=None, database=None)
    @given(prompts)
    def check(server, batch):
        from concurrent.futures import ThreadPoolExecutor

        def ask(prompt: str) -> tuple[int, dict]:
            body = json.dumps({"model": "scheme:rope", "prompt": prompt}).encode()
            return post(server, body, f"Content-Length: {len(body)}")

        alone = {prompt: ask(prompt) for prompt in set(batch)}
        with ThreadPoolExecutor(len(batch)) as pool:
            answers = list(pool.map(ask, batch))
        differing = sum(answer != alone[prompt] for prompt, answer in zip(batch, answers))
        FIGURES["concurrent_requests"] += len(batch)
        FIGURES["concurrent_answers_differing"] += differing
        assert differing == 0 and all(status in (200, 400) for status, _ in answers), answers

    return check


def _run_concurrent(server, slow: bool) -> None:
    _concurrent_batches(slow)(server)
    for key in ("requests", "refused", "served_anyway"):  # good requests are not part of the bad-request figures
        FIGURES[key] = 0


def test_fuzzed_concurrent_requests_each_get_their_own_answer(server):
    _run_concurrent(server, slow=False)


@pytest.mark.slow
def test_fuzzed_concurrent_requests_at_length(server):
    _run_concurrent(server, slow=True)
