"""``logging``: log every decision that changes a message's fate.

Events are the record for machines; these lines are for the humans watching a
terminal. Normal traffic logs at DEBUG only, so the plugin costs nothing
unless something happens (or DEBUG is on).
"""

from __future__ import annotations

import logging

from mqguard import hookimpl
from mqguard.context import HookContext
from mqguard.message import Message
from mqguard.verdict import AckReason

log = logging.getLogger("mqguard.decisions")


@hookimpl
def message_acknowledged(message: Message, ctx: HookContext, reason: AckReason) -> None:
    if reason is not AckReason.NORMAL:
        log.warning("message %s on %s acknowledged without handling: %s",
                    message.message_id, ctx.address, reason.value)


@hookimpl
def message_acknowledged_batch(messages: list[Message], contexts: list[HookContext],
                               reason: AckReason) -> None:
    if reason is not AckReason.NORMAL:
        for message, ctx in zip(messages, contexts, strict=True):
            message_acknowledged(message, ctx, reason)


@hookimpl
def message_moved(original: Message, copy: Message, ctx: HookContext, reason: str) -> None:
    log.warning("message %s moved from %s to %s as %s: %s", original.message_id,
                original.address, copy.address, copy.message_id, reason)


@hookimpl
def message_nacked(message: Message, ctx: HookContext, requeue: bool) -> None:
    log.info("message %s on %s negatively acknowledged (requeue=%s)",
             message.message_id, ctx.address, requeue)


@hookimpl
def on_send_exception(message: Message, ctx: HookContext, exception: BaseException) -> None:
    log.error("send of %s to %s failed: %s", message.message_id, ctx.address, exception)


@hookimpl
def message_expired(message: Message, ctx: HookContext, moved_to: str | None) -> None:
    if moved_to is None:
        log.warning("message %s on %s expired and was dropped: no expiry address",
                    message.message_id, ctx.address)
