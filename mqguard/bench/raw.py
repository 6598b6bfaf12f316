"""The raw clients the guard is compared with: plain stomp.py and paho-mqtt.

They do the same work as the guarded path (confirmed sends, individual acks),
without mqguard, so the ratio of the two is the guard's cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import stomp
from paho.mqtt import client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def stomp_destination(address: str) -> str:
    return address if address.startswith("/") else f"/queue/{address}"


class _Receipts(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.cond = threading.Condition()
        self.on_msg: Callable[[Any], None] | None = None

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.pending.discard(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        if self.on_msg is not None:
            self.on_msg(frame)

    def wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.pending)} receipts missing")
                self.cond.wait(left)


def _stomp_connect(url: str) -> tuple[stomp.Connection12, _Receipts]:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    conn = stomp.Connection12([(parts.hostname or "127.0.0.1", parts.port or 61613)],
                              vhost=query.get("vhost", ["/"])[0], heartbeats=(0, 0))
    listener = _Receipts()
    conn.set_listener("raw", listener)
    conn.connect(parts.username or "guest", parts.password or "guest", wait=True)
    return conn, listener


class StompProducer:
    """Plain stomp.py sending confirmed batches: every SEND receipted, each batch awaited."""

    def __init__(self, url: str, address: str) -> None:
        self.address = address
        self.destination = stomp_destination(address)
        self.conn, self.listener = _stomp_connect(url)
        self.sent = 0

    def send_batch(self, bodies: Sequence[bytes]) -> None:
        listener = self.listener
        for i, body in enumerate(bodies, self.sent):
            receipt = f"r{i}"
            with listener.cond:
                listener.pending.add(receipt)
            self.conn.send(self.destination, body,
                           headers={"persistent": "true", "receipt": receipt,
                                    "_AMQ_DUPL_ID": f"{self.address}-{i}"})
        self.sent += len(bodies)
        listener.wait()

    def close(self) -> None:
        self.conn.disconnect()


def stomp_produce(url: str, address: str, bodies: list[bytes], batch: int) -> float:
    """Send every body, ``batch`` frames at a time, each batch confirmed; returns seconds."""
    producer = StompProducer(url, address)
    try:
        started = time.perf_counter()
        for start in range(0, len(bodies), batch):
            producer.send_batch(bodies[start:start + batch])
        return time.perf_counter() - started
    finally:
        producer.close()


def stomp_consume(url: str, address: str, count: int, prefetch: int,
                  timeout: float = 120.0) -> float:
    """Receive ``count`` messages acking each (client-individual); returns seconds."""
    conn, listener = _stomp_connect(url)
    done = threading.Event()
    seen = 0

    def on_message(frame: Any) -> None:
        nonlocal seen
        conn.ack(frame.headers["ack"])
        seen += 1
        if seen >= count:
            done.set()

    listener.on_msg = on_message
    try:
        started = time.perf_counter()
        conn.subscribe(stomp_destination(address), id="raw", ack="client-individual",
                       headers={"activemq.prefetchSize": str(prefetch),
                                "prefetch-count": str(prefetch)})
        if not done.wait(timeout):
            raise TimeoutError(f"raw STOMP consumer got {seen} of {count}")
        return time.perf_counter() - started
    finally:
        conn.disconnect()


def _mqtt_client(url: str, client_id: str) -> mqtt.Client:
    parts = urlsplit(url)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv5, manual_ack=True)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    client.connect(parts.hostname or "127.0.0.1", parts.port or 1883, clean_start=False,
                   properties=props)
    client.loop_start()
    return client


class MqttProducer:
    """Plain paho-mqtt publishing QoS 1 batches, each batch's PUBACKs awaited.

    Every PUBLISH carries a unique ``_AMQ_DUPL_ID`` user property, built with paho's own
    ``Properties``, as the raw STOMP producer carries the header: an application that
    wants duplicate detection sends its duplicate id either way, so both sides of the
    benchmark send it.
    """

    def __init__(self, url: str, address: str) -> None:
        self.address = address
        self.client = _mqtt_client(url, f"raw-pub-{time.monotonic_ns()}")
        self.topic = address.replace(".", "/")
        self.sent = 0

    def send_batch(self, bodies: Sequence[bytes]) -> None:
        infos = []
        for i, body in enumerate(bodies, self.sent):
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = ("_AMQ_DUPL_ID", f"{self.address}-{i}")
            infos.append(self.client.publish(self.topic, body, qos=1, properties=properties))
        self.sent += len(bodies)
        for info in infos:
            info.wait_for_publish(30)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def mqtt_produce(url: str, address: str, bodies: list[bytes], batch: int) -> float:
    producer = MqttProducer(url, address)
    try:
        started = time.perf_counter()
        for start in range(0, len(bodies), batch):
            producer.send_batch(bodies[start:start + batch])
        return time.perf_counter() - started
    finally:
        producer.close()


def mqtt_subscribe_session(url: str, address: str, client_id: str) -> None:
    """Create a persistent session subscribed to ``address`` so messages queue up for it."""
    client = _mqtt_client(url, client_id)
    done = threading.Event()
    client.on_subscribe = lambda *a: done.set()
    client.subscribe(address.replace(".", "/"), qos=1)
    done.wait(10)
    client.loop_stop()
    client.disconnect()


def mqtt_consume(url: str, address: str, count: int, client_id: str,
                 timeout: float = 120.0) -> float:
    done = threading.Event()
    seen = 0

    def on_message(client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        nonlocal seen
        client.ack(msg.mid, msg.qos)
        seen += 1
        if seen >= count:
            done.set()

    started = time.perf_counter()
    parts = urlsplit(url)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv5, manual_ack=True)
    client.on_message = on_message
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    client.connect(parts.hostname or "127.0.0.1", parts.port or 1883, clean_start=False,
                   properties=props)
    client.loop_start()
    try:
        if not done.wait(timeout):
            raise TimeoutError(f"raw MQTT consumer got {seen} of {count}")
        return time.perf_counter() - started
    finally:
        client.loop_stop()
        client.disconnect()
