"""Reading a dead-letter address through the ordinary adapters.

Two ways, chosen per broker:

*peek* (``mqguard dlq list`` / ``show`` and every ``--dry-run``)
    ActiveMQ browses (``browser:true``): nothing is consumed or redelivered. Brokers that
    cannot browse (RabbitMQ, MQTT) deliver the messages to a subscription that never
    acknowledges them; closing the connection gives them all back (RabbitMQ requeues them
    at once, flagged redelivered; an MQTT session resends them on its next connection).
*consume* (``retry`` / ``purge``)
    a client-individual subscription whose deliveries the caller acknowledges one by one;
    what it leaves unacknowledged (filtered out) comes back the same way.

MQTT keeps nothing for a topic nobody subscribes to, so a dead-letter topic is held by a
persistent session of its own, client id :func:`session_client_id`, that never expires:
every ``mqguard dlq`` command uses it, and the first one creates it (:func:`attach`).
Dead letters published before that are gone. Retained messages are not used: a topic
retains one message, a dead-letter address holds many.

On MQTT every read subscribes two topic filters (:func:`subscription_addresses`): the
dead-letter topic itself, where MQTT 5 dead letters go with their properties, and
``<topic>/+/#``, where MQTT 3.1.1 ones go as ``<topic>/<count>/<original topic>``
(:class:`~mqguard.dlq.model.DeadLetter` reads them back).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final
from urllib.parse import urlsplit

from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.dlq.model import DeadLetter
from mqguard.mqtt_sidecar.messages import dead_letter_filter
from mqguard.registry import open_adapter

__all__ = ["DEFAULT_IDLE_MS", "DEFAULT_WINDOW", "FIRST_WAIT_FACTOR", "MQTT_SESSION_EXPIRY",
           "DeliveryQueue", "attach", "consuming", "is_mqtt", "open_dlq_adapter", "peek",
           "session_client_id", "subscription_addresses"]

#: How long a read waits for one more message before it takes the address as drained (for
#: the first one, :data:`FIRST_WAIT_FACTOR` times as long: a deep queue takes a while).
DEFAULT_IDLE_MS: Final = 500
FIRST_WAIT_FACTOR: Final = 4
#: Messages a read holds unacknowledged at most (the subscription's prefetch): a peek of a
#: non-browsing broker sees at most this many, a filtered retry scans at most this many
#: ahead of what it acknowledged.
DEFAULT_WINDOW: Final = 10_000
#: MQTT 5 Session Expiry Interval of the dead-letter session: 0xFFFFFFFF, never.
MQTT_SESSION_EXPIRY: Final = 0xFFFFFFFF


def is_mqtt(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("mqtt", "mqtts")


def session_client_id(address: str) -> str:
    """The MQTT client id of the persistent session that holds ``address``."""
    return f"mqguard-dlq.{address}"


def subscription_addresses(adapter: Adapter, address: str) -> list[str]:
    """What a read of ``address`` subscribes: on MQTT also the topics below it that hold
    MQTT 3.1.1 dead letters (``<topic>/<count>/<original topic>``), else ``address``."""
    if adapter.name != "mqtt":
        return [address]
    return [address, dead_letter_filter(address)]


def _subscribe(adapter: Adapter, address: str, queue: DeliveryQueue,
               options: SubscribeOptions) -> list[str]:
    return [adapter.subscribe(each, queue, options)
            for each in subscription_addresses(adapter, address)]


def open_dlq_adapter(url: str, address: str, **options: Any) -> Adapter:
    """An adapter for reading ``address`` (not connected); on MQTT, its session's."""
    if is_mqtt(url):
        options.setdefault("client_id", session_client_id(address))
        options.setdefault("session_expiry", MQTT_SESSION_EXPIRY)
        options.setdefault("clean_start", False)
    return open_adapter(url, **options)


class DeliveryQueue:
    """Delivery callback that hands deliveries to the reading thread."""

    def __init__(self) -> None:
        self._items: list[Delivery] = []
        self._cond = threading.Condition()

    def __call__(self, delivery: Delivery) -> None:
        with self._cond:
            self._items.append(delivery)
            self._cond.notify_all()

    def take(self, limit: int, idle_s: float, first_s: float = 0.0) -> list[Delivery]:
        """Up to ``limit`` deliveries, waiting until none came for ``idle_s`` (for the first
        one up to ``first_s`` when that is longer)."""
        with self._cond:
            wait = max(idle_s, first_s) if not self._items else idle_s
            while len(self._items) < limit:
                seen = len(self._items)
                self._cond.wait(wait)
                wait = idle_s
                if len(self._items) == seen:
                    break
            taken, self._items = self._items[:limit], self._items[limit:]
            return taken


def attach(adapter: Adapter, address: str) -> None:
    """Subscribe ``address`` once, so that an MQTT broker keeps its dead letters from now
    on (the session outlives the connection), MQTT 3.1.1 ones below it included
    (:func:`subscription_addresses`). A no-op for STOMP brokers, which keep queues without
    subscribers."""
    if adapter.name != "mqtt":
        return
    queue = DeliveryQueue()
    _subscribe(adapter, address, queue, SubscribeOptions())
    # No unsubscribe: it would end the subscription the session exists for. Whatever was
    # delivered meanwhile stays unacknowledged and is resent to the next connection.


def peek(adapter: Adapter, address: str, *, limit: int | None = None,
         idle_ms: int = DEFAULT_IDLE_MS, first_wait_ms: int | None = None,
         window: int = DEFAULT_WINDOW) -> list[DeadLetter]:
    """The dead letters of ``address`` (at most ``limit``) without consuming any.

    ``adapter`` is connected; on a broker without browse it must be closed afterwards
    (which gives the messages back) and not used to consume meanwhile.
    """
    want = window if limit is None else min(limit, window)
    queue = DeliveryQueue()
    browse = adapter.capabilities.browse and hasattr(adapter, "wait_browse_end")
    options = SubscribeOptions(browse=True) if browse else SubscribeOptions(prefetch=want)
    subscriptions = _subscribe(adapter, address, queue, options)
    found: list[Delivery] = []
    first_s = (FIRST_WAIT_FACTOR * idle_ms if first_wait_ms is None else first_wait_ms) / 1000.0
    if browse:
        # ActiveMQ says when a browse has sent everything: no idle guess needed.
        wait_end = adapter.wait_browse_end  # type: ignore[attr-defined]
        (subscription,) = subscriptions  # one: browsing is STOMP's (ActiveMQ)
        wait_end(subscription, max(first_s, 30.0))
        first_s, idle_ms = 0.0, 1
    while len(found) < want:
        batch = queue.take(want - len(found), idle_ms / 1000.0, first_s)
        first_s = 0.0
        if not batch:
            break
        found.extend(batch)
    if browse:
        adapter.unsubscribe(subscriptions[0])
    # Elsewhere the subscription stays until the connection closes: an UNSUBSCRIBE would
    # end an MQTT session's subscription, and on STOMP the close gives everything back.
    return [DeadLetter.from_delivery(d, address) for d in found[:want]]


@contextmanager
def consuming(adapter: Adapter, address: str, *, window: int = DEFAULT_WINDOW
              ) -> Iterator[DeliveryQueue]:
    """A client-individual subscription of ``address`` for the duration of the block."""
    queue = DeliveryQueue()
    subscriptions = _subscribe(adapter, address, queue, SubscribeOptions(prefetch=window))
    try:
        yield queue
    finally:
        if adapter.name != "mqtt":
            for subscription in subscriptions:
                adapter.unsubscribe(subscription)
