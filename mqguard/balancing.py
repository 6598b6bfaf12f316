"""Load balancing across a group of brokers (Artemis ``MessageLoadBalancingType``).

A *group* (``[mqguard.groups.<name>]``) is several independent brokers holding queues
of the same names, the way the nodes of an Artemis cluster do. A
:class:`GroupProducer` routes each send the way Artemis's ``BindingsImpl`` picks a
binding (``getNextBinding``):

``OFF``
    the local node only.
``STRICT``
    round robin over every node (each holds the queue), consumers or not.
``ON_DEMAND`` (Artemis's default)
    round robin over the nodes with a live consumer whose selector accepts the
    message; when there is none, the local node keeps it (Artemis gives the local
    binding priority among the low-priority ones).
``OFF_WITH_REDISTRIBUTION``
    the local node, like OFF; the redistributor (:mod:`mqguard.redistributor`)
    may move it later. Artemis refuses redistribution under OFF and STRICT.

Consumer presence is shared through the store: a :class:`PresenceBeacon` beats
every third of ``presence-ttl-ms`` for a consumer, and a consumer that stops
beating (crashed, partitioned) drops out after the TTL. :class:`GroupConsumer`
is a guarded consumer with its beacon. Every routing decision is a ``routed``
event (docs/events.md).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mqguard.adapter import Adapter, SubscribeOptions
from mqguard.balancing_selector import SelectorError, compile_selector
from mqguard.config import GroupConfig, MqguardConfig, load_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import ConfigError
from mqguard.message import Message, new_message_id
from mqguard.pipeline import Guard, SendResult
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.stores import Store

log = logging.getLogger("mqguard.balancing")

OFF = "OFF"
STRICT = "STRICT"
ON_DEMAND = "ON_DEMAND"
OFF_WITH_REDISTRIBUTION = "OFF_WITH_REDISTRIBUTION"
#: Modes under which Artemis redistributes (``BindingsImpl.redistribute`` refuses the others).
REDISTRIBUTING_MODES = frozenset({ON_DEMAND, OFF_WITH_REDISTRIBUTION})

#: Event type of a routing decision (schema v1 addition, docs/events.md).
ROUTED_EVENT = "routed"
#: Longest info a consumer may publish (selectors included); longer ones are ignored.
MAX_PRESENCE_INFO = 8192


def node_name(url: str) -> str:
    """The name of a node in events, metrics and presence: ``host:port``, no credentials.

    The host is what follows the *last* ``@``: a password holding an unencoded ``/``, ``?``
    or ``#`` would otherwise be taken for the host and port (mqguard.redact).
    """
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        url = f"{scheme}{sep}{rest.rpartition('@')[2]}"
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def group_config(config: MqguardConfig, name: str) -> GroupConfig:
    """``[mqguard.groups.<name>]``, or ConfigError naming the known groups."""
    group = config.core.groups.get(name)
    if group is None:
        known = ", ".join(sorted(config.core.groups)) or "none"
        raise ConfigError(f"{config.source}: no [mqguard.groups.{name}] (known: {known})")
    return group


# -- consumer presence --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Presence:
    """One live consumer of a queue, as read from the store."""

    member: str
    group: str
    node: str
    selector: str | None

    def accepts(self, headers: Mapping[str, str]) -> bool:
        """Would this consumer's selector take a message with ``headers``? A selector this
        process cannot evaluate counts as accepting (better a move than a stranded queue)."""
        if not self.selector:
            return True
        try:
            return compile_selector(self.selector).matches(headers)
        except SelectorError:
            return True


def live_consumers(store: Store, group: str, queue: str) -> list[Presence]:
    """The live consumers of ``queue`` in ``group``, read from the store."""
    out: list[Presence] = []
    for member, raw in store.presence_live(queue).items():
        if len(raw) > MAX_PRESENCE_INFO:
            continue
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(info, dict) or info.get("group") != group:
            continue
        node, selector = info.get("node"), info.get("selector")
        if isinstance(node, str) and (selector is None or isinstance(selector, str)):
            out.append(Presence(member, group, node, selector))
    return out


class PresenceBeacon:
    """Announces one consumer of ``queue`` on ``node`` in the store until stopped."""

    def __init__(self, store: Store, group: str, node: str, queue: str, *,
                 selector: str | None = None, ttl_ms: int = 10_000,
                 member: str | None = None) -> None:
        self.store = store
        self.queue = queue
        self.ttl_ms = ttl_ms
        self.member = member or f"{node}/{new_message_id()[:16]}"
        self.info = json.dumps({"group": group, "node": node, "selector": selector},
                               separators=(",", ":")).encode()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PresenceBeacon:
        # The first beat is synchronous: once start() returns, routers see the consumer.
        self.store.presence_beat(self.queue, self.member, self.info, self.ttl_ms)
        self._thread = threading.Thread(target=self._run, name="mqguard-presence", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            try:
                self.store.presence_beat(self.queue, self.member, self.info, self.ttl_ms)
            except Exception as exc:  # the next beat retries; the TTL covers two misses
                log.warning("presence heartbeat of %s on %s failed: %s", self.member,
                            self.queue, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.store.presence_leave(self.queue, self.member)
        except Exception as exc:
            log.warning("presence of %s on %s not withdrawn (it lapses after %d ms): %s",
                        self.member, self.queue, self.ttl_ms, exc)


# -- routing --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """Where one message goes and why."""

    node: str
    url: str
    mode: str
    reason: str


class GroupRouter:
    """Chooses a node per message (Artemis ``BindingsImpl.getNextBinding``). Thread-safe."""

    def __init__(self, name: str, group: GroupConfig, store: Store) -> None:
        self.name = name
        self.group = group
        self.store = store
        self.mode = group.message_load_balancing
        self.urls = list(group.nodes)
        self.names = [node_name(url) for url in self.urls]
        self.local_index = self.urls.index(group.local_node())
        self._position = 0
        self._lock = threading.Lock()

    @property
    def local(self) -> str:
        return self.names[self.local_index]

    def _route(self, index: int, reason: str) -> Route:
        return Route(self.names[index], self.urls[index], self.mode, reason)

    def _next(self, eligible: Callable[[int], bool]) -> int | None:
        # Round robin over the configured order, as Artemis walks its bindings array: start
        # at the saved position, take the first eligible node, save the one after it.
        with self._lock:
            count = len(self.urls)
            position = self._position % count
            for _ in range(count):
                index = position
                position = (position + 1) % count
                if eligible(index):
                    self._position = position
                    return index
            return None

    def choose(self, message: Message) -> Route:
        mode = self.mode
        if mode in (OFF, OFF_WITH_REDISTRIBUTION) or len(self.urls) == 1:
            return self._route(self.local_index, f"{mode}: local node")
        if mode == STRICT:
            index = self._next(lambda i: True)
            assert index is not None
            return self._route(index, "STRICT: round robin over every node")
        headers = message.wire_headers()
        with_consumers = {p.node for p in live_consumers(self.store, self.name, message.address)
                          if p.accepts(headers)}
        index = self._next(lambda i: self.names[i] in with_consumers)
        if index is None:
            return self._route(self.local_index,
                               "ON_DEMAND: no node has a matching consumer; local node")
        return self._route(index, "ON_DEMAND: round robin over nodes with a matching consumer")


class GroupProducer:
    """A guarded producer in front of a broker group; routes each send per the group's mode.

    >>> with GroupProducer("orders", config) as producer:  # doctest: +SKIP
    ...     producer.send("orders", b"{}")

    One producer id and one sequence for the whole group (the consumer audit's key),
    one guard (duplicate ids are checked per address whatever the node), one
    connection per node, opened on first use.
    """

    def __init__(self, group: str, config: MqguardConfig | None = None, *,
                 guard: Guard | None = None, producer_id: str | None = None,
                 adapter_options: Mapping[str, Any] | None = None) -> None:
        self.config = config if config is not None else (
            guard.config if guard is not None else load_config())
        self.group_name = group
        self.group = group_config(self.config, group)
        self._owns_guard = guard is None
        self.guard = guard if guard is not None else Guard(self.config, role="producer")
        self.router = GroupRouter(group, self.group, self.guard.store)
        self.producer_id = producer_id or new_message_id()
        self._options = dict(adapter_options or {})
        self._lock = threading.Lock()
        # The local node's producer numbers every message of the group (one sequence per
        # producer id, whatever node a message goes to).
        local = self.router.urls[self.router.local_index]
        self._builder = GuardedProducer(open_adapter(local, **self._options), self.guard,
                                        producer_id=self.producer_id)
        self._producers: dict[str, GuardedProducer] = {local: self._builder}

    def _producer(self, route: Route) -> GuardedProducer:
        with self._lock:
            producer = self._producers.get(route.url)
            if producer is None:
                adapter = open_adapter(route.url, **self._options)
                producer = GuardedProducer(adapter, self.guard, producer_id=self.producer_id)
                self._producers[route.url] = producer
        return producer.start()

    def message(self, address: str, body: bytes | str, **kwargs: Any) -> Message:
        """A stamped message (see :meth:`GuardedProducer.message`) with the group's sequence."""
        message = self._builder.message(address, body, **kwargs)
        message.message_id = new_message_id()
        return message

    def send(self, address: str, body: bytes | str, **kwargs: Any) -> SendResult:
        """Route and send one message; same arguments and errors as GuardedProducer.send."""
        return self.send_message(self.message(address, body, **kwargs))

    def send_message(self, message: Message) -> SendResult:
        if not message.message_id:
            message.message_id = new_message_id()
        route = self.router.choose(message)
        self.guard.events.emit(ROUTED_EVENT, message, mode=route.mode, target_node=route.node,
                               group=self.group_name, reason=route.reason)
        return self._producer(route).send_message(message)

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()
        if self._owns_guard:
            self.guard.close()

    def __enter__(self) -> GroupProducer:
        self.guard.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class GroupConsumer:
    """A :class:`~mqguard.consumer.GuardedConsumer` on one node of a group that announces
    itself (with its selector) so that ON_DEMAND routing and redistribution find it."""

    def __init__(self, group: str, node_url: str, address: str,
                 handler: Callable[[Message], object], guard: Guard, *,
                 adapter: Adapter | None = None, options: SubscribeOptions | None = None,
                 queue: str | None = None) -> None:
        self.group = group_config(guard.config, group)
        if node_url not in self.group.nodes:
            raise ConfigError(f"{node_name(node_url)} is not a node of group {group}")
        self.options = options or SubscribeOptions()
        self.consumer = GuardedConsumer(adapter or open_adapter(node_url), address, handler,
                                        guard, queue=queue, options=self.options)
        self.beacon = PresenceBeacon(guard.store, group, node_name(node_url), address,
                                     selector=self.options.selector,
                                     ttl_ms=self.group.presence_ttl_ms)

    def start(self) -> GroupConsumer:
        self.consumer.start()
        self.beacon.start()
        return self

    def stop(self) -> None:
        # Withdraw first: no router should pick this node for a consumer that is leaving.
        self.beacon.stop()
        self.consumer.stop()

    close = stop

    def __enter__(self) -> GroupConsumer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

