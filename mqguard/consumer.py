"""``GuardedConsumer``: receive through the guard pipeline with a handler."""

from __future__ import annotations

import threading
from collections.abc import Callable

from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.registry import open_adapter


class GuardedConsumer:
    """Delivers messages of one address to ``handler`` through the guard.

    The handler returning normally acknowledges the message; raising (for
    instance :class:`~mqguard.errors.Nack`) is a failure that the plugins turn
    into a redelivery, a dead-letter move, or a broker NACK.

    The handler runs on the adapter's delivery thread (its network thread:
    one message at a time, in arrival order), which is also the thread that
    reads the broker's confirmations. Sending from a handler must therefore
    use another producer, on another connection (a
    :class:`~mqguard.producer.GuardedProducer` with its own adapter): a send
    through this consumer's adapter would have to wait for a confirmation
    only that thread can read, and raises
    :class:`~mqguard.errors.AdapterError` at once instead. (The guard's own
    dead-letter moves are deferred to the adapter's dispatcher thread.) A
    handler that blocks for long also holds up heart-beats/keep-alives: see
    the adapter's "Threads" documentation.

    >>> def handle(message):  # doctest: +SKIP
    ...     print(message.body)
    >>> with GuardedConsumer("stomp://127.0.0.1:61613", "orders", handle):  # doctest: +SKIP
    ...     time.sleep(10)
    """

    def __init__(self, adapter: Adapter | str, address: str,
                 handler: Callable[[Message], object], guard: Guard | None = None, *,
                 queue: str | None = None, options: SubscribeOptions | None = None) -> None:
        self.adapter = open_adapter(adapter) if isinstance(adapter, str) else adapter
        self.address = address
        self.queue = queue or address
        self.handler = handler
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(role="consumer")
        self.options = options or SubscribeOptions()
        self._subscription: str | None = None
        self._lock = threading.Lock()

    def start(self) -> GuardedConsumer:
        with self._lock:
            if self._subscription is None:
                self.adapter.connect()
                self.guard.start()
                self._subscription = self.adapter.subscribe(self.address, self._on_delivery,
                                                            self.options)
        return self

    def _on_delivery(self, delivery: Delivery) -> None:
        self.guard.deliver(self.adapter, delivery, self.handler, queue=self.queue)

    def stop(self) -> None:
        """Unsubscribe and disconnect; unacknowledged messages go back to the broker."""
        with self._lock:
            if self._subscription is not None:
                subscription, self._subscription = self._subscription, None
                try:
                    self.adapter.unsubscribe(subscription)
                finally:
                    self.adapter.close()
            if self._owns_guard:
                self.guard.close()

    close = stop

    def __enter__(self) -> GuardedConsumer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
