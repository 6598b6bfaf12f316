"""The scenario model of the differential conformance run: what is sent, how it is consumed,
and what an application can observe afterwards.

A scenario is plain data, independent of any broker: the same scenario runs against Artemis
itself and through mqguard (sidecar or wrappers) in front of ActiveMQ or RabbitMQ, and the
observations are compared (:mod:`mqguard.conformance.compare`).

Messages are named by their key (``m<key>`` is the body). A consumer's plan says, per key, what
it does with the 1st, 2nd, ... delivery of that message (``ack`` when the plan runs out):

* ``ack``: acknowledge;
* ``fail``: a failed delivery (a NACK through mqguard; see :mod:`mqguard.conformance.paths`
  for how each path expresses it);
* ``disconnect``: drop the connection with the message unacknowledged, then reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ACTIONS",
    "PATH_NAMES",
    "Action",
    "Batch",
    "DeadLetterMode",
    "Moved",
    "Observation",
    "Scenario",
    "SendSpec",
    "Settings",
    "Ttl",
    "TxMode",
]

#: Every path a scenario can run on, the oracle first (see :mod:`mqguard.conformance.paths`).
PATH_NAMES: tuple[str, ...] = ("artemis", "sidecar-activemq", "sidecar-rabbitmq",
                               "wrapper-activemq", "wrapper-rabbitmq")

Action = Literal["ack", "fail", "disconnect"]
ACTIONS: tuple[Action, ...] = ("ack", "fail", "disconnect")
Ttl = Literal["none", "short", "long"]
TxMode = Literal["none", "commit", "abort"]
DeadLetterMode = Literal["none", "address", "auto"]

#: A "short" time to live is over before the consumer starts; a "long" one never is.
SHORT_TTL_MS = 300
LONG_TTL_MS = 600_000


@dataclass(frozen=True)
class SendSpec:
    """One message: its key, optional duplicate id / bridge id, and its time to live."""

    key: int
    duplicate_id: str | None = None
    bridge_id: str | None = None
    ttl: Ttl = "none"

    @property
    def body(self) -> str:
        return f"m{self.key}"


@dataclass(frozen=True)
class Batch:
    """Sends outside a transaction (``none``) or in one transaction that commits or aborts."""

    sends: tuple[SendSpec, ...]
    transaction: TxMode = "none"


@dataclass(frozen=True)
class Settings:
    """The address settings of the scenario's address (Artemis names and meanings)."""

    max_delivery_attempts: int = 10
    redelivery_delay: int = 0
    dead_letter: DeadLetterMode = "none"
    expiry: DeadLetterMode = "none"
    #: ``expiry-delay`` (-1: unset).
    expiry_delay: int = -1

    def address_settings(self, address: str) -> dict[str, dict[str, Any]]:
        """The ``[address-settings]`` tables for ``address`` (and its targets)."""
        table: dict[str, Any] = {"max-delivery-attempts": self.max_delivery_attempts,
                                 "redelivery-delay": self.redelivery_delay}
        if self.expiry_delay >= 0:
            table["expiry-delay"] = self.expiry_delay
        if self.dead_letter != "none":
            table["dead-letter-address"] = dead_letter_address(address)
            table["auto-create-dead-letter-resources"] = self.dead_letter == "auto"
        if self.expiry != "none":
            table["expiry-address"] = expiry_address(address)
            table["auto-create-expiry-resources"] = self.expiry == "auto"
        return {address: table}


def dead_letter_address(address: str) -> str:
    return f"{address}.DLA"


def expiry_address(address: str) -> str:
    return f"{address}.EXP"


@dataclass(frozen=True)
class Scenario:
    """Settings, batches of sends, and the consumer's plan per key."""

    settings: Settings
    batches: tuple[Batch, ...]
    #: (key, actions for its 1st, 2nd, ... delivery); keys not listed are acknowledged.
    plans: tuple[tuple[int, tuple[Action, ...]], ...] = ()

    def plan(self, key: int) -> tuple[Action, ...]:
        return dict(self.plans).get(key, ())

    def action(self, key: int, attempt: int) -> Action:
        """What the consumer does with the ``attempt``-th (1-based) delivery of ``key``."""
        actions = self.plan(key)
        return actions[attempt - 1] if attempt <= len(actions) else "ack"

    @property
    def uses(self) -> frozenset[str]:
        """Features the scenario exercises (actions, transactions, ids, TTLs)."""
        found: set[str] = {a for _, acts in self.plans for a in acts}
        for batch in self.batches:
            if batch.transaction != "none":
                found.add(f"tx-{batch.transaction}")
            for send in batch.sends:
                if send.duplicate_id:
                    found.add("duplicate-id")
                if send.bridge_id:
                    found.add("bridge-id")
                if send.ttl != "none":
                    found.add(f"ttl-{send.ttl}")
        return frozenset(found)

    def describe(self) -> str:
        """One line per batch and plan, for reports."""
        s = self.settings
        lines = [f"settings: max-delivery-attempts={s.max_delivery_attempts} "
                 f"redelivery-delay={s.redelivery_delay} dead-letter={s.dead_letter} "
                 f"expiry={s.expiry} expiry-delay={s.expiry_delay}"]
        for i, batch in enumerate(self.batches):
            sends = ", ".join(
                f"m{x.key}" + (f" dup={x.duplicate_id}" if x.duplicate_id else "")
                + (f" bridge={x.bridge_id}" if x.bridge_id else "")
                + (f" ttl={x.ttl}" if x.ttl != "none" else "") for x in batch.sends)
            lines.append(f"batch {i} ({batch.transaction}): {sends}")
        for key, actions in self.plans:
            lines.append(f"consumer: m{key}: {' '.join(actions)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Moved:
    """A message found on a dead-letter or expiry queue, with the headers that say why."""

    key: int
    orig_address: str | None
    orig_queue: str | None
    has_orig_message_id: bool
    has_actual_expiry: bool


@dataclass
class Observation:
    """What the application saw when a path ran a scenario."""

    #: Per batch: "ok", or "error" when a send or the COMMIT was refused.
    batches: list[str] = field(default_factory=list)
    #: (key, attempt) in the order the consumer got them from the scenario's queue.
    deliveries: list[tuple[int, int]] = field(default_factory=list)
    dead_letters: list[Moved] = field(default_factory=list)
    expired: list[Moved] = field(default_factory=list)
    #: Deliveries of keys the scenario never sent, or unreadable frames (always a bug).
    strays: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "deliveries": [list(d) for d in self.deliveries],
            "dead_letters": [vars(m) for m in self.dead_letters],
            "expired": [vars(m) for m in self.expired],
            "strays": self.strays,
        }
