"""The demo's MQTT leg: devices and an application publish through the MQTT sidecar.

- A device (paho-mqtt, MQTT 3.1.1, QoS 1) cannot set headers; it publishes some
  readings twice, as a device does that resends its buffer after a reboot. The address
  takes its duplicate id from the content (``duplicate-id-from = "content"``).
- An application (paho-mqtt, MQTT 5) sends the rest with ``_AMQ_DUPL_ID``, some twice,
  and the short-lived ones with a Message Expiry Interval (MQTT 3.1.1 has no expiry).
- A subscriber (MQTT 5, persistent session, Receive Maximum 1 so that only the message
  in hand is unacknowledged) "crashes" on a poison message: its connection is reset
  through a fault proxy before it acknowledges, and it comes back on the same session.
  The sidecar counts each such delivery as failed and dead-letters the message after
  ``max-delivery-attempts``.

Dead letters and expired copies are counted straight from the broker (``DLQ/<topic>``,
``EXP/<topic>``), distinct by ``_AMQ_ORIG_MESSAGE_ID``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.demo.faultproxy import FaultProxy
from mqguard.demo.outcome import LegOutcome, wait_for
from mqguard.demo.plan import Kind, Planned
from mqguard.message import DUPLICATE_ID_HEADER, ORIG_MESSAGE_ID_HEADER
from mqguard.mqtt_sidecar.messages import address_to_topic

__all__ = ["MQTT_TTL_S", "DemoMqttLeg", "mqtt_host_port", "payload_of", "sent_by_device"]

#: Lifetime of the short-lived MQTT messages: the Message Expiry Interval counts seconds.
MQTT_TTL_S = 1
#: How long the subscriber's session outlives its connection (it comes back at once).
_SESSION_EXPIRY_S = 600
_CONNECT_TIMEOUT_S = 10.0

Report = Callable[[str], None]


def sent_by_device(item: Planned) -> bool:
    """Which messages the MQTT 3.1.1 device sends: half of the others, never a
    short-lived one (3.1.1 has no expiry); the MQTT 5 application sends the rest."""
    return item.kind is not Kind.SHORT_LIVED and item.index % 2 == 0


def payload_of(item: Planned) -> bytes:
    """What the subscriber reads: a device cannot set headers, so the body says it all."""
    return json.dumps({"reading": item.index, "poison": item.kind is Kind.POISON},
                      separators=(",", ":")).encode()


def mqtt_host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 1883


class _Client:
    """A paho client that waits for its CONNACK and queues what it receives.

    ``threaded=False``: the caller drives the network (:meth:`receive`), so a dropped
    connection stays dropped; paho's own thread would reconnect, and stopping that
    thread waits out its reconnect delay (a second) on every drop.
    """

    def __init__(self, client_id: str, port: int, *, host: str = "127.0.0.1",
                 v5: bool = True, clean: bool = True, keep_session: bool = False,
                 receive_maximum: int | None = None, threaded: bool = True) -> None:
        self.threaded = threaded
        self.inbox: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=MQTTProtocolVersion.MQTTv5 if v5
                                  else MQTTProtocolVersion.MQTTv311, manual_ack=True)
        connected = threading.Event()
        self.client.on_connect = lambda *args: connected.set()
        self.client.on_message = lambda client, userdata, message: self.inbox.put(message)
        properties = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = _SESSION_EXPIRY_S if keep_session else 0
            if receive_maximum is not None:
                properties.ReceiveMaximum = receive_maximum
            self.client.connect(host, port, clean_start=clean, properties=properties)
        else:
            self.client.connect(host, port)
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        if threaded:
            self.client.loop_start()
            connected.wait(_CONNECT_TIMEOUT_S)
        while not threaded and not connected.is_set() and time.monotonic() < deadline:
            self.client.loop(0.05)
        if not connected.is_set():
            self.abandon()
            raise RuntimeError(f"MQTT client {client_id} got no CONNACK")

    def receive(self, timeout: float) -> paho.MQTTMessage | None:
        """The next message (driving the network meanwhile), or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.inbox.empty() and time.monotonic() < deadline:
            self.client.loop(0.02)
        return None if self.inbox.empty() else self.inbox.get_nowait()

    def subscribe(self, *topics: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *args: done.set()
        self.client.subscribe([(topic, 1) for topic in topics])
        if not done.wait(_CONNECT_TIMEOUT_S):
            raise RuntimeError("no SUBACK")

    def close(self, *, end_session: bool = False) -> None:
        properties = None
        if end_session:
            properties = Properties(PacketTypes.DISCONNECT)
            properties.SessionExpiryInterval = 0
        self.client.disconnect(properties=properties)
        if self.threaded:
            self.client.loop_stop()
        else:
            self.client.loop(0.05)  # writes the DISCONNECT, if still queued

    def abandon(self) -> None:
        """After the connection was reset: stop the client without a goodbye."""
        if self.threaded:
            self.client.loop_stop()
        else:
            self.client.loop(0.05)  # paho reads the reset and closes its socket


class DemoMqttLeg:
    """One address through the MQTT sidecar (see the module docstring)."""

    def __init__(self, outcome: LegOutcome, broker: tuple[str, int], *, name: str,
                 report: Report, timeout: float) -> None:
        self.outcome = outcome
        self.broker = broker
        self.name = name
        self.report = report
        self.timeout = timeout
        self.topic = address_to_topic(outcome.address)
        #: Session drops (each a failed delivery of a poison message).
        self.crashes = 0
        self._tally: _Client | None = None
        self._originals: dict[str, set[str]] = {"DLQ": set(), "EXP": set()}
        self._lock = threading.Lock()

    # -- before the traffic --------------------------------------------------------------

    def prepare(self, sidecar_port: int) -> None:
        """The subscriber's session and subscription exist before anything is published
        (MQTT keeps messages only for subscriptions), and dead letters and expired copies
        are counted from the broker from the start."""
        subscriber = _Client(f"{self.name}-subscriber", sidecar_port, keep_session=True)
        subscriber.subscribe(self.topic)
        subscriber.close()
        self._tally = _Client(f"{self.name}-tally", self.broker[1], host=self.broker[0])
        self._tally.client.on_message = self._count_copy
        self._tally.subscribe(f"DLQ/{self.topic}", f"EXP/{self.topic}")

    def _count_copy(self, client: paho.Client, userdata: object,
                    message: paho.MQTTMessage) -> None:
        prefix = message.topic.partition("/")[0]
        props = getattr(message.properties, "UserProperty", None) or []
        original = dict(props).get(ORIG_MESSAGE_ID_HEADER)
        with self._lock:
            if original is not None and prefix in self._originals:
                self._originals[prefix].add(original)
        client.ack(message.mid, message.qos)

    # -- sending -------------------------------------------------------------------------

    def send(self, sidecar_port: int) -> float:
        """Publish the plan; the monotonic time by which every short-lived one expired."""
        planned = self.outcome.planned
        ordered = [*planned, *(p for p in planned if p.resent)]
        device = _Client(f"{self.name}-device", sidecar_port, v5=False)
        app = _Client(f"{self.name}-app", sidecar_port)
        infos = []
        try:
            for item in ordered:
                if sent_by_device(item):
                    infos.append(device.client.publish(self.topic, payload_of(item), qos=1))
                    continue
                properties = Properties(PacketTypes.PUBLISH)
                properties.UserProperty = [(DUPLICATE_ID_HEADER, item.duplicate_id)]
                if item.kind is Kind.SHORT_LIVED:
                    properties.MessageExpiryInterval = MQTT_TTL_S
                infos.append(app.client.publish(self.topic, payload_of(item), qos=1,
                                                properties=properties))
            deadline = time.monotonic() + self.timeout
            for info in infos:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
                if not info.is_published():
                    raise TimeoutError("the MQTT sidecar did not acknowledge every publish")
        finally:
            device.close()
            app.close()
        by_device = sum(1 for item in ordered if sent_by_device(item))
        self.report(f"{self.outcome.address}: {len(ordered)} publishes through the MQTT "
                    f"sidecar ({by_device} by an MQTT 3.1.1 device, content-based duplicate "
                    f"ids; {len(ordered) - len(planned)} of them duplicates)")
        return time.monotonic() + MQTT_TTL_S + 0.5

    # -- consuming -----------------------------------------------------------------------

    def consume(self, sidecar_port: int, connections: Callable[[], int]) -> None:
        """Handle every message; on a poison one, drop the session before acknowledging.

        ``connections``: the MQTT sidecar's open connections. After a drop the subscriber
        waits until the sidecar has settled the old connection (counted the failure,
        perhaps dead-lettered the message over it) before it takes its session back.
        """
        outcome = self.outcome
        deadline = time.monotonic() + self.timeout
        with FaultProxy("127.0.0.1", sidecar_port) as proxy:
            while not self._settled():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {outcome.progress()}")
                subscriber = _Client(f"{self.name}-subscriber", proxy.port, clean=False,
                                     keep_session=True, receive_maximum=1, threaded=False)
                crashed = False
                while not crashed and time.monotonic() < deadline:
                    message = subscriber.receive(0.2)
                    if message is None:
                        if self._settled():
                            break
                        continue
                    body = json.loads(message.payload)
                    outcome.handled[int(body["reading"])] += 1
                    if body["poison"]:
                        proxy.cut()  # the handler crashed the process: no PUBACK
                        crashed = True
                    else:
                        subscriber.client.ack(message.mid, message.qos)
                if not crashed:
                    subscriber.close(end_session=True)
                    if not self._settled():
                        raise TimeoutError(f"timed out waiting for {outcome.progress()}")
                    break
                subscriber.abandon()
                self.crashes += 1
                wait_for(lambda: connections() == 0, self.timeout,
                         "the MQTT sidecar to settle a dropped session")
        if self._tally is not None:
            self._tally.close()
        self.report(f"{outcome.address}: the subscriber dropped its session {self.crashes} "
                    "times while holding a poison message")

    def _settled(self) -> bool:
        with self._lock:
            self.outcome.dead_letters = len(self._originals["DLQ"])
            self.outcome.expired_copies = len(self._originals["EXP"])
        return self.outcome.complete()
