"""One test per hookspec (datasette's rule), and a meta-test enforcing it.

Each test registers a recording plugin and drives the pipeline on the
loopback broker until the hook fires, checking the arguments it receives.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

from mqguard import hookimpl, hookspecs
from mqguard.adapter import Delivery
from mqguard.config import MqguardConfig
from mqguard.consumer import GuardedConsumer
from mqguard.context import HookContext
from mqguard.errors import AdapterError, ConfigError, Nack, TransactionRolledBack
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.plugin_manager import make_plugin_manager
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import AckReason, Action, Verdict


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def kwargs(self, name: str) -> dict[str, Any]:
        return next(kw for n, kw in self.calls if n == name)


def recording_plugin(hook: str, result: Any = None) -> tuple[object, Recorder]:
    """A plugin object implementing ``hook`` with all of its spec's arguments."""
    recorder = Recorder()
    params = list(inspect.signature(getattr(hookspecs, hook)).parameters)

    def record(**kwargs: Any) -> Any:
        recorder.calls.append((hook, kwargs))
        return result

    # pluggy reads argument names from the function's code object (how, differs between
    # pluggy versions), so generate a real function with exactly the spec's parameters.
    source = (f"def {hook}({', '.join(params)}):\n"
              f"    return record({', '.join(f'{p}={p}' for p in params)})\n")
    namespace: dict[str, Any] = {"record": record}
    exec(source, namespace)  # identifiers come from the hookspecs module only
    plugin = type(f"Record_{hook}", (), {})()
    setattr(plugin, hook, hookimpl(namespace[hook]))
    return plugin, recorder


def register(guard: Guard, hook: str, result: Any = None) -> Recorder:
    plugin, recorder = recording_plugin(hook, result)
    guard.plugins.register(plugin)
    return recorder


def consume(guard: Guard, adapter: LoopbackAdapter, handler: Any, address: str = "q") -> None:
    with GuardedConsumer(adapter, address, handler, guard):
        adapter.pump()


def test_hook_configure() -> None:
    config = MqguardConfig()
    manager = make_plugin_manager(config)
    plugin, recorder = recording_plugin("configure")
    manager.register(plugin)  # historic: a late plugin still gets the call
    assert recorder.kwargs("configure")["config"] is config


def test_hook_guard_started(guard: Guard) -> None:
    recorder = register(guard, "guard_started")
    guard._started = False
    guard.start()
    assert recorder.kwargs("guard_started")["guard"] is guard


def test_hook_guard_stopping(guard: Guard) -> None:
    recorder = register(guard, "guard_stopping")
    guard.close()
    assert recorder.kwargs("guard_stopping")["guard"] is guard


def test_hook_before_send(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "before_send")
    GuardedProducer(adapter, guard).send("q", b"x", headers={"h": "1"})
    kwargs = recorder.kwargs("before_send")
    assert kwargs["message"].message_id and kwargs["message"].headers == {"h": "1"}
    assert isinstance(kwargs["ctx"], HookContext) and kwargs["ctx"].role == "producer"


def test_hook_before_send_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "before_send_batch", {1: Verdict.drop("second refused")})
    producer = GuardedProducer(adapter, guard)
    batch = [producer.message("q", body) for body in (b"0", b"1", b"2")]
    results = producer.send_batch(batch)
    assert [r.sent for r in results] == [True, False, True]
    assert [m.body for m in recorder.kwargs("before_send_batch")["messages"]] == [
        b"0", b"1", b"2"]
    assert recorder.kwargs("before_send_batch")["ctx"].batch is True
    assert [m.body for m in adapter.loop.drain("q")] == [b"0", b"2"]


def test_hook_after_send(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "after_send")
    sent = GuardedProducer(adapter, guard).send("q", b"x").message
    assert recorder.kwargs("after_send")["message"] is sent
    adapter.fail_sends = True
    with pytest.raises(AdapterError):
        GuardedProducer(adapter, guard).send("q", b"y")
    assert recorder.names() == ["after_send"]  # not called for a failed send


def test_hook_after_send_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "after_send_batch")
    per_message = register(guard, "after_send")
    producer = GuardedProducer(adapter, guard)
    results = producer.send_batch([producer.message(address, body) for address, body in
                                   (("q", b"0"), ("r", b"1"), ("q", b"2"))])
    assert [call for call, _ in recorder.calls] == ["after_send_batch"]  # once per batch
    kwargs = recorder.kwargs("after_send_batch")
    assert kwargs["messages"] == [result.message for result in results]
    assert kwargs["ctx"].batch is True and kwargs["ctx"].address == "q"
    assert len(per_message.calls) == 3  # after_send still runs for each message first
    producer.send("q", b"single")
    assert len(recorder.calls) == 1  # not for a one-message send


def test_hook_on_send_exception(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "on_send_exception")
    adapter.fail_sends = True
    with pytest.raises(AdapterError):
        GuardedProducer(adapter, guard).send("q", b"x")
    assert isinstance(recorder.kwargs("on_send_exception")["exception"], AdapterError)


def test_hook_transaction_committing(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "transaction_committing", Verdict.reject("veto"))
    producer = GuardedProducer(adapter, guard)
    with pytest.raises(TransactionRolledBack, match="veto"), producer.transaction() as tx:
        producer.send("q", b"1", transaction=tx)
    assert [m.body for m in recorder.kwargs("transaction_committing")["messages"]] == [b"1"]
    assert adapter.loop.depth("q") == 0


def test_hook_transaction_ended(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "transaction_ended")
    producer = GuardedProducer(adapter, guard)
    with producer.transaction() as tx:
        producer.send("q", b"1", transaction=tx)
    with pytest.raises(KeyError), producer.transaction() as tx:
        raise KeyError("app failure")
    assert [kw["committed"] for _, kw in recorder.calls] == [True, False]


def test_hook_before_deliver(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "before_deliver", Verdict.drop("skip"))
    GuardedProducer(adapter, guard).send("q", b"x")
    handled: list[Message] = []
    consume(guard, adapter, handled.append)
    assert handled == []  # the DROP verdict kept it from the handler
    kwargs = recorder.kwargs("before_deliver")
    assert kwargs["message"].delivery_count == 1 and kwargs["ctx"].queue == "q"
    assert len(adapter.acked) == 1


def test_hook_after_deliver(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "after_deliver")
    producer = GuardedProducer(adapter, guard)
    producer.send("q", b"ok")
    consume(guard, adapter, lambda m: None)
    assert recorder.kwargs("after_deliver")["error"] is None


class Twins:
    """A plugin with the deliver path's per-message hooks and their batch twins."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    @hookimpl
    def before_deliver(self, message: Message, ctx: HookContext) -> Verdict | None:
        self.calls.append(("before_deliver", [message.message_id]))
        return None

    @hookimpl
    def before_deliver_batch(self, messages: list[Message], contexts: list[HookContext]
                             ) -> dict[int, Verdict] | None:
        assert [ctx.queue for ctx in contexts] == ["q"] * len(messages)
        self.calls.append(("before_deliver_batch", [m.message_id for m in messages]))
        return {1: Verdict.drop("second")}

    @hookimpl
    def after_deliver(self, message: Message, ctx: HookContext,
                      error: BaseException | None) -> None:
        self.calls.append(("after_deliver", [message.message_id]))

    @hookimpl
    def after_deliver_batch(self, messages: list[Message], contexts: list[HookContext]) -> None:
        self.calls.append(("after_deliver_batch", [m.message_id for m in messages]))

    @hookimpl
    def message_acknowledged(self, message: Message, ctx: HookContext,
                             reason: AckReason) -> None:
        self.calls.append(("message_acknowledged", [message.message_id]))

    @hookimpl
    def message_acknowledged_batch(self, messages: list[Message], contexts: list[HookContext],
                                   reason: AckReason) -> None:
        assert reason is AckReason.NORMAL
        self.calls.append(("message_acknowledged_batch", [m.message_id for m in messages]))


def open_three(guard: Guard, adapter: LoopbackAdapter) -> tuple[Twins, list[Delivery],
                                                                 list[HookContext | None]]:
    twins = Twins()
    guard.plugins.register(twins)
    deliveries = [Delivery(Message("q", b"x", message_id=f"m{n}"), "s", (None, 0))
                  for n in range(3)]
    return twins, deliveries, guard.open_deliveries(adapter, deliveries, ["q"] * 3)


def test_hook_before_deliver_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    twins, _, contexts = open_three(guard, adapter)
    # One call for the three (the per-message hook is not called), its verdict applied.
    assert twins.calls[0] == ("before_deliver_batch", ["m0", "m1", "m2"])
    assert [ctx is not None for ctx in contexts] == [True, False, True]
    assert [m.message_id for m in adapter.acked] == ["m1"]


def test_hook_after_deliver_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    twins, deliveries, contexts = open_three(guard, adapter)
    twins.calls.clear()
    guard.finish_deliveries(adapter, [(deliveries[0], contexts[0], None),
                                      (deliveries[2], contexts[2], None)])  # type: ignore[list-item]
    assert ("after_deliver_batch", ["m0", "m2"]) in twins.calls
    assert not any(name == "after_deliver" for name, _ in twins.calls)


def test_hook_message_acknowledged_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    twins, deliveries, contexts = open_three(guard, adapter)
    twins.calls.clear()
    guard.finish_deliveries(adapter, [(deliveries[0], contexts[0], None),
                                      (deliveries[2], contexts[2], None)])  # type: ignore[list-item]
    assert twins.calls == [("after_deliver_batch", ["m0", "m2"]),
                           ("message_acknowledged_batch", ["m0", "m2"])]
    assert [m.message_id for m in adapter.acked] == ["m1", "m0", "m2"]


def test_batch_twin_without_its_hook_is_refused(guard: Guard) -> None:
    class Orphan:
        @hookimpl
        def after_deliver_batch(self, messages: list[Message],
                                contexts: list[HookContext]) -> None:
            pass

    guard.plugins.register(Orphan())
    guard._started = False
    with pytest.raises(ConfigError, match="after_deliver_batch but not after_deliver"):
        guard.start()


def test_hook_on_handler_failure(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "on_handler_failure", Verdict.drop("give up"))
    GuardedProducer(adapter, guard).send("q", b"x")

    def fail(message: Message) -> None:
        raise Nack("no")

    consume(guard, adapter, fail)
    assert isinstance(recorder.kwargs("on_handler_failure")["error"], Nack)
    assert adapter.nacked == [] and len(adapter.acked) == 1


def test_hook_message_acknowledged(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "message_acknowledged")
    GuardedProducer(adapter, guard).send("q", b"x")
    consume(guard, adapter, lambda m: None)
    assert recorder.kwargs("message_acknowledged")["reason"] is AckReason.NORMAL


def test_hook_message_nacked(guard: Guard, adapter: LoopbackAdapter) -> None:
    recorder = register(guard, "message_nacked")
    GuardedProducer(adapter, guard).send("q", b"x")
    seen: list[int] = []

    def fail_once(message: Message) -> None:
        seen.append(message.delivery_count)
        if len(seen) == 1:
            raise Nack("once")

    consume(guard, adapter, fail_once)
    assert recorder.kwargs("message_nacked")["requeue"] is True
    assert seen == [1, 2]


def test_hook_message_moved(guard: Guard, adapter: LoopbackAdapter) -> None:
    register(guard, "before_deliver", Verdict.move("elsewhere", "test"))
    recorder = register(guard, "message_moved")
    GuardedProducer(adapter, guard).send("q", b"x")
    consume(guard, adapter, lambda m: None)
    kwargs = recorder.kwargs("message_moved")
    assert kwargs["copy"].address == "elsewhere" and kwargs["reason"] == "test"
    assert adapter.loop.depth("elsewhere") == 1


# The expiry reaper (issue 5) is the caller of the next three hooks; until it
# lands these tests pin the specifications' arguments, so the reaper is built
# against exactly what plugins implement.


def test_hook_message_expired(guard: Guard) -> None:
    recorder = register(guard, "message_expired")
    ctx = guard.context("q", LoopbackAdapter().capabilities)
    message = Message("q", expiration=1)
    guard.hook.message_expired(message=message, ctx=ctx, moved_to="EXP.q")
    assert recorder.kwargs("message_expired") == {"message": message, "ctx": ctx,
                                                  "moved_to": "EXP.q"}


def test_hook_before_expiry_scan(guard: Guard) -> None:
    recorder = register(guard, "before_expiry_scan")
    ctx = guard.context("q", LoopbackAdapter().capabilities)
    guard.hook.before_expiry_scan(address="q", ctx=ctx)
    assert recorder.kwargs("before_expiry_scan")["address"] == "q"


def test_hook_after_expiry_scan(guard: Guard) -> None:
    recorder = register(guard, "after_expiry_scan")
    ctx = guard.context("q", LoopbackAdapter().capabilities)
    guard.hook.after_expiry_scan(address="q", ctx=ctx, expired=3)
    assert recorder.kwargs("after_expiry_scan")["expired"] == 3


def test_decision_hooks_are_firstresult(guard: Guard, adapter: LoopbackAdapter) -> None:
    first = register(guard, "before_send", Verdict(Action.CONTINUE))
    later = register(guard, "before_send", Verdict.reject("never asked"))  # called first (LIFO)
    with pytest.raises(Exception, match="never asked"):
        GuardedProducer(adapter, guard).send("q", b"x")
    assert later.names() == ["before_send"] and first.names() == []


def test_every_hookspec_has_a_test() -> None:
    specs = {name for name, obj in inspect.getmembers(hookspecs, inspect.isfunction)
             if hasattr(obj, "mqguard_spec")}
    tests = {name.removeprefix("test_hook_") for name in dir(sys.modules[__name__])
             if name.startswith("test_hook_")}
    assert specs, "no hookspecs found: the marker attribute changed?"
    assert specs - tests == set(), f"hookspecs without a test_hook_<name>: {specs - tests}"
