"""A raw MQTT client on a socket, built on the project's codec: full control over what it
acknowledges and how it leaves (tests of the MQTT sidecar)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable

from mqguard.mqtt_codec import (
    MqttDecoder,
    MqttPacket,
    mqtt_ack,
    mqtt_connect,
    mqtt_publish,
    mqtt_simple,
    mqtt_subscribe,
)

__all__ = ["RawMqtt"]

Props = Iterable[tuple[str, int | str | bytes | tuple[str, str]]]


class RawMqtt:
    """One connection: CONNECT at construction (``connack`` holds the answer)."""

    def __init__(self, port: int, client_id: str, *, version: str = "5", clean: bool = True,
                 keep_alive: int = 60, properties: Props | None = None,
                 will: dict[str, object] | None = None, connect: bool = True) -> None:
        self.version = version
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = MqttDecoder(version)
        self.backlog: list[MqttPacket] = []
        self.closed = False
        self.connack: MqttPacket | None = None
        if connect:
            self.send(mqtt_connect(client_id, version=version, clean_start=clean,
                                   keep_alive=keep_alive, properties=properties, will=will))
            self.connack = self.expect("CONNACK")

    def send(self, packet: MqttPacket) -> None:
        self.sock.sendall(packet.encode())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, timeout: float) -> bool:
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.backlog.extend(self.decoder.feed(data))
        return True

    def expect(self, kind: str, timeout: float = 10.0) -> MqttPacket:
        """The first packet of ``kind`` (others stay in the backlog)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, packet in enumerate(self.backlog):
                if packet.type == kind:
                    return self.backlog.pop(index)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                raise AssertionError(f"no {kind} within {timeout} s (have "
                                     f"{[p.type for p in self.backlog]}, closed={self.closed})")
            self._read(min(remaining, 0.5))

    def collect(self, kind: str, seconds: float) -> list[MqttPacket]:
        """Every packet of ``kind`` that arrives within ``seconds``."""
        deadline = time.monotonic() + seconds
        while not self.closed and (remaining := deadline - time.monotonic()) > 0:
            self._read(min(remaining, 0.2))
        got = [p for p in self.backlog if p.type == kind]
        self.backlog = [p for p in self.backlog if p.type != kind]
        return got

    def wait_closed(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            self._read(0.2)
        return self.closed

    def subscribe(self, topic: str, qos: int = 1, packet_id: int = 1) -> MqttPacket:
        self.send(mqtt_subscribe(packet_id, [(topic, qos)], version=self.version))
        return self.expect("SUBACK")

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, packet_id: int | None = None,
                retain: bool = False, properties: Props | None = None) -> None:
        self.send(mqtt_publish(topic, payload, qos=qos, packet_id=packet_id, retain=retain,
                               properties=properties, version=self.version))

    def ack(self, packet_id: int) -> None:
        self.send(mqtt_ack("PUBACK", packet_id, version=self.version))

    def disconnect(self) -> None:
        self.send(mqtt_simple("DISCONNECT", version=self.version))
        self.sock.close()

    def drop(self) -> None:
        """Leave without DISCONNECT (a crash): the broker publishes the will."""
        self.sock.close()
