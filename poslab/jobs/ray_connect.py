"""Joining a Ray cluster with a deadline: an address where no cluster answers is a one-line error, not a hang."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

#: seconds ``--ray-address`` is given to answer (:data:`RAY_TIMEOUT_ENV` changes it)
RAY_CONNECT_TIMEOUT_S = 30.0
#: the environment variable that sets how long to wait for a Ray cluster to answer, in seconds
RAY_TIMEOUT_ENV = "POSLAB_RAY_CONNECT_TIMEOUT"


def ray_connect_timeout() -> float:
    """Seconds to wait for a Ray cluster: :data:`RAY_TIMEOUT_ENV`, else :data:`RAY_CONNECT_TIMEOUT_S`.

    Raises:
        ValueError: the variable is not a positive finite number of seconds.
    """
    text = os.environ.get(RAY_TIMEOUT_ENV)
    if text is None or not text.strip():
        return RAY_CONNECT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{RAY_TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``, ``ray://host:port`` or ``[::1]:6379``; ``None`` for ``auto`` and the like."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _probe(address: str, timeout: float) -> str | None:
    """``None`` when a Ray cluster at ``address`` answers a driver in a child process within ``timeout`` seconds, else
    why not. The child is killed at the deadline: Ray's retrying threads die with it instead of writing into this
    process's output while it exits."""
    code = "import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); ray.shutdown()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, address], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no Ray cluster answered within {timeout:g} s ({RAY_TIMEOUT_ENV} sets the wait)"
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        return f"cannot connect to Ray: {lines[-1] if lines else f'the driver exited with {done.returncode}'}"
    return None


def connect_ray(ray: Any, address: str, timeout: float) -> None:
    """``ray.init(address=...)`` bounded by ``timeout`` seconds; a one-line ``ValueError`` naming the address otherwise.

    Ray keeps retrying an address where no cluster answers; here a ``host:port`` nobody listens on is
    refused at once (a TCP connection, loopback included), and a cluster that does not answer a driver in a
    child process within the deadline is refused when the time is up (:func:`_probe`). A cluster that answered
    is joined in this process, again bounded by the deadline (the attempt is left to a daemon thread).
    """
    where = _host_port(address)
    if where is not None:
        try:
            socket.create_connection(where, timeout=timeout).close()
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise ValueError(f"--ray-address {address!r}: no Ray cluster there ({reason})") from None
    start = time.monotonic()
    refused = _probe(address, timeout)
    if refused is not None:
        raise ValueError(f"--ray-address {address!r}: {refused}")
    outcome: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=False)
            outcome.append(None)
        except Exception as err:  # noqa: BLE001 - handed to the caller below
            outcome.append(err)

    thread = threading.Thread(target=init, name="poslab-ray-connect", daemon=True)
    thread.start()
    thread.join(max(timeout - (time.monotonic() - start), 1.0))  # one deadline for the probe and the join
    if not outcome:
        raise ValueError(
            f"--ray-address {address!r}: no Ray cluster answered within {timeout:g} s ({RAY_TIMEOUT_ENV} sets the wait)"
        )
    if outcome[0] is not None:
        first = (str(outcome[0]).strip().splitlines() or [type(outcome[0]).__name__])[0]
        raise ValueError(f"--ray-address {address!r}: cannot connect to Ray: {first}") from None


__all__ = ["RAY_CONNECT_TIMEOUT_S", "RAY_TIMEOUT_ENV", "connect_ray", "ray_connect_timeout"]
