"""What every hook gets besides the message: :class:`HookContext`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mqguard.adapter import Capabilities
from mqguard.settings import AddressSettings

if TYPE_CHECKING:
    from mqguard.events import EventLog
    from mqguard.pipeline import Guard
    from mqguard.stores.base import Store


@dataclass(slots=True)
class HookContext:
    """Where a hook is called from and what it may use."""

    guard: Guard
    #: The address the message is sent to / was delivered from.
    address: str
    #: Effective address settings (resolved and cached by the guard).
    settings: AddressSettings
    #: Capabilities of the broker adapter in use.
    capabilities: Capabilities
    #: ``producer``, ``consumer`` or ``sidecar``.
    role: str
    #: Name of the queue (subscription) on the deliver path; None on the send path.
    queue: str | None = None
    #: Id of the broker transaction the send belongs to, if any.
    transaction: str | None = None
    #: Broker flavour (``activemq``, ``rabbitmq``, ``mosquitto``, ...).
    broker: str = "unknown"
    #: Raw frame headers on the deliver path, for broker-specific plugins.
    raw_headers: dict[str, str] | None = None
    #: Delivery count reported by the broker itself (RabbitMQ quorum queues), if any.
    native_delivery_count: int | None = None
    #: The broker (or a held redelivery) says this delivery is not the first.
    redelivered: bool = False
    #: True on the send path when the message is part of a batch that
    #: ``before_send_batch`` will see as a whole (work may be deferred to it).
    batch: bool = False
    #: One ordered stream of sends whose confirmations come back in order (a sidecar
    #: client connection), or None. Sends of one sender succeed or fail in order, which
    #: lets duplicate detection drop a repeat of an id the same sender still has in flight.
    sender: str | None = None
    #: Time (epoch ms) of the ``delivered`` event of this delivery, once written.
    delivered_ts: int | None = None

    @property
    def store(self) -> Store:
        return self.guard.store

    @property
    def events(self) -> EventLog:
        return self.guard.events

    def plugin_options(self, name: str) -> dict[str, Any]:
        return self.guard.config.plugin_options(name)
