"""STOMP 1.2 adapter on stomp.py, for ActiveMQ Classic, RabbitMQ and ActiveMQ Artemis.

URL: ``stomp://[user:pass@]host[:port][?vhost=/]`` (port 61613 by default) or ``stomp+ssl://``
(61614). Credentials come from the URL or the ``login``/``passcode`` options and are never
logged or put in an exception message (stomp.py 9 itself logs the CONNECT frame, passcode
included, at DEBUG: this module installs a filter on the ``stomp.py`` logger that masks it).

Addresses
    A plain mqguard address ``orders.eu`` is the destination ``/queue/orders.eu``; an address
    that starts with ``/`` (``/topic/x``, ``/exchange/amq.topic/k``, ``/amq/queue/q``) is used as
    is (:func:`mqguard.stomp_brokers.destination_of`). A delivery carries the address its
    subscriber used, whatever ``destination`` header the broker put on the MESSAGE frame.

Brokers
    The broker is detected from the CONNECTED frame (or forced with ``broker=``), and
    everything that differs between ActiveMQ Classic, RabbitMQ and Artemis -- capabilities,
    the headers each adds to a MESSAGE, how a SEND tells it about delays, persistence and
    expiration, its delivery count -- comes from :mod:`mqguard.stomp_brokers`, which the
    sidecar uses too; its docstring tabulates what each broker does. This adapter sends
    ``persistent:true`` by default.

Receipts and errors
    Every SEND outside a transaction carries a ``receipt`` and :meth:`StompAdapter.send`
    returns only once the RECEIPT is in; :meth:`StompAdapter.send_many` writes all frames first
    and then waits for all receipts (pipelining). Because RabbitMQ's ERROR frames never name
    the frame that caused them, an ERROR without ``receipt-id`` is charged to the *oldest*
    outstanding receipt: frames are processed in order, so every earlier frame has had its
    RECEIPT already. While a transaction is open such an ERROR taints the open transactions
    instead (their SENDs carry no receipt), and :meth:`StompAdapter.commit` then rolls back.
    A lost connection fails every outstanding receipt: a send never silently disappears.

Transactions
    SENDs and ACKs inside a transaction are not individually receipted: neither broker routes
    them before COMMIT, and RabbitMQ only answers their receipts at COMMIT. To never commit half
    a transaction, ``commit()`` first waits on a receipted BEGIN/ABORT of a throw-away
    transaction (a barrier: its RECEIPT proves every earlier frame was processed, so any ERROR
    caused by an in-transaction SEND has arrived), then sends a receipted COMMIT -- or an ABORT
    and :class:`~mqguard.errors.TransactionRolledBack` if an ERROR tainted the transaction.

Reconnection
    When the connection drops (broker restart, heart-beat timeout, connection-level ERROR), the
    adapter reconnects in the background with exponential backoff (``reconnect_attempts``,
    ``reconnect_delay``, ``reconnect_max_delay``) and re-subscribes every subscription with its
    original id and headers. Until then ``send()`` raises :class:`~mqguard.errors.AdapterError`
    at once. Unacknowledged deliveries of the lost connection can no longer be acked (the
    broker redelivers them); ``ack()`` of such a delivery raises AdapterError rather than
    sending an ACK that RabbitMQ would punish by closing the connection.

Threads
    Delivery callbacks run inline on stomp.py's receiver thread (the *delivery thread*: one at
    a time, in arrival order): handing each one to another thread cost a large share of the
    consume throughput. That thread is also the only one that reads RECEIPTs, so nothing that
    waits for one can run in a callback: ``send``, ``send_many``, ``subscribe``, ``begin``,
    ``commit``, ``abort`` and ``wait_browse_end`` called there raise AdapterError at once
    (:meth:`StompAdapter.on_delivery_thread` tells). ``ack`` and ``nack`` are fine there;
    ``unsubscribe`` and ``close`` work without waiting for their RECEIPT. Work that must wait
    goes through :meth:`StompAdapter.defer`, which runs it on the adapter's dispatcher thread
    in submission order (the guard moves messages to dead-letter addresses that way), or
    through another adapter (another connection): a handler that sends must use its own
    producer. An exception in a callback is logged and the message stays unacknowledged.

    A callback also holds up reading: heart-beats and receipts wait until it returns, and one
    that runs longer than about 1.5x the broker's heart-beat interval (15 s with the default
    ``heartbeats``) makes stomp.py declare the connection dead; the adapter reconnects and the
    broker redelivers what was unacknowledged. Over TLS, frames written in a callback are only
    flushed once it returns. ``dispatch_thread=True`` restores the old behaviour (every callback
    on the dispatcher thread, which may send and wait; deliveries still queued when their
    connection drops are skipped and redelivered by the broker) at the cost of throughput.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final
from urllib.parse import parse_qsl, unquote

import stomp  # type: ignore[import-untyped]
import stomp.exception  # type: ignore[import-untyped]
import stomp.protocol  # type: ignore[import-untyped]
import stomp.transport  # type: ignore[import-untyped]
import stomp.utils  # type: ignore[import-untyped]

from mqguard.adapter import Capabilities, Delivery, DeliveryCallback, SubscribeOptions
from mqguard.errors import AdapterError, TransactionRolledBack
from mqguard.jobthread import JobThread
from mqguard.message import Message
from mqguard.redact import redact_url, split_server_url
from mqguard.sidecar.frames import (
    FrameError,
    encode_bodiless,
    encode_one_header,
    encode_send,
    parse_received,
)
from mqguard.stomp_brokers import (
    ACK_MODES,
    BROKER_CAPABILITIES,
    BROKER_MESSAGE_HEADERS,
    DEFAULT_PORTS,
    PREFETCH_HEADERS,
    RESERVED_SUBSCRIBE_HEADERS,
    destination_of,
    detect_broker,
    expired_selector,
    is_quorum_queue,
    native_delivery_count,
    send_headers,
)

# BROKER_CAPABILITIES and send_headers live in mqguard.stomp_brokers; they stay importable
# from here for code written against earlier releases.
__all__ = ["BROKER_CAPABILITIES", "PendingSends", "StompAdapter", "send_headers"]

log = logging.getLogger("mqguard.adapters.stomp")

#: Longest ERROR body kept in an exception message (ActiveMQ sends whole Java stack traces).
MAX_ERROR_BODY: Final = 600

#: Frames are written in chunks of about this size (one sendall() each).
WRITE_CHUNK_BYTES: Final = 256 * 1024
#: ...except the first chunk of a batch, written after this many frames so that the broker
#: starts on the batch while the rest is encoded (0: no early first chunk).
FIRST_CHUNK_FRAMES = 8

#: Why a method that waits for the broker refuses to run on the delivery (receiver) thread.
ON_DELIVERY_THREAD: Final = (
    "cannot wait for the broker's confirmation on the delivery thread; use a separate "
    "connection for sending from a handler, or adapter.defer()")


# -- received frames -----------------------------------------------------------------------------

def parse_frame(data: bytes) -> Any:
    """One received frame (without its NUL) as ``stomp.utils.parse_frame`` gives it.

    Read by the native codec (:func:`mqguard.sidecar.frames.parse_received`), with
    stomp.py's leniency: the head ends at the first blank line (LF or CRLF), lines split at
    LF or CRLF, leading empty lines are skipped, a line splits at its first ``:`` (lines
    without one, or with an empty name, are ignored), unknown escapes are kept, invalid
    UTF-8 is replaced, the first occurrence of a name wins, and the body is everything
    after the blank line. None for a head of empty lines only, as stomp.py.
    """
    parsed = parse_received(data)
    return None if parsed is None else stomp.utils.Frame(*parsed)


class _AckWriter:
    """Coalesces the ACK frames written on the receiver thread during one read turn.

    stomp.py's receiver reads whatever the socket holds (often many MESSAGE frames) and
    dispatches the frames one by one; the guard acknowledges each inline. Instead of one
    ``sendall`` per ACK (a system call, and on loopback the broker side's TCP work too),
    the ACKs of one turn are written together when the turn ends -- before the receiver
    reads (and possibly blocks) again, so no ACK waits for more traffic.

    Every other write on the connection (any thread: SENDs, NACKs, heart-beats,
    UNSUBSCRIBE...) goes through :meth:`send`, which writes the pending ACKs first, under
    one lock: frames reach the socket in the order they were issued (a cumulative
    ``client``-mode ACK or NACK never overtakes an earlier ACK).
    """

    __slots__ = ("_lock", "_pending", "_send", "_turn")

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._turn: int | None = None  # the receiver thread's id during a read turn

    def begin_turn(self) -> None:
        self._turn = threading.get_ident()

    def end_turn(self) -> None:
        self._turn = None
        try:
            self.send(b"")
        except (stomp.exception.StompException, OSError):
            # The connection is lost: the receiver sees it on its next read, and the
            # broker redelivers every unacknowledged message.
            log.debug("pending ACKs not written: connection lost", exc_info=True)

    def ack(self, frame: bytes) -> None:
        """Write ``frame`` at the end of the current read turn, or now off the receiver."""
        if self._turn == threading.get_ident():
            with self._lock:
                self._pending.append(frame)
            return
        self.send(frame)

    def send(self, frame: bytes) -> None:
        with self._lock:
            pending = self._pending
            if pending:
                if frame:
                    pending.append(frame)
                frame = b"".join(pending)
                pending.clear()
            if frame:
                self._send(frame)


def _install_fast_receiver(conn: Any, on_receipt: Callable[[Any], bool] | None = None
                           ) -> _AckWriter | None:
    """Make ``conn``'s receiver parse frames with :func:`parse_frame` and coalesce ACKs.

    This connection only. stomp.py reads and splits frames in the private
    ``BaseTransport.__read_frames``; the replacement keeps its reading and dispatch, swaps
    the parser, and brackets each read turn for the :class:`_AckWriter` (plain TCP; with
    TLS stomp.py's I/O thread owns the socket). When the private names are not there
    (another stomp.py version), stomp.py's own receiver stays and None is returned.

    ``on_receipt(frame)`` sees each RECEIPT first; when it returns True the frame was
    handled and skips stomp.py's dispatch (sorting the listeners, a condition variable,
    lookups: ~4x the cost of resolving it, once per confirmed SEND), apart from the
    heart-beat listener's "something was received" bookkeeping, which is kept.
    """
    transport = conn.transport
    read = getattr(transport, "_BaseTransport__read", None)
    is_eol = getattr(transport, "_BaseTransport__is_eol", None)
    if read is None or is_eol is None or not hasattr(transport, "_BaseTransport__auto_decode"):
        return None
    heartbeat = stomp.transport.HEARTBEAT_FRAME
    decode = stomp.utils.decode
    writer = _AckWriter(transport.send) if transport.blocking else None
    if writer is not None:
        transport.send = writer.send

    def read_frames() -> None:
        frames = read()
        if writer is not None:
            writer.begin_turn()
        try:
            for data in frames:
                frame = heartbeat if is_eol(data) else parse_frame(data)
                if frame is None:
                    continue
                if on_receipt is not None and frame.cmd == "RECEIPT" and on_receipt(frame):
                    heartbeats = transport.listeners.get("protocol-listener")
                    if heartbeats is not None:
                        heartbeats.on_receipt(frame)
                    continue
                if transport._BaseTransport__auto_decode:
                    frame.body = decode(frame.body)
                transport.process_frame(frame, data)
        finally:
            if writer is not None:
                writer.end_turn()

    transport._BaseTransport__read_frames = read_frames
    return writer


# -- credentials never reach a log ---------------------------------------------------------------

class _PasscodeFilter(logging.Filter):
    """Masks passcodes in stomp.py's own log records.

    stomp.py 9 logs every outgoing frame at DEBUG through ``clean_lines``, whose masking regex
    (``passcode:\\s+...``) needs a blank after the colon that a real frame never has, so the
    CONNECT frame's passcode would be logged verbatim whenever DEBUG is on. The filter masks
    ``passcode:`` up to the end of the header line and, to be safe with odd characters, every
    passcode an adapter of this process was given.
    """

    _pattern = re.compile(r"(passcode:).*?(?=\\n|\n|'|\"|$)")
    secrets: ClassVar[set[str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not ours
            return True
        masked = self._pattern.sub(r"\1********", text) if "passcode" in text else text
        for secret in self.secrets:
            for form in {secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]}:
                if form in masked:
                    masked = masked.replace(form, "********")
        if masked != text:
            record.msg = masked
            record.args = None
        return True


def _install_passcode_filter() -> None:
    stomp_logger = logging.getLogger("stomp.py")
    if not any(isinstance(f, _PasscodeFilter) for f in stomp_logger.filters):
        stomp_logger.addFilter(_PasscodeFilter())


_install_passcode_filter()


# -- internal state records ----------------------------------------------------------------------

class _Batch:
    """Receipts awaited together (one SEND, a pipelined batch, a COMMIT...)."""

    __slots__ = ("done", "errors", "ids", "remaining")

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.remaining = len(ids)
        self.errors: dict[int, str] = {}
        self.done = threading.Event()
        if not ids:
            self.done.set()


class PendingSends:
    """Receipted SEND frames already written; :meth:`wait` for their RECEIPTs."""

    __slots__ = ("_adapter", "_batch", "_deadline", "_error", "_settled", "_what")

    def __init__(self, adapter: StompAdapter, batch: _Batch, what: str, deadline: float) -> None:
        self._adapter = adapter
        self._batch = batch
        self._what = what
        self._deadline = deadline
        self._settled = False
        self._error: AdapterError | None = None

    def wait(self) -> None:
        """Return once the broker confirmed every frame; AdapterError when one failed or
        the receipt timeout (counted from the write) passed first. Calling it again gives
        the same outcome."""
        if not self._settled:
            try:
                self._adapter._await(self._batch, self._what, self._deadline)
            except AdapterError as exc:
                self._error = exc
            self._settled = True
        if self._error is not None:
            raise self._error


@dataclass(slots=True)
class _Subscription:
    id: str
    address: str
    destination: str
    callback: DeliveryCallback
    options: SubscribeOptions
    ack: str
    headers: dict[str, str]
    browse_end: threading.Event = field(default_factory=threading.Event)
    #: To a RabbitMQ quorum queue (whose deliveries are counted by the broker).
    quorum: bool = False


@dataclass(slots=True)
class _Transaction:
    id: str
    generation: int
    #: First ERROR that arrived while the transaction was open (its SENDs are unreceipted).
    failure: str | None = None


@dataclass(slots=True)
class _Handshake:
    done: threading.Event = field(default_factory=threading.Event)
    server: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Endpoint:
    scheme: str
    host: str
    port: int
    login: str | None
    passcode: str | None
    vhost: str


def _parse_url(url: str) -> _Endpoint:
    safe = redact_url(url)
    try:
        parts, host, port = split_server_url(url, DEFAULT_PORTS, what="STOMP URL")
    except ValueError as exc:
        raise AdapterError(str(exc)) from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - {"vhost"})
    if unknown:
        raise AdapterError(f"STOMP URL {safe!r}: unknown query parameter(s) {', '.join(unknown)}; "
                           "only 'vhost' is read from the URL, pass the rest as options")
    return _Endpoint(
        scheme=parts.scheme,
        host=host,
        port=port,
        login=unquote(parts.username) if parts.username else None,
        passcode=unquote(parts.password) if parts.password is not None else None,
        vhost=query.get("vhost") or "/",
    )


def _describe_error(frame: Any) -> str:
    headers: Mapping[str, str] = frame.headers
    summary = headers.get("message", "").strip() or "(no message header)"
    body = frame.body
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else str(body or "")
    text = text.strip()
    if len(text) > MAX_ERROR_BODY:
        text = text[:MAX_ERROR_BODY] + "..."
    return f"ERROR frame: {summary}" + (f" -- {text}" if text and text != summary else "")


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Forwards stomp.py events of one connection (``generation``) to the adapter.

    Every hook swallows and logs exceptions: stomp.py calls listeners on its receiver thread
    and closes the socket if one raises.
    """

    def __init__(self, adapter: StompAdapter, generation: int) -> None:
        self._adapter = adapter
        self._generation = generation

    def _guard(self, what: str, func: Any, *args: Any) -> None:
        try:
            func(self._generation, *args)
        except Exception:
            log.exception("internal error handling %s from %s", what, self._adapter.where)

    def on_connected(self, frame: Any) -> None:
        self._guard("CONNECTED", self._adapter._on_connected, frame)

    def on_error(self, frame: Any) -> None:
        self._guard("ERROR", self._adapter._on_error, frame)

    def on_receipt(self, frame: Any) -> None:
        self._guard("RECEIPT", self._adapter._on_receipt, frame)

    def on_message(self, frame: Any) -> None:
        self._guard("MESSAGE", self._adapter._on_message, frame)

    def on_disconnected(self) -> None:
        self._guard("disconnect", self._adapter._on_disconnected)

    def on_heartbeat_timeout(self) -> None:
        log.warning("heart-beat timeout on %s: reconnecting", self._adapter.where)


class StompAdapter:
    """mqguard :class:`~mqguard.adapter.Adapter` speaking STOMP 1.2 (see the module docstring).

    Options (all keyword-only; the registry passes them as ``StompAdapter(url, **options)``):

    ``login``, ``passcode``
        Credentials; override the URL's. No login is sent when neither gives one (ActiveMQ
        accepts that by default; RabbitMQ then uses ``stomp.default_user``).
    ``vhost``
        The ``host`` header, i.e. the RabbitMQ virtual host; overrides ``?vhost=``; default ``/``.
    ``heartbeats``
        ``(send_ms, receive_ms)``; default ``(10000, 10000)``; ``(0, 0)`` turns them off.
    ``persistent``
        Send ``persistent:true`` on every SEND (default True) unless the message has its own.
    ``receipt_timeout``, ``connect_timeout``
        Seconds to wait for a RECEIPT / the CONNECTED frame (default 10 each).
    ``reconnect_attempts``, ``reconnect_delay``, ``reconnect_max_delay``
        Background reconnection after a connection loss: attempts (default 10, 0 = never),
        first delay and cap of the doubling backoff in seconds (0.2 and 5).
    ``failover``
        More URLs of the same broker cluster (``stomp://host:port``, same scheme), tried in
        order after the main one on every (re)connection attempt: after a node dies the
        adapter reconnects to the next node that answers and re-subscribes there. Their
        credentials and vhost are ignored (the main URL's apply). Default: none.
    ``broker``
        Force the broker flavour instead of detecting it from the CONNECTED ``server`` header.
    ``dispatch_thread``
        False (default): delivery callbacks run inline on stomp.py's receiver thread, and
        whatever waits for a RECEIPT must go through :meth:`defer` (see "Threads" in the module
        docstring). True: the old behaviour -- every callback is handed to the adapter's own
        dispatcher thread, so callbacks may send and wait, at a large cost in consume
        throughput.
    ``ssl_ca_certs``, ``ssl_cert_file``, ``ssl_key_file``, ``ssl_verify``
        TLS settings for ``stomp+ssl://``.
    """

    name = "stomp"

    def __init__(
        self,
        url: str,
        *,
        login: str | None = None,
        passcode: str | None = None,
        vhost: str | None = None,
        heartbeats: tuple[int, int] = (10000, 10000),
        persistent: bool = True,
        native_expiry: bool = False,
        receipt_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        reconnect_attempts: int = 10,
        reconnect_delay: float = 0.2,
        reconnect_max_delay: float = 5.0,
        failover: Iterable[str] = (),
        broker: str | None = None,
        dispatch_thread: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_cert_file: str | None = None,
        ssl_key_file: str | None = None,
        ssl_verify: bool = True,
    ) -> None:
        endpoint = _parse_url(url)
        if isinstance(failover, str):
            raise AdapterError("failover must be a list of URLs, not one string")
        others = [_parse_url(other) for other in failover]
        if any(other.scheme != endpoint.scheme for other in others):
            raise AdapterError(f"failover URLs must use the main URL's scheme "
                               f"({endpoint.scheme}://)")
        self.url = redact_url(url)
        #: Where the adapter connects, for messages (never contains a password).
        self.where = f"STOMP broker at {endpoint.host}:{endpoint.port}" + (
            f" (failover {', '.join(f'{o.host}:{o.port}' for o in others)})" if others else "")
        if broker is not None and broker not in BROKER_CAPABILITIES:
            raise AdapterError(f"unknown broker {broker!r} for {self.where}; expected one of "
                               f"{', '.join(sorted(BROKER_CAPABILITIES))}")
        if len(heartbeats) != 2 or min(heartbeats) < 0:
            raise AdapterError(f"heartbeats must be two non-negative ms values, got {heartbeats!r}")
        if receipt_timeout <= 0 or connect_timeout <= 0:
            raise AdapterError("receipt_timeout and connect_timeout must be positive")
        self._endpoint = endpoint
        #: Every (host, port) a connection attempt tries, in order: the main URL's first.
        self._hosts = [(ep.host, ep.port) for ep in (endpoint, *others)]
        self._login = login if login is not None else endpoint.login
        self._passcode = passcode if passcode is not None else endpoint.passcode
        self._vhost = vhost if vhost is not None else endpoint.vhost
        self._heartbeats = (int(heartbeats[0]), int(heartbeats[1]))
        self._persistent = persistent
        self._native_expiry = bool(native_expiry)
        self._receipt_timeout = receipt_timeout
        self._connect_timeout = connect_timeout
        self._reconnect_attempts = max(0, int(reconnect_attempts))
        self._reconnect_delay = max(0.0, reconnect_delay)
        self._reconnect_max_delay = max(self._reconnect_delay, reconnect_max_delay)
        self._forced_broker = broker
        self._dispatch_thread = bool(dispatch_thread)
        #: Delivery callbacks begun and finished (each written by the one thread that runs
        #: the callbacks: the receiver, or the dispatcher with ``dispatch_thread``), so that
        #: unsubscribe() and close() can wait for a handler still running (_await_callbacks).
        self._callbacks_begun = 0
        self._callbacks_done = 0
        if self._passcode:
            _PasscodeFilter.secrets.add(self._passcode)
        self._ssl = {"ca_certs": ssl_ca_certs, "cert_file": ssl_cert_file,
                     "key_file": ssl_key_file, "verify": ssl_verify}

        #: Detected (or forced) broker flavour; ``unknown`` until connected.
        self.broker = broker or "unknown"
        #: The CONNECTED frame's ``server`` header, e.g. ``RabbitMQ/3.10.8``.
        self.server = ""

        # One lock guards all mutable state below. It is never held during socket I/O: the
        # receiver thread needs it to resolve receipts, and a writer blocked in sendall()
        # while holding it could deadlock against a broker waiting for us to read.
        self._lock = threading.RLock()
        self._conn: Any = None
        self._generation = 0
        self._state = "new"  # new | connecting | connected | reconnecting | failed | closed
        self._handshake: _Handshake | None = None
        self._subs: dict[str, _Subscription] = {}
        self._pending: dict[str, tuple[_Batch, int]] = {}
        self._unacked: dict[str, str] = {}  # ack id -> subscription id, current connection only
        self._transactions: dict[str, _Transaction] = {}
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._reconnect_thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._dispatcher = JobThread("mqguard-stomp-dispatcher")
        #: stomp.py's receiver thread of the current connection (set by its CONNECTED frame).
        self._receiver_thread: threading.Thread | None = None
        #: STOMP sessions established so far (1 after connect(), +1 per reconnect).
        self.sessions = 0
        self._prefix = os.urandom(4).hex()
        self._send_prefix = f"send-{self._prefix}-"
        self._ids = itertools.count(1)

    # -- introspection --------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return BROKER_CAPABILITIES[self.broker]

    @property
    def connected(self) -> bool:
        """True while a STOMP session is up (False while reconnecting)."""
        return self._state == "connected"

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the adapter is connected (e.g. after a background reconnect)."""
        return self._connected.wait(timeout)

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{self._prefix}-{next(self._ids)}"

    # -- threads --------------------------------------------------------------------------------

    def on_delivery_thread(self) -> bool:
        """True on stomp.py's receiver thread, where delivery callbacks run inline.

        Nothing that waits for a RECEIPT can run there (only that thread reads it): such
        methods raise AdapterError at once; use :meth:`defer` or another adapter. With
        ``dispatch_thread=True`` callbacks run on the dispatcher thread instead, where this is
        False.
        """
        return threading.current_thread() is self._receiver_thread

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the adapter's dispatcher thread, after every job deferred before it.

        For work that waits for the broker (a send, a commit) and therefore cannot run in a
        delivery callback. The job may call any method of the adapter; the receiver thread
        goes on delivering meanwhile, so it may run after later deliveries. An exception in
        the job is logged. :meth:`close` (from any other thread) first lets the jobs queued so
        far finish, bounded by ``receipt_timeout``. Raises AdapterError when the adapter is
        not connected (before :meth:`connect`, after :meth:`close`).
        """
        if not self._dispatcher.submit(job):
            raise AdapterError(f"cannot defer a job on {self.where}: the adapter is not "
                               "connected (connect() first; a closed adapter runs nothing)")

    def _refuse_on_delivery_thread(self, action: str) -> None:
        if threading.current_thread() is self._receiver_thread:
            raise AdapterError(f"{action} refused on {self.where}: {ON_DELIVERY_THREAD}")

    # -- connection lifecycle -------------------------------------------------------------------

    def connect(self) -> None:
        """Connect and log in; AdapterError (credentials redacted) on failure.

        Calling it while connected does nothing, while a (re)connection is in progress waits
        for it; after :meth:`close` it opens a new session.
        """
        with self._lock:
            state = self._state
        if state == "connected":
            return
        if state in ("connecting", "reconnecting"):  # another thread is at it: wait for it
            if not self._connected.wait(self._connect_timeout):
                raise AdapterError(f"{self.where}: not connected after waiting "
                                   f"{self._connect_timeout:g}s for a connection in progress")
            return
        with self._lock:
            if self._state == "closed":
                self._state = "new"
            self._stop.clear()
            self._dispatcher.start()
        # Re-subscribes what survived a failed background reconnect; none after close().
        self._open(resubscribe=True, expected=("new", "failed"))

    def _new_connection(self) -> Any:
        ep = self._endpoint
        conn = stomp.Connection12(
            # stomp.py tries these in order within one attempt: failover at connect time.
            list(self._hosts),
            heartbeats=self._heartbeats,
            vhost=self._vhost,
            # Bodies are bytes: stomp.py's default would decode them as UTF-8 (lossy).
            auto_decode=False,
            # One TCP attempt per _open(): the adapter does its own backoff and re-subscribes.
            reconnect_attempts_max=1,
            timeout=self._connect_timeout,
            try_loopback_connect=False,
        )
        if ep.scheme == "stomp+ssl":
            conn.set_ssl(for_hosts=list(self._hosts), key_file=self._ssl["key_file"],
                         cert_file=self._ssl["cert_file"], ca_certs=self._ssl["ca_certs"],
                         verify=bool(self._ssl["verify"]))
        conn.mqguard_acks = _install_fast_receiver(conn, self._send_receipt)
        return conn

    def _open(self, *, resubscribe: bool, expected: tuple[str, ...]) -> None:
        handshake = _Handshake()
        with self._lock:
            # Checked and changed atomically: close() may run while a reconnect is starting.
            if self._state not in expected:
                raise AdapterError(f"not connecting to {self.where}: the adapter is "
                                   f"{self._state}")
            previous = self._state
            self._generation += 1
            generation = self._generation
            self._handshake = handshake
            self._state = "connecting"
            self._last_error = None
        conn = self._new_connection()
        conn.set_listener("mqguard", _Listener(self, generation))
        with self._lock:
            self._conn = conn
        try:
            try:
                conn.connect(username=self._login, passcode=self._passcode, wait=False)
            except (stomp.exception.StompException, OSError) as exc:
                raise AdapterError(f"cannot connect to {self.where}: "
                                   f"{type(exc).__name__} (is the broker running?)") from None
            if not handshake.done.wait(self._connect_timeout):
                raise AdapterError(f"{self.where} sent no CONNECTED frame within "
                                   f"{self._connect_timeout:g}s")
            if handshake.error is not None:
                raise AdapterError(f"{self.where} refused the connection: {handshake.error}")
            with self._lock:
                self.server = handshake.server or ""
                self.broker = self._forced_broker or detect_broker(handshake.server)
                subs = list(self._subs.values()) if resubscribe else []
            for sub in subs:
                self._subscribe_on(conn, sub)
            with self._lock:
                if self._generation != generation or self._state != "connecting":
                    raise AdapterError(f"connection to {self.where} was lost while connecting: "
                                       f"{self._last_error or 'closed by the broker'}")
                self._state = "connected"
                self.sessions += 1
                self._connected.set()
            log.info("connected to %s (%s, server %r, vhost %r)", self.where, self.broker,
                     self.server, self._vhost)
        except BaseException:
            with self._lock:
                if self._generation == generation:
                    self._generation += 1  # late events of this connection are now ignored
                if self._conn is conn:
                    self._conn = None
                if self._state == "connecting":
                    self._state = previous
            self._drop(conn)
            raise

    @staticmethod
    def _drop(conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.transport.disconnect_socket()

    def close(self) -> None:
        """DISCONNECT with a receipt (bounded by ``receipt_timeout``) and end all subscriptions.

        Safe to call twice. Unacknowledged deliveries are redelivered by the broker. Jobs
        deferred before the call (:meth:`defer`) may finish first, within ``receipt_timeout``.

        Safe in a delivery callback too: there it does not wait for the RECEIPT (only the
        receiver thread, busy in the callback, can read it); stomp.py closes the socket when
        the RECEIPT arrives, and the dispatcher thread does if none comes in time.
        """
        on_delivery_thread = self.on_delivery_thread()
        if not on_delivery_thread and not self._dispatch_thread:
            # Let a running handler and deferred work (the guard's dead-letter moves,
            # delayed re-sends) finish while still connected.
            self._await_callbacks(self._receipt_timeout)
            self._dispatcher.drain(self._receipt_timeout)
        with self._lock:
            if self._state == "closed":
                return
            was_connected = self._state == "connected"
            self._state = "closed"
            self._stop.set()
            self._connected.clear()
            conn, self._conn = self._conn, None
            self._generation += 1
            self._receiver_thread = None
            thread = self._reconnect_thread
        disconnect: _Batch | None = None
        if conn is not None:
            if was_connected:
                rid = self._new_id("disconnect")
                disconnect = self._register([rid])
                try:
                    # Protocol12.disconnect only sends the frame; Connection12.disconnect would
                    # then wait for the receiver thread without any timeout.
                    stomp.protocol.Protocol12.disconnect(conn, receipt=rid)
                except Exception as exc:
                    log.debug("DISCONNECT to %s failed: %r", self.where, exc)
                    disconnect = None
            if on_delivery_thread and disconnect is not None:
                batch = disconnect
                self._dispatcher.submit(lambda: self._finish_disconnect(conn, batch))
            else:
                self._finish_disconnect(conn, disconnect)
        with self._lock:
            self._fail_pending(f"adapter for {self.where} was closed", spare=disconnect)
            self._subs.clear()
            self._unacked.clear()
            self._transactions.clear()
        # Deliveries still queued (dispatch_thread=True) are skipped unacknowledged: the broker
        # redelivers them.
        self._dispatcher.stop(timeout=self._receipt_timeout, join=not on_delivery_thread)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._connect_timeout + 1)

    def _finish_disconnect(self, conn: Any, batch: _Batch | None) -> None:
        """Wait (bounded) for the DISCONNECT's RECEIPT, then close the socket."""
        if batch is not None and not batch.done.wait(self._receipt_timeout):
            log.warning("no RECEIPT for DISCONNECT from %s within %gs", self.where,
                        self._receipt_timeout)
            with self._lock:
                for rid in batch.ids:
                    self._pending.pop(rid, None)
        self._drop(conn)

    # -- events from the receiver thread --------------------------------------------------------

    def _on_connected(self, generation: int, frame: Any) -> None:
        with self._lock:
            if generation != self._generation or self._handshake is None:
                return
            # CONNECTED is read by the connection's receiver thread: deliveries come from it.
            self._receiver_thread = threading.current_thread()
            self._handshake.server = frame.headers.get("server", "")
            self._handshake.done.set()

    def _on_receipt(self, generation: int, frame: Any) -> None:
        rid = frame.headers.get("receipt-id")
        if rid is not None:
            with self._lock:
                self._resolve(rid, None)

    def _send_receipt(self, frame: Any) -> bool:
        """The receiver's shortcut for the RECEIPT of a SEND (see _install_fast_receiver):
        resolved here; anything else (DISCONNECT, SUBSCRIBE, COMMIT...) goes the usual way."""
        rid = frame.headers.get("receipt-id")
        if rid is None or not rid.startswith(self._send_prefix):
            return False
        with self._lock:
            self._resolve(rid, None)
        return True

    def _on_error(self, generation: int, frame: Any) -> None:
        text = _describe_error(frame)
        rid = frame.headers.get("receipt-id")
        with self._lock:
            if generation != self._generation:
                return
            self._last_error = text
            if self._state == "connecting" and self._handshake is not None \
                    and not self._handshake.done.is_set():
                self._handshake.error = text
                self._handshake.done.set()
                return
            if rid is not None and self._resolve(rid, text):
                return
            # No receipt-id (always so on RabbitMQ): see the module docstring.
            open_txs = [tx for tx in self._transactions.values() if tx.generation == generation]
            if open_txs:
                for tx in open_txs:
                    if tx.failure is None:
                        tx.failure = text
                log.warning("%s from %s while transaction(s) %s open: they will roll back",
                            text, self.where, ", ".join(tx.id for tx in open_txs))
                return
            if self._pending:
                self._resolve(next(iter(self._pending)), text)
                return
        log.error("%s from %s, not tied to any request", text, self.where)

    def _on_disconnected(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            if self._state == "connecting":
                if self._handshake is not None and not self._handshake.done.is_set():
                    self._handshake.error = self._last_error or "connection closed by the broker"
                    self._handshake.done.set()
                self._generation += 1
                return
            if self._state != "connected":
                return
            reason = self._last_error or "connection closed"
            self._generation += 1
            self._conn = None
            self._connected.clear()
            self._fail_pending(f"connection to {self.where} lost before the RECEIPT "
                               f"({reason}); the broker may or may not have the frame")
            self._unacked.clear()  # the broker redelivers them; their ack ids are void
            if self._reconnect_attempts == 0 or self._stop.is_set():
                self._state = "failed"
                log.error("connection to %s lost (%s); reconnecting is disabled", self.where,
                          reason)
                return
            self._state = "reconnecting"
            thread = threading.Thread(target=self._reconnect_loop, daemon=True,
                                      name="mqguard-stomp-reconnect")
            self._reconnect_thread = thread
        log.warning("connection to %s lost (%s): reconnecting", self.where, reason)
        thread.start()

    def _reconnect_loop(self) -> None:
        delay = self._reconnect_delay
        for attempt in range(1, self._reconnect_attempts + 1):
            if self._stop.wait(delay):
                return
            try:
                self._open(resubscribe=True, expected=("reconnecting",))
            except AdapterError as exc:
                with self._lock:
                    if self._state != "reconnecting":  # closed meanwhile
                        return
                log.warning("reconnect attempt %d/%d to %s failed: %s", attempt,
                            self._reconnect_attempts, self.where, exc)
                delay = min(max(delay * 2, 0.05), self._reconnect_max_delay)
                continue
            log.info("reconnected to %s after %d attempt(s), %d subscription(s) restored",
                     self.where, attempt, len(self._subs))
            return
        with self._lock:
            if self._state == "reconnecting":
                self._state = "failed"
        log.error("giving up on %s after %d reconnect attempts; call connect() to retry",
                  self.where, self._reconnect_attempts)

    def _on_message(self, generation: int, frame: Any) -> None:
        headers: dict[str, str] = dict(frame.headers)
        sub_id = headers.get("subscription", "")
        with self._lock:
            if generation != self._generation:
                return
            sub = self._subs.get(sub_id)
            if sub is None:
                log.debug("MESSAGE for unknown subscription %r from %s dropped (unacked, so the "
                          "broker redelivers it)", sub_id, self.where)
                return
            if headers.get("browser") == "end":  # ActiveMQ: end of a browse, not a message
                if self._dispatch_thread:
                    # Through the dispatcher, so it is set after the browsed messages.
                    self._dispatcher.submit(sub.browse_end.set)
                else:
                    sub.browse_end.set()
                return
            ack_id = headers.get("ack")
            if ack_id is not None and sub.ack != "auto":
                self._unacked[ack_id] = sub_id
            broker = self.broker
        body = frame.body
        if not isinstance(body, bytes):
            body = str(body or "").encode("utf-8")
        message = Message.from_wire(sub.address, body, headers,
                                    broker_message_id=headers.get("message-id"),
                                    exclude=BROKER_MESSAGE_HEADERS)
        delivery = Delivery(
            message=message,
            subscription_id=sub_id,
            ack_token=ack_id if sub.ack != "auto" else None,
            redelivered=headers.get("redelivered") == "true",
            native_delivery_count=native_delivery_count(broker, headers, quorum=sub.quorum),
            raw_headers=headers,
        )
        if self._dispatch_thread:
            self._dispatcher.submit(lambda: self._deliver(generation, sub, delivery))
        else:
            self._call(sub, delivery)  # inline: generation and subscription checked above

    def _deliver(self, generation: int, sub: _Subscription, delivery: Delivery) -> None:
        # On the dispatcher thread (dispatch_thread=True).
        with self._lock:
            current = generation == self._generation and self._subs.get(sub.id) is sub
        if not current:
            # Its connection is gone (the broker redelivers it) or it was unsubscribed.
            log.debug("delivery of %s on %s skipped: its connection or subscription has ended",
                      delivery.message.message_id or delivery.ack_token, sub.address)
            return
        self._call(sub, delivery)

    def _call(self, sub: _Subscription, delivery: Delivery) -> None:
        self._callbacks_begun += 1
        try:
            sub.callback(delivery)
        except Exception:
            log.exception("delivery callback of subscription %s (%s) raised; the message stays "
                          "unacknowledged", sub.id, sub.address)
        finally:
            self._callbacks_done += 1

    def _await_callbacks(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until the delivery callback running now has returned.

        A handler that fails while its consumer closes still has its outcome to settle
        (ActiveMQ: a delayed re-send deferred to the dispatcher, then the original's ACK);
        unsubscribing first would drop its ack token, so the broker would redeliver the
        message at once, skipping the redelivery delay, besides the delayed copy.
        """
        target = self._callbacks_begun
        deadline = time.monotonic() + timeout
        while self._callbacks_done < target and time.monotonic() < deadline:
            time.sleep(0.002)

    # -- receipts -------------------------------------------------------------------------------

    def _register(self, ids: list[str]) -> _Batch:
        batch = _Batch(ids)
        with self._lock:
            for index, rid in enumerate(ids):
                self._pending[rid] = (batch, index)
        return batch

    def _resolve(self, rid: str, error: str | None) -> bool:
        # Caller holds the lock.
        entry = self._pending.pop(rid, None)
        if entry is None:
            return False
        batch, index = entry
        if error is not None:
            batch.errors[index] = error
        batch.remaining -= 1
        if batch.remaining <= 0:
            batch.done.set()
        return True

    def _fail_pending(self, reason: str, *, spare: _Batch | None = None) -> None:
        # Caller holds the lock. ``spare``: a batch still to be answered (close()'s DISCONNECT).
        for rid, (batch, _index) in list(self._pending.items()):
            if batch is not spare:
                self._resolve(rid, reason)

    def _await(self, batch: _Batch, what: str, deadline: float | None = None) -> None:
        # ``deadline`` (monotonic): receipts written earlier are owed by then, not a full
        # receipt_timeout after the caller got round to waiting for them.
        timeout = (self._receipt_timeout if deadline is None
                   else max(0.0, deadline - time.monotonic()))
        if not batch.done.wait(timeout):
            with self._lock:
                missing = sum(1 for rid in batch.ids if self._pending.pop(rid, None) is not None)
            raise AdapterError(f"no RECEIPT from {self.where} within {self._receipt_timeout:g}s "
                               f"for {missing} of {len(batch.ids)} {what}; the broker may or "
                               "may not have them")
        if batch.errors:
            first = min(batch.errors)
            if len(batch.ids) == 1:
                raise AdapterError(f"{what} failed on {self.where}: {batch.errors[first]}")
            raise AdapterError(
                f"{len(batch.errors)} of {len(batch.ids)} {what} failed on {self.where} "
                f"(indexes {sorted(batch.errors)[:20]}); first, #{first}: {batch.errors[first]}")

    def _require_conn(self, action: str) -> Any:
        # Caller holds the lock.
        if self._state == "connected" and self._conn is not None:
            return self._conn
        if self._state == "reconnecting":
            why = f"the connection was lost ({self._last_error or 'closed'}) and is being restored"
        elif self._state == "failed":
            why = "the connection was lost and reconnecting failed; call connect()"
        elif self._state == "closed":
            why = "the adapter is closed"
        else:
            why = "connect() has not been called"
        raise AdapterError(f"cannot {action} on {self.where}: {why}")

    # -- sending --------------------------------------------------------------------------------

    #: JMS selector of the messages expired by a time in epoch ms (ActiveMQ; the reaper's).
    expired_selector = staticmethod(expired_selector)
    #: STOMP destination of an mqguard address (``orders.eu`` -> ``/queue/orders.eu``).
    destination = staticmethod(destination_of)

    def _send_headers(self, message: Message, broker: str) -> dict[str, str]:
        return send_headers(message, broker, persistent=self._persistent,
                            native_expiry=self._native_expiry)

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        """Send one message; returns once the broker's RECEIPT arrived (outside a transaction).

        Inside a transaction the SEND is not receipted (see :meth:`commit`). Raises
        AdapterError on an ERROR frame, a receipt timeout, while disconnected, and at once
        (nothing sent) in a delivery callback: see :meth:`on_delivery_thread`.
        """
        self.send_many((message,), transaction=transaction)

    def send_many(self, messages: Iterable[Message], *, transaction: str | None = None) -> None:
        """Send several messages, writing all SEND frames before waiting for the receipts.

        One round trip for the whole batch instead of one per message. Raises AdapterError if
        any receipt is missing or an ERROR came back; the message names the failed indexes
        (the others were confirmed).
        """
        if transaction is None:
            self.send_many_nowait(messages).wait()
            return
        self._refuse_on_delivery_thread("send")
        batch_messages = list(messages)
        if not batch_messages:
            return
        with self._lock:
            conn = self._require_conn("send")
            broker = self.broker
            tx = self._transactions.get(transaction)
            if tx is None or tx.generation != self._generation:
                raise AdapterError(f"no open transaction {transaction!r} on {self.where}")
            if tx.failure is not None:
                raise AdapterError(f"transaction {transaction} already failed: {tx.failure}")
        frames = [(self.destination(m.address), m.body, self._send_headers(m, broker))
                  for m in batch_messages]
        for _destination, _body, headers in frames:
            headers["transaction"] = transaction
        self._write(conn, frames)

    def send_many_nowait(self, messages: Iterable[Message]) -> PendingSends:
        """Write receipted SEND frames for ``messages`` and return without waiting.

        The returned handle's ``wait()`` blocks until every receipt arrived (AdapterError as
        :meth:`send_many` otherwise), so a caller can have several batches on their way to
        the broker and wait for them together. Errors found before
        anything is written (disconnected, a header STOMP cannot carry, the delivery
        thread) raise here, and then nothing of ``messages`` was sent.
        """
        self._refuse_on_delivery_thread("send")
        batch_messages = list(messages)
        if not batch_messages:
            return PendingSends(self, _Batch([]), "SEND frames", time.monotonic())
        with self._lock:
            conn = self._require_conn("send")
            broker = self.broker
        frames = [(self.destination(m.address), m.body, self._send_headers(m, broker))
                  for m in batch_messages]
        ids = [self._new_id("send") for _ in frames]
        for (_destination, _body, headers), rid in zip(frames, ids, strict=True):
            headers["receipt"] = rid
        batch = self._register(ids)
        try:
            self._write(conn, frames)
        except AdapterError:
            with self._lock:
                for rid in ids:
                    self._pending.pop(rid, None)
            raise
        return PendingSends(self, batch, "SEND frame" if len(ids) == 1 else "SEND frames",
                            time.monotonic() + self._receipt_timeout)

    def _write(self, conn: Any, frames: list[tuple[str, bytes, dict[str, str]]]) -> None:
        transport = conn.transport
        try:
            if transport.blocking:
                # Plain TCP: stomp.py writes to the socket under its own lock, frame by frame
                # and through its listeners. Encoding here and writing whole chunks of frames
                # per sendall() roughly doubles the pipelined send rate (send_many); frames
                # never straddle a chunk, so other threads' frames cannot interleave inside one.
                chunk: list[bytes] = []
                size = 0
                early = FIRST_CHUNK_FRAMES if len(frames) > 2 * FIRST_CHUNK_FRAMES else 0
                for destination, body, headers in frames:
                    encoded = encode_send(destination, headers, body)
                    chunk.append(encoded)
                    size += len(encoded)
                    if size >= WRITE_CHUNK_BYTES or len(chunk) == early:
                        transport.send(b"".join(chunk))
                        chunk, size, early = [], 0, 0
                if chunk:
                    transport.send(b"".join(chunk))
            else:
                # TLS: stomp.py's I/O thread owns the socket; go through its own send path.
                for destination, body, headers in frames:
                    conn.send(destination, body, headers=headers)
        except (stomp.exception.StompException, OSError) as exc:
            raise AdapterError(f"cannot write to {self.where}: connection lost "
                               f"({type(exc).__name__})") from None
        except FrameError as exc:
            # A NUL or a lone surrogate in a header: no STOMP frame can carry it (the reason
            # alone is kept: the detail may quote the value). In a batch large enough to go
            # out in chunks, the chunks before that frame are already written.
            raise AdapterError(f"a message to {self.where} cannot be sent over STOMP: "
                               f"{exc.reason}") from None

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(self, address: str, callback: DeliveryCallback,
                  options: SubscribeOptions | None = None) -> str:
        """Subscribe (receipted, so a bad selector or destination raises AdapterError here).

        ``options.prefetch`` becomes ``activemq.prefetchSize`` (ActiveMQ) or ``prefetch-count``
        (RabbitMQ); ``selector`` and ``browse`` need the broker's capability. A browse is always
        ``ack:auto`` (it consumes nothing); ActiveMQ's closing ``browser:end`` frame is not
        passed on but sets :meth:`wait_browse_end`. Not from a delivery callback (it waits
        for a RECEIPT: AdapterError).
        """
        self._refuse_on_delivery_thread("subscribe")
        opts = options or SubscribeOptions()
        if opts.ack not in ACK_MODES:
            modes = ", ".join(sorted(ACK_MODES))
            raise AdapterError(f"ack mode {opts.ack!r} is not one of {modes}")
        bad = sorted(set(opts.headers) & RESERVED_SUBSCRIBE_HEADERS)
        if bad:
            raise AdapterError(f"SUBSCRIBE headers {', '.join(bad)} are set by the adapter")
        with self._lock:
            conn = self._require_conn("subscribe")
            broker = self.broker
            caps = self.capabilities
        if opts.selector is not None and not caps.selectors:
            raise AdapterError(f"{broker} does not support message selectors ({self.where})")
        if opts.browse and not caps.browse:
            raise AdapterError(f"{broker} does not support browsing ({self.where})")
        headers = dict(opts.headers)
        if opts.prefetch > 0:
            for name in PREFETCH_HEADERS.get(broker, ()):
                headers.setdefault(name, str(opts.prefetch))
        if opts.selector is not None:
            headers["selector"] = opts.selector
        if opts.browse:
            headers["browser"] = "true"
        sub = _Subscription(
            id=self._new_id("sub"), address=address, destination=self.destination(address),
            callback=callback, options=opts, ack="auto" if opts.browse else opts.ack,
            headers=headers, quorum=is_quorum_queue(headers),
        )
        with self._lock:
            self._subs[sub.id] = sub
        try:
            self._subscribe_on(conn, sub)
        except BaseException:
            with self._lock:
                self._subs.pop(sub.id, None)
            raise
        return sub.id

    def _subscribe_on(self, conn: Any, sub: _Subscription) -> None:
        rid = self._new_id("subscribe")
        batch = self._register([rid])
        headers = dict(sub.headers)
        headers["receipt"] = rid
        try:
            conn.subscribe(sub.destination, id=sub.id, ack=sub.ack, headers=headers)
        except (stomp.exception.StompException, OSError) as exc:
            with self._lock:
                self._pending.pop(rid, None)
            raise AdapterError(f"cannot subscribe on {self.where}: connection lost "
                               f"({type(exc).__name__})") from None
        self._await(batch, f"SUBSCRIBE to {sub.destination}")

    def wait_browse_end(self, subscription_id: str, timeout: float) -> bool:
        """For a ``browse`` subscription on ActiveMQ: wait until the browse has finished."""
        self._refuse_on_delivery_thread("waiting for the end of a browse")
        with self._lock:
            sub = self._subs.get(subscription_id)
        if sub is None:
            raise AdapterError(f"no subscription {subscription_id!r}")
        return sub.browse_end.wait(timeout)

    def unsubscribe(self, subscription_id: str) -> None:
        """End a subscription (receipted). Unknown ids are ignored, so it is idempotent.

        In a delivery callback it does not wait for the RECEIPT (only the receiver thread,
        busy in the callback, can read it); no delivery of the subscription follows anyway.
        Elsewhere, jobs deferred before the call (:meth:`defer`) may finish first, within
        ``receipt_timeout``, so that their acks precede the UNSUBSCRIBE.
        """
        if not self._dispatch_thread and not self.on_delivery_thread():
            self._await_callbacks(self._receipt_timeout)
            self._dispatcher.drain(self._receipt_timeout)
        with self._lock:
            sub = self._subs.pop(subscription_id, None)
            conn = self._conn if self._state == "connected" else None
            if sub is not None:
                # A delivery still being handled (another thread) must not ACK after the
                # UNSUBSCRIBE: the broker answers with an ERROR ("Subscription not found"
                # on RabbitMQ) and closes the connection. Its ack now fails here instead,
                # and the broker redelivers the message to the next consumer.
                for token in [t for t, s in self._unacked.items() if s == sub.id]:
                    del self._unacked[token]
        if sub is None or conn is None:
            return
        rid = self._new_id("unsubscribe")
        batch = self._register([rid])
        try:
            conn.unsubscribe(sub.id, headers={"receipt": rid})
        except (stomp.exception.StompException, OSError):
            with self._lock:
                self._pending.pop(rid, None)
            return  # the connection is gone, and the subscription with it
        if self.on_delivery_thread():
            return  # the RECEIPT resolves the batch later; nobody waits for it
        self._await(batch, f"UNSUBSCRIBE from {sub.destination}")

    # -- acknowledgements -----------------------------------------------------------------------

    def _take_ack(self, delivery: Delivery, action: str) -> tuple[Any, str]:
        token = delivery.ack_token
        if token is None:
            raise AdapterError(f"cannot {action}: the delivery came from an ack:auto "
                               "subscription (the broker acknowledged it on delivery)")
        with self._lock:
            conn = self._require_conn(action)
            sub_id = self._unacked.pop(token, None)
            if sub_id is None:
                raise AdapterError(
                    f"cannot {action} delivery {token!r}: it was already acknowledged, or "
                    "its subscription was closed or it arrived over a connection that has "
                    "since been lost (the broker redelivers it)")
            sub = self._subs.get(sub_id)
            if sub is not None and sub.ack == "client":
                # Cumulative: this ACK/NACK also settles every earlier delivery of the
                # subscription (dicts keep delivery order).
                for other in [t for t, s in self._unacked.items() if s == sub_id]:
                    if other == token:
                        break
                    del self._unacked[other]
        return conn, token

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        """ACK a delivery (not receipted: acks are frequent and need no confirmation).

        A no-op for ``ack:auto`` deliveries, which the broker settled itself.
        """
        if delivery.ack_token is None:
            return
        if transaction is not None:
            with self._lock:
                if transaction not in self._transactions:
                    raise AdapterError(f"no open transaction {transaction!r} on {self.where}")
        conn, token = self._take_ack(delivery, "ack")
        try:
            self._write_ack(conn, "ACK", token, transaction=transaction)
        except (stomp.exception.StompException, OSError) as exc:
            raise AdapterError(f"cannot ack on {self.where}: connection lost "
                               f"({type(exc).__name__}); the broker redelivers it") from None

    @staticmethod
    def _write_ack(conn: Any, command: str, token: str, *, transaction: str | None = None,
                   extra: Mapping[str, str] | None = None) -> None:
        """Write an ACK/NACK frame.

        On plain TCP the frame is encoded here (the native codec, STOMP 1.2 escaping) and
        written in one ``send``: stomp.py's generic frame path (listeners, header escaping
        through regexes) costs ~30 us per ACK, the largest single item of a guarded receive.
        A plain ACK issued on the receiver thread is written with the other ACKs of the same
        read turn (:class:`_AckWriter`). TLS goes through stomp.py.
        """
        transport = conn.transport
        writer: _AckWriter | None = getattr(conn, "mqguard_acks", None)
        if writer is None or not transport.blocking:
            if command == "ACK":
                conn.ack(token, transaction=transaction)
            else:
                conn.nack(token, transaction=transaction, **(extra or {}))
            return
        if transaction is None and not extra:
            encoded = encode_one_header(command, "id", token, "1.2")
        else:
            headers = [("id", token)]
            if transaction is not None:
                headers.append(("transaction", transaction))
            headers.extend((extra or {}).items())
            encoded = encode_bodiless(command, headers, "1.2")
        if command == "ACK" and transaction is None:
            writer.ack(encoded)  # coalesced per read turn (see _AckWriter)
        else:
            writer.send(encoded)

    def can_settle(self, delivery: Delivery) -> bool:
        """True while ``delivery`` is unacknowledged on the current connection.

        False once acked or nacked, for ``ack:auto`` deliveries, and after the connection
        it came over was lost (the broker redelivers it on its own).
        """
        with self._lock:
            return delivery.ack_token is not None and delivery.ack_token in self._unacked

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        """NACK a delivery.

        RabbitMQ: ``requeue:true`` puts it back at once, ``requeue:false`` drops or
        dead-letters it. ActiveMQ 5: whatever ``requeue`` says, a NACK is a *poison ack* -- the
        message goes straight to ActiveMQ.DLQ (``capabilities.nack_requeue`` is False), so the
        guard must redeliver by other means there.
        """
        conn, token = self._take_ack(delivery, "nack")
        extra = {"requeue": "true" if requeue else "false"} if self.broker == "rabbitmq" else {}
        try:
            self._write_ack(conn, "NACK", token, extra=extra)
        except (stomp.exception.StompException, OSError) as exc:
            raise AdapterError(f"cannot nack on {self.where}: connection lost "
                               f"({type(exc).__name__})") from None

    # -- transactions ---------------------------------------------------------------------------

    def begin(self) -> str:
        """BEGIN a transaction (not receipted: an ERROR taints it and commit() rolls back).

        Not from a delivery callback (AdapterError): the transaction could not be committed
        there; begin, send and commit it in a :meth:`defer` job or on another adapter.
        """
        self._refuse_on_delivery_thread("begin a transaction")
        tx_id = self._new_id("tx")
        with self._lock:
            conn = self._require_conn("begin a transaction")
            self._transactions[tx_id] = _Transaction(tx_id, self._generation)
        try:
            conn.begin(transaction=tx_id)
        except (stomp.exception.StompException, OSError) as exc:
            with self._lock:
                self._transactions.pop(tx_id, None)
            raise AdapterError(f"cannot begin a transaction on {self.where}: connection lost "
                               f"({type(exc).__name__})") from None
        return tx_id

    def _take_transaction(self, transaction: str, action: str) -> tuple[Any, _Transaction]:
        with self._lock:
            tx = self._transactions.get(transaction)
            if tx is None:
                raise AdapterError(f"cannot {action} {transaction!r}: no such open transaction "
                                   f"on {self.where}")
            if tx.generation != self._generation or self._state != "connected":
                self._transactions.pop(transaction, None)
                raise TransactionRolledBack(
                    transaction, f"the connection to {self.where} was lost; the broker "
                    "discarded the transaction")
            return self._conn, tx

    def commit(self, transaction: str) -> None:
        """COMMIT (receipted) after a barrier that flushes any ERROR of the transaction's SENDs.

        Raises :class:`~mqguard.errors.TransactionRolledBack` when the transaction is known
        not to have been committed (an in-transaction SEND failed, so it was aborted instead;
        the connection was lost), AdapterError when the outcome is unknown (no RECEIPT) or
        when called in a delivery callback (it waits for RECEIPTs; the transaction stays open).
        """
        self._refuse_on_delivery_thread("commit")
        conn, tx = self._take_transaction(transaction, "commit")
        try:
            barrier, rid = self._new_id("barrier"), self._new_id("barrier")
            batch = self._register([rid])
            try:
                conn.begin(transaction=barrier, headers={"receipt": rid})
                conn.abort(transaction=barrier)
            except (stomp.exception.StompException, OSError):
                raise TransactionRolledBack(transaction, f"connection to {self.where} lost "
                                            "before COMMIT") from None
            try:
                self._await(batch, "transaction barrier")
            except AdapterError as exc:
                with self._lock:
                    connected = self._state == "connected" and tx.generation == self._generation
                if not connected:
                    raise TransactionRolledBack(transaction, str(exc)) from None
                raise
            with self._lock:
                failure = tx.failure
            if failure is not None:
                with contextlib.suppress(AdapterError):
                    self._finish(conn, "abort", transaction)
                raise TransactionRolledBack(transaction, failure)
            self._finish(conn, "commit", transaction)
        finally:
            with self._lock:
                self._transactions.pop(transaction, None)

    def abort(self, transaction: str) -> None:
        """ABORT (receipted). A transaction lost with its connection is already discarded.

        AdapterError in a delivery callback (it waits for the RECEIPT).
        """
        self._refuse_on_delivery_thread("abort")
        try:
            conn, _tx = self._take_transaction(transaction, "abort")
        except TransactionRolledBack:
            return
        try:
            self._finish(conn, "abort", transaction)
        finally:
            with self._lock:
                self._transactions.pop(transaction, None)

    def _finish(self, conn: Any, command: str, transaction: str) -> None:
        rid = self._new_id(command)
        batch = self._register([rid])
        try:
            getattr(conn, command)(transaction=transaction, headers={"receipt": rid})
        except (stomp.exception.StompException, OSError):
            with self._lock:
                self._pending.pop(rid, None)
            raise TransactionRolledBack(transaction, f"connection to {self.where} lost before "
                                        f"{command.upper()}") from None
        self._await(batch, f"{command.upper()} of {transaction}")
