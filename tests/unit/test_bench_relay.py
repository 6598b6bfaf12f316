"""The do-nothing relay of ``mqguard bench proxy --baselines``, run as its command, in
front of a loopback echo server."""

from __future__ import annotations

import signal
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from mqguard.bench.relay import READY_MARKER


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)  # half-close answered: the relay passes it on


@pytest.fixture
def echo_port() -> Iterator[int]:
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.server_address[1]
        server.shutdown()


def _start_relay(upstream: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "mqguard.bench.relay", "--upstream",
                             upstream, "--event-loop", "asyncio"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(READY_MARKER), line
    return proc, int(line.rpartition(":")[2])


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(10)


def test_relays_both_ways_and_passes_the_half_close_on(echo_port: int) -> None:
    proc, port = _start_relay(f"127.0.0.1:{echo_port}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            # Sent at once: the relay may still be connecting upstream and holds it.
            payload = bytes(range(256)) * 4096  # 1 MiB: more than one write buffer
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            received = bytearray()
            while len(received) < len(payload):
                received += client.recv(65536)
            sender.join(10)
            assert bytes(received) == payload
            client.shutdown(socket.SHUT_WR)
            assert client.recv(10) == b""  # the echo server's half-close came back
    finally:
        assert _stop(proc) == 0  # SIGTERM is its normal end


def test_an_unreachable_upstream_closes_the_client() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    proc, port = _start_relay(f"127.0.0.1:{dead}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"CONNECT\n\n\0")
            assert client.recv(10) == b""
    finally:
        assert _stop(proc) == 0


def test_bad_arguments_are_refused() -> None:
    result = subprocess.run([sys.executable, "-m", "mqguard.bench.relay", "--upstream",
                             "nohostport"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--upstream must be HOST:PORT" in result.stderr
