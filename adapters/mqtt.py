"""MQTT adapter on paho-mqtt 2 (``CallbackAPIVersion.VERSION2``), MQTT 5 by default.

URL: ``mqtt://[user:pass@]host[:port]`` (1883 by default) or ``mqtts://`` (8883). Credentials
come from the URL or the ``username``/``password`` options; they are never logged or put in
an exception message.

Addresses
    ``orders.eu`` is the topic ``orders/eu`` and back ('.' <-> '/'). MQTT wildcards pass
    through for subscriptions (``orders.+`` -> ``orders/+``). A delivery's address is the
    topic the message was *published* to, mapped back (for a non-wildcard subscription that is
    the subscribed address). A topic level containing '.' cannot be addressed.

Delivery guarantees
    Everything is QoS 1. ``send()`` returns once the PUBACK arrived and raises AdapterError
    when it does not come within ``publish_timeout`` or carries a failure reason code (MQTT 5;
    "no matching subscribers", 0x10, is a success). A timeout means the outcome is unknown:
    paho keeps the message queued and may still deliver it (at least once, never silently
    lost). While the client is disconnected ``send()`` raises at once.

    Consumers use ``manual_ack=True`` and ``clean_start=False`` with a session expiry (default
    3600 s) and a stable ``client_id``: unacknowledged messages survive a reconnect, and the
    broker resends them (DUP set, so ``Delivery.redelivered`` is True) to the next connection
    with the same client id. Messages the broker pushes before the application has
    re-subscribed (a resumed session delivers at once) are held, up to ``orphan_limit``, and
    handed to the first matching ``subscribe()``; they are never acked unseen.

    Mosquitto's default ``max_queued_messages 1000`` *silently drops* QoS 1 messages for a
    subscriber more than 1000 messages behind (offline, or slower than its producers; the log
    says "Outgoing messages are being dropped for client ..."). A guarded deployment must raise
    it (``mqguard.servers`` uses 1000000); no client setting can compensate.

    ``nack()`` cannot give a message back: MQTT has no negative acknowledgement
    (``capabilities.nack_requeue`` is False). It only leaves the message unacknowledged: the
    broker redelivers it after the *next reconnect* of the same session, and until then it
    occupies one slot of the broker's in-flight window (Receive Maximum).

Headers
    MQTT 5: the application's headers and the guard's own (``Message.wire_headers()``) travel as
    user properties. On receipt every read is bounded: at most ``max_user_properties``
    properties of at most ``max_property_bytes`` bytes each; malformed, oversized or duplicate
    ones are skipped (first value wins), logged, and summarised in
    ``Delivery.raw_headers["mqguard-property-errors"]`` -- a message is never lost for them.
    On sending, header names, values and topics with control characters (a newline, say) or
    Unicode non-characters are refused with AdapterError: Mosquitto 2.0 answers them by
    dropping the connection ("Malformed UTF-8"), after which paho would resend the same PUBLISH
    on every reconnect.

    MQTT 3.1.1 (``protocol="3.1.1"``, the only MQTT that ActiveMQ 5.17 and RabbitMQ 3.10 speak)
    has no properties, so headers cannot be carried. Rather than invent an envelope that other
    MQTT clients would not understand, the adapter *refuses* (AdapterError) any message whose
    wire headers are not empty -- including the guard's ``mqguard-id`` and ``mqguard-expires``.
    Header-less messages pass. One exception: the guard's own dead-letter and expiry copies
    (``Guard.move``: ``_AMQ_ORIG_ADDRESS`` and ``mqguard-move-reason``) go, as the MQTT
    sidecar publishes them, to ``<dead-letter topic>/<delivery count>/<original topic>``
    with the payload only, which ``mqguard dlq`` reads back (docs/dlq.md); refusing them
    would leave a poison message unacknowledged for good.

Expiry
    ``Message.expiration`` becomes the MQTT 5 Message Expiry Interval in whole seconds, rounded
    up. An already expired message is sent with the minimum interval, 1 s: a broker drops it
    unless a subscriber is connected within that second (the guard's ``mqguard-expires`` check
    covers that case). Mosquitto 2.0 drops expired messages silently (no expiry topic, no
    count).

Broker identity
    MQTT has no server identification, so ``broker`` is whatever the ``broker=`` option says
    (default ``"mqtt"``; pass ``"mosquitto"``, ``"activemq"``, ``"rabbitmq"`` as appropriate).
    Capabilities: ``native_ttl`` (MQTT 5 only) and ``persistent``; no transactions
    (``begin()`` raises), no NACK requeue, no selectors, no browsing, no stable message id.

Threads
    Callbacks run inline on paho's network thread (the *delivery thread*: one at a time, in
    arrival order): handing each one to another thread cost a large share of the consume
    throughput. That thread is also the only one that reads PUBACKs and SUBACKs, so nothing
    that waits for one can run in a callback: ``send``, ``send_many`` and ``subscribe`` called
    there raise AdapterError at once (:meth:`MqttAdapter.on_delivery_thread` tells). ``ack``
    and ``nack`` are fine there; ``unsubscribe`` and ``close`` work without waiting. Work that
    must wait goes through :meth:`MqttAdapter.defer`, which runs it on the adapter's dispatcher
    thread in submission order (the guard moves messages to dead-letter addresses that way),
    or through another adapter (another connection): a handler that sends must use its own
    producer. An exception in a callback is logged and the message stays unacknowledged.
    Messages held for a later ``subscribe()`` are delivered on the dispatcher thread (see
    :meth:`MqttAdapter.subscribe`).

    A callback also holds up the network loop: PUBACKs, acks and keep-alive PINGREQs wait until
    it returns, and one that runs longer than about 1.5x ``keepalive`` (45 s by default) makes
    the broker drop the connection; paho reconnects and the session's unacknowledged messages
    come again. ``dispatch_thread=True`` restores the old behaviour (every callback on the
    dispatcher thread, which may send and wait) at the cost of throughput. paho reconnects by
    itself (with ``reconnect_min_delay``..``reconnect_max_delay`` backoff) and, when the broker
    lost the session, the adapter re-subscribes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from mqguard.adapter import Capabilities, Delivery, DeliveryCallback, SubscribeOptions
from mqguard.errors import AdapterError
from mqguard.jobthread import JobThread
from mqguard.message import (
    MOVE_REASON_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    Message,
    now_ms,
)
from mqguard.mqtt_sidecar.messages import dead_letter_topic
from mqguard.redact import redact_url, split_server_url

__all__ = ["MqttAdapter", "address_to_topic", "check_mqtt_string", "read_user_properties",
           "topic_to_address"]

log = logging.getLogger("mqguard.adapters.mqtt")

DEFAULT_PORTS: Final = {"mqtt": 1883, "mqtts": 8883}
PROTOCOLS: Final = {
    "5": MQTTProtocolVersion.MQTTv5,
    "5.0": MQTTProtocolVersion.MQTTv5,
    "3.1.1": MQTTProtocolVersion.MQTTv311,
    "311": MQTTProtocolVersion.MQTTv311,
}
#: Key of ``Delivery.raw_headers`` summarising skipped user properties.
PROPERTY_ERRORS_KEY: Final = "mqguard-property-errors"
#: Longest MQTT 5 property value (a two-byte length prefix).
MAX_MQTT_STRING: Final = 65535
#: Topics whose matching subscription is remembered (see MqttAdapter._match).
MAX_CACHED_ROUTES: Final = 10_000
#: Addresses whose checked publish topic is remembered (see MqttAdapter._publish_topic).
MAX_REMEMBERED_TOPICS: Final = 1024
#: Why a method that waits for the broker refuses to run on the delivery (network) thread.
ON_DELIVERY_THREAD: Final = (
    "cannot wait for the broker's confirmation on the delivery thread; use a separate "
    "connection for sending from a handler, or adapter.defer()")


#: What Mosquitto (``mosquitto_validate_utf8``) and the MQTT 5 spec's SHOULD NOTs refuse in a
#: UTF-8 string: control characters and Unicode non-characters. A broker that meets one
#: disconnects the client ("Malformed UTF-8"), and paho would then resend the same PUBLISH after
#: every reconnect -- so such strings are refused before publishing.
_FORBIDDEN_MQTT_CHARS: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\ufdd0-\ufdef\ufffe\uffff\ud800-\udfff]"
    "|[\U0001fffe\U0001ffff\U0002fffe\U0002ffff\U0003fffe\U0003ffff\U0004fffe\U0004ffff"
    "\U0005fffe\U0005ffff\U0006fffe\U0006ffff\U0007fffe\U0007ffff\U0008fffe\U0008ffff"
    "\U0009fffe\U0009ffff\U000afffe\U000affff\U000bfffe\U000bffff\U000cfffe\U000cffff"
    "\U000dfffe\U000dffff\U000efffe\U000effff\U000ffffe\U000fffff\U0010fffe\U0010ffff]"
)


def check_mqtt_string(text: str, what: str) -> None:
    """AdapterError if ``text`` cannot be an MQTT UTF-8 string (see ``_FORBIDDEN_MQTT_CHARS``)."""
    bad = _FORBIDDEN_MQTT_CHARS.search(text)
    if bad is not None:
        raise AdapterError(f"{what} contains {bad.group()!r} (U+{ord(bad.group()):04X}), which "
                           "MQTT brokers refuse in strings (control or non-character)")
    if len(text.encode("utf-8")) > MAX_MQTT_STRING:
        raise AdapterError(f"{what} exceeds MQTT's {MAX_MQTT_STRING}-byte string limit")


def address_to_topic(address: str) -> str:
    """``orders.eu`` -> ``orders/eu``."""
    if not address:
        raise AdapterError("empty address")
    return address.replace(".", "/")


def topic_to_address(topic: str) -> str:
    """``orders/eu`` -> ``orders.eu``."""
    return topic.replace("/", ".")


def read_user_properties(
    properties: Any, *, max_count: int, max_bytes: int
) -> tuple[dict[str, str], list[str]]:
    """User properties of a received PUBLISH as headers, with what was skipped and why.

    Never raises: anything unexpected is skipped and reported instead.
    """
    headers: dict[str, str] = {}
    problems: list[str] = []
    pairs = getattr(properties, "UserProperty", None) if properties is not None else None
    if pairs is None:
        return headers, problems
    if not isinstance(pairs, list | tuple):
        return headers, [f"user properties of unexpected type {type(pairs).__name__} ignored"]
    if len(pairs) > max_count:
        problems.append(f"{len(pairs) - max_count} user properties beyond the limit of "
                        f"{max_count} ignored")
        pairs = pairs[:max_count]
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, tuple) and len(pair) == 2
                and isinstance(pair[0], str) and isinstance(pair[1], str)):
            problems.append(f"malformed user property #{index} ignored")
            continue
        key, value = pair
        # The wire format caps each string at MAX_MQTT_STRING bytes: check only a lower limit.
        if max_bytes < MAX_MQTT_STRING and (
                len(key.encode("utf-8", "replace")) > max_bytes
                or len(value.encode("utf-8", "replace")) > max_bytes):
            problems.append(f"user property {key[:40]!r} longer than {max_bytes} bytes ignored")
            continue
        if key in headers:
            problems.append(f"duplicate user property {key[:40]!r}: first value kept")
            continue
        headers[key] = value
    return headers, problems


def _vbi(value: int) -> bytes:
    """An MQTT Variable Byte Integer."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


class _PackedProperties:
    """PUBLISH properties (user properties, message expiry) encoded once, by the adapter.

    paho's ``Properties`` costs ~30 us to build and pack for a guarded message's five or
    so user properties; paho only ever calls ``pack()`` on what it is given to publish
    (again on a resend after a reconnect) and formats it for its debug log, so this
    stand-in gives it the bytes. ``invalid`` is True when a string is not acceptable to
    MQTT (control characters, non-characters, longer than 65535 bytes).
    """

    __slots__ = ("MessageExpiryInterval", "UserProperty", "_packed", "invalid")

    def __init__(self, headers: dict[str, str], expiry: int | None) -> None:
        self.UserProperty = list(headers.items())
        self.MessageExpiryInterval = expiry
        self.invalid = _FORBIDDEN_MQTT_CHARS.search("".join(headers) +
                                                    "".join(headers.values())) is not None
        parts: list[bytes] = []
        for key, value in self.UserProperty:
            k, v = key.encode("utf-8"), value.encode("utf-8")
            if len(k) > MAX_MQTT_STRING or len(v) > MAX_MQTT_STRING:
                self.invalid = True
                break
            parts.append(b"\x26%b%b%b%b" % (len(k).to_bytes(2, "big"), k,
                                             len(v).to_bytes(2, "big"), v))
        if expiry is not None:
            parts.append(b"\x02" + expiry.to_bytes(4, "big"))
        body = b"".join(parts)
        self._packed = _vbi(len(body)) + body

    def pack(self) -> bytes:
        return self._packed

    def __str__(self) -> str:
        return (f"[UserProperty : {self.UserProperty}, "
                f"MessageExpiryInterval : {self.MessageExpiryInterval}]")


class _Properties:
    """The PUBLISH properties the adapter reads, as paho's ``Properties`` names them."""

    __slots__ = ("MessageExpiryInterval", "PayloadFormatIndicator", "UserProperty")

    def __init__(self) -> None:
        self.UserProperty: list[tuple[str, str]] | None = None
        self.MessageExpiryInterval: int | None = None
        self.PayloadFormatIndicator: int | None = None


class _Publish:
    """A received PUBLISH with the attributes of ``paho.MQTTMessage`` that the adapter reads.

    paho builds an ``MQTTMessage`` (with a ``threading.Condition`` inside) and a
    ``Properties`` object (a dict of every property type, strings checked character by
    character in Python) per PUBLISH: most of a receive's cost before the guard runs.
    """

    __slots__ = ("_topic", "dup", "mid", "payload", "properties", "qos", "retain")

    def __init__(self, topic: bytes, mid: int, qos: int, dup: bool, retain: bool,
                 properties: _Properties, payload: bytes) -> None:
        self._topic = topic
        self.mid = mid
        self.qos = qos
        self.dup = dup
        self.retain = retain
        self.properties = properties
        self.payload = payload

    @property
    def topic(self) -> str:
        """The topic as text; UnicodeDecodeError when it is not UTF-8 (as paho's)."""
        return self._topic.decode("utf-8")


def _read_string(packet: bytes | bytearray, pos: int, end: int) -> tuple[str, int] | None:
    length = (packet[pos] << 8) | packet[pos + 1]
    start = pos + 2
    stop = start + length
    if stop > end:
        return None
    text = packet[start:stop].decode("utf-8")  # strict: encoded surrogates raise
    if "\x00" in text or "\ufeff" in text:
        return None  # paho refuses these (MQTT-1.5.4-2/3): let it say so
    return text, stop


def decode_publish_v5(header: int, packet: bytes | bytearray) -> _Publish | None:
    """Decode an MQTT 5 QoS 0/1 PUBLISH whose properties are among the common ones.

    Handles Payload Format Indicator, Message Expiry Interval and User Properties (what
    guarded producers send). Returns None for anything else -- other properties, a repeated
    single-valued one, a malformed or truncated packet, text paho would refuse -- and the
    caller then lets paho decode it, so paho's own checks and errors apply unchanged.
    """
    try:
        qos = (header & 0x06) >> 1
        if qos > 1:
            return None
        size = len(packet)
        pos = 2 + ((packet[0] << 8) | packet[1])
        topic = bytes(packet[2:pos])
        mid = 0
        if qos:
            mid = (packet[pos] << 8) | packet[pos + 1]
            pos += 2
        # Property Length: a Variable Byte Integer (at most 4 bytes).
        length = 0
        for shift in (0, 7, 14, 21):
            byte = packet[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
        else:
            return None
        end = pos + length
        if end > size or pos > size:
            return None
        properties = _Properties()
        while pos < end:
            ident = packet[pos]
            pos += 1
            if ident == 0x26:  # User Property: a UTF-8 string pair, may repeat
                key = _read_string(packet, pos, end)
                if key is None:
                    return None
                value = _read_string(packet, key[1], end)
                if value is None:
                    return None
                pos = value[1]
                if properties.UserProperty is None:
                    properties.UserProperty = []
                properties.UserProperty.append((key[0], value[0]))
            elif ident == 0x02 and properties.MessageExpiryInterval is None:
                if pos + 4 > end:
                    return None
                properties.MessageExpiryInterval = int.from_bytes(packet[pos:pos + 4], "big")
                pos += 4
            elif ident == 0x01 and properties.PayloadFormatIndicator is None:
                properties.PayloadFormatIndicator = packet[pos]
                pos += 1
            else:
                return None
        if pos != end:
            return None
        return _Publish(topic, mid, qos, bool(header & 0x08), bool(header & 0x01),
                        properties, bytes(packet[end:]))
    except (IndexError, UnicodeDecodeError):
        return None


_PUBACK: Final = 0x40
_PUBLISH: Final = 0x30


class _Client(paho.Client):
    """paho's client with a lean PUBLISH decoder for MQTT 5 (see :func:`decode_publish_v5`).

    Only ``_handle_publish`` differs, and only for QoS 0/1 MQTT 5 packets that the lean
    decoder takes: the callback is then called through paho's own ``_handle_on_message``
    (its locks and filtered callbacks) with a :class:`_Publish`, and a QoS 1 message is
    acknowledged by paho unless ``manual_ack`` (as paho does). ``_packet_queue`` skips the
    wake-up of paho's loop for PUBACKs queued on the loop's own thread, and for the
    PUBLISHes of a batch after its first (see :meth:`publish_batch`). Everything else is
    paho's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Batches being queued by :meth:`publish_batch` (any thread), and whether the
        #: network thread was woken since the first of them began.
        self._batch_lock = threading.Lock()
        self._batches = 0
        self._batch_woken = False

    @contextlib.contextmanager
    def publish_batch(self) -> Iterator[None]:
        """Queue several PUBLISHes with two wake-ups of the network thread, not one each.

        paho writes a byte to its wake-up socket pair per publish from another thread: a
        system call, and a wake-up of the network thread (select, recv, write), per
        message. Inside this block only the first PUBLISH wakes it (so the broker gets
        to work at once), and the block's end wakes it again: every packet queued in the
        block is followed by a wake-up, and once awake the network thread writes whatever
        is queued, so none waits longer than the batch takes to queue.
        """
        with self._batch_lock:
            self._batches += 1
        try:
            yield
        finally:
            with self._batch_lock:
                self._batches -= 1
                if not self._batches:
                    self._batch_woken = False
            self._wake_network_thread()

    def _wake_network_thread(self) -> None:
        if self._sockpairW is not None:
            with contextlib.suppress(BlockingIOError):
                self._sockpairW.send(b"0")

    def _handle_publish(self) -> MQTTErrorCode:
        if self._protocol == paho.MQTTv5:
            in_packet = self._in_packet
            message = decode_publish_v5(in_packet["command"], in_packet["packet"])
            if message is not None:
                if self.on_log is not None or self._logger is not None:
                    self._easy_log(paho.MQTT_LOG_DEBUG,
                                   "Received PUBLISH (d%d, q%d, r%d, m%d), %r, ...  (%d bytes)",
                                   message.dup, message.qos, message.retain, message.mid,
                                   message._topic, len(message.payload))
                self._handle_on_message(message)  # type: ignore[arg-type]
                if message.qos == 1 and not self._manual_ack:
                    return self._send_puback(message.mid)
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        return super()._handle_publish()

    def _packet_queue(self, command: int, packet: bytes | bytearray, mid: int, qos: int,
                      info: paho.MQTTMessageInfo | None = None) -> MQTTErrorCode:
        # A PUBACK queued on the network thread itself (an ack from a delivery callback)
        # needs no wake-up byte through paho's socket pair: that thread is not in select(),
        # and its next turn sees the queued packet (want_write) and writes it. Saves two
        # system calls per acknowledged message; everything else is paho's.
        kind = command & 0xF0
        quiet = (kind == _PUBACK and self._on_socket_register_write is None
                 and self._thread is threading.current_thread())
        if (not quiet and kind == _PUBLISH and self._batches
                and self._on_socket_register_write is None and self._thread is not None):
            # Inside publish_batch: the first PUBLISH wakes the network thread, the
            # batch's end wakes it again; the ones in between need not.
            quiet, self._batch_woken = self._batch_woken, True
        if quiet:
            self._out_packet.append({"command": command, "mid": mid, "qos": qos, "pos": 0,
                                     "to_process": len(packet), "packet": packet,
                                     "info": info})
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return super()._packet_queue(command, packet, mid, qos, info)


@dataclass(slots=True)
class _Subscription:
    id: str
    address: str
    topic: str
    callback: DeliveryCallback
    auto_ack: bool


class MqttAdapter:
    """mqguard :class:`~mqguard.adapter.Adapter` speaking MQTT (see the module docstring).

    Options (keyword-only; the registry passes them as ``MqttAdapter(url, **options)``):

    ``client_id``
        Stable client id: give one to consumers so a reconnect resumes their session (and
        their unacked messages). Default: a random ``mqguard-<hex>`` (stable for this object).
    ``protocol``
        ``"5"`` (default) or ``"3.1.1"`` (no headers, no expiry: see the module docstring).
    ``clean_start``
        Default False (resume the session).
    ``session_expiry``
        MQTT 5 Session Expiry Interval in seconds (default 3600); 0 ends the session at
        disconnect.
    ``receive_maximum``
        MQTT 5 Receive Maximum: in-flight QoS 1 messages the broker may push unacked (the
        connection-wide prefetch; ``SubscribeOptions.prefetch`` cannot be per subscription
        in MQTT and is ignored). Default: the broker's.
    ``username``, ``password``
        Override the URL's credentials.
    ``broker``
        The broker flavour to report (default ``"mqtt"``; MQTT cannot tell).
    ``keepalive``, ``connect_timeout``, ``publish_timeout``
        Seconds (30, 10, 10).
    ``max_inflight``
        Our own unacknowledged publishes in flight (default 100; paho's default 20 caps a
        pipelined ``send_many`` at 20 per round trip).
    ``reconnect_min_delay``, ``reconnect_max_delay``
        paho's automatic reconnection backoff, seconds (1 and 10).
    ``max_user_properties``, ``max_property_bytes``, ``orphan_limit``
        Bounds on what is read from the broker (256 properties, 65535 bytes each, 1000 held
        messages).
    ``dispatch_thread``
        False (default): delivery callbacks run inline on paho's network thread, and whatever
        waits for the broker must go through :meth:`defer` (see "Threads" in the module
        docstring). True: the old behaviour -- every callback is handed to the adapter's own
        dispatcher thread, so callbacks may send and wait, at a large cost in consume
        throughput.
    ``tls_ca_certs``, ``tls_certfile``, ``tls_keyfile``, ``tls_verify``
        TLS settings for ``mqtts://``.
    """

    name = "mqtt"

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        protocol: str = "5",
        clean_start: bool = False,
        session_expiry: int = 3600,
        receive_maximum: int | None = None,
        username: str | None = None,
        password: str | None = None,
        broker: str = "mqtt",
        keepalive: int = 30,
        connect_timeout: float = 10.0,
        publish_timeout: float = 10.0,
        max_inflight: int = 100,
        reconnect_min_delay: int = 1,
        reconnect_max_delay: int = 10,
        max_user_properties: int = 256,
        max_property_bytes: int = MAX_MQTT_STRING,
        orphan_limit: int = 1000,
        dispatch_thread: bool = False,
        tls_ca_certs: str | None = None,
        tls_certfile: str | None = None,
        tls_keyfile: str | None = None,
        tls_verify: bool = True,
    ) -> None:
        safe = redact_url(url)
        try:
            parts, host, port = split_server_url(url, DEFAULT_PORTS, what="MQTT URL")
        except ValueError as exc:
            raise AdapterError(str(exc)) from None
        if parts.query:
            raise AdapterError(f"MQTT URL {safe!r}: query parameters are not read; pass options")
        if protocol not in PROTOCOLS:
            raise AdapterError(f"MQTT protocol {protocol!r} is not one of "
                               f"{', '.join(sorted(PROTOCOLS))}")
        if connect_timeout <= 0 or publish_timeout <= 0:
            raise AdapterError("connect_timeout and publish_timeout must be positive")
        self.url = safe
        self.where = f"MQTT broker at {host}:{port}"
        self._host = host
        self._port = port
        self._tls = parts.scheme == "mqtts"
        self._username = username if username is not None else (
            unquote(parts.username) if parts.username else None)
        self._password = password if password is not None else (
            unquote(parts.password) if parts.password is not None else None)
        self._protocol = PROTOCOLS[protocol]
        self._v5 = self._protocol == MQTTProtocolVersion.MQTTv5
        self._capabilities: Capabilities | None = None
        self.client_id = client_id or f"mqguard-{os.urandom(6).hex()}"
        self._clean_start = clean_start
        self._session_expiry = max(0, int(session_expiry))
        self._receive_maximum = receive_maximum
        self._keepalive = keepalive
        self._connect_timeout = connect_timeout
        self._publish_timeout = publish_timeout
        self._max_inflight = max(1, int(max_inflight))
        self._reconnect_delays = (max(1, int(reconnect_min_delay)),
                                  max(1, int(reconnect_max_delay), int(reconnect_min_delay)))
        self._max_user_properties = max(0, int(max_user_properties))
        self._max_property_bytes = max(1, int(max_property_bytes))
        self._orphan_limit = max(0, int(orphan_limit))
        self._tls_files = (tls_ca_certs, tls_certfile, tls_keyfile)
        self._tls_verify = tls_verify
        self._dispatch_thread = bool(dispatch_thread)

        #: Broker flavour as configured (MQTT has no server identification).
        self.broker = broker
        #: Whether the broker resumed a session at the last CONNACK.
        self.session_present = False

        self._lock = threading.RLock()
        # address -> its topic, checked (dict reads and writes are atomic: no lock).
        self._publish_topics: dict[str, str] = {}
        self._dispatcher = JobThread("mqguard-mqtt-dispatcher")
        #: paho's network thread of the current client (set by its CONNACK).
        self._network_thread: threading.Thread | None = None
        #: Deliveries handed to the dispatcher and not finished yet: while there are any, later
        #: ones follow them there, so that arrival order is kept (see subscribe()).
        self._queued = 0
        #: UNSUBSCRIBEs sent from a delivery callback, whose UNSUBACK nobody waits for.
        self._unawaited: set[int] = set()
        self._client: paho.Client | None = None
        self._state = "new"  # new | connected | disconnected | closed
        #: CONNACKs seen; stamped into ack tokens so a delivery from an earlier connection
        #: is known to be void (see can_settle).
        self._connects = 0
        #: topic -> subscription (or None) answers of _match; cleared when _subs changes.
        self._routes: dict[str, _Subscription | None] = {}
        self._connack = threading.Event()
        self._connack_error: str | None = None
        self._subs: dict[str, _Subscription] = {}
        self._orphans: deque[paho.MQTTMessage] = deque()
        self._acks = threading.Condition(self._lock)
        self._suback: dict[int, list[ReasonCode]] = {}
        self._publish_failures: dict[int, str] = {}
        self._abandoned: set[int] = set()
        self._ids = itertools.count(1)

    # -- introspection --------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        # Fixed by the protocol version; read once per delivery, so built once.
        caps = self._capabilities
        if caps is None:
            caps = self._capabilities = Capabilities(
                native_ttl=self._v5, persistent=True,
                expiry_reaping="native-drop" if self._v5 else "none")
        return caps

    @property
    def connected(self) -> bool:
        client = self._client
        return self._state == "connected" and client is not None and client.is_connected()

    # -- threads --------------------------------------------------------------------------------

    def on_delivery_thread(self) -> bool:
        """True on paho's network thread, where delivery callbacks run inline.

        Nothing that waits for the broker (PUBACK, SUBACK) can run there (only that thread
        reads it): such methods raise AdapterError at once; use :meth:`defer` or another
        adapter. With ``dispatch_thread=True`` callbacks run on the dispatcher thread instead,
        where this is False (and so are the deliveries of messages held for a subscription:
        see :meth:`subscribe`).
        """
        return threading.current_thread() is self._network_thread

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the adapter's dispatcher thread, after every job deferred before it.

        For work that waits for the broker (a send) and therefore cannot run in a delivery
        callback. The job may call any method of the adapter; the network thread goes on
        delivering meanwhile, so it may run after later deliveries. An exception in the job is
        logged. :meth:`close` (from any other thread) first lets the jobs queued so far
        finish, bounded by ``publish_timeout``. Raises AdapterError when the adapter is not
        connected (before :meth:`connect`, after :meth:`close`).
        """
        if not self._dispatcher.submit(job):
            raise AdapterError(f"cannot defer a job on {self.where}: the adapter is not "
                               "connected (connect() first; a closed adapter runs nothing)")

    def _refuse_on_delivery_thread(self, action: str) -> None:
        if threading.current_thread() is self._network_thread:
            raise AdapterError(f"{action} refused on {self.where}: {ON_DELIVERY_THREAD}")

    # -- connection -----------------------------------------------------------------------------

    def _new_client(self) -> paho.Client:
        client = _Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            # MQTT 3.1.1 takes the session flag here; MQTT 5 takes clean_start at connect().
            clean_session=None if self._v5 else self._clean_start,
            protocol=self._protocol,
            manual_ack=True,
            reconnect_on_failure=True,
        )
        if self._username is not None:
            client.username_pw_set(self._username, self._password)
        if self._tls:
            ca_certs, certfile, keyfile = self._tls_files
            client.tls_set(ca_certs=ca_certs, certfile=certfile, keyfile=keyfile,
                           cert_reqs=ssl.CERT_REQUIRED if self._tls_verify else ssl.CERT_NONE)
            if not self._tls_verify:
                client.tls_insecure_set(True)
        client.max_inflight_messages_set(self._max_inflight)
        client.reconnect_delay_set(*self._reconnect_delays)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_unsubscribe = self._on_subscribe
        return client

    def connect(self) -> None:
        """Connect and wait for CONNACK; AdapterError (credentials redacted) on failure."""
        with self._lock:
            if self._client is not None and self._state == "connected":
                return
            stale, self._client = self._client, None
        if stale is not None:  # paho still trying to reconnect an earlier client: stop it
            self._shutdown(stale)
        with self._lock:
            self._dispatcher.start()
            client = self._new_client()
            self._client = client
            self._connack.clear()
            self._connack_error = None
            self._state = "new"
        properties = None
        kwargs: dict[str, Any] = {}
        if self._v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self._session_expiry
            if self._receive_maximum is not None:
                properties.ReceiveMaximum = self._receive_maximum
            kwargs["clean_start"] = self._clean_start
        try:
            client.connect(self._host, self._port, keepalive=self._keepalive,
                           properties=properties, **kwargs)
        except (OSError, ValueError) as exc:
            with self._lock:
                self._client = None
            raise AdapterError(f"cannot connect to {self.where}: {type(exc).__name__} "
                               "(is the broker running?)") from None
        client.loop_start()
        ok = self._connack.wait(self._connect_timeout)
        if not ok or self._connack_error is not None:
            self._shutdown(client)
            with self._lock:
                self._client = None
                self._state = "new"
            if not ok:
                raise AdapterError(f"{self.where} sent no CONNACK within "
                                   f"{self._connect_timeout:g}s")
            raise AdapterError(f"{self.where} refused the connection: {self._connack_error}")
        log.info("connected to %s as %r (MQTT %s, session present: %s)", self.where,
                 self.client_id, "5" if self._v5 else "3.1.1", self.session_present)

    @staticmethod
    def _shutdown(client: paho.Client) -> None:
        with contextlib.suppress(Exception):
            client.disconnect()
        with contextlib.suppress(Exception):
            client.loop_stop()

    def close(self) -> None:
        """Disconnect (the session stays on the broker for ``session_expiry``). Idempotent.

        Jobs deferred before the call (:meth:`defer`) may finish first, within
        ``publish_timeout``. Safe in a delivery callback too (nothing there waits for the
        network thread).
        """
        on_delivery_thread = self.on_delivery_thread()
        if not on_delivery_thread and not self._dispatch_thread:
            # Let deferred work (the guard's dead-letter moves) finish while still connected.
            self._dispatcher.drain(self._publish_timeout)
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            client, self._client = self._client, None
            self._network_thread = None
            self._subs.clear()
            self._routes.clear()
            self._orphans.clear()
            self._unawaited.clear()
            self._acks.notify_all()
        if client is not None:
            # On the network thread loop_stop() does not wait for itself; paho writes the
            # DISCONNECT once the callback returns.
            self._shutdown(client)
        # Deliveries still queued on the dispatcher are skipped unacknowledged: the session
        # keeps them for the next connection with this client id.
        self._dispatcher.stop(timeout=self._publish_timeout, join=not on_delivery_thread)
        with self._lock:
            self._queued = 0

    # -- paho callbacks (network thread); never let an exception reach paho -----------------------

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any,
                    reason_code: ReasonCode, properties: Any) -> None:
        try:
            if reason_code.is_failure:
                with self._lock:
                    self._connack_error = f"CONNACK {reason_code}"
                self._connack.set()
                log.warning("%s refused the connection: %s", self.where, reason_code)
                return
            with self._lock:
                if self._state == "closed":
                    return
                if client is self._client:
                    # CONNACK is read by the client's network thread: deliveries come from it.
                    self._network_thread = threading.current_thread()
                reconnect = self._state == "disconnected"
                self._state = "connected"
                self._connects += 1
                self.session_present = bool(flags.session_present)
                resubscribe = [] if self.session_present else list(self._subs.values())
            for sub in resubscribe:
                # Inside the network thread: send only, do not wait for the SUBACK here.
                client.subscribe(sub.topic, qos=1)
            if reconnect:
                log.info("reconnected to %s (session present: %s, %d re-subscribed)",
                         self.where, self.session_present, len(resubscribe))
            self._connack.set()
        except Exception:
            log.exception("internal error handling CONNACK from %s", self.where)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any,
                       reason_code: ReasonCode, properties: Any) -> None:
        with self._lock:
            if self._state != "connected":
                return
            self._state = "disconnected"
            self._acks.notify_all()
        log.warning("connection to %s lost (%s): paho reconnects", self.where, reason_code)

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int,
                    reason_code: ReasonCode, properties: Any) -> None:
        if not reason_code.is_failure:
            return
        with self._lock:
            if mid in self._abandoned:
                self._abandoned.discard(mid)
                return
            self._publish_failures[mid] = f"PUBACK {reason_code}"

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int,
                      reason_codes: Any, properties: Any) -> None:
        with self._lock:
            if mid in self._unawaited:  # an UNSUBSCRIBE sent from a delivery callback
                self._unawaited.discard(mid)
                return
            codes = reason_codes if isinstance(reason_codes, list) else [reason_codes]
            self._suback[mid] = codes
            self._acks.notify_all()

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            try:
                topic = msg.topic
            except UnicodeDecodeError:
                log.warning("PUBLISH with a topic that is not UTF-8 from %s left unacked",
                            self.where)
                return
            with self._lock:
                sub = self._match(topic)
                if sub is None:
                    self._hold(msg, topic)
                    return
                if self._dispatch_thread or self._queued:
                    # Decided under the lock: subscribe() hands held messages over under it
                    # too, so a resumed session's redeliveries stay ahead of new messages.
                    self._submit(sub, msg, topic)
                    return
            self._deliver(sub, msg, topic)  # inline, outside the lock
        except Exception:
            log.exception("internal error handling a PUBLISH from %s", self.where)

    # -- deliveries -----------------------------------------------------------------------------

    def _match(self, topic: str) -> _Subscription | None:
        # Caller holds the lock. First matching subscription wins: one PUBLISH has one ack,
        # so it is never handed to two callbacks. paho's topic_matches_sub builds a matcher
        # per call (~10 us), so answers are cached per topic until the subscriptions change;
        # the cache is bounded because topics come from the network.
        try:
            return self._routes[topic]
        except KeyError:
            pass
        found = None
        for sub in self._subs.values():
            if paho.topic_matches_sub(sub.topic, topic):
                found = sub
                break
        if len(self._routes) >= MAX_CACHED_ROUTES:
            self._routes.clear()
        self._routes[topic] = found
        return found

    def _hold(self, msg: paho.MQTTMessage, topic: str) -> None:
        # Caller holds the lock.
        if len(self._orphans) >= self._orphan_limit:
            log.warning("PUBLISH on %r from %s matches no subscription and the hold limit (%d) "
                        "is reached: left unacked, the broker resends it after a reconnect",
                        topic, self.where, self._orphan_limit)
            return
        self._orphans.append(msg)

    def _submit(self, sub: _Subscription, msg: paho.MQTTMessage, topic: str) -> None:
        # Caller holds the lock.
        if self._dispatcher.submit(lambda: self._dispatch(sub, msg, topic)):
            self._queued += 1

    def _dispatch(self, sub: _Subscription, msg: paho.MQTTMessage, topic: str) -> None:
        # On the dispatcher thread.
        try:
            with self._lock:
                current = self._subs.get(sub.id) is sub
            if not current:
                log.debug("PUBLISH on %r skipped: subscription %s has ended (left unacked)",
                          topic, sub.id)
                return
            self._deliver(sub, msg, topic)
        finally:
            with self._lock:
                self._queued = max(0, self._queued - 1)

    def _deliver(self, sub: _Subscription, msg: paho.MQTTMessage, topic: str) -> None:
        delivery = self._delivery(sub, msg, topic)
        if sub.auto_ack and delivery.ack_token is not None:
            # "auto": settled before the application sees it (at most once per callback).
            self._ack_token(delivery.ack_token)
            delivery.ack_token = None
        try:
            sub.callback(delivery)
        except Exception:
            log.exception("delivery callback of subscription %s (%s) raised; the message "
                          "stays unacknowledged", sub.id, sub.address)

    def _delivery(self, sub: _Subscription, msg: paho.MQTTMessage, topic: str) -> Delivery:
        properties = getattr(msg, "properties", None)
        headers, problems = read_user_properties(
            properties, max_count=self._max_user_properties, max_bytes=self._max_property_bytes)
        raw = dict(headers)
        raw["mqtt-topic"] = topic
        raw["mqtt-mid"] = str(msg.mid)
        raw["mqtt-qos"] = str(msg.qos)
        raw["mqtt-dup"] = "true" if msg.dup else "false"
        raw["mqtt-retain"] = "true" if msg.retain else "false"
        expiry = getattr(properties, "MessageExpiryInterval", None)
        if isinstance(expiry, int):
            raw["message-expiry-interval"] = str(expiry)
        if problems:
            raw[PROPERTY_ERRORS_KEY] = "; ".join(problems[:10])
            log.warning("PUBLISH on %r from %s: %s", topic, self.where, raw[PROPERTY_ERRORS_KEY])
        payload = msg.payload if isinstance(msg.payload, bytes) else bytes(msg.payload or b"")
        message = Message.from_wire(topic_to_address(topic), payload, headers)
        return Delivery(
            message=message,
            subscription_id=sub.id,
            ack_token=(msg.mid, msg.qos, self._connects) if msg.qos > 0 else None,
            redelivered=bool(msg.dup),
            native_delivery_count=None,
            raw_headers=raw,
        )

    # -- sending --------------------------------------------------------------------------------

    def _publish_args(self, message: Message) -> tuple[str, bytes, Any]:
        if message.scheduled_delivery:
            raise AdapterError(f"MQTT has no delayed delivery: cannot hold a message to "
                               f"{message.address!r} back")
        topic = self._publish_topics.get(message.address)
        if topic is None:
            topic = self._publish_topic(message.address)
        headers = message.wire_headers()
        if not self._v5:
            moved_from = message.headers.get(ORIG_ADDRESS_HEADER)
            if moved_from and MOVE_REASON_HEADER in message.headers:
                # The guard's move: what the properties would say goes into the topic.
                count = message.headers.get(ORIG_DELIVERY_COUNT_HEADER, "0")
                topic = dead_letter_topic(topic, count, address_to_topic(moved_from))
                check_mqtt_string(topic, f"topic {topic!r}")
                return topic, message.body, None
            if headers:
                raise AdapterError(
                    f"cannot send a message with headers ({', '.join(sorted(headers))}) to "
                    f"{message.address!r} over MQTT 3.1.1, which has no properties; use MQTT 5 "
                    "(protocol='5') or the broker's STOMP endpoint")
            return topic, message.body, None
        for key, value in headers.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise AdapterError(f"header {key!r} of a message to {message.address!r} is not "
                                   "a string pair")
        expiry = None
        if message.expiration:
            remaining_ms = message.expiration - now_ms()
            expiry = max(1, math.ceil(remaining_ms / 1000))
        properties = _PackedProperties(headers, expiry)
        if properties.invalid:
            # One search over all strings found something: name the culprit (the checks
            # raise AdapterError; every string of a message is checked before it is sent).
            for key, value in headers.items():
                check_mqtt_string(key, f"header name {key[:40]!r} of a message to "
                                       f"{message.address!r}")
                check_mqtt_string(value, f"header {key[:40]!r} of a message to "
                                         f"{message.address!r}")
            raise AdapterError(f"headers of a message to {message.address!r} are not valid "
                               "MQTT strings")
        return topic, message.body, properties

    def _publish_topic(self, address: str) -> str:
        """``address``'s topic, checked once and remembered (a producer sends to few)."""
        topic = address_to_topic(address)
        check_mqtt_string(topic, f"topic {topic!r}")
        if "+" in topic or "#" in topic:
            raise AdapterError(f"cannot publish to {address!r}: MQTT wildcards (+, #) "
                               "are only for subscriptions")
        if len(self._publish_topics) >= MAX_REMEMBERED_TOPICS:
            self._publish_topics.clear()
        self._publish_topics[address] = topic
        return topic

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        """Publish at QoS 1 and wait for the PUBACK (``publish_timeout``).

        AdapterError at once in a delivery callback: see :meth:`on_delivery_thread`.
        """
        self.send_many((message,), transaction=transaction)

    def send_many(self, messages: Iterable[Message], *, transaction: str | None = None) -> None:
        """Publish all messages, then wait for all PUBACKs (pipelined).

        AdapterError at once (nothing published) in a delivery callback: see
        :meth:`on_delivery_thread`.
        """
        self._refuse_on_delivery_thread("send")
        if transaction is not None:
            raise AdapterError("MQTT has no transactions")
        prepared = [self._publish_args(m) for m in messages]
        if not prepared:
            return
        client = self._require_client("send")
        infos: list[paho.MQTTMessageInfo] = []
        with client.publish_batch() if isinstance(client, _Client) else contextlib.nullcontext():
            for topic, payload, properties in prepared:
                info = client.publish(topic, payload, qos=1, properties=properties)
                if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    self._abandon([i.mid for i in infos])
                    raise AdapterError(
                        f"publish to {topic!r} on {self.where} failed: "
                        f"{paho.error_string(info.rc)}; {len(infos)} earlier message(s) of "
                        "the batch are unconfirmed (paho keeps them queued)")
                infos.append(info)
        deadline = time.monotonic() + self._publish_timeout
        failures: list[str] = []
        unconfirmed: list[int] = []
        for index, info in enumerate(infos):
            with contextlib.suppress(RuntimeError, ValueError):
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            if not info.is_published():
                unconfirmed.append(info.mid)
                failures.append(f"#{index}: no PUBACK within {self._publish_timeout:g}s")
                continue
            with self._lock:
                failure = self._publish_failures.pop(info.mid, None)
            if failure is not None:
                failures.append(f"#{index}: {failure}")
        self._abandon(unconfirmed)
        if failures:
            raise AdapterError(f"{len(failures)} of {len(infos)} publish(es) to {self.where} "
                               f"failed: {'; '.join(failures[:5])}")

    def _abandon(self, mids: list[int]) -> None:
        with self._lock:
            self._abandoned.update(mids)
            if len(self._abandoned) > 65535:  # mids wrap at 65535: old entries are meaningless
                self._abandoned.clear()
            if len(self._publish_failures) > 65535:
                self._publish_failures.clear()

    def _require_client(self, action: str) -> paho.Client:
        with self._lock:
            client = self._client
            state = self._state
        if client is not None and state == "connected" and client.is_connected():
            return client
        why = {"closed": "the adapter is closed", "new": "connect() has not been called"}.get(
            state, "the connection was lost and paho is reconnecting")
        raise AdapterError(f"cannot {action} on {self.where}: {why}")

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(self, address: str, callback: DeliveryCallback,
                  options: SubscribeOptions | None = None) -> str:
        """SUBSCRIBE at QoS 1 and wait for the SUBACK.

        ``ack`` may be ``client-individual`` (default) or ``auto`` (acked before the callback);
        MQTT has no cumulative ``client`` mode, selectors, browsing or subscribe headers.
        Not from a delivery callback (it waits for the SUBACK: AdapterError).

        Messages a resumed session pushed before this call (held, see the module docstring)
        are delivered on the dispatcher thread, and deliveries arriving meanwhile follow them
        there until they are done, so arrival order is kept.
        """
        self._refuse_on_delivery_thread("subscribe")
        opts = options or SubscribeOptions()
        if opts.ack not in ("client-individual", "auto"):
            raise AdapterError(f"ack mode {opts.ack!r} is not available over MQTT (use "
                               "client-individual or auto)")
        if opts.selector is not None or opts.browse or opts.headers:
            raise AdapterError("MQTT subscriptions take no selector, browse or headers")
        topic = address_to_topic(address)
        client = self._require_client("subscribe")
        sub = _Subscription(f"sub-{next(self._ids)}", address, topic, callback,
                            auto_ack=opts.ack == "auto")
        with self._lock:
            if any(s.topic == topic for s in self._subs.values()):
                raise AdapterError(f"{address!r} is already subscribed on this adapter")
            self._subs[sub.id] = sub
            self._routes.clear()
            # Messages a resumed session pushed before this subscribe() (see _hold).
            for held in [m for m in self._orphans if paho.topic_matches_sub(topic, m.topic)]:
                self._orphans.remove(held)
                self._submit(sub, held, held.topic)
        try:
            self._await_ack(client.subscribe(topic, qos=1),
                            f"SUBSCRIBE to {topic!r}")
        except BaseException:
            with self._lock:
                self._subs.pop(sub.id, None)
                self._routes.clear()
            raise
        return sub.id

    def _await_ack(self, result: tuple[MQTTErrorCode, int | None], what: str) -> None:
        rc, mid = result
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise AdapterError(f"{what} on {self.where} failed: {paho.error_string(rc)}")
        deadline = time.monotonic() + self._connect_timeout
        with self._acks:
            while mid not in self._suback:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._state == "closed":
                    raise AdapterError(f"no acknowledgement of {what} from {self.where} within "
                                       f"{self._connect_timeout:g}s")
                self._acks.wait(remaining)
            codes = self._suback.pop(mid)
        failed = [str(code) for code in codes if getattr(code, "is_failure", False)]
        if failed:
            raise AdapterError(f"{what} refused by {self.where}: {', '.join(failed)}")

    def unsubscribe(self, subscription_id: str) -> None:
        """UNSUBSCRIBE and wait for the UNSUBACK; unknown ids are ignored.

        In a delivery callback it does not wait for the UNSUBACK (only the network thread,
        busy in the callback, can read it); no delivery of the subscription follows anyway.
        Elsewhere, jobs deferred before the call (:meth:`defer`) may finish first, within
        ``publish_timeout``, so that their acks precede the UNSUBSCRIBE.
        """
        if not self._dispatch_thread and not self.on_delivery_thread():
            self._dispatcher.drain(self._publish_timeout)
        with self._lock:
            sub = self._subs.pop(subscription_id, None)
            self._routes.clear()
        if sub is None:
            return
        client = self._require_client("unsubscribe")
        if self.on_delivery_thread():
            rc, mid = client.unsubscribe(sub.topic)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
                raise AdapterError(f"UNSUBSCRIBE from {sub.topic!r} on {self.where} failed: "
                                   f"{paho.error_string(rc)}")
            with self._lock:  # the UNSUBACK cannot be read before this callback returns
                self._unawaited.add(mid)
            return
        self._await_ack(client.unsubscribe(sub.topic), f"UNSUBSCRIBE from {sub.topic!r}")

    # -- acknowledgements -----------------------------------------------------------------------

    def _ack_token(self, token: Any) -> None:
        client = self._require_client("ack")
        mid, qos, _connection = token
        rc = client.ack(mid, qos)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise AdapterError(f"PUBACK for message {mid} to {self.where} failed: "
                               f"{paho.error_string(rc)}; the broker resends it after a "
                               "reconnect")

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        """PUBACK the delivery (a no-op for QoS 0 and ``auto`` deliveries)."""
        if transaction is not None:
            raise AdapterError("MQTT has no transactions")
        if delivery.ack_token is not None:
            self._ack_token(delivery.ack_token)

    def can_settle(self, delivery: Delivery) -> bool:
        """True when ``delivery`` came over the current connection (its PUBACK would count).

        After a reconnect the broker resends unacknowledged messages of a persistent
        session itself, so a delivery from an earlier connection must not be handled again.
        """
        token = delivery.ack_token
        if token is None:
            return False
        with self._lock:
            return self._state == "connected" and token[2] == self._connects

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """Leave the delivery unacknowledged (MQTT has no NACK; see the module docstring).

        The broker resends it only after the next reconnect of this session.
        """
        log.debug("nack of message %s on %s: left unacknowledged until the next reconnect",
                  delivery.ack_token, delivery.message.address)

    # -- transactions ---------------------------------------------------------------------------

    def begin(self) -> str:
        raise AdapterError("MQTT has no transactions (capabilities.transactions is False)")

    def commit(self, transaction: str) -> None:
        raise AdapterError("MQTT has no transactions (capabilities.transactions is False)")

    def abort(self, transaction: str) -> None:
        raise AdapterError("MQTT has no transactions (capabilities.transactions is False)")
