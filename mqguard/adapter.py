"""The broker adapter protocol.

An adapter speaks one wire protocol (``mqguard.adapters.stomp``,
``mqguard.adapters.mqtt``) and moves :class:`~mqguard.message.Message` objects
to and from a broker. It knows nothing of plugins: the guard pipeline drives it.
Each adapter declares :class:`Capabilities` per broker so that plugins choose
their mechanism (say, how to redeliver later) from documented facts rather
than by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mqguard.message import Message


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker offers through an adapter. Plugins consult these flags."""

    #: BEGIN/COMMIT/ABORT with sends (and acks) inside a transaction.
    transactions: bool = False
    #: A negative acknowledgement puts the message back on the queue for redelivery
    #: (RabbitMQ). False where NACK means something else (ActiveMQ 5: poison ack
    #: straight to ActiveMQ.DLQ) or does not exist (MQTT).
    nack_requeue: bool = False
    #: Server-side message selectors on subscriptions (JMS selectors).
    selectors: bool = False
    #: Browsing a queue without consuming (``browser:true`` subscriptions).
    browse: bool = False
    #: The broker reports a delivery count itself (RabbitMQ quorum ``x-delivery-count``).
    native_delivery_count: bool = False
    #: The broker can hold a message back for a delay (ActiveMQ ``AMQ_SCHEDULED_DELAY``).
    delayed_delivery: bool = False
    #: The broker expires messages itself (ActiveMQ ``expires``, RabbitMQ ``expiration``,
    #: MQTT 5 Message Expiry Interval).
    native_ttl: bool = False
    #: The broker's ``message-id`` stays the same across redeliveries.
    stable_message_id: bool = False
    #: Messages survive a broker restart when sent persistent.
    persistent: bool = False


@dataclass(slots=True)
class Delivery:
    """One delivery of a message to a subscription, with what is needed to ack it."""

    message: Message
    subscription_id: str
    #: Opaque handle the adapter needs to ack/nack this delivery.
    ack_token: Any
    #: The broker says this is a redelivery (not reliable across brokers).
    redelivered: bool = False
    #: Delivery count as reported by the broker itself, when it has one.
    native_delivery_count: int | None = None
    #: Raw frame headers, for plugins that need broker-specific details.
    raw_headers: dict[str, str] = field(default_factory=dict)


DeliveryCallback = Callable[[Delivery], None]


@dataclass(frozen=True, slots=True)
class SubscribeOptions:
    """How to subscribe. ``ack`` is the acknowledgement mode."""

    #: ``client-individual`` (ack each message), ``client`` (cumulative) or ``auto``.
    ack: str = "client-individual"
    #: Unacknowledged messages the broker may push at once (STOMP prefetch / MQTT receive max).
    prefetch: int = 100
    #: Server-side selector, where the adapter supports it.
    selector: str | None = None
    #: Browse without consuming, where the adapter supports it.
    browse: bool = False
    #: Extra broker-specific SUBSCRIBE headers (e.g. RabbitMQ ``x-queue-type``).
    headers: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Adapter(Protocol):
    """What the guard needs from a broker connection.

    Calls may come from several threads. Delivery callbacks run on a delivery
    thread of the adapter's own (not the socket receiver thread), one at a time
    and in order, so a callback may itself send and wait for a receipt (the
    pipeline does, when it moves a message to a dead-letter address).
    """

    #: Registry name, e.g. ``stomp``.
    name: str
    #: Broker flavour detected at connect, e.g. ``activemq``, ``rabbitmq``, ``mosquitto``.
    broker: str

    @property
    def capabilities(self) -> Capabilities: ...

    def connect(self) -> None:
        """Connect (and log in); raise :class:`~mqguard.errors.AdapterError` on failure."""
        ...

    def close(self) -> None:
        """Disconnect cleanly, waiting for outstanding receipts. Safe to call twice."""
        ...

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        """Send one message. Returns once the broker confirmed it (receipt, PUBACK), so a
        return means the broker has it; raises AdapterError otherwise."""
        ...

    def send_many(self, messages: list[Message], *, transaction: str | None = None) -> None:
        """Send several messages pipelined (all frames, then all confirmations). Raises
        AdapterError when any is not confirmed; the outcome of the others is unknown."""
        ...

    def subscribe(self, address: str, callback: DeliveryCallback,
                  options: SubscribeOptions | None = None) -> str:
        """Start delivering ``address`` to ``callback``; returns the subscription id."""
        ...

    def unsubscribe(self, subscription_id: str) -> None: ...

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        """Acknowledge one delivery."""
        ...

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Negatively acknowledge. What the broker does with it is in :attr:`capabilities`."""
        ...

    def begin(self) -> str:
        """Start a transaction; returns its id. AdapterError when unsupported."""
        ...

    def commit(self, transaction: str) -> None: ...

    def abort(self, transaction: str) -> None: ...
