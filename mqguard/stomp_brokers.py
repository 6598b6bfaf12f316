"""What the STOMP brokers do: the facts the STOMP adapter and the sidecar both act on.

One place for every per-broker difference that crosses the wire: which broker is at the
other end (:func:`detect_broker`), what it can do (:data:`BROKER_CAPABILITIES`), which
headers it adds to a MESSAGE (:data:`BROKER_MESSAGE_HEADERS`), which SEND headers a client
may not set and how a message's delay, persistence and expiration are told to it
(:func:`send_headers`), how an mqguard address maps to a STOMP destination
(:func:`destination_of` / :func:`address_of`), and how it counts deliveries
(:func:`native_delivery_count`). ``mqguard.adapters.stomp`` (a client of its own) and
``mqguard.sidecar`` (a proxy for other clients) both import them from here, so the two
cannot disagree about a broker.

Brokers are named ``activemq`` (ActiveMQ Classic 5.x), ``rabbitmq`` (RabbitMQ 3.x with its
STOMP plugin), ``artemis`` (ActiveMQ Artemis 2.x) and ``unknown`` (anything else: only what
STOMP 1.2 itself guarantees).

Addresses
    A plain mqguard address ``orders.eu`` is the destination ``/queue/orders.eu``, and back;
    every other destination (``/topic/x``, RabbitMQ's ``/exchange/amq.topic/k``,
    ``/amq/queue/q`` and ``/temp-queue/t``) is its own address, unchanged, so it cannot
    collide with a queue's name in address settings. The mapping is the same for every
    broker.

What the brokers do (ActiveMQ 5.17.2 and RabbitMQ 3.10.8 verified by
``tests/adapters/test_stomp_adapter.py``; Artemis declared from its documentation and
source):

=====================  ===================================  =====================================
topic                  ActiveMQ Classic 5.17                RabbitMQ 3.10
=====================  ===================================  =====================================
CONNECTED ``server``   ``ActiveMQ/5.17.2``                  ``RabbitMQ/3.10.8``
``host`` header        ignored                              the vhost: stomp.py must be given
                                                            ``vhost`` (the adapter's default is
                                                            ``/``) or it sends the host name and
                                                            login fails
``message-id``         stable across redeliveries           a per-delivery id (it *is* the ack
                                                            id); a SEND carrying ``message-id``
                                                            gets an ERROR, so it is never sent
persistence            only with ``persistent:true``        ``persistent:true`` = delivery mode 2
native TTL             ``expires``: absolute epoch ms       ``expiration``: relative ms string;
                       (0 = never); an expired message is   negative is a *connection* error. An
                       never delivered (goes to             already expired message is sent with
                       ActiveMQ.DLQ). Sent only with        ``1``: it dies on the queue unless a
                       ``native_expiry=True``; by default   consumer is waiting at that very
                       ``MQGUARD_EXPIRES`` (selectable)     moment (the guard's own
                       lets the guard and its reaper        ``mqguard-expires`` check still
                       expire it                            catches that case)
NACK                   a *poison ack*: straight to          requeues at once (``requeue:true``,
                       ActiveMQ.DLQ, no redelivery          the default); ``requeue:false`` drops
                       (``Capabilities.nack_requeue``       or dead-letters
                       is False)
delivery count         none; ``redelivered:true`` on a      quorum queues only: ``x-delivery-count``
                       redelivery only                      is absent on the first delivery, then
                                                            1, 2... (= earlier deliveries, counting
                                                            both NACK-requeue and connection loss),
                                                            so ``native_delivery_count`` is that+1
ERROR frames           carry ``receipt-id``; most leave     never carry ``receipt-id``; some leave
                       the connection open                  the connection open (bad destination,
                                                            unknown transaction), channel errors
                                                            (PRECONDITION_FAILED) close it
transactions           in-tx SENDs are receipted at once    in-tx SENDs are receipted only at
                                                            COMMIT (after the COMMIT's own receipt)
selectors / browse     ``selector`` (JMS), ``browser:true``  not supported
                       (ends with a ``browser:end`` frame)
delayed delivery       ``AMQ_SCHEDULED_DELAY`` (relative    none over STOMP
                       ms; ``schedulerSupport="true"``)
prefetch               ``activemq.prefetchSize``            ``prefetch-count``
MESSAGE extras         ``expires``, ``priority``,           ``redelivered`` always; echoes the
                       ``timestamp``, ``persistent``        SEND's ``receipt``/``transaction``/
                                                            ``persistent``/``expiration``
=====================  ===================================  =====================================

Artemis announces itself as ``ActiveMQ-Artemis/2.40.0 ActiveMQ Artemis Messaging Engine`` and
takes an absolute ``expires``; the rest of its row in :data:`BROKER_CAPABILITIES` is declared
from its documentation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from mqguard.adapter import Capabilities
from mqguard.errors import AdapterError
from mqguard.message import Message, now_ms, parse_wire_int

__all__ = [
    "ACK_MODES",
    "BROKERS",
    "BROKER_CAPABILITIES",
    "BROKER_MESSAGE_HEADERS",
    "DEFAULT_PORTS",
    "DELIVERY_COUNT_HEADER",
    "PREFETCH_HEADERS",
    "QUEUE_PREFIX",
    "RESERVED_SEND_HEADERS",
    "RESERVED_SUBSCRIBE_HEADERS",
    "SELECTOR_EXPIRES_HEADER",
    "address_of",
    "capabilities_of",
    "destination_of",
    "detect_broker",
    "expired_selector",
    "is_quorum_queue",
    "native_delivery_count",
    "send_headers",
]

#: The broker names used throughout mqguard, ``unknown`` last.
BROKERS: Final = ("activemq", "rabbitmq", "artemis", "unknown")

#: Capabilities per broker. Artemis is from its documentation; ``unknown`` keeps to what
#: STOMP 1.2 itself guarantees.
BROKER_CAPABILITIES: Final[Mapping[str, Capabilities]] = {
    "activemq": Capabilities(
        transactions=True, nack_requeue=False, selectors=True, browse=True,
        native_delivery_count=False, delayed_delivery=True, native_ttl=True,
        stable_message_id=True, persistent=True, expiry_reaping="selector",
    ),
    "rabbitmq": Capabilities(
        transactions=True, nack_requeue=True, selectors=False, browse=False,
        native_delivery_count=True, delayed_delivery=False, native_ttl=True,
        stable_message_id=False, persistent=True, expiry_reaping="dead-letter",
    ),
    "artemis": Capabilities(
        transactions=True, nack_requeue=False, selectors=True, browse=False,
        native_delivery_count=False, delayed_delivery=False, native_ttl=True,
        stable_message_id=True, persistent=True,
    ),
    "unknown": Capabilities(transactions=True),
}

#: STOMP's acknowledgement modes of a SUBSCRIBE (every broker here knows all three).
ACK_MODES: Final = frozenset({"client-individual", "client", "auto"})

#: Port of a STOMP listener per URL scheme, when the URL names none.
DEFAULT_PORTS: Final[Mapping[str, int]] = {"stomp": 61613, "stomp+ssl": 61614}

#: SEND headers the adapter and the sidecar own: an application header of that name would
#: change the frame's meaning (routing, framing, receipts) or, for ``message-id``, make
#: RabbitMQ send an ERROR.
RESERVED_SEND_HEADERS: Final = frozenset(
    {"destination", "receipt", "transaction", "content-length", "message-id", "subscription",
     "ack", "id"}
)
#: SUBSCRIBE headers the adapter sets itself.
RESERVED_SUBSCRIBE_HEADERS: Final = frozenset({"destination", "id", "ack", "receipt"})

#: Headers the brokers put on MESSAGE frames (or echo from the SEND). They stay in
#: ``Delivery.raw_headers`` but are not application headers, so a send/receive round trip
#: returns exactly the application's headers. Consequently an application header named like
#: one of these (``priority``, ``persistent``...) is interpreted by the broker and does not
#: come back in ``Message.headers``.
BROKER_MESSAGE_HEADERS: Final = frozenset(
    {"destination", "subscription", "ack", "message-id", "content-length", "receipt",
     "transaction", "redelivered", "persistent", "expires", "expiration", "priority",
     "timestamp", "x-delivery-count", "browser",
     # ActiveMQ's scheduler: a message re-sent with its old scheduledJobId would be taken
     # for one already scheduled and delivered at once, ignoring the new delay.
     "AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT",
     "AMQ_SCHEDULED_CRON", "scheduledJobId", "MQGUARD_EXPIRES"}
)

#: ActiveMQ copy of ``mqguard-expires`` that JMS selectors can name (see :func:`send_headers`).
SELECTOR_EXPIRES_HEADER: Final = "MQGUARD_EXPIRES"

#: RabbitMQ's count of a message's earlier deliveries (quorum queues only).
DELIVERY_COUNT_HEADER: Final = "x-delivery-count"

#: SUBSCRIBE headers that carry the prefetch (unacknowledged messages in flight) per broker;
#: for ``unknown`` both are sent, each broker ignoring the other's.
PREFETCH_HEADERS: Final[Mapping[str, tuple[str, ...]]] = {
    "activemq": ("activemq.prefetchSize",),
    "rabbitmq": ("prefetch-count",),
    "artemis": (),
    "unknown": ("activemq.prefetchSize", "prefetch-count"),
}

#: The destination prefix a plain mqguard address gets (see :func:`destination_of`).
QUEUE_PREFIX: Final = "/queue/"
_QUEUE_PREFIX_LEN: Final = len(QUEUE_PREFIX)


# -- which broker ---------------------------------------------------------------------------


def detect_broker(server: str | None) -> str:
    """Broker name from the CONNECTED frame's ``server`` header (``name/version ...``).

    ``ActiveMQ/5.17.2`` is ``activemq``, ``RabbitMQ/3.10.8`` is ``rabbitmq``,
    ``ActiveMQ-Artemis/2.40.0 ActiveMQ Artemis Messaging Engine`` is ``artemis``;
    anything else, or no header (STOMP 1.0), is ``unknown``.
    """
    name = (server or "").split("/", 1)[0].strip().lower()
    if name == "activemq":
        return "activemq"
    if name == "rabbitmq":
        return "rabbitmq"
    if "artemis" in name:
        return "artemis"
    return "unknown"


def capabilities_of(broker: str) -> Capabilities:
    """:data:`BROKER_CAPABILITIES` of ``broker``; an unlisted name gets ``unknown``'s."""
    return BROKER_CAPABILITIES.get(broker, BROKER_CAPABILITIES["unknown"])


# -- addresses ------------------------------------------------------------------------------


def destination_of(address: str) -> str:
    """STOMP destination of an mqguard address: ``orders.eu`` -> ``/queue/orders.eu``; one
    that starts with ``/`` is used as is. AdapterError for an empty address."""
    if not address:
        raise AdapterError("empty address")
    return address if address.startswith("/") else f"{QUEUE_PREFIX}{address}"


def address_of(destination: str) -> str:
    """mqguard address of a STOMP destination: ``/queue/orders`` -> ``orders``.

    Other destinations (``/topic/...``, RabbitMQ's ``/exchange/...`` and ``/amq/queue/...``)
    keep their full name, so they cannot collide with queue names in address settings.
    """
    if destination.startswith(QUEUE_PREFIX):
        return destination[_QUEUE_PREFIX_LEN:]
    return destination


# -- sending --------------------------------------------------------------------------------

_HEADER_NAME_FORBIDDEN = re.compile(r"[:\r\n\\]")
#: Header names already checked by :func:`_check_header_name` (names repeat from message to
#: message; bounded so that a stream of distinct names cannot grow it without limit).
_VALID_HEADER_NAMES: set[str] = set()
_VALID_HEADER_NAMES_MAX: Final = 4096


def _check_header_name(key: object, address: str) -> None:
    """AdapterError unless ``key`` can be a SEND header name; remembers the good ones."""
    if not isinstance(key, str) or not key or _HEADER_NAME_FORBIDDEN.search(key):
        raise AdapterError(f"header name {key!r} of a message to {address!r} "
                           "cannot be sent over STOMP (empty, or contains ':', '\\' or a "
                           "line break)")
    if key in RESERVED_SEND_HEADERS:
        raise AdapterError(f"header {key!r} of a message to {address!r} is "
                           "reserved by STOMP/the adapter; rename it")
    if len(_VALID_HEADER_NAMES) < _VALID_HEADER_NAMES_MAX:
        _VALID_HEADER_NAMES.add(key)


def send_headers(message: Message, broker: str, *, persistent: bool,
                 native_expiry: bool = False) -> dict[str, str]:
    """SEND headers of ``message`` for ``broker``: its wire headers plus how that broker
    is told about delays, persistence and expiration. AdapterError for a header STOMP
    cannot carry, or a delay the broker cannot keep."""
    headers = message.wire_headers()
    for key, value in headers.items():
        if key not in _VALID_HEADER_NAMES:
            _check_header_name(key, message.address)
        if not isinstance(value, str):
            raise AdapterError(f"header {key!r} of a message to {message.address!r} is "
                               f"{type(value).__name__}, not str")
    if message.scheduled_delivery:
        if broker != "activemq":
            raise AdapterError(f"{broker} has no delayed delivery over STOMP: cannot hold "
                               f"a message to {message.address!r} back")
        # ActiveMQ's scheduler (schedulerSupport="true") takes a relative delay.
        headers["AMQ_SCHEDULED_DELAY"] = str(max(0, message.scheduled_delivery - now_ms()))
    if persistent:
        headers.setdefault("persistent", "true")
    if message.expiration:
        if broker == "activemq":
            # A selector-friendly copy (JMS identifiers cannot contain '-'): the reaper
            # selects expired messages with it, leaving every other message in place.
            headers[SELECTOR_EXPIRES_HEADER] = str(message.expiration)
            if native_expiry:
                # ActiveMQ then expires by itself, to ActiveMQ.DLQ, before the reaper
                # or a consumer sees the message: off unless asked for.
                headers["expires"] = str(message.expiration)
        elif broker == "artemis":
            headers["expires"] = str(message.expiration)
        elif broker == "rabbitmq":
            # Relative and >= 1: RabbitMQ closes the connection on a negative value.
            headers["expiration"] = str(max(1, message.expiration - now_ms()))
    return headers


def expired_selector(at_ms: int) -> str:
    """JMS selector of the messages that have expired by ``at_ms`` (ActiveMQ).

    ActiveMQ converts a string property to the type of the literal it is compared
    with: the literal must be a long (a small int literal would convert the 13-digit
    value to an int, fail, and match nothing).
    """
    return f"{SELECTOR_EXPIRES_HEADER} <= {max(int(at_ms), 1 << 32)}"


# -- receiving ------------------------------------------------------------------------------


def is_quorum_queue(subscribe_headers: Mapping[str, str]) -> bool:
    """A SUBSCRIBE with these headers declares a RabbitMQ quorum queue."""
    return subscribe_headers.get("x-queue-type") == "quorum"


def native_delivery_count(broker: str, headers: Mapping[str, str], *,
                          quorum: bool) -> int | None:
    """The broker's own count of this delivery (1 = first), from a MESSAGE's ``headers``,
    or None where the broker keeps none (ActiveMQ, Artemis over STOMP, RabbitMQ classic
    queues). ``quorum``: the subscription is to a RabbitMQ quorum queue."""
    raw = headers.get(DELIVERY_COUNT_HEADER)
    number = parse_wire_int(raw) if raw is not None else None
    if number is not None:
        # RabbitMQ counts the *earlier* deliveries: absent, then 1, 2...
        return number + 1
    if broker == "rabbitmq" and quorum:
        return 1  # a quorum queue omits the header on the first delivery
    return None
