"""What the native sessions count reaches ``/metrics``: octets read per leg, broker
connections that failed or were lost, malformed broker frames -- against a scripted
broker (a real one cannot be made to send a malformed frame) and against nothing at all
(an unreachable broker)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

from mqguard_tests.scripted_broker import ScriptedBroker
from mqguard_tests.stomp_clients import RawClient, connect_frame
from prometheus_client.parser import text_string_to_metric_families

from mqguard.config import parse_config
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for


class ClosingBroker(ScriptedBroker):
    """To a SEND to ``/queue/close`` it closes the connection, to one to
    ``/queue/garbage`` it answers a malformed frame."""

    def answer(self, sock: socket.socket, command: str, headers: dict[str, str]) -> bool:
        destination = headers.get("destination", "")
        if command == "SEND" and destination == "/queue/close":
            return False
        if command == "SEND" and destination == "/queue/garbage":
            sock.sendall(b"MESSAGE\nbad\\qescape:x\n\n\0")
            return True
        return super().answer(sock, command, headers)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _sidecar(tmp_path: Path, upstream: str) -> Sidecar:
    config = parse_config({"mqguard": {
        "node-id": "metrics-counts", "message-expiry-scan-period": -1,
        "event-log": {"directory": str(tmp_path / "events")},
        "sidecar": {"connect-timeout-ms": 2000}}})
    return Sidecar(config, parse_upstream(upstream), admin=("127.0.0.1", 0))


def _session(port: int, destination: str) -> list[str]:
    """CONNECT, one SEND with a receipt to ``destination``, then read until the end."""
    raw = RawClient(port)
    try:
        raw.send(connect_frame())
        raw.send(f"SEND\ndestination:{destination}\nreceipt:r1\n\nbody\0".encode())
        if destination == "/queue/ok":
            raw.read_frames(lambda got: any(f.command == "RECEIPT" for f in got))
            raw.send(b"DISCONNECT\nreceipt:bye\n\n\0")
        raw.read_to_close(timeout=10)
        return [frame.command for frame in raw.frames()]
    finally:
        raw.close()


def test_octets_lost_connections_and_malformed_broker_frames_are_counted(
        tmp_path: Path) -> None:
    broker = ClosingBroker()
    try:
        with SidecarThread(_sidecar(tmp_path, f"stomp://127.0.0.1:{broker.port}")) as proxy:
            admin = proxy.admin_port
            assert _session(proxy.port, "/queue/ok")[:2] == ["CONNECTED", "RECEIPT"]
            wait_for(lambda: not proxy.sidecar.sessions, 10, "the session to end")
            first = _scrape(admin)
            client_bytes = first["mqguard_sidecar_bytes_total", (("direction", "client"),)]
            broker_bytes = first["mqguard_sidecar_bytes_total", (("direction", "broker"),)]
            # CONNECT, SEND and DISCONNECT from the client; CONNECTED and RECEIPTs back.
            assert client_bytes > 60 and broker_bytes > 40
            # A clean session lost nothing.
            assert first.get(("mqguard_sidecar_upstream_failures_total",
                              (("phase", "lost"),)), 0) == 0
            assert _session(proxy.port, "/queue/close")[-1] == "ERROR"
            assert _session(proxy.port, "/queue/garbage")[-1] == "ERROR"
            wait_for(lambda: not proxy.sidecar.sessions, 10, "both sessions to end")
            after = _scrape(admin)
    finally:
        broker.close()
    assert after["mqguard_sidecar_upstream_failures_total", (("phase", "lost"),)] == 1
    assert after["mqguard_sidecar_protocol_errors_total", (("side", "broker"),)] == 1
    assert after["mqguard_sidecar_bytes_total", (("direction", "client"),)] > client_bytes
    assert after.get(("mqguard_sidecar_upstream_failures_total",
                      (("phase", "connect"),)), 0) == 0


def test_an_unreachable_broker_is_a_connect_failure(tmp_path: Path) -> None:
    # A port nothing listens on: the broker connection is refused at once.
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    with SidecarThread(_sidecar(tmp_path, f"stomp://127.0.0.1:{port}")) as proxy:
        for _ in range(2):
            raw = RawClient(proxy.port)
            raw.send(connect_frame())
            raw.read_to_close(timeout=10)
            raw.close()
            [error] = raw.frames()
            assert error.get("message") == "broker unreachable"
        wait_for(lambda: not proxy.sidecar.sessions, 10, "the sessions to end")
        got = _scrape(proxy.admin_port)
    assert got["mqguard_sidecar_upstream_failures_total", (("phase", "connect"),)] == 2
    assert got.get(("mqguard_sidecar_upstream_failures_total", (("phase", "lost"),)), 0) == 0
