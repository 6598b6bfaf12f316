"""The broker side of one MQTT client connection, as an :class:`~mqguard.adapter.Adapter`.

The guard settles deliveries through an adapter: it acknowledges them and sends
dead-letter and expiry copies. In the MQTT sidecar both go over the client's own upstream
connection (an acknowledgement is only valid on the connection that received the
PUBLISH): :class:`MqttLeg` turns them into commands of the native plane. ``ack`` never
waits; ``send`` waits for the broker's PUBACK and therefore runs on the sidecar's job
thread (``defer``), never on the loop, which reads that PUBACK.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from mqguard.adapter import Capabilities, Delivery, DeliveryCallback, SubscribeOptions
from mqguard.errors import AdapterError
from mqguard.jobthread import JobThread
from mqguard.message import ORIG_ADDRESS_HEADER, ORIG_DELIVERY_COUNT_HEADER, Message
from mqguard.mqtt_sidecar.messages import address_to_topic, dead_letter_topic, expiry_interval

if TYPE_CHECKING:
    from mqguard_native import MqttPlane

__all__ = ["PUBLISH_TIMEOUT_S", "DeliveryToken", "MqttLeg", "Publications", "capabilities_for"]

#: How long a copy's publish waits for the broker's PUBACK.
PUBLISH_TIMEOUT_S: Final = 30.0


def capabilities_for(level: int) -> Capabilities:
    """What an MQTT broker offers a client of protocol ``level`` (4: 3.1.1, 5: 5.0)."""
    v5 = level == 5
    return Capabilities(native_ttl=v5, persistent=True,
                        expiry_reaping="native-drop" if v5 else "none")


@dataclass(slots=True)
class DeliveryToken:
    """How a delivery is acknowledged upstream: its packet id and QoS on the connection."""

    packet_id: int
    qos: int
    #: The client acknowledged it: its own PUBACK (PUBREC) went upstream already.
    acked: bool = False


class Publications:
    """Publishes of the sidecar's own waiting for their PUBACK, by token (all connections)."""

    def __init__(self) -> None:
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, Future[int]] = {}

    def start(self) -> tuple[int, Future[int]]:
        future: Future[int] = Future()
        with self._lock:
            token = next(self._tokens)
            self._waiting[token] = future
        return token, future

    def forget(self, token: int) -> None:
        with self._lock:
            self._waiting.pop(token, None)

    def resolve(self, token: int, reason: int) -> None:
        with self._lock:
            future = self._waiting.pop(token, None)
        if future is not None and not future.done():
            future.set_result(reason)


class MqttLeg:
    """Adapter over one client connection's upstream leg (see the module docstring)."""

    name = "mqtt-sidecar"

    def __init__(self, plane: MqttPlane, conn: int, *, level: int, broker: str,
                 publications: Publications, jobs: JobThread) -> None:
        self._plane = plane
        self.conn = conn
        self.level = level
        self.broker = broker
        self._capabilities = capabilities_for(level)
        self._publications = publications
        self._jobs = jobs
        self._loop_thread = threading.get_ident()
        #: False once the client is gone: the broker redelivers what it did not get
        #: acknowledged to the client's next connection.
        self.alive = True

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def connect(self) -> None:
        """The connection is the client's: nothing to do."""

    def close(self) -> None:
        self.alive = False

    def topic_of(self, message: Message) -> str:
        """The topic a copy is published to. MQTT 3.1.1 has no user properties: a dead
        letter's original topic and delivery count go into its topic instead
        (``DLA/<count>/<original topic>``; ``mqguard dlq`` reads them back)."""
        topic = address_to_topic(message.address)
        original = message.headers.get(ORIG_ADDRESS_HEADER)
        if self.level != 5 and original:
            count = message.headers.get(ORIG_DELIVERY_COUNT_HEADER, "0")
            topic = dead_letter_topic(topic, count, address_to_topic(original))
        return topic

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        if transaction is not None:
            raise AdapterError("MQTT has no transactions")
        if self.on_delivery_thread():
            raise AdapterError("send() waits for the broker's PUBACK: not on the loop thread")
        token, future = self._publications.start()
        user = list(message.wire_headers().items()) if self.level == 5 else []
        expiry = expiry_interval(message.expiration) if self.level == 5 else None
        if not self._plane.publish(self.conn, token, self.topic_of(message), message.body,
                                   False, user, expiry):
            self._publications.forget(token)
            raise AdapterError("the connection to the broker has ended")
        try:
            reason = future.result(PUBLISH_TIMEOUT_S)
        except FutureTimeout:
            self._publications.forget(token)
            raise AdapterError("no PUBACK from the broker in time") from None
        if reason >= 0x80:
            raise AdapterError(f"the broker refused the publish (reason code 0x{reason:02x})")

    def send_many(self, messages: list[Message], *, transaction: str | None = None) -> None:
        for message in messages:
            self.send(message, transaction=transaction)

    def subscribe(self, address: str, callback: DeliveryCallback,
                  options: SubscribeOptions | None = None) -> str:
        raise AdapterError("the client's own connection subscribes")

    def unsubscribe(self, subscription_id: str) -> None:
        raise AdapterError("the client's own connection unsubscribes")

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        token = delivery.ack_token
        if not isinstance(token, DeliveryToken) or token.acked or token.qos == 0:
            return
        token.acked = True
        if not self._plane.ack(self.conn, token.packet_id, token.qos):
            raise AdapterError("the connection to the broker has ended")

    def can_settle(self, delivery: Delivery) -> bool:
        token = delivery.ack_token
        return self.alive and isinstance(token, DeliveryToken) and not token.acked

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """MQTT has no negative acknowledgement: the delivery stays unacknowledged and the
        broker hands it to the client's next connection."""

    def begin(self) -> str:
        raise AdapterError("MQTT has no transactions")

    def commit(self, transaction: str) -> None:
        raise AdapterError("MQTT has no transactions")

    def abort(self, transaction: str) -> None:
        raise AdapterError("MQTT has no transactions")

    def on_delivery_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def defer(self, job: Callable[[], None]) -> None:
        if not self._jobs.submit(job):
            raise AdapterError("the sidecar is stopping")
