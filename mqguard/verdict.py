"""Verdicts returned by decision hooks, and acknowledgement reasons."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    """What the pipeline does with a message once a decision hook has spoken."""

    #: Go on: send it / hand it to the application. Ends the decision.
    CONTINUE = "continue"
    #: Refuse it. On send the caller gets :class:`~mqguard.errors.MessageRejected`;
    #: on delivery the message is not handed to the application and is acknowledged
    #: with reason KILLED.
    REJECT = "reject"
    #: Swallow it quietly. On send the call still succeeds for the client (Artemis
    #: does this with duplicates); on delivery it is acknowledged without handling.
    DROP = "drop"
    #: Route a copy to :attr:`Verdict.address` instead (dead-letter, expiry, ...)
    #: and acknowledge the original.
    MOVE = "move"
    #: Give the message back for another delivery after :attr:`Verdict.delay_ms`
    #: (on the deliver path only). How depends on the broker: see
    #: :mod:`mqguard.redelivery`.
    REDELIVER = "redeliver"


class AckReason(enum.StrEnum):
    """Why a delivered message was acknowledged (Artemis ``AckReason``).

    A ``StrEnum``: ``str(reason)`` is its value without the enum's ``.value``
    descriptor, which cost ~0.2 us on every ``acked`` event.
    """

    #: Handled by the application (or a duplicate delivery the consumer audit acknowledged).
    NORMAL = "normal"
    #: Not handled: rejected, dropped or moved (dead-lettered) by a plugin.
    KILLED = "killed"
    #: Expired: moved to the expiry address or dropped.
    EXPIRED = "expired"
    #: Replaced by a newer message (Artemis last-value queues); mqguard does not use it yet.
    REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision hook's answer. Return ``None`` from a hook to have no opinion."""

    action: Action
    reason: str = ""
    #: Target address for :attr:`Action.MOVE`.
    address: str | None = None
    #: Acknowledgement reason to use when the original is acknowledged (MOVE/DROP/REJECT).
    ack_reason: AckReason = AckReason.KILLED
    #: Name of the event the pipeline writes for this verdict; defaults per action.
    event: str | None = None
    #: Delay before the redelivery, for :attr:`Action.REDELIVER` (ms, >= 0).
    delay_ms: int = 0
    #: The message expired (Artemis ``expire``): a MOVE copy loses its expiration and
    #: gets ``_AMQ_ACTUAL_EXPIRY``; ``message_expired`` is called after the move or drop.
    expiry: bool = False

    def __post_init__(self) -> None:
        if self.action is Action.MOVE and not self.address:
            raise ValueError("a MOVE verdict needs a target address")
        if self.delay_ms < 0:
            raise ValueError(f"a redelivery delay must be >= 0 ms, got {self.delay_ms}")

    @classmethod
    def reject(cls, reason: str, *, event: str | None = None) -> Verdict:
        """Refuse the message (see :attr:`Action.REJECT`)."""
        return cls(Action.REJECT, reason, event=event)

    @classmethod
    def drop(cls, reason: str, *, event: str | None = None,
             ack_reason: AckReason = AckReason.KILLED) -> Verdict:
        """Swallow the message (see :attr:`Action.DROP`)."""
        return cls(Action.DROP, reason, event=event, ack_reason=ack_reason)

    @classmethod
    def move(cls, address: str, reason: str, *, event: str | None = None,
             ack_reason: AckReason = AckReason.KILLED) -> Verdict:
        """Send a copy to ``address`` and acknowledge the original (see :attr:`Action.MOVE`)."""
        return cls(Action.MOVE, reason, address=address, event=event, ack_reason=ack_reason)

    @classmethod
    def expire(cls, address: str | None, reason: str) -> Verdict:
        """An expired message: moved to ``address`` (the expiry address), or dropped if None."""
        return cls(Action.MOVE if address else Action.DROP, reason, address=address,
                   ack_reason=AckReason.EXPIRED, event="expired", expiry=True)

    @classmethod
    def redeliver(cls, delay_ms: int, reason: str = "", *, event: str | None = None) -> Verdict:
        """Deliver the message again after ``delay_ms`` (see :attr:`Action.REDELIVER`)."""
        return cls(Action.REDELIVER, reason, event=event, delay_ms=delay_ms)


CONTINUE = Verdict(Action.CONTINUE)
