"""An in-process broker and adapter, for fast unit tests of pipeline logic.

It is NOT a stand-in for a real broker in integration tests (those use the
servers in :mod:`mqguard.servers`); it exists so that the logic of hooks and
verdicts can be tested in milliseconds. It behaves like a simple queue broker:
per-address FIFO queues, client-individual acks, NACK requeues, transactions
that hold sends until COMMIT.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mqguard.adapter import Capabilities, Delivery, DeliveryCallback, SubscribeOptions
from mqguard.errors import AdapterError
from mqguard.message import Message, now_ms


@dataclass
class LoopbackBroker:
    """Queues shared by every :class:`LoopbackAdapter` created on it."""

    queues: dict[str, deque[tuple[Message, int]]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def enqueue(self, message: Message, redeliveries: int = 0) -> None:
        with self.lock:
            self.queues.setdefault(message.address, deque()).append((message, redeliveries))

    def depth(self, address: str) -> int:
        with self.lock:
            return len(self.queues.get(address, ()))

    def drain(self, address: str) -> list[Message]:
        with self.lock:
            items = self.queues.pop(address, deque())
            return [message for message, _ in items]


class LoopbackAdapter:
    """Adapter over a :class:`LoopbackBroker`; deliveries are pumped explicitly."""

    name = "loopback"
    broker = "loopback"

    def __init__(
        self, broker: LoopbackBroker | None = None, capabilities: Capabilities | None = None
    ) -> None:
        self.loop = broker or LoopbackBroker()
        self._capabilities = capabilities or Capabilities(transactions=True, nack_requeue=True)
        self._subscriptions: dict[str, tuple[str, DeliveryCallback]] = {}
        self._transactions: dict[str, list[Message]] = {}
        self._ids = itertools.count(1)
        self.connected = False
        self.fail_sends = False
        self.acked: list[Message] = []
        self.nacked: list[Message] = []

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def connect(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False

    def send(self, message: Message, *, transaction: str | None = None) -> None:
        if self.fail_sends:
            raise AdapterError("loopback: send refused (fail_sends is set)")
        if message.scheduled_delivery and not self._capabilities.delayed_delivery:
            raise AdapterError("loopback: delayed delivery disabled by capabilities")
        frozen = Message.from_wire(message.address, message.body, message.wire_headers())
        frozen.scheduled_delivery = message.scheduled_delivery
        if transaction is not None:
            self._transactions[transaction].append(frozen)
        else:
            self.loop.enqueue(frozen)

    def send_many(self, messages: list[Message], *, transaction: str | None = None) -> None:
        for message in messages:
            self.send(message, transaction=transaction)

    def subscribe(
        self, address: str, callback: DeliveryCallback, options: SubscribeOptions | None = None
    ) -> str:
        subscription = f"sub-{next(self._ids)}"
        self._subscriptions[subscription] = (address, callback)
        return subscription

    def unsubscribe(self, subscription_id: str) -> None:
        self._subscriptions.pop(subscription_id, None)

    def pump(self, limit: int = 1000) -> int:
        """Deliver queued messages to the subscriptions; returns how many were delivered."""
        delivered = 0
        for subscription, (address, callback) in list(self._subscriptions.items()):
            # Scheduled messages not yet due go to the back; each is looked at once per pump.
            skips = 0
            while delivered < limit:
                with self.loop.lock:
                    queue = self.loop.queues.get(address)
                    if not queue or skips >= len(queue):
                        break
                    message, redeliveries = queue.popleft()
                    # ">=": both times are truncated to whole ms, so the due ms itself may
                    # still be up to 1 ms early; waiting one more ms keeps the delay a floor.
                    if message.scheduled_delivery >= now_ms():
                        queue.append((message, redeliveries))
                        skips += 1
                        continue
                copy = Message.from_wire(address, message.body, message.wire_headers())
                callback(
                    Delivery(
                        copy, subscription, (message, redeliveries), redelivered=redeliveries > 0
                    )
                )
                delivered += 1
        return delivered

    def ack(self, delivery: Delivery, *, transaction: str | None = None) -> None:
        self.acked.append(delivery.message)

    def can_settle(self, delivery: Delivery) -> bool:
        return self.connected and delivery.ack_token is not None

    def nack(self, delivery: Delivery, *, requeue: bool = True) -> None:
        self.nacked.append(delivery.message)
        if requeue:
            original, redeliveries = delivery.ack_token
            self.loop.enqueue(original, redeliveries + 1)

    def begin(self) -> str:
        if not self._capabilities.transactions:
            raise AdapterError("loopback: transactions disabled by capabilities")
        transaction = f"tx-{next(self._ids)}"
        self._transactions[transaction] = []
        return transaction

    def commit(self, transaction: str) -> None:
        for message in self._transactions.pop(transaction):
            self.loop.enqueue(message)

    def abort(self, transaction: str) -> None:
        self._transactions.pop(transaction, None)

    def on_delivery_thread(self) -> bool:
        """Always False: :meth:`pump` runs callbacks on the caller's thread, and nothing
        here waits for a broker, so every method may be called from a callback."""
        return False

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` at once, on the caller's thread (nothing to wait for here)."""
        job()
