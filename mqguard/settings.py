"""Address settings with ActiveMQ Artemis semantics.

Each ``[address-settings."<match>"]`` table in ``mqguard.toml`` applies to the
addresses its match key fits (see :mod:`mqguard.matching`). For one address the
matching tables are merged most-specific-first: a value unset in the most
specific table is inherited from the next one, and so on down to the Artemis
defaults. Resolution is cached per address, so the hot path pays one dict
lookup.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mqguard.matching import ordered_matches


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class AddressSettingsTable(BaseModel):
    """One ``[address-settings."<match>"]`` table as written: every value optional."""

    model_config = ConfigDict(extra="forbid", alias_generator=_kebab, populate_by_name=True,
                              frozen=True, strict=True)

    #: Deliveries before a message is dead-lettered; -1 = unlimited.
    max_delivery_attempts: int | None = Field(None, ge=-1)
    #: Duplicate-ID cache (ring) size of the address; 0 turns duplicate detection off.
    id_cache_size: int | None = Field(None, ge=0)
    #: Where the duplicate id of a message without ``_AMQ_DUPL_ID`` comes from: ``header``
    #: (none: not checked) or ``content`` (a digest of the body and of the headers named in
    #: ``duplicate-id-headers``; docs/duplicate-detection.md). A message's own id wins.
    duplicate_id_from: Literal["header", "content"] | None = None
    #: With ``duplicate-id-from = "content"``: headers (MQTT 5 user properties) whose values
    #: enter the digest with the body, so equal bodies with different values are distinct.
    duplicate_id_headers: list[str] | None = None
    #: Milliseconds before a failed message is redelivered.
    redelivery_delay: int | None = Field(None, ge=0)
    #: Backoff factor applied to the delay per further attempt.
    redelivery_delay_multiplier: float | None = Field(None, ge=1.0)
    #: Cap on the redelivery delay in ms; unset: 10 x ``redelivery-delay``. An explicit 0
    #: caps every delay at 0 (redelivered at once), as in Artemis.
    max_redelivery_delay: int | None = Field(None, ge=0)
    #: Random spread of the delay (0..1): moved by up to +/- this fraction.
    redelivery_collision_avoidance_factor: float | None = Field(None, ge=0.0, le=1.0)
    #: Where poison messages go; unset (and no auto-created queue): dropped with a WARN.
    dead_letter_address: str | None = None
    #: Send dead letters to the queue ``<prefix><address><suffix>`` instead.
    auto_create_dead_letter_resources: bool | None = None
    #: Prefix of the auto-created dead-letter queue.
    dead_letter_queue_prefix: str | None = None
    #: Suffix of the auto-created dead-letter queue.
    dead_letter_queue_suffix: str | None = None
    #: Where expired messages go; unset (and no auto-created queue): dropped with a WARN.
    expiry_address: str | None = None
    #: Send expired messages to the queue ``<prefix><address><suffix>`` instead.
    auto_create_expiry_resources: bool | None = None
    #: Prefix of the auto-created expiry queue.
    expiry_queue_prefix: str | None = None
    #: Suffix of the auto-created expiry queue.
    expiry_queue_suffix: str | None = None
    #: Expiration (ms from send) given to messages without one; -1 = none.
    expiry_delay: int | None = Field(None, ge=-1)
    #: Lower bound (ms from send) on expirations; -1 = unset.
    min_expiry_delay: int | None = Field(None, ge=-1)
    #: Upper bound (ms from send) on expirations, also given to messages without one; -1 = unset.
    max_expiry_delay: int | None = Field(None, ge=-1)
    #: Remove every expiration: messages of the address never expire.
    no_expiry: bool | None = None
    #: Accepted for Artemis compatibility; not used by mqguard yet.
    auto_create_queues: bool | None = None
    #: Accepted for Artemis compatibility; not used by mqguard yet.
    auto_create_addresses: bool | None = None
    #: Ms a node's queue must have had no consumer before the redistributor moves its
    #: messages to a node that has one (broker groups); -1 = never.
    redistribution_delay: int | None = Field(None, ge=-1)
    #: Accepted for Artemis compatibility; not used by mqguard yet.
    send_to_dla_on_no_route: bool | None = None

    @field_validator("redelivery_delay_multiplier", "redelivery_collision_avoidance_factor",
                     mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        # TOML writes 2 for 2.0; strict mode would refuse it, which helps nobody.
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("duplicate_id_headers")
    @classmethod
    def _header_names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if any(not name.strip() for name in value):
            raise ValueError("header names must not be blank")
        if len(set(value)) != len(value):
            raise ValueError("header names must not repeat")
        return value

    @model_validator(mode="after")
    def _headers_need_content(self) -> AddressSettingsTable:
        if self.duplicate_id_headers and self.duplicate_id_from == "header":
            raise ValueError('duplicate-id-headers is used only with duplicate-id-from = '
                             '"content"')
        return self

    @field_validator("dead_letter_address", "expiry_address")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank; omit the key to leave it unset")
        return value


#: ``AddressSettings.max_redelivery_delay`` not given: 10 x ``redelivery-delay`` (Artemis).
UNSET_MAX_REDELIVERY_DELAY = -1


@dataclass(frozen=True, slots=True)
class AddressSettings:
    """Fully resolved settings of one address. Defaults are Artemis's."""

    max_delivery_attempts: int = 10
    #: ``[mqguard] id-cache-size`` (20000 by default).
    id_cache_size: int = 20000
    duplicate_id_from: str = "header"
    #: None: the body alone.
    duplicate_id_headers: tuple[str, ...] = ()
    redelivery_delay: int = 0
    redelivery_delay_multiplier: float = 1.0
    # UNSET_MAX_REDELIVERY_DELAY resolves to 10 x redelivery-delay in __post_init__, as
    # Artemis's getMaxRedeliveryDelay() does for its null: only an unset value defaults.
    #: Artemis: when unset, 10 x redelivery-delay; an explicit 0 caps every delay at 0.
    max_redelivery_delay: int = UNSET_MAX_REDELIVERY_DELAY
    redelivery_collision_avoidance_factor: float = 0.0
    dead_letter_address: str | None = None
    auto_create_dead_letter_resources: bool = False
    dead_letter_queue_prefix: str = "DLQ."
    dead_letter_queue_suffix: str = ""
    expiry_address: str | None = None
    auto_create_expiry_resources: bool = False
    expiry_queue_prefix: str = "EXP."
    expiry_queue_suffix: str = ""
    expiry_delay: int = -1
    min_expiry_delay: int = -1
    max_expiry_delay: int = -1
    no_expiry: bool = False
    auto_create_queues: bool = False
    auto_create_addresses: bool = False
    redistribution_delay: int = -1
    send_to_dla_on_no_route: bool = False

    def __post_init__(self) -> None:
        if self.max_redelivery_delay == UNSET_MAX_REDELIVERY_DELAY:
            # Resolved here rather than in merge_tables, so that settings built in code
            # (plugins, tests) get the same value as settings read from mqguard.toml.
            object.__setattr__(self, "max_redelivery_delay", 10 * self.redelivery_delay)

    def dead_letter_queue_for(self, address: str) -> str:
        """Name of the auto-created dead-letter queue of ``address``."""
        return f"{self.dead_letter_queue_prefix}{address}{self.dead_letter_queue_suffix}"

    def dead_letter_target(self, address: str) -> str | None:
        """Where dead letters of ``address`` go, or None (dropped, as Artemis does).

        With ``auto-create-dead-letter-resources`` the per-address queue
        ``<prefix><address><suffix>``: Artemis creates that queue on the DLA with a
        filter on ``_AMQ_ORIG_ADDRESS``; STOMP and MQTT brokers have no such
        bindings, so mqguard sends to the queue itself (created on first send).
        """
        if self.auto_create_dead_letter_resources:
            return self.dead_letter_queue_for(address)
        return self.dead_letter_address

    def expiry_target(self, address: str) -> str | None:
        """Where expired messages of ``address`` go, or None (dropped); see
        :meth:`dead_letter_target` for the auto-created queue."""
        if self.auto_create_expiry_resources:
            return self.expiry_queue_for(address)
        return self.expiry_address

    def expiry_queue_for(self, address: str) -> str:
        """Name of the auto-created expiry queue of ``address``."""
        return f"{self.expiry_queue_prefix}{address}{self.expiry_queue_suffix}"

    @property
    def has_move_target(self) -> bool:
        """Whether mqguard can move a message of this address anywhere: it has a
        dead-letter or an expiry target (every move goes to one). Without one a poison or
        expired message is dropped, so its send time (``mqguard-sent-at``) is not stamped:
        every header a guarded message carries costs its broker CPU per send."""
        return bool(self.dead_letter_address or self.auto_create_dead_letter_resources
                    or self.expiry_address or self.auto_create_expiry_resources)


_FIELD_NAMES = tuple(f.name for f in fields(AddressSettings))


def merge_tables(tables: list[AddressSettingsTable], *, global_id_cache_size: int | None = None
                 ) -> AddressSettings:
    """Merge tables given most specific first into resolved settings."""
    values: dict[str, Any] = {}
    for name in _FIELD_NAMES:
        for table in tables:
            value = getattr(table, name)
            if value is not None:
                values[name] = tuple(value) if isinstance(value, list) else value
                break
    if "id_cache_size" not in values and global_id_cache_size is not None:
        values["id_cache_size"] = global_id_cache_size
    # An unset max-redelivery-delay stays out of ``values``: AddressSettings derives it from
    # the *resolved* redelivery-delay. An explicit one (0 included) is kept as written.
    return AddressSettings(**values)


class AddressSettingsRepository:
    """Resolves the effective :class:`AddressSettings` of an address, with a cache."""

    def __init__(self, tables: dict[str, AddressSettingsTable] | None = None, *,
                 global_id_cache_size: int | None = None) -> None:
        self._tables = dict(tables or {})
        self._global_id_cache_size = global_id_cache_size
        self._cache: dict[str, AddressSettings] = {}
        self._lock = threading.Lock()

    @property
    def match_keys(self) -> list[str]:
        return list(self._tables)

    def matching_keys(self, address: str) -> list[str]:
        """Match keys that apply to ``address``, most specific first."""
        return ordered_matches(list(self._tables), address)

    def resolve(self, address: str) -> AddressSettings:
        cached = self._cache.get(address)
        if cached is not None:
            return cached
        tables = [self._tables[key] for key in self.matching_keys(address)]
        resolved = merge_tables(tables, global_id_cache_size=self._global_id_cache_size)
        with self._lock:
            # Bound the cache: addresses come from the network (sidecar), and an
            # unbounded dict would let a client exhaust memory with random names.
            if len(self._cache) >= 65536:
                self._cache.clear()
            self._cache[address] = resolved
        return resolved
