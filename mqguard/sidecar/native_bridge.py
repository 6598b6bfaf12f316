"""The native data plane's Python side: the guard, called once per batch.

Each client connection is a session in the extension's tokio runtime
(``native/src/session``): it parses both legs' frames, keeps subscriptions, ack modes,
the receipt chain and the held DISCONNECT, and asks the guard only about what carries
messages, one read at a time: the SENDs of a read, the MESSAGEs of a broker read, the
ACK/NACKs of a client read. Such a batch arrives here as plain data:
:meth:`NativeSessions.handle_batch` is called by the runtime's thread itself, with the
GIL taken there, and turns it into one :meth:`~mqguard.pipeline.Guard.decide_sends`,
:meth:`~mqguard.pipeline.Guard.open_deliveries` or
:meth:`~mqguard.pipeline.Guard.finish_deliveries` call whose verdicts it returns (plain
data again). The session applies them before it goes on, so the order of each
session's frames is kept; no other thread is woken for it.

The sessions' guard state (:class:`BridgedSession`) belongs to the runtime's thread: it
is that thread that calls the guard, and work the guard does elsewhere (acknowledgements
and copies written by a leg's job thread) comes back to it through
``Plane.call_soon_threadsafe``, as it would to an asyncio loop. What the guard writes to
the broker (acknowledgements, NACKs, dead-letter copies, delayed re-sends) goes through
an :class:`~mqguard.sidecar.upstream.UpstreamLeg` that writes to the session's broker
leg directly; its RECEIPTs come back as notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from mqguard.adapter import Delivery
from mqguard.context import HookContext
from mqguard.errors import AdapterError, Nack
from mqguard.events import NullEventLog
from mqguard.message import GUARD_HEADERS, Message, new_message_id
from mqguard.pipeline import Guard, SendResult, TransactionState
from mqguard.sidecar.frames import (
    BROKER_ADDED_BYTES,
    BROKER_ADDED_HEADERS,
    BROKER_STOMP_LIMITS,
    COPY_ADDED_HEADERS,
    Frame,
    FrameLimits,
    encode,
    limits_tuple,
    send_refusal,
)
from mqguard.sidecar.guarding import message_of_send
from mqguard.sidecar.native_oversized import OversizedItem, settle_oversized
from mqguard.sidecar.native_transactions import BridgedTransaction, TransactionFrames
from mqguard.sidecar.native_verdicts import (
    ACKS,
    CONFIRMED,
    DISCONNECT,
    ENDED,
    ERROR,
    FORWARD,
    FORWARD_VERDICT,
    GUARD,
    HOLD,
    LEG_RECEIPT,
    LOCAL,
    LOCAL_VERDICT,
    MESSAGES,
    OPEN,
    OVERSIZED,
    SENDS,
    STARTED,
    TX,
    UNSUBSCRIBED,
    TxItem,
    Verdict,
)
from mqguard.sidecar.upstream import UpstreamLeg
from mqguard.stomp_brokers import (
    BROKER_MESSAGE_HEADERS,
    RESERVED_SEND_HEADERS,
    address_of,
    destination_of,
    detect_broker,
    native_delivery_count,
    send_headers,
)
from mqguard.verdict import Action

if TYPE_CHECKING:
    from mqguard_native import Plane

    from mqguard.sidecar.server import Sidecar

__all__ = ["BYPASS_DELIVERIES", "BYPASS_SENDS", "NACK_REQUEUE", "BridgedSession",
           "NativeClient", "NativeSessionHandle", "NativeSessions", "bypass_flags",
           "outcome_label", "send_bounds"]

log = logging.getLogger("mqguard.sidecar")

#: Seconds the sessions may take to end beyond the drain timeout.
STOP_GRACE = 3.0

#: ``Plane.drain()``'s event kind of a client the runtime refused itself
#: (native/src/transport/plane.rs): why is "max" (max-connections), "fd" (no descriptor
#: left to accept it), "tls", or "upstream-fd" (none left for its broker connection).
_REFUSED = 6

#: What a session may do without the guard (``native/src/session/bypass.rs``): forward
#: SENDs outside transactions, deliver MESSAGEs and settle them.
BYPASS_SENDS: Final = 1
BYPASS_DELIVERIES: Final = 2
#: The broker's NACK requeues (its capability): a bypassed NACK is passed on.
NACK_REQUEUE: Final = 4

#: The hooks a SEND outside transactions goes through (decide_sends, settle_sends).
_SEND_HOOKS: Final = ("before_send", "before_send_batch", "after_send", "after_send_batch",
                      "on_send_exception")
#: The hooks a delivery goes through (open_deliveries, finish_deliveries, a NACK's failure).
_DELIVERY_HOOKS: Final = ("before_deliver", "before_deliver_batch", "after_deliver",
                          "after_deliver_batch", "on_handler_failure", "message_acknowledged",
                          "message_acknowledged_batch", "message_nacked")
#: SEND headers that need this module even when no plugin looks at SENDs: names
#: send_headers refuses, the expirations it converts, the guard's own fields.
_GUARDED_SEND_HEADERS: Final = "\n".join(
    sorted(RESERVED_SEND_HEADERS | GUARD_HEADERS | {"expires", "expiration"})).encode()
#: Room left for the sidecar's receipt line below the size send_refusal allows.
_RECEIPT_ROOM: Final = 1024

class NativeClient:
    """A native session's client connection as the Python side knows it: its peer (the
    socket and its buffers are the runtime's)."""

    __slots__ = ("__weakref__", "peer")

    def __init__(self, peer: str) -> None:
        self.peer = peer


class NativeSessionHandle:
    """A native session as the sidecar counts it (``Sidecar.sessions``), from its accept
    to its end, handshake included. Weakly referable, so that a test can check that an
    ended session leaves nothing alive."""

    __slots__ = ("__weakref__", "_client", "label", "peer")

    def __init__(self, session_id: int, peer: str) -> None:
        self.label = f"n{session_id}"
        self.peer = peer
        #: The client connection, as a test looks for it.
        self._client = NativeClient(peer)

    def shutdown(self) -> None:
        """Graceful stop: the runtime ends native sessions when the plane closes."""


class BridgedSession:
    """What the guard needs of one native session: its broker, its adapter (the broker
    leg), the SENDs awaiting the broker's RECEIPT, the deliveries awaiting the client."""

    def __init__(self, owner: NativeSessions, session_id: int, peer: str, version: str,
                 server: str | None, broker_leg: int) -> None:
        self.id = session_id
        self.label = f"n{session_id}"
        self.peer = peer
        self.version = version
        self.broker = detect_broker(server)
        plane = owner.plane
        self._plane = plane
        self._broker_leg = broker_leg
        # Created on the runtime's thread (the OPEN batch): the leg's delivery thread.
        self.leg = UpstreamLeg(plane, self._write_frame, broker=self.broker,
                               version=version,
                               native_expiry=owner.sidecar.config.native_expiry,
                               label=self.label, write_wire=self._write_wire)
        self.producer_id = new_message_id()
        self.sequence = itertools.count(1)
        #: Forwarded SENDs by the session's sequence number, until confirmed or failed.
        self.sent: dict[int, SendResult] = {}
        #: Deliveries handed to the client and not settled yet, by ack token.
        self.pending: dict[str, tuple[Delivery, HookContext]] = {}
        self.holds = itertools.count(1)
        #: While a batch is decided: the broker writes it makes, joined (see flush).
        self.batching = False
        self.out: list[bytes] = []
        self.transactions: dict[str, BridgedTransaction] = {}
        #: What to do when the chain entry of a transaction frame is confirmed or failed
        #: (COMMIT), by the frame's sequence number.
        self.callbacks: dict[int, tuple[Callable[[], None], Callable[[str], None]]] = {}

    def _write_frame(self, frame: Frame) -> None:
        self._write_wire(encode(frame, self.version))

    def _write_wire(self, data: bytes) -> None:
        # Inside a batch, the guard's writes (one ACK per delivery...) leave together
        # when it is decided (see flush); outside one (a job's), at once.
        if self.batching:
            self.out.append(data)
        else:
            self._plane.write(self._broker_leg, data)

    def flush(self) -> None:
        """Write what the guard wrote to the broker while deciding a batch."""
        self.batching = False
        if self.out:
            data = b"".join(self.out)
            self.out.clear()
            self._plane.write(self._broker_leg, data)


class NativeSessions:
    """The native data plane of one sidecar: the runtime, its sessions' guard state."""

    def __init__(self, sidecar: Sidecar, loop: asyncio.AbstractEventLoop) -> None:
        from mqguard_native import Plane

        self.sidecar = sidecar
        self.guard = sidecar.guard
        self.metrics = sidecar.metrics
        self.loop = loop
        self.plane: Plane = Plane()
        self._sessions: dict[int, BridgedSession] = {}
        self._handles: dict[int, NativeSessionHandle] = {}
        #: Protocol errors of the runtime's sessions counted in the metrics so far.
        self._protocol_errors = 0
        #: The runtime's other totals counted in the metrics so far, by (metric, label).
        self._counted: dict[tuple[str, str], int] = {}
        self._counting = threading.Lock()
        self._fd = self.plane.wake_fd()
        loop.add_reader(self._fd, self.dispatch)
        #: What the sessions may do without the guard: decided once, plugins are fixed.
        self.bypass = bypass_flags(self.guard)
        #: Bypassed sends and deliveries counted in the metrics so far.
        self._bypassed = (0, 0)

    # -- life cycle ----------------------------------------------------------------------

    def listen(self, hosts: list[str], port: int, *, refusal: bytes, limits: FrameLimits,
               broker_limits: FrameLimits, tls_files: tuple[str, str] | None,
               max_tls_handshakes: int) -> int:
        """Listen on every host and serve each client with a native session; the port."""
        config = self.sidecar.config
        upstream = self.sidecar.upstream
        if upstream.ssl_context is not None:
            cafile = upstream.cafile
            if cafile is None and not upstream.insecure:
                paths = ssl.get_default_verify_paths()
                cafile = paths.cafile or paths.openssl_cafile
            self.plane.upstream_tls(cafile, upstream.insecure)
        cert, key = tls_files if tls_files is not None else (None, None)
        sidecar = self.sidecar
        if sidecar.max_sessions < config.max_connections:
            full = (f"too many connections (the sidecar's limit on open files allows "
                    f"{sidecar.max_sessions}; max-connections = {config.max_connections})")
        else:
            full = f"too many connections (max-connections = {sidecar.max_sessions})"
        return self.plane.serve_sessions(
            hosts, port, refusal, limits_tuple(limits), limits_tuple(broker_limits),
            upstream.host, upstream.port, upstream.where, config.connect_timeout_ms,
            config.drain_timeout_ms, upstream.ssl_context is not None, cert, key,
            max_tls_handshakes, config.connect_timeout_ms, self.handle_batch,
            max_sessions=sidecar.max_sessions, max_handshakes=sidecar.max_handshakes,
            handshake_bytes=min(config.max_handshake_frame_bytes, config.max_frame_bytes),
            full_refusal=encode(Frame("ERROR", [("message", full)]), "1.0"))

    def close_listeners(self) -> None:
        self.plane.close_listeners()

    def close(self, timeout: float = 1.0) -> None:
        """Graceful: every session reads no more client frames, lets what is in flight
        settle (``timeout``: the drain timeout), tells its client with an ERROR and ends;
        then stop the runtime (sessions still open then are dropped) and stop watching it."""
        # The sessions end on the runtime's thread, which calls the guard meanwhile (the
        # GIL is given up while waiting).
        left = self.plane.stop_sessions(int((timeout + STOP_GRACE) * 1000))
        if left:
            log.warning("%d native session(s) had not ended %.1f s after the sidecar began "
                        "to stop; dropped", left, timeout + STOP_GRACE)
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self._fd)
        self.plane.shutdown(int(timeout * 1000))
        for session in list(self._sessions.values()):
            self._ended(session, "shutdown", [], 0)
        self._sessions.clear()
        for handle in self._handles.values():
            self.sidecar.sessions.discard(handle)
        self._handles.clear()

    def refresh_metrics(self) -> None:
        """Copy the runtime's counts into the metrics (before a scrape): frames, octets
        read, broker connections failed or lost, malformed broker frames."""
        metrics = self.metrics
        for direction, command, frames in self.plane.frame_counts():
            metrics.frame_counts(direction)[command].value = float(frames)
        with self._counting:
            for metric, label, count in self.plane.counters():
                if metric == "bytes":
                    metrics.bytes.labels(label).value = float(count)
                    continue
                counter = (metrics.upstream_failures if metric == "upstream_failures"
                           else metrics.protocol_errors)
                seen = self._counted.get((metric, label), 0)
                if count > seen:
                    counter.labels(label).inc(count - seen)
                    self._counted[(metric, label)] = count
        self._count_protocol_errors()
        # What the sessions passed on without the guard counts as the guard's CONTINUE.
        sends, deliveries = self.plane.bypassed()
        counted_sends, counted_deliveries = self._bypassed
        if sends > counted_sends:
            self.metrics.messages.labels("send", "continue").inc(sends - counted_sends)
        if deliveries > counted_deliveries:
            self.metrics.messages.labels("deliver", "continue").inc(
                deliveries - counted_deliveries)
        self._bypassed = (sends, deliveries)

    def _count_protocol_errors(self) -> None:
        # From the runtime's thread (a session ended) and the loop's (a scrape): one at a
        # time, or both could add the same errors.
        with self._counting:
            total = self.plane.protocol_errors()
            if total > self._protocol_errors:
                self.metrics.protocol_errors.labels("client").inc(total - self._protocol_errors)
                self._protocol_errors = total

    # -- events --------------------------------------------------------------------------

    def handle_batch(self, session_id: int, asked: bool, payload: tuple[int, object]
                     ) -> list[Verdict] | None:
        """One batch of a native session, on the runtime's thread: its verdicts (None
        when deciding failed: that session ends with an ERROR)."""
        try:
            verdicts = self._handle(session_id, payload)
        except Exception:
            log.exception("native session n%d: deciding a batch failed inside the "
                          "sidecar; closing it", session_id)
            return None
        return verdicts if asked else None

    def dispatch(self) -> None:
        """Handle every pending event of the runtime (the loop's reader callback)."""
        for kind, session_id, batch, payload in self.plane.drain():
            if kind == _REFUSED:
                self._refused(str(batch))
                continue
            if kind != GUARD:
                continue
            batch_id = cast(int, batch)
            try:
                verdicts = self._handle(session_id, cast(tuple[int, object], payload))
            except Exception:
                log.exception("native session n%d: deciding a batch failed inside the "
                              "sidecar; closing it", session_id)
                if batch_id:
                    self.plane.verdicts(batch_id, None)
                continue
            if batch_id:
                self.plane.verdicts(batch_id, verdicts)

    def _refused(self, why: str) -> None:
        if why != "upstream-fd":
            self.sidecar.refused_by_native(why)
            return
        # Not the broker's fault: the sidecar's limit on open files is used up.
        self.metrics.upstream_failures.labels("connect").inc()
        log.warning("native session: no file descriptor left to connect to the broker "
                    "(raise the limit on open files or lower max-connections)")

    def _handle(self, session_id: int, payload: tuple[int, object]) -> list[Verdict]:
        kind, data = payload
        if kind == STARTED:
            host, port = cast(tuple[str, int], data)
            handle = self._handles[session_id] = NativeSessionHandle(session_id,
                                                                     f"{host}:{port}")
            self.sidecar.sessions.add(handle)
            return []
        if kind == OPEN:
            host, port, version, server, broker_leg = cast(
                tuple[str, int, str, str | None, int], data)
            opened = BridgedSession(self, session_id, f"{host}:{port}", version, server,
                              broker_leg)
            self._sessions[session_id] = opened
            self.metrics.connections.inc()
            log.info("session %s: %s connected through to %s (STOMP %s)", opened.label,
                     opened.peer, opened.broker, version)
            return self._opened(opened)
        if kind == ENDED:
            outcome, failed, lost = cast(tuple[str, list[int], int], data)
            gone = self._sessions.pop(session_id, None)
            if gone is not None:
                self._ended(gone, outcome, failed, lost)
            self.metrics.connections_total.labels(outcome_label(outcome)).inc()
            self._count_protocol_errors()
            ended = self._handles.pop(session_id, None)
            if ended is not None:
                self.sidecar.sessions.discard(ended)
            return []
        found = self._sessions.get(session_id)
        if found is None:
            return []
        found.batching = True
        try:
            return self._decide(found, kind, data)
        finally:
            found.flush()  # before the verdicts: the session's next writes follow

    def _decide(self, session: BridgedSession, kind: int, data: object) -> list[Verdict]:
        if kind == SENDS:
            return self._sends(session, cast(list[tuple[int, str, str | None,
                                                          list[tuple[str, str]], bytes]], data))
        if kind == MESSAGES:
            return self._messages(session, cast(list[tuple[str, str, bool, str, str,
                                                             list[tuple[str, str]], bytes]],
                                                 data))
        if kind == ACKS:
            return self._acks(session, cast(list[tuple[bool, list[str], str | None]], data))
        if kind == DISCONNECT:
            return [self._after_leg_jobs(session)]
        if kind == TX:
            return TransactionFrames(self, session).handle(cast(TxItem, data))
        if kind == OVERSIZED:
            settle_oversized(self.guard, session.leg, label=session.label,
                             version=session.version, broker=session.broker,
                             item=cast(OversizedItem, data))
            return [LOCAL_VERDICT]
        if kind == CONFIRMED:
            sent = session.sent
            seqs = cast(list[int], data)
            confirmed = [sent.pop(seq) for seq in seqs if seq in sent]
            if confirmed:
                self.guard.settle_sends(confirmed)
            for seq in seqs:
                callback = session.callbacks.pop(seq, None)
                if callback is not None:
                    callback[0]()
        elif kind == LEG_RECEIPT:
            session.leg.receipt(cast(str, data))
        elif kind == UNSUBSCRIBED:
            for token in cast(list[str], data):
                session.pending.pop(token, None)
                session.leg.forget(token)  # the broker takes them back
        return []

    def _opened(self, session: BridgedSession) -> list[Verdict]:
        """The verdicts of a session's OPEN: its broker kind, and what it may do without
        the guard (``native/src/session/bypass.rs``)."""
        flags = self.bypass
        if flags & BYPASS_DELIVERIES and session.leg.capabilities.nack_requeue:
            flags |= NACK_REQUEUE
        if not flags & BYPASS_SENDS:
            return [(LOCAL, flags, session.broker, b"")]
        # The session's SENDs get ids of a producer of their own: its numbers never meet
        # those this side gives the SENDs it still decides (session.producer_id).
        return [(LOCAL, flags, session.broker, new_message_id().encode()),
                *send_bounds(session.broker, self.sidecar.broker_limits)]

    def _ended(self, session: BridgedSession, outcome: str, failed: list[int], lost: int) -> None:
        sent = session.sent
        unconfirmed = [sent.pop(seq) for seq in failed if seq in sent]
        # Anything left was neither confirmed nor reported failed: unknown outcome too.
        unconfirmed.extend(sent.values())
        sent.clear()
        if unconfirmed:
            self.guard.settle_sends(failed=unconfirmed, error=AdapterError(
                f"session ended ({outcome}) before the broker confirmed the send"))
        callbacks, session.callbacks = session.callbacks, {}
        for _, on_fail in callbacks.values():
            on_fail(f"session ended ({outcome})")
        self._end_open_transactions(session, outcome)
        if lost:
            log.warning("session %s: %d receipt(s) the client asked for will not come: the "
                        "connection ended first", session.label, lost)
        session.pending.clear()
        session.leg.lost(outcome)
        session.leg.close()
        self.metrics.connections.dec()

    def _end_open_transactions(self, session: BridgedSession, outcome: str) -> None:
        """The connection ended with transactions neither committed nor aborted: the broker
        drops them, so the guard rolls them back too (their duplicate ids are released)."""
        open_transactions, session.transactions = session.transactions, {}
        for transaction in open_transactions.values():
            state = transaction.state
            try:
                self.guard.rolled_back(state, self.transaction_context(session, state),
                                       f"session ended before COMMIT ({outcome})")
            except Exception:
                log.exception("session %s: ending transaction %s failed", session.label,
                              state.transaction_id)

    def transaction_context(self, session: BridgedSession, state: TransactionState) -> HookContext:
        ctx = self.guard.transaction_context(session.leg.capabilities, session.broker, state)
        # The sender its SENDs were decided with: clients choose transaction ids, so two
        # connections may use the same one, and plugins tell them apart by sender.
        ctx.sender = session.producer_id
        return ctx

    # -- SENDs ---------------------------------------------------------------------------

    def _sends(self, session: BridgedSession,
               items: list[tuple[int, str, str | None, list[tuple[str, str]], bytes]]
               ) -> list[Verdict]:
        """The SENDs of one read, decided as one batch (``Guard.decide_sends``); at an ERROR
        nothing behind it is forwarded and what the batch reserved for those is released."""
        guard = self.guard
        messages = [message_of_send(body, destination, dict(headers),
                                    producer_id=session.producer_id,
                                    sequence=session.sequence, broker=session.broker)
                    for _, destination, _, headers, body in items]
        started = time.perf_counter()
        decision = guard.decide_sends(messages, session.leg.capabilities,
                                      broker=session.broker, role="sidecar",
                                      sender=session.producer_id)
        results = decision.results
        if results:
            self.metrics.send_guard.observe_many(
                (time.perf_counter() - started) / len(results), len(results))
        verdicts: list[Verdict] = []
        for position, result in enumerate(results):
            seq, destination, _, _, body = items[position]
            verdict = self._send_verdict(session, seq, destination, body, result)
            verdicts.append(verdict)
            if verdict[0] == ERROR:
                # Nothing after it reaches the broker: what the batch reserved for those
                # is given back.
                guard.settle_sends(failed=results[position + 1:], error=AdapterError(
                    "not sent: an earlier SEND on this connection failed"))
                break
        return verdicts

    def send_frame(self, session: BridgedSession, destination: str, body: bytes,
                   result: SendResult, transaction: str | None
                   ) -> tuple[bytes, None] | tuple[None, Verdict]:
        """The SEND to forward for an accepted ``result`` (the client's message or its
        moved copy), or the ERROR verdict refusing it."""
        message = result.forward
        assert message is not None
        if result.moved:
            destination = destination_of(message.address)
        if message.expiration:
            self.sidecar.watch_expiring(message.address)
        guard = self.guard
        try:
            headers = send_headers(message, session.broker, persistent=False,
                                   native_expiry=self.sidecar.config.native_expiry)
        except AdapterError as exc:
            if transaction is None:
                guard.settle_sends(failed=(result,), error=exc)  # frees a reserved id
            return None, (ERROR, 0, str(exc)[:200], b"")
        out = Frame("SEND", [("destination", destination)], body)
        out.headers.extend(headers.items())
        if transaction is not None:
            out.headers.append(("transaction", transaction))
        data = encode(out, session.version)
        # What the broker would refuse, or could never deliver back through the broker
        # leg, is refused here: a confirmed send must be one the broker keeps and delivers.
        refusal = send_refusal(data, len(out.headers), len(body),
                               self.sidecar.broker_limits, session.broker)
        if refusal is not None:
            if transaction is None:
                guard.settle_sends(failed=(result,), error=AdapterError(refusal))
            return None, (ERROR, 0, f"message refused: {refusal}"[:200],
                          f"not sent to {destination}: {refusal}".encode())
        return data, None

    def _send_verdict(self, session: BridgedSession, seq: int, destination: str, body: bytes,
                      result: SendResult) -> Verdict:
        verdict = result.verdict
        self.metrics.message("send", verdict.action.value)
        if verdict.action is Action.REJECT:
            return (ERROR, 0, f"message rejected: {verdict.reason}"[:200], b"")
        message = result.forward
        if message is None:
            return LOCAL_VERDICT  # DROP: the send "succeeds" for the client (Artemis)
        data, refused = self.send_frame(session, destination, body, result, None)
        if data is None:
            assert refused is not None
            return refused
        session.sent[seq] = result
        return (FORWARD, 0, "", data)

    # -- MESSAGEs ------------------------------------------------------------------------

    def _messages(self, session: BridgedSession,
                  items: list[tuple[str, str, bool, str, str, list[tuple[str, str]], bytes]]
                  ) -> list[Verdict]:
        """The guarded MESSAGEs of one broker read, opened in one batch."""
        leg = session.leg
        deliveries: list[Delivery] = []
        queues: list[str] = []
        for sub_id, destination, quorum, _, token, headers, body in items:
            raw = dict(headers)
            queue = address_of(destination)
            message = Message.from_wire(queue, body, raw,
                                        broker_message_id=raw.get("message-id"),
                                        exclude=BROKER_MESSAGE_HEADERS)
            deliveries.append(Delivery(
                message, sub_id, token, redelivered=raw.get("redelivered") == "true",
                native_delivery_count=native_delivery_count(session.broker, raw,
                                                            quorum=quorum),
                raw_headers=raw))
            queues.append(queue)
            leg.delivered(token)
        started = time.perf_counter()
        opened = self.guard.open_deliveries(leg, deliveries, queues)
        self.metrics.deliver_guard.observe_many(
            (time.perf_counter() - started) / len(deliveries), len(deliveries))
        verdicts: list[Verdict] = []
        auto: list[tuple[Delivery, HookContext, BaseException | None]] = []
        for (_, _, _, mode, token, _, _), delivery, ctx in zip(items, deliveries, opened,
                                                                strict=True):
            if ctx is None:
                self.metrics.message("deliver", "taken")
                verdicts.append(LOCAL_VERDICT)
                continue
            self.metrics.message("deliver", "continue")
            verdicts.append(FORWARD_VERDICT)
            if mode == "auto":
                auto.append((delivery, ctx, None))  # settled as soon as it is written
            else:
                session.pending[token] = (delivery, ctx)
        if auto:
            self.guard.finish_deliveries(leg, auto)
        return verdicts

    # -- ACK / NACK ----------------------------------------------------------------------

    def _acks(self, session: BridgedSession, items: list[tuple[bool, list[str], str | None]]
              ) -> list[Verdict]:
        """The ACK/NACKs of one client read, finished in one batch; a NACK's receipt (and
        a DISCONNECT behind it) waits for the work it left on the broker leg."""
        finished: list[tuple[Delivery, HookContext, BaseException | None]] = []
        nacked = False
        pending = session.pending
        for nack, tokens, _ in items:
            error = Nack("NACK from the client") if nack else None
            nacked = nacked or nack
            for token in tokens:
                entry = pending.pop(token, None)
                if entry is not None:
                    finished.append((entry[0], entry[1], error))
        if finished:
            self.guard.finish_deliveries(session.leg, finished)
        verdicts: list[Verdict] = []
        for nack, _, _ in items:
            verdicts.append(self._after_leg_jobs(session) if nack else LOCAL_VERDICT)
        return verdicts

    def _after_leg_jobs(self, session: BridgedSession) -> Verdict:
        """A hold released once the jobs the guard deferred on the broker leg so far have
        run (a delayed re-send, a dead-letter copy), or none if no job can run."""
        key = next(session.holds)
        plane = self.plane
        release: Callable[[], None] = lambda: plane.release(session.id, key)  # noqa: E731

        def marker() -> None:
            # Behind the job's own writes, which go the same way. The runtime is gone
            # only when the session is: nothing is left to release.
            with contextlib.suppress(RuntimeError):
                plane.call_soon_threadsafe(release)

        try:
            session.leg.defer(marker)
        except AdapterError:
            return LOCAL_VERDICT
        return (HOLD, key, "", b"")


def bypass_flags(guard: Guard) -> int:
    """What native sessions may do without ``guard``: with no event log, the SENDs
    outside transactions when no plugin implements a send hook (BYPASS_SENDS), the
    deliveries when none implements a delivery hook (BYPASS_DELIVERIES)."""
    if not isinstance(guard.events, NullEventLog):
        return 0
    hook = guard.hook

    def idle(names: tuple[str, ...]) -> bool:
        return not any(getattr(hook, name).get_hookimpls() for name in names)

    return ((BYPASS_SENDS if idle(_SEND_HOOKS) else 0)
            | (BYPASS_DELIVERIES if idle(_DELIVERY_HOOKS) else 0))


def send_bounds(broker: str, leg: FrameLimits | None) -> list[Verdict]:
    """The bounds within which a SEND to ``broker`` can be forwarded without asking
    :func:`~mqguard.sidecar.frames.send_refusal` (which a SEND outside them still is):
    encoded size, header count (destination and ``mqguard-id`` included), header block
    length; the last verdict also names the headers that need this module, one per line.
    Within them no limit of the broker nor of the broker leg ``leg`` can be exceeded."""
    unbounded = 1 << 62
    max_bytes = max_headers = max_head = unbounded
    if leg is not None:
        max_bytes = leg.max_frame_bytes - BROKER_ADDED_BYTES - _RECEIPT_ROOM
        max_headers = leg.max_header_count - BROKER_ADDED_HEADERS - 1
        max_head = leg.max_header_line_bytes
    known = BROKER_STOMP_LIMITS.get(broker)
    if known is not None:
        if known.max_body_bytes is not None:
            max_bytes = min(max_bytes, known.max_body_bytes)
        if known.max_header_count is not None:
            max_headers = min(max_headers, known.max_header_count - COPY_ADDED_HEADERS - 1)
        if known.max_header_line_bytes is not None:
            max_head = min(max_head, known.max_header_line_bytes)
    return [(LOCAL, max(0, max_bytes), "", b""), (LOCAL, max(0, max_headers), "", b""),
            (LOCAL, max(0, max_head), "", _GUARDED_SEND_HEADERS)]


def outcome_label(outcome: str) -> str:
    """Bounded label values: broker error texts must not become label values."""
    known = {"disconnect", "client-closed", "client-lost", "protocol-error", "shutdown",
             "broker-closed", "broker-error", "no-connect", "broker-refused", "client-error"}
    return outcome if outcome in known else "other"
