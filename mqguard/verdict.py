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


class AckReason(enum.Enum):
    """Why a delivered message was acknowledged (Artemis ``AckReason``)."""

    NORMAL = "normal"
    KILLED = "killed"
    EXPIRED = "expired"
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

    def __post_init__(self) -> None:
        if self.action is Action.MOVE and not self.address:
            raise ValueError("a MOVE verdict needs a target address")

    @classmethod
    def reject(cls, reason: str, *, event: str | None = None) -> Verdict:
        return cls(Action.REJECT, reason, event=event)

    @classmethod
    def drop(cls, reason: str, *, event: str | None = None,
             ack_reason: AckReason = AckReason.KILLED) -> Verdict:
        return cls(Action.DROP, reason, event=event, ack_reason=ack_reason)

    @classmethod
    def move(cls, address: str, reason: str, *, event: str | None = None,
             ack_reason: AckReason = AckReason.KILLED) -> Verdict:
        return cls(Action.MOVE, reason, address=address, event=event, ack_reason=ack_reason)


CONTINUE = Verdict(Action.CONTINUE)
