"""The sidecar's admin port: bounded requests, and /health that fails when clients fail."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.servers import ServerHandle, start
from mqguard.sidecar.admin import MAX_HEADER_COUNT, MAX_REQUEST_LINE_BYTES, UpstreamProbe
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream


def _config(tmp_path: Path, **sidecar: Any) -> Any:
    return parse_config({"mqguard": {
        "message-expiry-scan-period": -1,
        "event-log": {"directory": str(tmp_path / "events")},
        "sidecar": sidecar}})


def _http(port: int, request: bytes, timeout: float = 15.0) -> tuple[int, bytes]:
    """Send ``request`` raw, read the answer to EOF: (status code, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # Answered and closed before all was sent: the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = _http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return status, json.loads(body)


# -- bounded requests ------------------------------------------------------------------------


@pytest.fixture
def admin_only(tmp_path: Path) -> Iterator[SidecarThread]:
    # No broker is needed to read requests: the upstream is a port nothing listens on.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    proxy = Sidecar(_config(tmp_path), parse_upstream(f"stomp://127.0.0.1:{port}"),
                    admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        yield running


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET /" + b"a" * (MAX_REQUEST_LINE_BYTES + 1), 414),  # and never a line end
    (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADER_COUNT + 1) + b"\r\n", 431),
    (b"GET /health HTTP/1.1\r\nX: " + b"y" * 20_000 + b"\r\n\r\n", 431),
    (b"GET /health HTTP/1.1\r\n" + b"X: " + b"y" * 4000 + b"\r\n" * 1 +
     (b"Y: " + b"z" * 4000 + b"\r\n") * 10 + b"\r\n", 431),
], ids=["100KB-line", "endless-line", "too-many-headers", "long-header", "large-head"])
def test_oversized_requests_are_answered_and_closed_cleanly(
        admin_only: SidecarThread, request_bytes: bytes, status: int,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    got, body = _http(admin_only.admin_port, request_bytes)
    assert got == status, body
    # No traceback, no warning: a refused request is not news (and a flood must not
    # flood the log). The asyncio logger is where an unhandled callback error goes.
    time.sleep(0.2)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [r.getMessage() for r in loud]
    assert not any(r.exc_info for r in caplog.records)
    # The admin port still serves.
    assert _http(admin_only.admin_port, b"GET /metrics HTTP/1.1\r\n\r\n")[0] == 200


def test_an_ordinary_request_with_headers_is_served(admin_only: SidecarThread) -> None:
    request = (b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: curl/8\r\n"
               b"Accept: */*\r\n\r\n")
    status, body = _http(admin_only.admin_port, request)
    assert status == 200 and b"mqguard" in body


def test_health_is_503_with_a_reason_when_nothing_listens(admin_only: SidecarThread) -> None:
    status, report = _get(admin_only.admin_port, "/health")
    assert status == 503 and report["status"] == "unavailable"
    assert report["reason"].startswith("broker unreachable"), report


# -- /health against a broker that stops answering ------------------------------------------


@pytest.fixture(scope="module")
def own_activemq() -> Iterator[ServerHandle]:
    """A broker of this module's own: it gets frozen, so no shared one is."""
    handle = start("activemq")
    try:
        yield handle
    finally:
        handle.stop()


def _freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def _thaw(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def _stomp_connect_through(port: int, timeout: float) -> bytes:
    """A client's CONNECT through the sidecar; the first frame it gets back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
        data = b""
        while b"\x00" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.activemq
def test_health_follows_a_frozen_broker(own_activemq: ServerHandle, tmp_path: Path) -> None:
    config = _config(tmp_path, **{"connect-timeout-ms": 1500})
    proxy = Sidecar(config, parse_upstream(own_activemq.urls["stomp"]),
                    admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        status, healthy_report = _get(running.admin_port, "/health")
        assert status == 200, healthy_report
        _freeze(own_activemq.pid)
        try:
            # A client gets no answer to its CONNECT...
            answer = _stomp_connect_through(running.port, timeout=15)
            assert answer.startswith(b"ERROR") and b"did not answer CONNECT" in answer, answer
            # ...and /health says so (once the cached answer is older than its ttl).
            time.sleep(1.1)
            started = time.monotonic()
            status, report = _get(running.admin_port, "/health")
            assert time.monotonic() - started < 5  # a short timeout, not the client's
            assert status == 503, report
            assert report["status"] == "unavailable"
            assert "did not answer CONNECT" in report["reason"], report
            # Cached: a burst of requests does not open a connection per request.
            for _ in range(20):
                assert _get(running.admin_port, "/health")[0] == 503
        finally:
            _thaw(own_activemq.pid)
        deadline = time.monotonic() + 30
        while True:
            time.sleep(1.1)
            status, report = _get(running.admin_port, "/health")
            if status == 200 or time.monotonic() > deadline:
                break
        assert status == 200 and report["upstream_answer"] == "CONNECTED", report
    # The report says what the broker answered, and why not when it did not.
    assert healthy_report["upstream_answer"] == "CONNECTED" and healthy_report["reason"] is None


@pytest.mark.activemq
def test_health_probes_are_cached(mqguard_activemq_server: ServerHandle, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of /health requests makes one broker handshake per ttl, not one each."""
    probes: list[float] = []
    real = UpstreamProbe._probe

    async def counted(self: UpstreamProbe) -> Any:
        probes.append(time.monotonic())
        return await real(self)

    monkeypatch.setattr(UpstreamProbe, "_probe", counted)
    proxy = Sidecar(_config(tmp_path), parse_upstream(mqguard_activemq_server.urls["stomp"]),
                    admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        started = time.monotonic()
        reports = [_get(running.admin_port, "/health")[1] for _ in range(30)]
        elapsed = time.monotonic() - started
    assert all(r["status"] == "ok" for r in reports), reports
    assert 1 <= len(probes) <= int(elapsed / 1.0) + 1, (len(probes), elapsed)
