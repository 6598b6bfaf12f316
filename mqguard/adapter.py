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
    #: How the expiry reaper finds messages that expired at rest (mqguard.reaper):
    #: ``selector`` (a selector subscription takes only expired messages: ActiveMQ),
    #: ``dead-letter`` (the broker's own TTL dead-letters them to a queue the reaper
    #: drains: RabbitMQ), ``native-drop`` (the broker drops them itself and tells no one:
    #: MQTT 5), ``none`` (no way: expired messages are caught at delivery only).
    expiry_reaping: str = "none"


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

    Calls may come from several threads. Delivery callbacks run inline on the
    adapter's *delivery thread* -- the library's network (receiver) thread --
    one at a time and in arrival order. That thread is also the one that reads
    the broker's confirmations (RECEIPT, PUBACK, SUBACK), so a method that waits
    for one (``send``, ``send_many``, ``subscribe``, ``begin``, ``commit``,
    ``abort``) cannot run there: called in a callback it raises
    :class:`~mqguard.errors.AdapterError` at once instead of deadlocking.
    ``ack`` and ``nack`` never wait and are fine in a callback; ``unsubscribe``
    and ``close`` work there without waiting for the broker.

    Work that has to wait goes through :meth:`defer`, which runs it on a
    dispatcher thread of the adapter's own, in submission order (the pipeline
    moves a message to a dead-letter address that way when
    :meth:`on_delivery_thread` is True). An application handler that sends must
    use another adapter (another connection), e.g. its own
    :class:`~mqguard.producer.GuardedProducer`.

    Adapters may offer a ``dispatch_thread=True`` option that runs every
    callback on the dispatcher thread instead (callbacks may then send and
    wait, and :meth:`on_delivery_thread` is False in them) at a large cost in
    consume throughput.
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
        return means the broker has it; raises AdapterError otherwise (at once, nothing
        sent, on the delivery thread)."""
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

    def can_settle(self, delivery: Delivery) -> bool:
        """True while ``delivery`` is unacknowledged on the current connection, so that an
        ack or nack of it would reach the broker. False after it was settled, for deliveries
        the broker settled itself (``auto``), and once the connection it came over was lost
        (the broker then redelivers it on its own). Never waits."""
        ...

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Negatively acknowledge. What the broker does with it is in :attr:`capabilities`."""
        ...

    def begin(self) -> str:
        """Start a transaction; returns its id. AdapterError when unsupported."""
        ...

    def commit(self, transaction: str) -> None: ...

    def abort(self, transaction: str) -> None: ...

    def on_delivery_thread(self) -> bool:
        """True when the current thread is the one that runs delivery callbacks inline
        (the network/receiver thread), where methods that wait for the broker raise
        AdapterError."""
        ...

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the adapter's dispatcher thread, after every job deferred
        before it. The job may call any method of the adapter, blocking ones included;
        deliveries go on meanwhile. An exception in the job is logged. AdapterError when
        the adapter cannot run jobs (not connected, closed)."""
        ...
