"""Per-address limits the checks judge against, from ``mqguard.toml``.

The event log records what happened, not what was allowed: whether 4 deliveries
are too many depends on the ``max-delivery-attempts`` of the message's address,
resolved with the same Artemis matching rules the guard used
(:class:`~mqguard.settings.AddressSettingsRepository`). Addresses are few next to
messages, so they are resolved here, on the driver, into a small table that the
Spark plan joins by broadcast (:func:`mqguard.audit.checks.context_frame`): no
Python runs per message. This module itself needs no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mqguard.config import MqguardConfig


@dataclass(frozen=True, slots=True)
class AddressLimits:
    """What the guard enforced on one address."""

    address: str
    max_delivery_attempts: int | None
    dead_letter_target: str | None
    expiry_target: str | None
    expiry_enforced: bool


def resolve_limits(config: MqguardConfig, addresses: Iterable[str], *,
                   max_delivery_attempts: int | None = None) -> list[AddressLimits]:
    """Resolve every address; ``max_delivery_attempts`` overrides the configuration.

    A disabled ``delivery_counting`` plugin means nothing counted deliveries, so
    no limit is judged (unless given explicitly); a disabled ``expiry`` plugin means
    nothing kept expired messages from handlers.
    """
    repository = config.address_settings_repository()
    disabled = set(config.core.disabled_plugins)
    counting = "delivery_counting" not in disabled
    expiry = "expiry" not in disabled
    limits = []
    for address in sorted(set(addresses)):
        settings = repository.resolve(address)
        if max_delivery_attempts is not None:
            limit = max_delivery_attempts
        else:
            limit = settings.max_delivery_attempts if counting else 0
        limits.append(AddressLimits(
            address=address,
            max_delivery_attempts=limit if limit > 0 else None,
            dead_letter_target=settings.dead_letter_target(address),
            expiry_target=settings.expiry_target(address),
            expiry_enforced=expiry,
        ))
    return limits
