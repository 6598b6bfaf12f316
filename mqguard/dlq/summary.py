"""``mqguard dlq list``: what a dead-letter address holds, summed up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mqguard.config import MqguardConfig
from mqguard.dlq.model import DeadLetter
from mqguard.matching import is_wildcard, matches

__all__ = ["MAX_GROUPS", "REASON_CHARS", "AddressSummary", "configured_addresses",
           "is_dead_letter_address", "summarize"]

#: Groups (original addresses, reasons) listed per address; the rest are summed as "other".
MAX_GROUPS: Final = 20
#: A reason is grouped by its first this-many characters (exception texts vary at the end).
REASON_CHARS: Final = 120


@dataclass(slots=True)
class AddressSummary:
    address: str
    messages: int = 0
    oldest: int | None = None
    newest: int | None = None
    by_original: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    expired: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "messages": self.messages, "expired": self.expired,
                "oldest": self.oldest, "newest": self.newest,
                "by_original": self.by_original, "by_reason": self.by_reason}


def _top(counter: Counter[str]) -> dict[str, int]:
    top = dict(counter.most_common(MAX_GROUPS))
    rest = sum(counter.values()) - sum(top.values())
    if rest:
        top["(other)"] = rest
    return top


def summarize(address: str, letters: Sequence[DeadLetter]) -> AddressSummary:
    times = [t for t in (x.aged_from for x in letters) if t is not None]
    originals = Counter(x.original_address or "(unknown)" for x in letters)
    reasons = Counter((x.reason or "(unknown)")[:REASON_CHARS] for x in letters)
    return AddressSummary(address, len(letters), min(times, default=None),
                          max(times, default=None), _top(originals), _top(reasons),
                          sum(1 for x in letters if x.kind == "expired"))


def configured_addresses(config: MqguardConfig, extra: Iterable[str] = (),
                         pattern: str | None = None) -> list[str]:
    """The dead-letter and expiry addresses ``mqguard.toml`` names, plus ``extra``,
    filtered by ``pattern`` (an address or an address-settings match key).

    STOMP and MQTT have no way to enumerate a broker's queues, so the configuration is the
    list: each ``dead-letter-address`` / ``expiry-address``, and for a literal match key
    with ``auto-create-*-resources`` its per-address queue.
    """
    repository = config.address_settings_repository()
    found: list[str] = []
    for key in repository.match_keys:
        settings = repository.resolve(key)
        if is_wildcard(key):
            found += [a for a in (settings.dead_letter_address, settings.expiry_address) if a]
        else:
            found += [a for a in (settings.dead_letter_target(key), settings.expiry_target(key))
                      if a]
    found += list(extra)
    unique = list(dict.fromkeys(found))
    if pattern is None:
        return unique
    return [a for a in unique if a == pattern or (is_wildcard(pattern) and matches(pattern, a))]


def is_dead_letter_address(config: MqguardConfig, address: str) -> bool:
    """Whether ``mqguard.toml`` sends dead letters or expired messages to ``address``: one
    of :func:`configured_addresses`, or the auto-created per-address queue
    (``<prefix><original><suffix>``) of an address a wildcard match key covers."""
    if address in configured_addresses(config):
        return True
    repository = config.address_settings_repository()
    for key in repository.match_keys:
        settings = repository.resolve(key)
        shapes = []
        if settings.auto_create_dead_letter_resources:
            shapes.append((settings.dead_letter_queue_prefix, settings.dead_letter_queue_suffix))
        if settings.auto_create_expiry_resources:
            shapes.append((settings.expiry_queue_prefix, settings.expiry_queue_suffix))
        for prefix, suffix in shapes:
            if not (address.startswith(prefix) and address.endswith(suffix)
                    and len(address) > len(prefix) + len(suffix)):
                continue
            original = address[len(prefix):len(address) - len(suffix)]
            resolved = repository.resolve(original)
            if address in (resolved.dead_letter_target(original),
                           resolved.expiry_target(original)):
                return True
    return False
