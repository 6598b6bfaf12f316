"""One proxied client connection: client <-> sidecar <-> broker.

The client's CONNECT goes to the broker unchanged (credentials pass through and
are never logged; the heart-beat header too, so heart-beats are negotiated end
to end and flow through both legs). From then on every frame is relayed, and
the guard acts on the frames that carry messages:

- SEND: ``before_send`` decides (duplicate detection, expiry stamping...); an
  accepted message is forwarded with a receipt of the sidecar's own, and the
  ``sent`` event is written when the broker confirms it. A duplicate is not
  forwarded, yet a receipt the client asked for is still given, in order.
- BEGIN / COMMIT / ABORT: the guard's view of the transaction follows the
  client's; a transaction made rollback-only (a duplicate inside it) is aborted
  at the broker and its COMMIT answered with an ERROR frame.
- SUBSCRIBE: always ``client-individual`` towards the broker, whatever the
  client asked, so the guard settles each delivery itself: ``auto`` clients are
  acked for once their frame is written, ``client`` (cumulative) ACKs become
  individual ones.
- MESSAGE: ``before_deliver`` decides; a suppressed duplicate delivery or an
  expired message never reaches the client. The client's ACK/NACK then finishes
  the delivery (a NACK runs delivery counting: redelivery or dead letter).

A malformed or over-limit frame gets the ERROR frame the STOMP spec asks for
and ends this connection only; a lost broker connection ends the session with
an ERROR frame to the client. Unacknowledged deliveries stay with the broker,
which redelivers them: nothing is lost when a session dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from mqguard.adapter import Delivery
from mqguard.context import HookContext
from mqguard.errors import AdapterError, Nack
from mqguard.events import EventType
from mqguard.hookcall import observe
from mqguard.message import Message, new_message_id
from mqguard.pipeline import SendResult, TransactionState
from mqguard.sidecar.connection import FrameConnection, Items, QuickAck
from mqguard.sidecar.frames import (
    HEARTBEAT,
    MQGUARD_ADDED_HEADERS,
    SERVER_COMMANDS,
    Frame,
    FrameDecoder,
    FrameError,
    Oversized,
    encode,
    encode_one_header,
    send_refusal,
    wire_of,
    with_plain_header,
)
from mqguard.sidecar.guarding import message_of_send
from mqguard.sidecar.outbox import Outbox
from mqguard.sidecar.receipts import CHAIN_RECEIPT_PREFIX, ReceiptChain
from mqguard.sidecar.upstream import UpstreamLeg, ack_headers
from mqguard.stomp_brokers import (
    ACK_MODES,
    BROKER_MESSAGE_HEADERS,
    address_of,
    detect_broker,
    native_delivery_count,
    send_headers,
)
from mqguard.stomp_brokers import destination_of as _destination_of
from mqguard.verdict import Action, Verdict

if TYPE_CHECKING:
    from mqguard.sidecar.server import Sidecar

log = logging.getLogger("mqguard.sidecar")

_session_ids = itertools.count(1)
#: What a SEND's headers say: destination, receipt, transaction, and the message's own
#: headers (first occurrence of each name; framing headers left out).
_SendFields = tuple[str | None, str | None, str | None, dict[str, str]]


@dataclass(slots=True)
class _Subscription:
    id: str
    destination: str
    queue: str
    #: The client's ack mode; towards the broker it is always client-individual.
    mode: str
    browse: bool = False
    quorum: bool = False
    #: Deliveries handed to the client and not settled yet, in delivery order.
    pending: dict[str, tuple[Delivery, HookContext]] = field(default_factory=dict)


@dataclass(slots=True)
class _Transaction:
    state: TransactionState
    #: Deliveries acknowledged inside the transaction: finished at COMMIT.
    acks: list[tuple[_Subscription, Delivery, HookContext]] = field(default_factory=list)


#: connect() errors meaning the process (or system) has no descriptor left.
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})
#: A broker heart-beat goes on to the client unless one went less than this long ago
#: (seconds). EOLs bunched together say nothing more than one, and a client that reads two
#: of them in one go right before a frame can take them for that frame's start: stomp.py
#: then drops the frame (RabbitMQ's EOL after a frame's NUL often arrives in a read of
#: its own and is passed on as a heart-beat, so two in a row are common).
_HEARTBEAT_GAP_S: Final = 0.1


def _no_receipt(receipt_id: str) -> None:
    """The receipt writer of an ended session: nobody is left to receive one."""


class SessionEnded(Exception):
    """Internal: end the session after the ERROR frame was written."""


class ProxySession:
    """Relays one client connection; see the module docstring."""

    def __init__(self, sidecar: Sidecar, client: FrameConnection) -> None:
        """``client`` is the accepted connection, decoding with the client's commands
        (see :meth:`Sidecar.client_connection`)."""
        self.sidecar = sidecar
        self.guard = sidecar.guard
        self.metrics = sidecar.metrics
        self.label = f"s{next(_session_ids)}"
        self._client = client
        self._client_out = Outbox(client, asyncio.get_running_loop())
        peer = client.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._client_decoder = client.decoder
        self._broker_decoder = FrameDecoder(limits=sidecar.broker_limits,
                                            commands=SERVER_COMMANDS)
        #: The TCP quick-ack re-armers of both legs (see QuickAck), closed with them.
        self._quick_acks: list[QuickAck] = []
        self._broker: FrameConnection | None = None
        self._broker_out: Outbox | None = None
        self.version = "1.0"
        self.broker = "unknown"
        self.leg: UpstreamLeg | None = None
        self._chain = ReceiptChain(self._client_receipt)
        #: SENDs the broker confirmed whose "sent" bookkeeping is still to run.
        self._confirmed: list[SendResult] = []
        self._subs: dict[str, _Subscription] = {}
        #: ack token -> its subscription, for the client's ACK/NACK.
        self._token_sub: dict[str, _Subscription] = {}
        self._transactions: dict[str, _Transaction] = {}
        self._sub_ids = itertools.count(1)
        # The session is the producer the consumer audit knows (Guarded producers
        # stamp the same pair); a client that stamps its own keeps them.
        self._producer_id = new_message_id()
        self._sequence = itertools.count(1)
        self._client_done = False  # the client said DISCONNECT or got its ERROR
        #: A DISCONNECT waiting for the receipts owed before it (see _flush_disconnect).
        self._pending_disconnect: Frame | None = None
        self._disconnect_sent = False
        self._shutting_down = False
        #: The sidecar has given (or queued) its ERROR: nothing else may follow it.
        self._ending = False
        #: When the last broker heart-beat went to the client (_HEARTBEAT_GAP_S).
        self._heartbeat_sent = float("-inf")
        #: The sidecar ended the handshake to make room for a newer one (see evict).
        self._evicted = False
        #: How each side's relaying ended (an outcome for metrics), set while relaying.
        self._client_end: asyncio.Future[str] | None = None
        self._broker_end: asyncio.Future[str] | None = None
        #: The per-message counter of guarded deliveries, resolved once.
        self._delivered_count = self.metrics.messages.labels("deliver", "continue")

    # -- life cycle ----------------------------------------------------------------------

    async def run(self) -> str:
        """Serve the connection to its end; returns how it ended (for metrics)."""
        outcome = "error"
        try:
            connect = await self._read_connect()
            if connect is None:
                outcome = "no-connect"
                return outcome
            if not await self._open_broker(connect):
                outcome = "broker-refused"
                return outcome
            outcome = await self._relay()
            return outcome
        except SessionEnded as ended:
            outcome = str(ended) or "ended"
            return outcome
        except Exception:
            log.exception("session %s (%s) failed inside the sidecar", self.label, self.peer)
            self._send_error("internal error in the sidecar; connection closed")
            return outcome
        finally:
            await self._close(outcome)

    def shutdown(self) -> None:
        """Graceful stop: read no more client frames, let the broker confirm what it has."""
        self._shutting_down = True
        if self._client_end is not None:  # relaying; otherwise _relay will not start
            self._end_client("shutdown")

    async def _close(self, outcome: str) -> None:
        lost = self._chain.fail_all(f"session ended ({outcome})")
        self._end_open_transactions(outcome)
        self._settle_confirmed()
        if lost:
            log.warning("session %s: %d receipt(s) the client asked for will not come: the "
                        "connection ended first", self.label, len(lost))
        if self.leg is not None:
            self.leg.lost(outcome)
            self.leg.close()
        for out in (self._broker_out, self._client_out):
            if out is not None:
                with contextlib.suppress(Exception):
                    out.flush()
        for quick_ack in self._quick_acks:
            quick_ack.close()  # before the connections: a duplicate would keep one open
        self._quick_acks.clear()
        for connection in (self._broker, self._client):
            if connection is None:
                continue
            connection.stop_reading()
            try:
                await connection.close(2.0)
            except Exception:
                log.debug("session %s: closing a connection", self.label, exc_info=True)
        self._break_cycles()

    def _break_cycles(self) -> None:
        """Break the session's reference cycles, so that reference counting frees it (and
        the up to ``max-frame-bytes`` its decoders hold) as soon as it ends.

        The receipt chain and the upstream leg call back into the session, and the
        connections hold its read callbacks: each a cycle. The sidecar raises the cyclic
        collector's young-generation threshold (gctune), so such a session used to stay
        resident until enough other objects had been allocated: 20 unfinished 12 MiB
        frames kept 200 MB for minutes.
        """
        for connection in (self._broker, self._client):
            if connection is not None:
                connection.release()
        self._chain = ReceiptChain(_no_receipt)
        self.leg = None
        self._subs.clear()
        self._token_sub.clear()
        self._transactions.clear()
        self._client_decoder = self._client.decoder
        if self._broker is not None:
            self._broker_decoder = self._broker.decoder

    # -- connecting ----------------------------------------------------------------------

    def evict(self, reason: str) -> None:
        """End this connection's handshake now: it is the oldest one pending and a newer
        connection needs its place (see Sidecar._accept)."""
        self._evicted = True
        self._send_error(reason)
        self._client.abandon()

    async def _read_connect(self) -> Frame | None:
        try:
            connect = await self._read_connect_frame()
        finally:
            self.sidecar.handshake_over(self)
        # Evicted after its CONNECT was decoded, before it was read here: it has its ERROR.
        return None if self._evicted else connect

    async def _read_connect_frame(self) -> Frame | None:
        timeout = self.sidecar.config.connect_timeout_ms / 1000.0
        try:
            async with asyncio.timeout(timeout):
                async for item in self._client_frames():
                    if item is HEARTBEAT:
                        continue
                    assert isinstance(item, Frame)
                    if item.command not in ("CONNECT", "STOMP"):
                        self._send_error(f"expected CONNECT, got {item.command}")
                        return None
                    return item
        except TimeoutError:
            self._send_error(f"no CONNECT frame within {timeout:g} s")
        except FrameError as exc:
            # Garbage instead of a CONNECT is the client's protocol error, answered like
            # one later in the session (it used to escape as an "internal error" with a
            # logged traceback).
            self._protocol_error(exc)
        except (ConnectionError, OSError):
            # The client reset the connection before its CONNECT was complete: nobody is
            # left to tell, and it is no failure of the sidecar (was logged as one).
            pass
        else:
            if not self._evicted:
                self._truncated_frame()
        return None

    async def _open_broker(self, connect: Frame) -> bool:
        upstream = self.sidecar.upstream
        timeout = self.sidecar.config.connect_timeout_ms / 1000.0
        try:
            async with asyncio.timeout(timeout):
                # On the sidecar's data plane (asyncio's sockets or the native runtime's).
                broker = await self.sidecar.open_upstream(self._broker_decoder,
                                                          self.metrics.bytes.labels("broker"))
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                self._unreachable(exc)
                return False
            # Not the broker's fault: the sidecar's limit on open files is used up.
            self.metrics.upstream_failures.labels("connect").inc()
            log.warning("session %s: no file descriptor left to connect to the broker "
                        "(raise the limit on open files or lower max-connections)",
                        self.label)
            self._send_error("too many connections: the sidecar is out of file descriptors; "
                             "try again later")
            return False
        except (TimeoutError, ssl.SSLError) as exc:
            self._unreachable(exc)
            return False
        self._broker = broker
        self._broker_out = Outbox(broker, asyncio.get_running_loop())
        broker.after_read = self._quick_ack_of(broker)
        try:
            data = encode(connect, "1.0")
        except FrameError as exc:
            # A header the decoder accepted but no frame can carry (a value ending in CR:
            # CONNECT is never escaped): the client's error, not the sidecar's.
            self.metrics.protocol_errors.labels("client").inc()
            self._send_error(f"CONNECT cannot be forwarded: {exc.reason}")
            return False
        broker.write(data)
        try:
            async with asyncio.timeout(timeout):
                async for item in self._broker_frames():
                    if item is HEARTBEAT:
                        continue
                    assert isinstance(item, Frame)
                    if item.command == "CONNECTED":
                        self._connected(item)
                        return True
                    # ERROR (bad credentials...): the client gets the broker's own words.
                    self._write_client(item)
                    self._client_done = True
                    return False
        except TimeoutError:
            self.metrics.upstream_failures.labels("connect").inc()
            self._send_error(f"broker did not answer CONNECT within {timeout:g} s")
            return False
        except (ConnectionError, OSError) as exc:
            # A reset (the broker going down, a proxy in between refusing) is the broker
            # closing the connection, not a failure inside the sidecar.
            log.warning("session %s: broker %s reset the connection during CONNECT: %s",
                        self.label, upstream.where, type(exc).__name__)
        except FrameError as exc:
            self.metrics.protocol_errors.labels("broker").inc()
            log.warning("session %s: malformed frame from the broker: %s", self.label,
                        exc.reason)
            self._send_error("the broker sent a malformed frame during CONNECT")
            return False
        self.metrics.upstream_failures.labels("connect").inc()
        self._send_error("broker closed the connection during CONNECT")
        return False

    def _unreachable(self, exc: BaseException) -> None:
        upstream = self.sidecar.upstream
        self.metrics.upstream_failures.labels("connect").inc()
        log.warning("session %s: broker %s unreachable: %s", self.label, upstream.where,
                    type(exc).__name__)
        self._send_error("broker unreachable", detail=f"{upstream.where}: {exc}")

    def _connected(self, frame: Frame) -> None:
        self.version = frame.get("version") or "1.0"
        self.broker = detect_broker(frame.get("server"))
        if self.broker == "rabbitmq" and self._broker is not None:
            # RabbitMQ's STOMP listener writes with TCP_NODELAY (its default
            # tcp_listen_options): no segment of it waits for our ack, so the quick-ack
            # system call after every read (see QuickAck) buys nothing there.
            quick_ack = self._broker.after_read
            self._broker.after_read = None
            if isinstance(quick_ack, QuickAck):
                quick_ack.close()
                self._quick_acks.remove(quick_ack)
        self._client_decoder.version = self.version
        self._broker_decoder.version = self.version
        # From now on one MESSAGE over the broker leg's limits is dead-lettered, not the
        # end of the session (see _on_oversized).
        self._broker_decoder.oversized = True
        loop = asyncio.get_running_loop()
        self.leg = UpstreamLeg(loop, self._write_broker, broker=self.broker,
                               version=self.version,
                               native_expiry=self.sidecar.config.native_expiry,
                               label=self.label, write_wire=self._write_broker_bytes)
        log.info("session %s: %s connected through to %s (STOMP %s)", self.label, self.peer,
                 self.broker, self.version)
        self._write_client(frame)

    # -- relaying ------------------------------------------------------------------------

    async def _relay(self) -> str:
        client, broker = self._client, self._broker
        assert broker is not None
        loop = asyncio.get_running_loop()
        self._client_end = client_end = loop.create_future()
        self._broker_end = broker_end = loop.create_future()
        # Whichever peer stops reading holds the other side back.
        client.couple(broker)
        broker.couple(client)
        if self._shutting_down:
            self._end_client("shutdown")
        else:
            client.relay(self._on_client_read, self._on_client_end)
        broker.relay(self._on_broker_read, self._on_broker_end)
        await asyncio.wait({client_end, broker_end}, return_when=asyncio.FIRST_COMPLETED)
        client.stop_reading()
        for end in (client_end, broker_end):
            if end.done() and (failure := end.exception()) is not None:
                raise failure  # a bug met while handling a read: run() reports it
        if broker_end.done():
            outcome = broker_end.result()
            if not self._client_done:
                self._send_error("broker connection lost", detail=outcome)
            return outcome
        outcome = client_end.result()
        if outcome == "shutdown":
            self._send_error("the sidecar is shutting down; reconnect")
        # Let the broker confirm what it was given before the connection goes.
        await self._drain_broker(broker_end)
        return outcome

    async def _drain_broker(self, broker_end: asyncio.Future[str]) -> None:
        timeout = self.sidecar.config.drain_timeout_ms / 1000.0
        if not broker_end.done():
            if self._pending_disconnect is None and not self._disconnect_sent:
                # The sidecar's own: its receipt is the chain's, not owed to the client.
                self._disconnect(Frame("DISCONNECT"))
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(broker_end), timeout)
        if self._broker is not None:
            self._broker.stop_reading()

    def _end_client(self, outcome: str) -> None:
        """The client's side of the relay ended (or ends now): read nothing more from it."""
        self._client.stop_reading()
        end = self._client_end
        if end is not None and not end.done():
            end.set_result(outcome)

    def _end_broker(self, outcome: str) -> None:
        if self._broker is not None:
            self._broker.stop_reading()
        end = self._broker_end
        if end is not None and not end.done():
            end.set_result(outcome)

    def _failed(self, end: asyncio.Future[str] | None, exc: BaseException) -> None:
        """A bug met while handling a read: the session ends, run() logs it."""
        self._client.stop_reading()
        if self._broker is not None:
            self._broker.stop_reading()
        if end is not None and not end.done():
            end.set_exception(exc)

    def _hold(self) -> None:
        # The writes of one read leave together when it has been handled (see Outbox).
        self._client_out.hold()
        if self._broker_out is not None:
            self._broker_out.hold()

    def _release(self) -> None:
        try:
            if self._broker_out is not None:
                self._broker_out.release()
            self._client_out.release()
        except Exception as exc:  # a transport refusing a write: a bug, not the peer's doing
            self._failed(self._client_end, exc)

    def _on_client_read(self, items: Items) -> None:
        """The frames of one read of the client, handled within the read callback."""
        self._hold()
        try:
            self._on_client_items(items)
        except SessionEnded as ended:
            self._end_client(str(ended))
        except FrameError as exc:  # a frame that cannot be forwarded as it is
            self._protocol_error(exc)
            self._end_client("protocol-error")
        except OSError:
            self._end_client("client-lost")
        except Exception as exc:
            self._failed(self._client_end, exc)
        else:
            if self._client_done:
                self._end_client("disconnect")
        finally:
            self._release()

    def _on_client_end(self, kind: str, exc: BaseException | None) -> None:
        self._hold()
        try:
            if isinstance(exc, FrameError):
                self._protocol_error(exc)
                self._end_client("protocol-error")
            elif kind == "lost" or self._truncated_frame():
                self._end_client("client-lost")
            else:
                self._end_client("client-closed")
        finally:
            self._release()

    def _on_client_items(self, items: list[Frame | object]) -> None:
        """Handle the frames of one read in order; consecutive plain SENDs as one batch.

        A plain SEND (outside a transaction, with a destination) joins the SENDs right
        before it, and the run is decided together (:meth:`_on_sends`: one duplicate-ID
        reservation per address instead of one per message). Anything else is handled
        on its own, after the run before it. Stops after a frame that ended the client's
        side (DISCONNECT, an ERROR); SessionEnded propagates.
        """
        counts = self.metrics.frame_counts("client")
        count = len(items)
        index = 0
        while index < count:
            item = items[index]
            index += 1
            if item is HEARTBEAT:
                self._write_broker_bytes(b"\n")
                continue
            assert isinstance(item, Frame)
            counts[item.command].value += 1
            if item.command == "ACK" and item.get("transaction") is None:
                # Consecutive ACKs outside transactions: finished as one batch.
                run = [item]
                while index < count:
                    ahead = items[index]
                    if (ahead is HEARTBEAT or ahead.command != "ACK"  # type: ignore[attr-defined]
                            or ahead.get("transaction") is not None):  # type: ignore[attr-defined]
                        break
                    index += 1
                    counts["ACK"].value += 1
                    run.append(ahead)  # type: ignore[arg-type]
                if len(run) == 1:
                    self._on_settle(item)
                else:
                    self._on_acks(run)
            elif item.command != "SEND":
                self._on_client_frame(item)
            else:
                fields = _send_fields(item)
                if fields[2] is not None or not fields[0]:
                    self._on_send(item, fields)  # in a transaction, or an error
                else:
                    sends = [(item, fields)]
                    while index < count:
                        ahead = items[index]
                        if ahead is HEARTBEAT or ahead.command != "SEND":  # type: ignore[attr-defined]
                            break
                        ahead_fields = _send_fields(ahead)  # type: ignore[arg-type]
                        if ahead_fields[2] is not None or not ahead_fields[0]:
                            break
                        index += 1
                        counts["SEND"].value += 1
                        sends.append((ahead, ahead_fields))  # type: ignore[arg-type]
                    self._on_sends(sends)
            if self._client_done:
                return

    def _on_broker_read(self, items: Items) -> None:
        """The frames of one read of the broker, handled within the read callback."""
        self._hold()
        try:
            if self._on_broker_items(items):
                self._settle_confirmed()
                self._end_broker("broker-error")
                return
        except FrameError as exc:
            self._on_broker_end("malformed", exc)
            return
        except OSError as exc:
            self._on_broker_end("lost", exc)
            return
        except Exception as exc:
            self._failed(self._broker_end, exc)
            return
        finally:
            self._release()
        # The client's RECEIPTs and MESSAGEs left above, before the bookkeeping of the
        # confirmed SENDs: a pipelining client waits for its last RECEIPT before it sends
        # again, so that bookkeeping is off its critical path.
        if self._confirmed:
            try:
                self._settle_confirmed()
            except Exception as exc:
                self._failed(self._broker_end, exc)

    def _on_broker_items(self, items: Items) -> bool:
        """Relay the frames of one broker read; True when the broker sent an ERROR."""
        counts = self.metrics.frame_counts("broker")
        count = len(items)
        index = 0
        while index < count:
            item = items[index]
            index += 1
            if item is HEARTBEAT:
                now = time.monotonic()
                if not self._ending and now - self._heartbeat_sent >= _HEARTBEAT_GAP_S:
                    self._heartbeat_sent = now
                    self._write_client_bytes(b"\n")
                continue
            if type(item) is Oversized:
                self._on_oversized(item)
                continue
            assert isinstance(item, Frame)
            counts[item.command].value += 1
            if (item.command == "MESSAGE" and index < count and not self._ending
                    and getattr(items[index], "command", None) == "MESSAGE"):
                # The MESSAGEs of one read are guarded as one batch.
                run = [item]
                while (index < count
                       and getattr(items[index], "command", None) == "MESSAGE"):
                    run.append(items[index])  # type: ignore[arg-type]
                    index += 1
                counts["MESSAGE"].value += len(run) - 1
                self._on_messages(run)
                continue
            if self._on_broker_frame(item):
                return True
        return False

    def _on_broker_end(self, kind: str, exc: BaseException | None) -> None:
        if isinstance(exc, FrameError):
            self.metrics.protocol_errors.labels("broker").inc()
            log.warning("session %s: malformed frame from the broker: %s", self.label, exc)
            self._end_broker(f"broker sent a malformed frame: {exc.reason}")
            return
        self.metrics.upstream_failures.labels("lost").inc()
        self._end_broker("broker-closed")

    async def _client_frames(self) -> AsyncIterator[Frame | object]:
        while (item := await self._client.next()) is not None:
            yield item

    async def _broker_frames(self) -> AsyncIterator[Frame | object]:
        assert self._broker is not None
        while (item := await self._broker.next()) is not None:
            yield item

    def _quick_ack_of(self, connection: FrameConnection) -> QuickAck | None:
        quick_ack = QuickAck.of(connection)
        if quick_ack is not None:
            self._quick_acks.append(quick_ack)
        return quick_ack

    # -- writing -------------------------------------------------------------------------

    def _write_client(self, frame: Frame) -> None:
        # A broker frame relayed unchanged (most MESSAGEs) leaves as its received octets.
        # Client frames are always encoded again instead: that normalises what the broker
        # gets (one content-length, escapes as the version wants).
        self._client_out.write(wire_of(frame, self.version))

    def _write_client_bytes(self, data: bytes) -> None:
        self._client_out.write(data)

    def _write_broker(self, frame: Frame) -> None:
        if self._broker_out is not None:
            self._broker_out.write(encode(frame, self.version))

    def _write_broker_bytes(self, data: bytes) -> None:
        if self._broker_out is not None:
            self._broker_out.write(data)

    def _settle_confirmed(self) -> None:
        """The "sent" event and ``after_send`` of every SEND the broker confirmed since the
        last call, in confirmation order; the events in one append (one timestamp)."""
        confirmed = self._confirmed
        if confirmed:
            batch = confirmed[:]
            confirmed.clear()
            self.guard.settle_sends(batch)

    def _client_receipt(self, receipt_id: str) -> None:
        self._client_out.write(encode_one_header("RECEIPT", "receipt-id", receipt_id,
                                                 self.version))

    def _truncated_frame(self) -> bool:
        """At the client's end of stream: True (and an ERROR) if it ended inside a frame.

        The partial frame is dropped, never forwarded. A client that only half-closed its
        side (or a content-length promising more than it sent) still reads why.
        """
        if not self._client_decoder.buffered:
            return False
        self.metrics.protocol_errors.labels("client").inc()
        log.info("session %s: %s closed its side in the middle of a frame (%d bytes dropped)",
                 self.label, self.peer, self._client_decoder.buffered)
        self._send_error("incomplete frame: the connection ended in the middle of a frame")
        return True

    def _protocol_error(self, exc: FrameError) -> None:
        self.metrics.protocol_errors.labels("client").inc()
        log.info("session %s: malformed frame from %s: %s", self.label, self.peer, exc.reason)
        self._send_error(exc.reason, detail=str(exc)[:500])

    def _send_error(self, message: str, *, receipt: str | None = None, detail: str = "") -> None:
        if self._ending:
            # One ERROR per connection: the client already got (or has queued) its last
            # frame, e.g. the broker's ERROR, while the client side hit a problem of its own
            # (fuzz: a relayed broker ERROR followed by the sidecar's "incomplete frame").
            return
        headers = [("message", message[:200]), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        frame = Frame("ERROR", headers, (detail or message).encode()[:2000])

        def write() -> None:
            with contextlib.suppress(Exception):
                self._write_client(frame)

        # The ERROR is the client's last frame (STOMP: ERROR, then close), so it queues
        # behind the receipts still owed for the frames before the bad one: the broker
        # confirms those while the session drains, or they are failed when it ends
        # (ReceiptChain.fail_all runs this then). Written at once, a RECEIPT could follow
        # the ERROR, which a client has every reason to ignore.
        self._chain.local(None, on_done=write)
        self._client_done = True
        self._ending = True

    def _fail(self, message: str, *, receipt: str | None = None, detail: str = "") -> None:
        """ERROR frame to the client, then the session ends (STOMP: close after ERROR)."""
        self._send_error(message, receipt=receipt, detail=detail)
        raise SessionEnded("client-error")

    # -- client frames -------------------------------------------------------------------

    def _on_client_frame(self, frame: Frame) -> None:
        command = frame.command
        if command == "SEND":
            self._on_send(frame, _send_fields(frame))
        elif command in ("ACK", "NACK"):
            self._on_settle(frame)
        elif command == "SUBSCRIBE":
            self._on_subscribe(frame)
        elif command == "UNSUBSCRIBE":
            self._on_unsubscribe(frame)
        elif command == "BEGIN":
            self._on_begin(frame)
        elif command == "COMMIT":
            self._on_commit(frame)
        elif command == "ABORT":
            self._on_abort(frame)
        elif command == "DISCONNECT":
            self._disconnect(frame)
            self._client_done = True
        else:  # CONNECT / STOMP again
            self._fail(f"{command} on a connection that is already connected")

    def _disconnect(self, frame: Frame) -> None:
        """Hold ``frame`` (a DISCONNECT) until every receipt owed before it came back and the
        work the guard deferred on the broker leg so far has run (see _after_leg_jobs)."""
        self._pending_disconnect = frame
        if self.leg is not None:
            self._after_leg_jobs(None)
        self._flush_disconnect()

    def _after_leg_jobs(self, client_receipt: str | None) -> None:
        """Owe ``client_receipt`` once the jobs deferred on the broker leg so far have run.

        Such a job (a delayed re-send, a dead-letter copy) waits for a RECEIPT of the leg's
        own, outside the receipt chain; a DISCONNECT forwarded meanwhile would end the
        connection first, the job would fail and the broker would redeliver the original
        at once, skipping the redelivery delay. The leg runs its jobs one at a time in
        order, so a marker job queued now runs after them.
        """
        assert self.leg is not None
        release = self._chain.hold(client_receipt)
        loop = asyncio.get_running_loop()

        def done() -> None:
            release()
            self._flush_disconnect()

        def marker() -> None:
            # The loop is gone only when the session is: nothing is left to release.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done)

        try:
            self.leg.defer(marker)
        except AdapterError:
            done()  # the leg's jobs have stopped: nothing is pending there

    def _flush_disconnect(self) -> None:
        """Send the held DISCONNECT once every receipt owed for earlier frames came back.

        RabbitMQ may answer a DISCONNECT before the receipts of SENDs ahead of it and
        then close: those sends would be recorded as unknown outcomes (send_failed)
        although the broker has them.
        """
        frame = self._pending_disconnect
        if frame is not None and len(self._chain) == 0:
            self._pending_disconnect = None
            self._disconnect_sent = True
            if frame.get("receipt") is None:
                # A receipt of the sidecar's own: the broker's answer ends the drain.
                frame.set("receipt", self._chain.expect())
                self._write_broker(frame)
            else:
                self._forward(frame)

    def _forward(self, frame: Frame) -> None:
        """Relay a client frame; its receipt (if asked for) comes back through the chain."""
        receipt = frame.get("receipt")
        if receipt is not None:
            frame.set("receipt", self._chain.expect(receipt))
        self._write_broker(frame)

    def _on_send(self, frame: Frame, fields: _SendFields) -> None:
        """One SEND inside a transaction (or a malformed one): decided on its own."""
        destination, receipt, tx_id, headers = fields
        if not destination:
            self._fail("SEND without a destination header", receipt=receipt)
        transaction = None
        if tx_id is not None:
            transaction = self._transactions.get(tx_id)
            if transaction is None:
                self._fail(f"transaction {tx_id!r} was not begun", receipt=receipt)
        assert destination is not None and self.leg is not None
        message = self._message_of_send(frame.body, destination, headers)
        started = time.perf_counter()
        decision = self.guard.decide_sends(
            [message], self.leg.capabilities, broker=self.broker, role="sidecar",
            sender=self._producer_id,  # one connection: its receipts come back in order
            transaction=transaction.state if transaction is not None else None, batch=False)
        self.metrics.send_guard.observe(time.perf_counter() - started)
        result = decision.results[0]
        self.metrics.message("send", result.verdict.action.value)
        self._settle_send(frame, destination, receipt, result, transaction)

    def _on_sends(self, run: list[tuple[Frame, _SendFields]]) -> None:
        """Consecutive SENDs outside transactions, decided as one batch.

        As the wrappers' ``send_batch`` (:meth:`~mqguard.pipeline.Guard.decide_sends`):
        ``before_send`` per message (``ctx.batch``), up to the first REJECT, then one
        ``before_send_batch`` over the accepted ones (duplicate detection: one
        reservation per address instead of one per message). Then each is settled in
        order exactly as a SEND on its own would be. At a REJECT the session fails and
        nothing after it is forwarded: what the batch reserved for the later ones is
        given back (``send_failed``).
        """
        guard, leg = self.guard, self.leg
        assert leg is not None
        started = time.perf_counter()
        messages = [self._message_of_send(frame.body, fields[0], fields[3])  # type: ignore[arg-type]
                    for frame, fields in run]
        decision = guard.decide_sends(messages, leg.capabilities, broker=self.broker,
                                      role="sidecar", sender=self._producer_id)
        results = decision.results
        decided = len(results)
        self.metrics.send_guard.observe_many((time.perf_counter() - started) / decided,
                                             decided)
        position = 0
        try:
            for position, result in enumerate(results):
                frame, (destination, receipt, _, _) = run[position]
                self.metrics.message("send", result.verdict.action.value)
                self._settle_send(frame, destination, receipt, result, None)  # type: ignore[arg-type]
        except BaseException:
            # This SEND ended the session (rejected, or not representable): nothing after
            # it reaches the broker, so what the batch reserved for those is given back.
            guard.settle_sends(failed=results[position + 1:], error=AdapterError(
                "not sent: an earlier SEND on this connection failed"))
            raise

    def _settle_send(self, frame: Frame, destination: str, receipt: str | None,
                     result: SendResult, transaction: _Transaction | None) -> None:
        """Act on the decision for one SEND: forward what the guard accepted (the
        client's message or its moved copy), answer the client locally, or fail."""
        verdict = result.verdict
        if verdict.action is Action.REJECT:
            if transaction is not None:
                # Artemis: the transaction is rollback-only now (the guard marked it);
                # its COMMIT fails.
                self._chain.local(receipt)
                return
            self._fail(f"message rejected: {verdict.reason}"[:200], receipt=receipt)
        message = result.forward
        if message is None:
            self._chain.local(receipt)  # DROP: the send "succeeds" for the client (Artemis)
            return
        if result.moved:
            destination = _destination_of(message.address)
        if message.expiration:
            self.sidecar.watch_expiring(message.address)
        guard = self.guard
        try:
            headers = send_headers(message, self.broker, persistent=False,
                                   native_expiry=self.sidecar.config.native_expiry)
        except AdapterError as exc:
            if transaction is None:
                guard.settle_sends(failed=(result,), error=exc)  # frees a reserved duplicate id
            self._fail(str(exc)[:200], receipt=receipt)
        out = Frame("SEND", [("destination", destination)], frame.body)
        out.headers.extend(headers.items())
        if transaction is not None:
            out.headers.append(("transaction", transaction.state.transaction_id))
        data = encode(out, self.version)
        # What the broker would refuse, or could never deliver back through the broker
        # leg, is refused here: a confirmed send must be one the broker keeps and delivers.
        refusal = send_refusal(data, len(out.headers), len(out.body),
                               self.sidecar.broker_limits, self.broker)
        if refusal is not None:
            if transaction is None:
                guard.settle_sends(failed=(result,), error=AdapterError(refusal))
            self._fail(f"message refused: {refusal}"[:200], receipt=receipt,
                       detail=f"not sent to {destination}: {refusal}")
        if transaction is not None:
            guard.settle_sends((result,))  # the guard holds it for the COMMIT
            if receipt is not None:
                data = with_plain_header(data, "receipt", self._chain.expect(receipt))
        else:
            # A receipt of our own on every SEND: the "sent" event then means the broker
            # has the message, and an unconfirmed one is recorded as an unknown outcome.
            # The "sent" bookkeeping (event, after_send) is queued, not run, when the
            # RECEIPT comes: see _settle_confirmed.
            confirmed = self._confirmed
            data = with_plain_header(data, "receipt", self._chain.expect(
                receipt,
                on_done=lambda: confirmed.append(result),
                on_fail=lambda reason: guard.settle_sends(failed=(result,),
                                                          error=AdapterError(reason))))
        self._write_broker_bytes(data)

    def _message_of_send(self, body: bytes, destination: str,
                         headers: dict[str, str]) -> Message:
        return message_of_send(body, destination, headers, producer_id=self._producer_id,
                               sequence=self._sequence, broker=self.broker)

    def _on_subscribe(self, frame: Frame) -> None:
        destination = frame.get("destination")
        receipt = frame.get("receipt")
        if not destination:
            self._fail("SUBSCRIBE without a destination header", receipt=receipt)
        assert destination is not None
        mode = frame.get("ack") or "auto"
        if mode not in ACK_MODES:
            self._fail(f"unknown ack mode {mode!r}", receipt=receipt)
        sub_id = frame.get("id")
        if sub_id is None:  # optional in STOMP 1.0
            sub_id = f"mqguard-sub-{next(self._sub_ids)}"
            frame.set("id", sub_id)
        if sub_id in self._subs:
            self._fail(f"subscription id {sub_id!r} is already in use", receipt=receipt)
        browse = frame.get("browser") == "true"
        self._subs[sub_id] = _Subscription(
            sub_id, destination, address_of(destination), mode, browse=browse,
            quorum=frame.get("x-queue-type") == "quorum")
        if not browse:
            frame.set("ack", "client-individual")
        self._forward(frame)

    def _on_unsubscribe(self, frame: Frame) -> None:
        sub = self._subs.pop(frame.get("id") or "", None)
        if sub is not None and self.leg is not None:
            for token in sub.pending:
                self._token_sub.pop(token, None)
                self.leg.forget(token)  # the broker takes them back
        self._forward(frame)

    def _on_begin(self, frame: Frame) -> None:
        tx_id = frame.get("transaction")
        if not tx_id:
            self._fail("BEGIN without a transaction header", receipt=frame.get("receipt"))
        assert tx_id is not None
        if tx_id in self._transactions:
            self._fail(f"transaction {tx_id!r} is already open", receipt=frame.get("receipt"))
        self._transactions[tx_id] = _Transaction(TransactionState(tx_id))
        self._forward(frame)

    def _transaction_context(self, state: TransactionState) -> HookContext:
        assert self.leg is not None
        ctx = self.guard.transaction_context(self.leg.capabilities, self.broker, state)
        # The sender its SENDs were decided with: clients choose transaction ids, so two
        # connections may use the same one, and plugins tell them apart by sender.
        ctx.sender = self._producer_id
        return ctx

    def _end_open_transactions(self, outcome: str) -> None:
        """The connection ended with transactions neither committed nor aborted: the broker
        drops them, so the guard rolls them back too (their duplicate ids are released)."""
        open_transactions, self._transactions = self._transactions, {}
        if self.leg is None:
            return
        for transaction in open_transactions.values():
            state = transaction.state
            try:
                self.guard.rolled_back(state, self._transaction_context(state),
                                       f"session ended before COMMIT ({outcome})")
            except Exception:
                log.exception("session %s: ending transaction %s failed", self.label,
                              state.transaction_id)

    def _take_transaction(self, frame: Frame) -> tuple[str, _Transaction]:
        tx_id = frame.get("transaction") or ""
        transaction = self._transactions.pop(tx_id, None)
        if transaction is None:
            self._fail(f"{frame.command} of unknown transaction {tx_id!r}",
                       receipt=frame.get("receipt"))
        assert transaction is not None
        return tx_id, transaction

    def _on_commit(self, frame: Frame) -> None:
        tx_id, transaction = self._take_transaction(frame)
        assert self.leg is not None
        state = transaction.state
        ctx = self._transaction_context(state)
        reason = self.guard.commit_check(state, ctx)
        if reason is not None:
            self._write_broker(Frame("ABORT", [("transaction", tx_id)]))
            self.guard.rolled_back(state, ctx, reason)
            self.metrics.message("commit", "rolled-back")
            self._fail(f"transaction {tx_id} rolled back: {reason}"[:200],
                       receipt=frame.get("receipt"),
                       detail=f"COMMIT of {tx_id} failed, nothing of it was sent: {reason}")
        guard = self.guard

        def committed() -> None:
            guard.committed(state, ctx)
            for _sub, delivery, delivery_ctx in transaction.acks:
                guard.finish_delivery(self.leg, delivery, delivery_ctx, None,  # type: ignore[arg-type]
                                      settled=True)

        frame.set("receipt", self._chain.expect(
            frame.get("receipt"), on_done=committed,
            on_fail=lambda why: guard.commit_failed(state, ctx, why)))
        self._write_broker(frame)

    def _on_abort(self, frame: Frame) -> None:
        _, transaction = self._take_transaction(frame)
        assert self.leg is not None
        state = transaction.state
        ctx = self._transaction_context(state)
        self.guard.rolled_back(state, ctx, "aborted by the client")
        # Acks inside it are void: those deliveries are the client's to settle again.
        for sub, delivery, delivery_ctx in transaction.acks:
            token = delivery.ack_token
            if sub.id in self._subs:
                sub.pending[token] = (delivery, delivery_ctx)
                self._token_sub[token] = sub
                self.leg.delivered(token)
        self._forward(frame)

    def _on_acks(self, frames: list[Frame]) -> None:
        """Consecutive ACKs outside transactions (one client read), finished in one
        :meth:`~mqguard.pipeline.Guard.finish_deliveries` call: the same outcome per
        delivery as :meth:`_on_settle` on each. An ACK of a delivery the guard does not
        track is forwarded in its place, after the ones before it were finished; the
        client's receipts follow in order."""
        assert self.leg is not None
        items: list[tuple[Delivery, HookContext, BaseException | None]] = []
        receipts: list[str | None] = []
        for frame in frames:
            token = frame.get("id") if self.version == "1.2" else frame.get("message-id")
            sub = self._token_sub.get(token or "")
            if token is None or sub is None:
                self._finish_acks(items, receipts)
                items, receipts = [], []
                self._forward(frame)
                continue
            for each in self._covered(sub, token):
                delivery, ctx = sub.pending.pop(each)
                self._token_sub.pop(each, None)
                items.append((delivery, ctx, None))
            receipts.append(frame.get("receipt"))
        self._finish_acks(items, receipts)

    def _finish_acks(self, items: list[tuple[Delivery, HookContext, BaseException | None]],
                     receipts: list[str | None]) -> None:
        if items:
            self.guard.finish_deliveries(self.leg, items)  # type: ignore[arg-type]
        for receipt in receipts:
            self._chain.local(receipt)

    @staticmethod
    def _covered(sub: _Subscription, token: str) -> list[str]:
        """The deliveries an ACK/NACK of ``token`` settles: itself, or in ``client`` mode
        (cumulative) everything delivered on the subscription up to it."""
        if sub.mode != "client":
            return [token]
        covered = []
        for pending in sub.pending:
            covered.append(pending)
            if pending == token:
                break
        return covered

    def _on_settle(self, frame: Frame) -> None:
        assert self.leg is not None
        token = frame.get("id") if self.version == "1.2" else frame.get("message-id")
        receipt = frame.get("receipt")
        sub = self._token_sub.get(token or "")
        if token is None or sub is None:
            # Not a delivery the guard tracks (browsing, or already settled by the guard):
            # the broker has the final word.
            self._forward(frame)
            return
        covered = self._covered(sub, token)
        tx_id = frame.get("transaction")
        transaction = self._transactions.get(tx_id) if tx_id is not None else None
        if tx_id is not None and transaction is None:
            self._fail(f"{frame.command} in unknown transaction {tx_id!r}", receipt=receipt)
        for each in covered:
            delivery, ctx = sub.pending.pop(each)
            self._token_sub.pop(each, None)
            if transaction is not None:
                if frame.command == "ACK":
                    transaction.acks.append((sub, delivery, ctx))
                    self.leg.ack(delivery, transaction=tx_id)
                else:
                    assert tx_id is not None  # a transaction was found under it
                    self._write_broker(Frame("NACK", [
                        *ack_headers(self.version, each, sub.id), ("transaction", tx_id)]))
                    self.leg.forget(each)
                continue
            error = None if frame.command == "ACK" else Nack("NACK from the client")
            self.guard.finish_delivery(self.leg, delivery, ctx, error)
        if frame.command == "NACK" and transaction is None:
            # The NACK may have left work on the broker leg (ActiveMQ: the delayed re-send
            # and the original's ACK): its receipt, and a DISCONNECT behind it, wait for it.
            self._after_leg_jobs(receipt)
        else:
            self._chain.local(receipt)

    # -- broker frames -------------------------------------------------------------------

    def _on_broker_frame(self, frame: Frame) -> bool:
        """Handle one broker frame; True when the session must end (ERROR)."""
        command = frame.command
        if self._ending and command != "RECEIPT":
            # The session is ending with the sidecar's ERROR, which STOMP makes the client's
            # last frame, while the broker connection drains. What the broker still sends is
            # not relayed: a MESSAGE stays unacknowledged (not even auto-acked), so the broker
            # redelivers it once this connection is gone; nothing is lost.
            return command == "ERROR"
        if command == "MESSAGE":
            self._on_message(frame)
        elif command == "RECEIPT":
            receipt_id = frame.get("receipt-id") or ""
            if self.leg is not None and self.leg.receipt(receipt_id):
                return False
            if self._chain.owns(receipt_id):
                self._chain.confirmed(receipt_id)
                self._flush_disconnect()
                return False
            if not self._ending:
                self._write_client(frame)
        elif command == "ERROR":
            error_receipt = frame.get("receipt-id")
            if error_receipt is not None and self._chain.owns(error_receipt):
                client_receipt = self._chain.client_receipt_of(error_receipt)
                frame.remove("receipt-id")
                if client_receipt is not None:
                    frame.set("receipt-id", client_receipt)
            self._write_client(frame)
            self._client_done = True
            self._ending = True  # the broker's ERROR is the client's last frame
            return True
        else:  # a second CONNECTED
            self._send_error("the broker sent an unexpected frame", detail=command)
            return True
        return False

    def _on_message(self, frame: Frame) -> None:
        prepared = self._guarded_message(frame)
        if prepared is _RELAY:
            self._write_client(frame)
        if not isinstance(prepared, tuple):
            return
        delivery, sub = prepared
        started = time.perf_counter()
        ctx = self.guard.open_delivery(self.leg, delivery, queue=sub.queue)  # type: ignore[arg-type]
        self.metrics.deliver_guard.observe(time.perf_counter() - started)
        self._opened(frame, delivery, sub, ctx)

    def _on_messages(self, frames: list[Frame]) -> None:
        """The MESSAGEs of one broker read, in order: the guarded ones opened in one
        :meth:`~mqguard.pipeline.Guard.open_deliveries` call (the same outcome as one by
        one), then each frame written to the client in the order received. A MESSAGE of
        an ``auto`` subscription (settled as soon as it is written) is handled on its
        own, after the ones before it, as one by one."""
        batch: list[tuple[Frame, tuple[Delivery, _Subscription] | str]] = []
        for frame in frames:
            prepared = self._guarded_message(frame)
            if isinstance(prepared, tuple) and prepared[1].mode == "auto":
                self._open_batch(batch)
                batch = []
                self._open_batch([(frame, prepared)])
                continue
            batch.append((frame, prepared))
        self._open_batch(batch)

    def _open_batch(self, batch: list[tuple[Frame, tuple[Delivery, _Subscription] | str]]
                    ) -> None:
        guarded = [prepared for _, prepared in batch if isinstance(prepared, tuple)]
        opened: Iterator[HookContext | None] = iter(())
        if len(guarded) == 1:
            delivery, sub = guarded[0]
            started = time.perf_counter()
            opened = iter([self.guard.open_delivery(self.leg, delivery,  # type: ignore[arg-type]
                                                    queue=sub.queue)])
            self.metrics.deliver_guard.observe(time.perf_counter() - started)
        elif guarded:
            started = time.perf_counter()
            opened = iter(self.guard.open_deliveries(
                self.leg, [delivery for delivery, _ in guarded],  # type: ignore[arg-type]
                [sub.queue for _, sub in guarded]))
            self.metrics.deliver_guard.observe_many(
                (time.perf_counter() - started) / len(guarded), len(guarded))
        for frame, prepared in batch:
            if isinstance(prepared, tuple):
                self._opened(frame, prepared[0], prepared[1], next(opened))
            elif prepared is _RELAY:
                self._write_client(frame)

    def _guarded_message(self, frame: Frame) -> tuple[Delivery, _Subscription] | str:
        """The delivery to guard for a MESSAGE and its subscription; or, for a MESSAGE the
        guard does not see, :data:`_RELAY` (to write as is) or :data:`_DROP`."""
        assert self.leg is not None
        # All headers (first occurrence wins) for the lookups below and the guard.
        headers = frame.header_dict()
        echoed = headers.get("receipt")
        if echoed is not None and echoed.startswith(CHAIN_RECEIPT_PREFIX):
            # RabbitMQ echoes a SEND's receipt header in the MESSAGE: it is the
            # sidecar's own id, meaningless to the consumer.
            frame.remove("receipt")
            del headers["receipt"]
        sub = self._subs.get(headers.get("subscription") or "")
        if sub is None:
            # Unsubscribed meanwhile: unacked, so the broker gets it back.
            return _DROP
        if sub.browse:
            return _RELAY  # browsing consumes nothing, so there is nothing to guard
        token = headers.get("ack") if self.version == "1.2" else headers.get("message-id")
        if token is None:
            return _RELAY  # nothing to settle with: relayed as is
        # The message's own headers: the broker's left out in from_wire's one pass.
        message = Message.from_wire(sub.queue, frame.body, headers,
                                    broker_message_id=headers.get("message-id"),
                                    exclude=BROKER_MESSAGE_HEADERS)
        delivery = Delivery(message, sub.id, token,
                            redelivered=headers.get("redelivered") == "true",
                            native_delivery_count=_native_count(self.broker, sub, headers),
                            raw_headers=headers)
        self.leg.delivered(token)
        return delivery, sub

    def _on_oversized(self, item: Oversized) -> None:
        """A frame of the broker's over the broker leg's limits.

        Those limits admit every MESSAGE of a SEND the client leg admitted
        (:func:`~mqguard.sidecar.frames.broker_leg_limits`), so such a MESSAGE was put on
        the queue some other way. It is never given to the client, and it must not end the
        session either: left unacknowledged it would come back to every consumer of the
        queue. With its body at hand (too many headers, a header line too long) and a
        dead-letter target for the queue, the guard opens it and moves it there. Otherwise
        (a body over ``max_frame_bytes`` is never kept, so no copy can be made; no target;
        a copy the broker would refuse) the broker gets it back with a NACK that does not
        requeue it (ActiveMQ: its dead-letter queue; RabbitMQ: the queue's dead-letter
        exchange, else it drops it), with a WARN and a ``dead_lettered`` event; on STOMP
        1.0, which has no NACK, it is acknowledged (dropped) with a ``delivery_dropped``
        event. Any other frame over the limits ends the session.
        """
        frame = item.frame
        if frame.command != "MESSAGE":
            raise FrameError(item.reason, detail=item.detail)
        self.metrics.frame_counts("broker")["MESSAGE"].value += 1
        if self._ending:
            return  # left unacknowledged, as any MESSAGE then (see _on_broker_frame)
        why = f"undeliverable through the sidecar: {item.reason} ({item.detail})"
        prepared = self._guarded_message(frame)
        if not isinstance(prepared, tuple):
            # Browsing, unsubscribed, or nothing to settle it with: it stays the broker's.
            log.warning("session %s: a MESSAGE on subscription %r is %s; not delivered, "
                        "left with the broker", self.label, frame.get("subscription"), why)
            return
        delivery, sub = prepared
        message = delivery.message
        assert self.leg is not None
        ctx: HookContext | None = None
        if item.body_kept:
            ctx = self.guard.open_delivery(self.leg, delivery, queue=sub.queue)
            if ctx is None:
                return  # taken by the guard (a duplicate, expired...): settled there
            target = ctx.settings.dead_letter_target(message.address)
            if target is not None and target != sub.queue:
                # The copy carries the same headers: only where the broker takes them.
                refused = send_refusal(encode(frame, self.version),
                                       len(frame.headers) + MQGUARD_ADDED_HEADERS,
                                       len(frame.body), None, self.broker)
                if refused is None:
                    log.warning("session %s: message %s on %s dead-lettered to %s: %s",
                                self.label, message.message_id, sub.queue, target, why)
                    self.guard.apply_delivery_verdict(
                        self.leg, delivery, ctx,
                        Verdict.move(target, why, event=EventType.DEAD_LETTERED))
                    return
                why = f"{why}; its dead-letter copy would be refused: {refused}"
            else:
                why = f"{why}; no dead-letter-address is configured for it"
        # No copy to make (its body was skipped, there is no dead-letter target, or the
        # broker would refuse the copy): the broker's own dead-letter handling takes it.
        if self.version == "1.0":
            # STOMP 1.0 has no NACK: left unacknowledged it would come back forever.
            log.warning("session %s: message %s on %s dropped: %s (STOMP 1.0 cannot hand it "
                        "back to the broker)", self.label, message.message_id, sub.queue, why)
            reason = f"{why}; acknowledged (STOMP 1.0 has no NACK)"[:500]
            if ctx is not None:  # opened by the guard: dropped its way (event, hooks)
                self.guard.apply_delivery_verdict(
                    self.leg, delivery, ctx,
                    Verdict.drop(reason, event=EventType.DELIVERY_DROPPED))
                return
            self.leg.ack(delivery)
            self.guard.events.emit(EventType.DELIVERY_DROPPED, message, queue=sub.queue,
                                   reason=reason)
            return
        log.warning("session %s: message %s on %s is %s; rejected to the broker's own "
                    "dead-letter handling", self.label, message.message_id, sub.queue, why)
        self.leg.nack(delivery, requeue=False)
        self.guard.events.emit(EventType.DEAD_LETTERED, message, queue=sub.queue,
                               reason=f"{why}; rejected to the broker (NACK)"[:500])
        if ctx is not None:  # opened by the guard: its observers learn how it ended
            observe(self.guard.hook.message_nacked, message=message, ctx=ctx, requeue=False)

    def _opened(self, frame: Frame, delivery: Delivery, sub: _Subscription,
                ctx: HookContext | None) -> None:
        """After the guard opened a delivery: hand the frame to the client (unless a
        verdict took it) and track it until the client settles it."""
        if ctx is None:
            self.metrics.message("deliver", "taken")
            return
        self._delivered_count.value += 1
        self._write_client(frame)
        if sub.mode == "auto":
            self.guard.finish_delivery(self.leg, delivery, ctx, None)  # type: ignore[arg-type]
            return
        token = delivery.ack_token
        sub.pending[token] = (delivery, ctx)
        self._token_sub[token] = sub


#: What :meth:`ProxySession._guarded_message` says of a MESSAGE the guard does not see.
_RELAY = "relay"
_DROP = "drop"


def _send_fields(frame: Frame) -> _SendFields:
    """What a SEND's headers say (see :data:`_SendFields`); the first of a name wins."""
    headers = frame.header_dict()
    pop = headers.pop
    destination = pop("destination", None)
    receipt = pop("receipt", None)
    transaction = pop("transaction", None)
    pop("content-length", None)
    return destination, receipt, transaction, headers


def _native_count(broker: str, sub: _Subscription, headers: dict[str, str]) -> int | None:
    return native_delivery_count(broker, headers, quorum=sub.quorum)
