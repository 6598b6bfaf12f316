"""Dead-letter depth on the sidecar's admin port (``/metrics``).

Two series per dead-letter or expiry address, labelled ``address``:

``mqguard_dla_moved_total``
    copies this sidecar moved there (dead letters and expiries), counted from the guard's
    ``message_moved`` hook: exact and free.
``mqguard_dla_depth``
    messages in the address: a count the broker gives when it is cheap, refreshed every
    ``interval`` seconds (default 60), plus what the sidecar moved there since. ActiveMQ
    browses the address; RabbitMQ has no browse over STOMP, so the count takes the
    messages on a subscription that never acknowledges them and gives them back (bounded:
    at most ``window`` messages, 10,000; a full window reads as that many). Until the first
    count, and where counting fails, the gauge is what the sidecar moved since it started.

On MQTT (the MQTT sidecar) there is no broker count: a dead-letter topic's messages are
held by the persistent session ``mqguard-dlq.<address>``
(:func:`~mqguard.dlq.reader.session_client_id`), and MQTT shows a session's messages to
that session only: a connection under any other client id sees none of them, and one
under that client id takes the session from whoever holds it (an operator's ``mqguard
dlq`` command, cut off mid-read or mid-retry). So the counter never connects there: the
gauge is what the sidecar moved since it started, and ``mqguard dlq list`` gives the
session's count.

Label cardinality is bounded: the addresses ``mqguard.toml`` names and those the sidecar
moves to, at most ``max_addresses`` (100); moves to further addresses are logged once and
left out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mqguard import hookimpl
from mqguard.adapter import Adapter
from mqguard.context import HookContext
from mqguard.dlq.reader import DEFAULT_WINDOW, is_mqtt, open_dlq_adapter, peek
from mqguard.dlq.summary import configured_addresses
from mqguard.message import Message
from mqguard.pipeline import Guard

__all__ = ["DEFAULT_INTERVAL_S", "MAX_ADDRESSES", "DeadLetterDepth"]

log = logging.getLogger("mqguard.sidecar.dla_depth")

DEFAULT_INTERVAL_S: Final = 60.0
MAX_ADDRESSES: Final = 100


class DeadLetterDepth(Collector):
    """The guard plugin and Prometheus collector of the module doc."""

    def __init__(self, guard: Guard, url: str, *, interval_s: float = DEFAULT_INTERVAL_S,
                 max_addresses: int = MAX_ADDRESSES, window: int = DEFAULT_WINDOW,
                 open_adapter: Callable[[str, str], Adapter] = open_dlq_adapter,
                 broker_counts: bool | None = None) -> None:
        """``broker_counts``: whether :meth:`refresh` counts at the broker; by default
        where that disturbs no one, which excludes MQTT (see the module doc: only the
        dead-letter session can read its messages). ValueError for True on MQTT."""
        if broker_counts is None:
            broker_counts = not is_mqtt(url)
        elif broker_counts and is_mqtt(url):
            raise ValueError("no broker count of an MQTT dead-letter topic: only its "
                             "mqguard-dlq session can read it, and connecting as that "
                             "session takes it from an operator's `mqguard dlq`")
        self.broker_counts = broker_counts
        self.guard = guard
        self.url = url
        self.interval_s = interval_s
        self.max_addresses = max_addresses
        self.window = window
        self._open = open_adapter
        self._lock = threading.Lock()
        self._moved: dict[str, int] = {}
        #: Broker count and the moved total when it was taken, per address.
        self._counted: dict[str, tuple[int, int]] = {}
        self._warned = False
        for address in configured_addresses(guard.config)[:max_addresses]:
            self._moved[address] = 0

    # -- the guard's hook ------------------------------------------------------------------

    @hookimpl
    def message_moved(self, original: Message, copy: Message, ctx: HookContext,
                      reason: str) -> None:
        settings = self.guard.settings.resolve(original.address)
        if copy.address not in (settings.dead_letter_target(original.address),
                                settings.expiry_target(original.address)):
            return  # a redistribution, not a dead letter
        with self._lock:
            if copy.address not in self._moved and len(self._moved) >= self.max_addresses:
                if not self._warned:
                    self._warned = True
                    log.warning("more than %d dead-letter addresses: %s and later ones are "
                                "left out of mqguard_dla_depth", self.max_addresses,
                                copy.address)
                return
            self._moved[copy.address] = self._moved.get(copy.address, 0) + 1

    # -- broker counts ---------------------------------------------------------------------

    def refresh(self) -> None:
        """Count every known address at the broker (errors are logged, not raised);
        nothing without :attr:`broker_counts`."""
        if not self.broker_counts:
            return
        with self._lock:
            addresses = list(self._moved)
        for address in addresses:
            with self._lock:
                moved_then = self._moved.get(address, 0)
            try:
                adapter = self._open(self.url, address)
                adapter.connect()
                try:
                    count = len(peek(adapter, address, window=self.window, idle_ms=300))
                finally:
                    adapter.close()
            except Exception as exc:  # the broker away: keep the last count
                log.warning("dead-letter depth of %s not counted: %s", address, exc)
                continue
            with self._lock:
                self._counted[address] = (count, moved_then)

    def run(self, stop: threading.Event) -> None:
        """:meth:`refresh` every ``interval_s`` until ``stop``, the first one ``interval_s``
        after the start: a count on RabbitMQ holds the messages for a moment, which a
        sidecar's start (or a short-lived one) should not cost its broker. Returns at
        once without :attr:`broker_counts`."""
        while self.broker_counts and not stop.wait(self.interval_s):
            self.refresh()

    def depth(self, address: str) -> int:
        with self._lock:
            moved = self._moved.get(address, 0)
            count, moved_then = self._counted.get(address, (0, 0))
            return count + moved - moved_then

    # -- Prometheus ------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            addresses = list(self._moved)
            moved = dict(self._moved)
        depth = GaugeMetricFamily("mqguard_dla_depth", "Messages in a dead-letter or expiry "
                                  "address: the broker's count when it was last taken plus "
                                  "what the sidecar moved there since.", labels=["address"])
        total = CounterMetricFamily("mqguard_dla_moved_total", "Copies the sidecar moved to a "
                                    "dead-letter or expiry address.", labels=["address"])
        for address in addresses:
            depth.add_metric([address], self.depth(address))
            total.add_metric([address], moved[address])
        yield depth
        yield total
