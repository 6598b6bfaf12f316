"""``duplicate_detection``: Artemis's duplicate-ID cache, shared through the store.

Semantics follow ActiveMQ Artemis (``PostOfficeImpl.checkDuplicateID``,
``DuplicateIDCacheImpl``):

* A message carrying ``_AMQ_DUPL_ID`` (or one of the extra header names in
  ``[plugins.duplicate_detection] headers``; over MQTT 5 a user property of the
  same name) is checked against the circular cache of its address, of size
  ``id-cache-size`` (0 turns detection off for that address). The cache holds
  8-byte digests (:mod:`mqguard.digest`); ids leave only when overwritten or
  cleared, never on acknowledgement or expiry.
* Outside a transaction a duplicate is not routed; the send still succeeds
  for the client (Artemis behaviour), with a WARN line and a
  ``duplicate_rejected`` event.
* Inside a transaction the ids become visible only at COMMIT, atomically with
  a re-check (another producer may have sent the same id meanwhile); a
  duplicate makes the transaction rollback-only and COMMIT fails with
  ``DUPLICATE_ID_REJECTED``. ABORT adds nothing.
* ``_AMQ_BRIDGE_DUP`` is checked first, against the separate cache
  ``BRIDGE.<address>``, with an immediate check-and-add; when present,
  ``_AMQ_DUPL_ID`` is not checked.

The plugin runs ``trylast``: a message another plugin rejects does not take a
slot in the cache.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from mqguard import hookimpl
from mqguard.config import MqguardConfig, PluginOptions, parse_plugin_options
from mqguard.context import HookContext
from mqguard.digest import id_digest
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER, DUPLICATE_ID_HEADER, Message
from mqguard.verdict import Verdict

log = logging.getLogger("mqguard.plugins.duplicate_detection")

NAME = "duplicate_detection"
DUPLICATE_EVENT = "duplicate_rejected"
#: Artemis's error code for a transaction that carried a duplicate.
TX_ERROR_CODE = "DUPLICATE_ID_REJECTED"
#: Longest duplicate id accepted; longer ones are refused (ids come from the network).
MAX_ID_LENGTH = 4096


def bridge_cache_name(address: str) -> str:
    return f"BRIDGE.{address}"


@dataclass
class _StagedTransaction:
    """Ids sent inside one transaction, per cache, in order."""

    ids: dict[str, list[bytes]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    duplicate_ids: dict[bytes, str] = field(default_factory=dict)


class DuplicateDetectionOptions(PluginOptions):
    """``[plugins.duplicate_detection]``."""

    #: Further header names (MQTT 5 user properties) whose values are duplicate ids, besides
    #: ``_AMQ_DUPL_ID``; the first one a message carries is used.
    headers: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


class DuplicateDetectionPlugin:
    """One instance per guard; holds only the staged ids of open transactions."""

    def __init__(self) -> None:
        self.extra_headers: tuple[str, ...] = ()
        self._staged: dict[str, _StagedTransaction] = {}
        self._lock = threading.Lock()

    @hookimpl
    def configure(self, config: MqguardConfig) -> None:
        headers = parse_plugin_options(config, NAME, DuplicateDetectionOptions).headers
        self.extra_headers = tuple(h for h in headers if h != DUPLICATE_ID_HEADER)

    def duplicate_id_of(self, message: Message) -> str | None:
        if message.duplicate_id is not None:
            return message.duplicate_id
        for header in self.extra_headers:
            value = message.headers.get(header)
            if value is not None:
                return value
        return None

    @hookimpl(trylast=True)
    def before_send(self, message: Message, ctx: HookContext) -> Verdict | None:
        capacity = ctx.settings.id_cache_size
        if capacity == 0:
            return None
        bridge_id = message.headers.get(BRIDGE_DUPLICATE_ID_HEADER)
        if bridge_id is not None:
            return self._check_now(message, ctx, bridge_cache_name(message.address), bridge_id,
                                   capacity)
        duplicate_id = self.duplicate_id_of(message)
        if duplicate_id is None:
            return None
        if ctx.transaction is not None:
            return self._stage(message, ctx, duplicate_id, capacity)
        if ctx.batch:
            # Checked with the rest of the batch in one store call per address.
            return self._too_long(duplicate_id)
        return self._check_now(message, ctx, message.address, duplicate_id, capacity)

    @hookimpl
    def before_send_batch(self, messages: list[Message], ctx: HookContext
                          ) -> dict[int, Verdict] | None:
        """One atomic check-and-add per address for every duplicate id of the batch."""
        groups: dict[str, list[tuple[int, str]]] = {}
        for index, message in enumerate(messages):
            if BRIDGE_DUPLICATE_ID_HEADER in message.headers:
                continue  # checked at once in before_send
            duplicate_id = self.duplicate_id_of(message)
            if duplicate_id is not None:
                groups.setdefault(message.address, []).append((index, duplicate_id))
        verdicts: dict[int, Verdict] = {}
        for address, entries in groups.items():
            capacity = ctx.guard.settings.resolve(address).id_cache_size
            if capacity == 0:
                continue
            flags = ctx.store.ring_check_and_add(
                address, [id_digest(dup) for _, dup in entries], capacity)
            for (index, duplicate_id), duplicate in zip(entries, flags, strict=True):
                if duplicate:
                    verdicts[index] = self._duplicate(messages[index], address, duplicate_id)
        return verdicts or None

    def _duplicate(self, message: Message, cache: str, duplicate_id: str) -> Verdict:
        log.warning("Duplicate message detected - message will not be routed: address=%s "
                    "duplicate_id=%r message_id=%s", message.address, duplicate_id,
                    message.message_id)
        return Verdict.drop(f"duplicate id {duplicate_id!r} already in the cache of {cache}",
                            event=DUPLICATE_EVENT)

    def _too_long(self, duplicate_id: str) -> Verdict | None:
        if len(duplicate_id) > MAX_ID_LENGTH:
            return Verdict.reject(f"duplicate id is {len(duplicate_id)} characters long; "
                                  f"the limit is {MAX_ID_LENGTH}")
        return None

    def _check_now(self, message: Message, ctx: HookContext, cache: str, duplicate_id: str,
                   capacity: int) -> Verdict | None:
        if (refusal := self._too_long(duplicate_id)) is not None:
            return refusal
        (duplicate,) = ctx.store.ring_check_and_add(cache, [id_digest(duplicate_id)], capacity)
        if not duplicate:
            return None
        if ctx.transaction is not None:
            reason = f"duplicate id {duplicate_id!r} already in the cache of {cache}"
            return Verdict.reject(f"{TX_ERROR_CODE}: {reason}", event=DUPLICATE_EVENT)
        return self._duplicate(message, cache, duplicate_id)

    def _stage(self, message: Message, ctx: HookContext, duplicate_id: str,
               capacity: int) -> Verdict | None:
        if (refusal := self._too_long(duplicate_id)) is not None:
            return refusal
        digest = id_digest(duplicate_id)
        assert ctx.transaction is not None
        with self._lock:
            staged = self._staged.setdefault(ctx.transaction, _StagedTransaction())
            in_tx = digest in staged.duplicate_ids
        in_cache = not in_tx and ctx.store.ring_contains(message.address, [digest])[0]
        if in_tx or in_cache:
            where = "this transaction" if in_tx else f"the cache of {message.address}"
            log.warning("Duplicate message detected in transaction %s - transaction is "
                        "rollback-only: address=%s duplicate_id=%r", ctx.transaction,
                        message.address, duplicate_id)
            return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {duplicate_id!r} already "
                                  f"in {where}", event=DUPLICATE_EVENT)
        with self._lock:
            staged.ids.setdefault(message.address, []).append(digest)
            staged.capacity[message.address] = capacity
            staged.duplicate_ids[digest] = duplicate_id
        return None

    @hookimpl
    def transaction_committing(self, transaction: str, ctx: HookContext) -> Verdict | None:
        with self._lock:
            staged = self._staged.get(transaction)
        if staged is None:
            return None
        # Re-check and add atomically per address: another producer may have
        # committed the same id since it was staged. (Addresses in different
        # Redis Cluster slots cannot share one script; see docs/duplicate-detection.md.)
        for address, digests in staged.ids.items():
            flags = ctx.store.ring_add_all_or_none(address, digests, staged.capacity[address])
            if any(flags):
                first = next(d for d, dup in zip(digests, flags, strict=True) if dup)
                duplicate_id = staged.duplicate_ids.get(first, "?")
                ctx.events.emit(DUPLICATE_EVENT, None, address=address,
                                duplicate_id=duplicate_id, transaction=transaction,
                                reason="committed concurrently by another producer")
                return Verdict.reject(f"{TX_ERROR_CODE}: duplicate id {duplicate_id!r} was "
                                      f"committed to {address} by another producer")
        return None

    @hookimpl
    def transaction_ended(self, transaction: str) -> None:
        with self._lock:
            self._staged.pop(transaction, None)
