"""Hook specifications: the whole plugin API of mqguard.

Modelled on ActiveMQ Artemis's ``ActiveMQServerMessagePlugin``. Plugins are
modules or objects with functions marked ``@mqguard.hookimpl`` whose names
match the specifications below; like pytest, an implementation may accept any
subset of the specification's arguments.

Three kinds of hooks:

* **Decision hooks** (:func:`before_send`, :func:`before_deliver`,
  :func:`on_handler_failure`, :func:`transaction_committing`) return a
  :class:`~mqguard.verdict.Verdict` or ``None``. They are *firstresult*: the
  first implementation that returns a verdict decides and the rest are not
  called. ``None`` means "no opinion, ask the next plugin". Order plugins with
  ``tryfirst`` / ``trylast``.
* :func:`before_send_batch` collects: every implementation is called and
  their ``{index: verdict}`` answers are merged.
* **Batch twins** of per-message hooks (:func:`before_deliver_batch`,
  :func:`after_deliver_batch`, :func:`message_acknowledged_batch`) let a plugin
  handle the deliveries of one broker read (or the acknowledgements of one client
  read) in one call. They are optional and never replace the per-message hook: a
  plugin implements them *in addition* to it, and must give exactly the outcome its
  per-message hook would give called on each message in order. A plugin that
  implements only the per-message hook keeps working: the guard calls it once per
  message instead (see :meth:`~mqguard.pipeline.Guard.open_deliveries`).
* **Observers** (everything else but the lifecycle hooks) return nothing. An
  exception raised by one is logged (logger ``mqguard.plugins``, with the
  implementation's name) and does not change the message's fate nor stop the
  other observers: the broker already has the message (``after_send``) or the
  acknowledgement (``message_acknowledged``), and a bookkeeping plugin's bug must
  not make a sender resend or a consumer believe a message is unsettled.
  This holds on every path that calls an observer, with or without wrapper
  implementations (:mod:`mqguard.hookcall`); :func:`observer_hooks` lists them.
  The lifecycle hooks (:func:`configure`, :func:`guard_started`,
  :func:`guard_stopping`) do raise: a plugin that cannot start stops the guard.

A guard refuses to start when a plugin implements a hook that is not specified
here (a misspelled name would otherwise never be called); mark an implementation
``@hookimpl(optionalhook=True)`` to have it ignored when no such hook exists.

Every hook but the lifecycle ones receives a :class:`~mqguard.context.HookContext`
as ``ctx``: the resolved address settings, the store, the event log, the
adapter's capabilities and the transaction, if any.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from mqguard.config import MqguardConfig
    from mqguard.context import HookContext
    from mqguard.message import Message
    from mqguard.pipeline import Guard
    from mqguard.verdict import AckReason, Verdict

PROJECT_NAME = "mqguard"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: The hooks that raise (a plugin that cannot start stops the guard); never observers.
LIFECYCLE_HOOKS: frozenset[str] = frozenset({"configure", "guard_started", "guard_stopping"})


# -- lifecycle -----------------------------------------------------------------


@hookspec(historic=True)
def configure(config: MqguardConfig) -> None:
    """Called once the configuration is loaded, before any message flows.

    Validate your ``[plugins.<name>]`` table here and raise
    :class:`~mqguard.errors.ConfigError` naming the key when it is wrong.
    Historic: plugins registered later are called with the same config.
    """


@hookspec
def guard_started(guard: Guard) -> None:
    """Called when a guard (producer, consumer or sidecar) starts. Start threads here."""


@hookspec
def guard_stopping(guard: Guard) -> None:
    """Called when a guard stops, before the event log is closed. Stop threads here."""


# -- send path -----------------------------------------------------------------


@hookspec(firstresult=True)
def before_send(message: Message, ctx: HookContext) -> Verdict | None:
    """Decide whether ``message`` goes to the broker (Artemis ``beforeSend``).

    The message already carries its mqguard id. Implementations may modify it
    (stamp an expiration, add headers) and return ``None`` to let the next plugin
    decide, or return a verdict: ``Verdict.reject(reason)`` fails the send,
    ``Verdict.drop(reason)`` swallows it while the send still succeeds for the
    caller (how duplicates are treated), ``Verdict.move(address, reason)``
    sends it elsewhere. Inside a transaction ``ctx.transaction`` is set.
    """


@hookspec
def before_send_batch(messages: list[Message], ctx: HookContext) -> dict[int, Verdict] | None:
    """Decide about a batch at once, after ``before_send`` accepted each of ``messages``.

    Called once per batch by :meth:`~mqguard.pipeline.Guard.decide_sends` (the
    wrappers' ``send_batch``, a sidecar connection's SENDs of one read) outside
    transactions, with ``ctx.batch`` True (``before_send`` saw the same flag and may
    have deferred its work to this hook, e.g. to check all duplicate ids in one store
    round trip).
    Return ``{index: verdict}`` for the messages to refuse (DROP or REJECT); every
    implementation is called and the verdicts are merged, the first per index wins.
    """


@hookspec
def after_send(message: Message, ctx: HookContext) -> None:
    """The broker confirmed ``message`` (Artemis ``afterSend``).

    Inside a transaction this is called at COMMIT, once the broker confirmed it,
    for each message of the transaction.
    """


@hookspec
def after_send_batch(messages: list[Message], ctx: HookContext) -> None:
    """The broker confirmed ``messages``, a batch decided with ``ctx.batch`` True.

    The counterpart of :func:`before_send_batch`: called once per
    :meth:`~mqguard.pipeline.Guard.settle_sends` call with the confirmed messages that
    were decided as a batch (``send_batch`` outside transactions, the sidecar), *after*
    :func:`after_send` was called for each message.
    Those ``after_send`` calls saw ``ctx.batch`` True and may have left their work
    to this hook (e.g. confirming every duplicate id of the batch under one lock).
    ``ctx`` is the first message's; the messages may go to several addresses.
    """


@hookspec
def on_send_exception(message: Message, ctx: HookContext, exception: BaseException) -> None:
    """Sending ``message`` failed with ``exception`` (Artemis ``onSendException``).

    The exception is re-raised to the caller after every implementation ran.
    """


@hookspec(firstresult=True)
def transaction_committing(transaction: str, messages: list[Message],
                           ctx: HookContext) -> Verdict | None:
    """A transaction is about to commit ``messages``; ``Verdict.reject`` rolls it back.

    Used for work that must happen atomically with COMMIT, such as making a
    transaction's duplicate ids visible (Artemis adds them to the cache on commit).
    firstresult: the first verdict decides.
    """


@hookspec
def transaction_ended(transaction: str, committed: bool, ctx: HookContext) -> None:
    """A transaction committed (``committed=True``) or was rolled back / aborted."""


# -- deliver path ----------------------------------------------------------------


@hookspec(firstresult=True)
def before_deliver(message: Message, ctx: HookContext) -> Verdict | None:
    """Decide whether a delivered ``message`` reaches the application (Artemis ``beforeDeliver``).

    ``message.delivery_count`` is already counted for this delivery. Return
    ``None`` to hand it on, or a verdict: ``drop`` acknowledges it unhandled
    (a suppressed duplicate delivery), ``move`` sends a copy elsewhere and
    acknowledges the original (expired -> expiry address), ``reject``
    acknowledges it with reason KILLED without handling.
    """


@hookspec
def before_deliver_batch(messages: list[Message], contexts: list[HookContext]
                         ) -> dict[int, Verdict] | None:
    """The batch twin of :func:`before_deliver`: decide several deliveries in one call.

    ``contexts[i]`` is ``messages[i]``'s context. Used by
    :meth:`~mqguard.pipeline.Guard.open_deliveries` (the sidecar: the MESSAGEs of one
    broker read) only when *every* ``before_deliver`` implementation has this twin;
    otherwise each message goes through ``before_deliver`` on its own. Plugins are
    called in ``before_deliver``'s order, each with the messages no earlier plugin
    decided (so ``messages`` may be a subset of the batch; indexes refer to the list
    given). Return ``{index: verdict}`` for the messages you decide, None or ``{}``
    for none. The messages of one call are in delivery order and distinct: no two
    share a message id, or a producer id and sequence (the guard starts another call
    at a repeat, after the earlier one's verdict was applied); verdicts are applied in
    order after every plugin has seen the call. The answers must be those
    ``before_deliver`` would give on each message in order.
    """


@hookspec
def after_deliver(message: Message, ctx: HookContext, error: BaseException | None) -> None:
    """The application handler returned (``error`` is None) or raised ``error``."""


@hookspec
def after_deliver_batch(messages: list[Message], contexts: list[HookContext]) -> None:
    """The batch twin of :func:`after_deliver` for successful handlings (``error`` None).

    Called by :meth:`~mqguard.pipeline.Guard.finish_deliveries` (the sidecar: the ACKs
    of one client read) with the messages in acknowledgement order; failures go
    through ``after_deliver`` one by one. Plugins without this twin get
    ``after_deliver(message, ctx, None)`` per message, in the same plugin order.
    """


@hookspec(firstresult=True)
def on_handler_failure(message: Message, ctx: HookContext,
                       error: BaseException) -> Verdict | None:
    """The handler failed on ``message``: decide its fate (Artemis ``checkRedelivery``).

    Return ``Verdict.move(dla, reason)`` to dead-letter it, ``Verdict.drop`` to
    discard it, or a verdict with action CONTINUE after having arranged a
    redelivery yourself (then the pipeline acknowledges the current delivery).
    ``None`` from every plugin: the pipeline negatively acknowledges the
    delivery and leaves the rest to the broker.
    """


@hookspec
def message_acknowledged(message: Message, ctx: HookContext, reason: AckReason) -> None:
    """A delivery was acknowledged, with why (Artemis ``messageAcknowledged``)."""


@hookspec
def message_acknowledged_batch(messages: list[Message], contexts: list[HookContext],
                               reason: AckReason) -> None:
    """The batch twin of :func:`message_acknowledged`: ``messages`` were acknowledged,
    all for ``reason``, after ``after_deliver_batch``. Plugins without this twin get
    ``message_acknowledged`` per message, in the same plugin order."""


@hookspec
def message_nacked(message: Message, ctx: HookContext, requeue: bool) -> None:
    """The handler failed and no plugin decided: ``requeue=True`` means a requeueing NACK went
    to the broker (RabbitMQ); ``requeue=False`` means the delivery was left unacknowledged
    (ActiveMQ 5, whose NACK is a poison ack, and MQTT): the broker redelivers it after the
    consumer reconnects."""


@hookspec
def message_expired(message: Message, ctx: HookContext, moved_to: str | None) -> None:
    """``message`` expired; ``moved_to`` is the expiry address, or None if it was dropped."""


@hookspec
def message_moved(original: Message, copy: Message, ctx: HookContext, reason: str) -> None:
    """A copy of ``original`` was sent to ``copy.address`` (dead-letter, expiry, redistribution)."""


# -- expiry reaper -----------------------------------------------------------------


@hookspec
def before_expiry_scan(address: str, ctx: HookContext) -> None:
    """The expiry reaper is about to scan ``address``."""


@hookspec
def after_expiry_scan(address: str, ctx: HookContext, expired: int) -> None:
    """The expiry reaper finished ``address``; ``expired`` messages were moved or dropped."""


# -- introspection (not hooks) ------------------------------------------------------


def observer_hooks() -> tuple[str, ...]:
    """The names of the observer hooks, in source order, derived from the specs above.

    An observer is a hook that is neither a lifecycle hook, nor firstresult, nor
    annotated to return something (the decisions and :func:`before_send_batch`).
    Derived, not listed, so that a new hook is classified (and tested) by its spec.
    """
    marker = f"{PROJECT_NAME}_spec"
    module = sys.modules[__name__]
    specs = [function for _, function in inspect.getmembers(module, inspect.isfunction)
             if hasattr(function, marker)]
    specs.sort(key=lambda function: function.__code__.co_firstlineno)
    return tuple(function.__name__ for function in specs
                 if function.__name__ not in LIFECYCLE_HOOKS
                 and not getattr(function, marker).get("firstresult")
                 and function.__annotations__.get("return") in (None, "None"))
