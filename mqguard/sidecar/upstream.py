"""The broker side of one proxied connection, as an :class:`~mqguard.adapter.Adapter`.

The guard pipeline settles deliveries through an adapter: it acks, nacks, sends
dead-letter copies and re-sends delayed messages. In the sidecar these must go
over the very connection the client's messages came in on (an ACK is only valid
there, and ActiveMQ's delayed re-send must share a transaction with that ACK).
:class:`UpstreamLeg` offers exactly that on top of the session's asyncio stream.

Threads: the thread that creates the leg is its *delivery thread* -- the one
that reads the broker: the event loop's, or a native plane's runtime thread --
so methods that wait for a RECEIPT refuse to run there (the pipeline hands them
to :meth:`defer`, which runs them on a job thread of the leg's own). ``ack`` and
``nack`` are safe from any thread: off the delivery thread they are handed to it
through its :class:`Scheduler`.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final, Protocol

from mqguard.adapter import Capabilities, Delivery, DeliveryCallback, SubscribeOptions
from mqguard.errors import AdapterError
from mqguard.jobthread import JobThread
from mqguard.message import Message
from mqguard.sidecar.frames import Frame, encode_bodiless, encode_one_header
from mqguard.stomp_brokers import capabilities_of, destination_of, send_headers

__all__ = [
    "LEG_RECEIPT_PREFIX",
    "LEG_TRANSACTION_PREFIX",
    "RECEIPT_TIMEOUT_S",
    "Scheduler",
    "UpstreamLeg",
    "ack_headers",
]

log = logging.getLogger("mqguard.sidecar.upstream")

#: Prefix of receipts the leg waits for itself (never seen by the client).
LEG_RECEIPT_PREFIX: Final = "mqguard-i-"
#: Prefix of the transactions the leg opens itself (delayed re-sends).
LEG_TRANSACTION_PREFIX: Final = "mqguard-tx-"
#: How long a blocking call waits for the broker's RECEIPT.
RECEIPT_TIMEOUT_S: Final = 30.0


class Scheduler(Protocol):
    """Where the leg's own writes run: an asyncio loop, or a native plane's runtime."""

    def call_soon_threadsafe(self, callback: Callable[[], None], /) -> object: ...


class UpstreamLeg:
    """Adapter over one sidecar session's broker connection (see the module docstring)."""

    name = "sidecar"

    def __init__(self, loop: Scheduler, write: Callable[[Frame], None], *,
                 broker: str, version: str, native_expiry: bool, label: str,
                 write_wire: Callable[[bytes], None] | None = None) -> None:
        self._loop = loop
        #: Writes one frame to the broker; loop thread only.
        self._write = write
        #: Writes encoded octets to the broker (loop thread only), or None: the ACKs and
        #: NACKs settled on the loop thread are then encoded here (encode_bodiless).
        self._write_wire = write_wire
        self.broker = broker
        self.version = version
        self._capabilities = capabilities_of(broker)
        self._native_expiry = native_expiry
        self._label = label
        self._loop_thread = threading.get_ident()
        self._ids = itertools.count(1)
        self._waiting: dict[str, Future[None]] = {}
        #: Ack tokens delivered on this connection and not settled yet (loop thread only).
        self._open: set[str] = set()
        self._alive = True
        self._jobs = JobThread(f"mqguard-sidecar-jobs-{label}")
        self._jobs.start()

    # -- Adapter: facts ------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def on_delivery_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def connect(self) -> None:
        """The session connected this leg already."""

    def close(self) -> None:
        """The session owns the connection; this only stops the leg's job thread."""
        self._jobs.stop(RECEIPT_TIMEOUT_S, join=not self._jobs.is_current())

    # -- bookkeeping the session calls (loop thread) ------------------------------------

    def delivered(self, token: str) -> None:
        self._open.add(token)

    def forget(self, token: str) -> None:
        self._open.discard(token)

    def receipt(self, receipt_id: str) -> bool:
        """A RECEIPT with one of the leg's ids arrived; False if it is not the leg's."""
        waiter = self._waiting.pop(receipt_id, None)
        if waiter is None:
            return False
        if not waiter.done():
            waiter.set_result(None)
        return True

    def lost(self, reason: str) -> None:
        """The connection ended: fail every waiting call; nothing can be settled any more."""
        self._alive = False
        self._open.clear()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(AdapterError(f"broker connection lost: {reason}"))

    # -- Adapter: settling ---------------------------------------------------------------

    def can_settle(self, delivery: Delivery) -> bool:
        return self._alive and delivery.ack_token in self._open

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        self._settle("ACK", delivery, transaction=transaction)

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        if self.version == "1.0":
            # STOMP 1.0 has no NACK: leaving it unacknowledged is the only way back.
            log.debug("STOMP 1.0 has no NACK; %s stays unacknowledged", delivery.ack_token)
            return
        extra = [] if requeue else [("requeue", "false")]
        self._settle("NACK", delivery, extra=extra)

    def _settle(self, command: str, delivery: Delivery, *, transaction: str | None = None,
                extra: list[tuple[str, str]] | None = None) -> None:
        token = delivery.ack_token
        if not isinstance(token, str):
            raise AdapterError(f"{command} of a delivery without an ack id")
        if (transaction is None and not extra and self._write_wire is not None
                and self.version == "1.2" and threading.get_ident() == self._loop_thread):
            # The common case, once per consumed message: written at once, no Frame.
            if self._alive and token in self._open:
                self._open.discard(token)
                self._write_wire(encode_one_header(command, "id", token, "1.2"))
            return
        headers = ack_headers(self.version, token, delivery.subscription_id)
        if transaction is not None:
            headers.append(("transaction", transaction))
        if extra:
            headers.extend(extra)
        if self._write_wire is not None and threading.get_ident() == self._loop_thread:
            # The common case, once per consumed message: written at once, no Frame.
            if self._alive and token in self._open:
                self._open.discard(token)
                self._write_wire(encode_bodiless(command, headers, self.version))
            return
        frame = Frame(command, headers)

        def write() -> None:
            if not self._alive or token not in self._open:
                return  # settled already, or the broker redelivers it after the loss
            self._open.discard(token)
            self._write(frame)

        self._on_loop(write)

    # -- Adapter: calls that wait for the broker ----------------------------------------

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        headers = send_headers(message, self.broker, persistent=True,
                               native_expiry=self._native_expiry)
        frame_headers = [("destination", destination_of(message.address))]
        frame_headers.extend(headers.items())
        if transaction is not None:
            frame_headers.append(("transaction", transaction))
        self._request(Frame("SEND", frame_headers, message.body), "send")

    def send_many(self, messages: list[Message], *, transaction: str | None = None) -> None:
        for message in messages:
            self.send(message, transaction=transaction)

    def begin(self) -> str:
        transaction = f"{LEG_TRANSACTION_PREFIX}{self._label}-{next(self._ids)}"
        self._request(Frame("BEGIN", [("transaction", transaction)]), "begin")
        return transaction

    def commit(self, transaction: str) -> None:
        self._request(Frame("COMMIT", [("transaction", transaction)]), "commit")

    def abort(self, transaction: str) -> None:
        self._request(Frame("ABORT", [("transaction", transaction)]), "abort")

    def _request(self, frame: Frame, what: str) -> None:
        if self.on_delivery_thread():
            raise AdapterError(f"{what} waits for the broker and cannot run on the sidecar's "
                               "event loop; use defer()")
        if not self._alive:
            raise AdapterError(f"{what}: the broker connection of this session has ended")
        receipt_id = f"{LEG_RECEIPT_PREFIX}{self._label}-{next(self._ids)}"
        frame.headers.append(("receipt", receipt_id))
        waiter: Future[None] = Future()

        def write() -> None:
            if not self._alive:
                waiter.set_exception(AdapterError("the broker connection has ended"))
                return
            self._waiting[receipt_id] = waiter
            self._write(frame)

        self._loop.call_soon_threadsafe(write)
        try:
            waiter.result(RECEIPT_TIMEOUT_S)
        except TimeoutError:
            raise AdapterError(f"{what}: no RECEIPT from the broker within "
                               f"{RECEIPT_TIMEOUT_S:.0f} s") from None

    def defer(self, job: Callable[[], None]) -> None:
        if not self._jobs.submit(job):
            raise AdapterError("the sidecar session is closing; job not run")

    # -- unused by the pipeline on the sidecar ------------------------------------------

    def subscribe(self, address: str, callback: DeliveryCallback,
                  options: SubscribeOptions | None = None) -> str:
        raise AdapterError("the sidecar subscribes on its client's behalf only")

    def unsubscribe(self, subscription_id: str) -> None:
        raise AdapterError("the sidecar unsubscribes on its client's behalf only")

    # -- helpers -------------------------------------------------------------------------

    def _on_loop(self, action: Callable[[], None]) -> None:
        if self.on_delivery_thread():
            action()
        else:
            self._loop.call_soon_threadsafe(action)


def ack_headers(version: str, token: str, subscription: str) -> list[tuple[str, str]]:
    """ACK/NACK headers naming one delivery, per STOMP version.

    1.2 acks by the MESSAGE's ``ack`` header (sent as ``id``); 1.1 by ``message-id``
    and ``subscription``; 1.0 by ``message-id`` alone.
    """
    if version == "1.2":
        return [("id", token)]
    if version == "1.1":
        return [("message-id", token), ("subscription", subscription)]
    return [("message-id", token)]
