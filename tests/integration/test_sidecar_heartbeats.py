"""Heart-beats through the sidecar, against a scripted broker (a real
one cannot be made to send its EOLs in a given pattern)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import stomp  # type: ignore[import-untyped]
from mqguard_tests.scripted_broker import ScriptedBroker

from mqguard.config import parse_config
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for


class Client(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, port: int) -> None:
        self.messages: list[Any] = []
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("c", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        self.messages.append(frame)


class HeartbeatBroker(ScriptedBroker):
    """To a SUBSCRIBE: two heart-beat EOLs in one write, then (a read later) one MESSAGE."""

    def answer(self, sock: socket.socket, command: str, headers: dict[str, str]) -> bool:
        if command == "SUBSCRIBE":
            sock.sendall(b"\n\n")
            time.sleep(0.2)  # the MESSAGE comes in a read of its own
            sock.sendall(f"MESSAGE\nsubscription:{headers['id']}\n"
                         f"destination:{headers['destination']}\nmessage-id:m-1\n"
                         "ack:a-1\ncontent-length:5\n\nhello\0\n".encode())
        return super().answer(sock, command, headers)


def test_bunched_broker_heart_beats_do_not_hide_the_next_frame(tmp_path: Path) -> None:
    """Heart-beat EOLs the broker sends together reach the client as one: stomp.py takes
    two EOLs read at once, before a frame, for that frame's start and drops the frame
    (which stalled a consumer on RabbitMQ, whose EOL after a frame's NUL often arrives in
    a read of its own)."""
    broker = HeartbeatBroker()
    config = parse_config({"mqguard": {
        "node-id": "heartbeat-test", "message-expiry-scan-period": -1,
        "event-log": {"directory": str(tmp_path / "events"), "flush-interval-ms": 20}}})
    sidecar = Sidecar(config, parse_upstream(f"stomp://127.0.0.1:{broker.port}"))
    try:
        with SidecarThread(sidecar) as running:
            client = Client(running.port)
            try:
                client.conn.subscribe("/queue/bunched", id="s", ack="client-individual")
                wait_for(lambda: client.messages, 10, "the MESSAGE behind two heart-beats")
                assert [frame.body for frame in client.messages] == ["hello"]
            finally:
                if client.conn.is_connected():
                    client.conn.disconnect()
    finally:
        broker.close()
