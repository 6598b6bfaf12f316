"""The MQTT 5 client of ``mqguard bench proxy --protocol mqtt``: raw sockets and the
project's codec, so the client costs little next to what it measures.

``produce`` pipelines QoS 1 PUBLISHes ``batch`` at a time (each with a unique
``_AMQ_DUPL_ID`` user property, so duplicate detection does its full work) and waits for
every PUBACK of a batch before the next; ``consume`` takes a persistent session's backlog,
one PUBACK per message; ``latency`` sends one message at a time to its own subscription
and times its return.
"""

from __future__ import annotations

import socket
import time
import uuid

from mqguard.mqtt_codec import (
    MqttDecoder,
    MqttPacket,
    mqtt_ack,
    mqtt_connect,
    mqtt_publish,
    mqtt_simple,
    mqtt_subscribe,
)

__all__ = ["MqttBenchClient", "consume", "fill", "latency", "produce", "subscribe_session"]

_SESSION = [("session_expiry_interval", 3600)]


class MqttBenchClient:
    """One MQTT 5 connection."""

    def __init__(self, port: int, client_id: str, *, clean: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = MqttDecoder("5")
        self.pending: list[MqttPacket] = []
        self.sock.sendall(mqtt_connect(client_id, clean_start=clean,
                                       properties=None if clean else _SESSION).encode())
        connack = self.next()
        if connack.type != "CONNACK" or (connack.reason_code or 0) >= 0x80:
            raise RuntimeError(f"connection refused: {connack!r}")

    def next(self) -> MqttPacket:
        while not self.pending:
            data = self.sock.recv(262144)
            if not data:
                raise RuntimeError("connection closed")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def close(self) -> None:
        try:
            self.sock.sendall(mqtt_simple("DISCONNECT").encode())
        finally:
            self.sock.close()


def _publishes(topic: str, bodies: list[bytes], first_id: int) -> list[bytes]:
    return [mqtt_publish(topic, body, qos=1, packet_id=(first_id + i) % 65535 + 1,
                         properties=[("user_property", ("_AMQ_DUPL_ID", uuid.uuid4().hex))]
                         ).encode()
            for i, body in enumerate(bodies)]


def produce(port: int, topic: str, bodies: list[bytes], batch: int) -> float:
    """Seconds from the first PUBLISH to the last PUBACK."""
    client = MqttBenchClient(port, f"bench-p-{uuid.uuid4().hex[:12]}")
    frames = _publishes(topic, bodies, 0)
    try:
        started = time.perf_counter()
        for start in range(0, len(frames), batch):
            chunk = frames[start:start + batch]
            client.sock.sendall(b"".join(chunk))
            acked = 0
            while acked < len(chunk):
                if client.next().type == "PUBACK":
                    acked += 1
        return time.perf_counter() - started
    finally:
        client.close()


def subscribe_session(port: int, client_id: str, topic: str) -> None:
    """A persistent session subscribed to ``topic`` at QoS 1, then left: the broker keeps
    what is published to it."""
    client = MqttBenchClient(port, client_id, clean=False)
    client.sock.sendall(mqtt_subscribe(1, [(topic, 1)]).encode())
    while client.next().type != "SUBACK":
        pass
    client.close()


def fill(port: int, topic: str, bodies: list[bytes]) -> None:
    produce(port, topic, bodies, 100)


def consume(port: int, client_id: str, count: int) -> float:
    """Seconds from CONNECT to the ``count``-th PUBLISH of the session's backlog, each
    acknowledged."""
    started = time.perf_counter()
    client = MqttBenchClient(port, client_id, clean=False)
    try:
        got = 0
        while got < count:
            packet = client.next()
            if packet.type == "PUBLISH":
                got += 1
                client.sock.sendall(mqtt_ack("PUBACK", packet.packet_id or 0).encode())
        return time.perf_counter() - started
    finally:
        client.close()


def latency(port: int, topic: str, samples: int, size: int, warmup: int = 0) -> list[float]:
    """Round trips (ms) of one QoS 1 message at a time to the connection's own
    subscription: from writing the PUBLISH to its delivery arriving."""
    client = MqttBenchClient(port, f"bench-l-{uuid.uuid4().hex[:12]}")
    body = b"x" * size
    try:
        client.sock.sendall(mqtt_subscribe(1, [(topic, 1)]).encode())
        while client.next().type != "SUBACK":
            pass
        out: list[float] = []
        for i in range(samples + warmup):
            frame = _publishes(topic, [body], i)[0]
            started = time.perf_counter()
            client.sock.sendall(frame)
            while True:
                packet = client.next()
                if packet.type == "PUBLISH":
                    elapsed = time.perf_counter() - started
                    client.sock.sendall(mqtt_ack("PUBACK", packet.packet_id or 0).encode())
                    break
            if i >= warmup:
                out.append(elapsed * 1000)
        return out
    finally:
        client.close()
