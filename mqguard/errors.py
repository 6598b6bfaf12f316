"""Exceptions raised by mqguard. Every one says what failed and what to do."""

from __future__ import annotations


class MqguardError(Exception):
    """Base class of every mqguard error."""


class ConfigError(MqguardError):
    """Invalid configuration: the message names the file, the key and the value."""


class MessageRejected(MqguardError):
    """A plugin refused a message on the send path."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"message to {address!r} rejected: {reason}")
        self.address = address
        self.reason = reason


class TransactionRolledBack(MqguardError):
    """COMMIT failed; nothing of the transaction reached the broker."""

    def __init__(self, transaction: str, reason: str) -> None:
        super().__init__(f"transaction {transaction} rolled back: {reason}")
        self.transaction = transaction
        self.reason = reason


class AdapterError(MqguardError):
    """The broker adapter failed (connection refused, ERROR frame, timeout...)."""


class StoreError(MqguardError):
    """The store failed (Redis unreachable, script error...)."""


class Nack(MqguardError):
    """Raise from a consumer handler to refuse a message without it being a crash."""
