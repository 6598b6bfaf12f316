"""Every observer hook, on every path that calls it, isolates a raising implementation.

The hookspecs promise that an observer's exception is logged (with the hook's and the
plugin's names) and that the other observers still run. The list of observers is
derived from the specs (:func:`mqguard.hookspecs.observer_hooks`), so a new hook is
covered here as soon as it is specified: each test below fails for a hook without a
driver. Two kinds of tests:

* the calling helpers (:func:`~mqguard.hookcall.observe`, ``HotCall.each``,
  ``BatchCall.each``), with and without a wrapper implementation, for every observer;
* the guard's and the reaper's real paths (loopback broker), one or more scenarios
  per observer, with a plugin that raises called before a recording one.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Generator
from typing import Any

import pytest

from mqguard import hookimpl, hookspecs
from mqguard.adapter import Delivery
from mqguard.consumer import GuardedConsumer
from mqguard.errors import AdapterError, ConfigError, Nack
from mqguard.hookcall import BatchCall, HotCall, observe
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.plugin_manager import GuardPluginManager, check_plugins
from mqguard.producer import GuardedProducer
from mqguard.reaper import ExpiryReaper
from mqguard.testing.loopback import LoopbackAdapter
from mqguard.verdict import Verdict

OBSERVERS = hookspecs.observer_hooks()
RAISER = "raiser"
RECORDER = "recorder"


def _spec_params(hook: str) -> list[str]:
    return list(inspect.signature(getattr(hookspecs, hook)).parameters)


def _twin_of(hook: str) -> str | None:
    """The per-message hook a batch twin stands in for, if ``hook`` is one."""
    single = hook.removesuffix("_batch")
    return single if single != hook and single in _all_specs() else None


def _all_specs() -> set[str]:
    return {name for name, obj in inspect.getmembers(hookspecs, inspect.isfunction)
            if hasattr(obj, f"{hookspecs.PROJECT_NAME}_spec")}


def _plugin(hooks: dict[str, Callable[..., None]], **opts: Any) -> object:
    """A plugin object implementing each of ``hooks`` with all of its spec's arguments."""
    plugin = type("Generated", (), {})()
    for hook, behaviour in hooks.items():
        params = _spec_params(hook)
        # pluggy reads the argument names from the function: generate one with exactly
        # the spec's parameters (identifiers come from the hookspecs module only).
        call = f"behaviour({', '.join(f'{p}={p}' for p in params)})"
        # A wrapper must itself be a generator function: delegate to the behaviour's.
        body = f"(yield from {call})" if opts.get("wrapper") else call
        source = f"def {hook}({', '.join(params)}):\n    return {body}\n"
        namespace: dict[str, Any] = {"behaviour": behaviour}
        exec(source, namespace)
        setattr(plugin, hook, hookimpl(**opts)(namespace[hook]))
    return plugin


class Calls:
    def __init__(self) -> None:
        self.hooks: list[str] = []

    def recorder(self, hook: str) -> Callable[..., None]:
        def record(**kwargs: Any) -> None:
            self.hooks.append(hook)
        return record


def _raise(hook: str) -> Callable[..., None]:
    def fail(**kwargs: Any) -> None:
        raise RuntimeError(f"{hook} is broken")
    return fail


def _register_pair(manager: Any, hook: str) -> Calls:
    """The recorder, then the raiser: pluggy calls the last registered first, so the
    raiser runs before the recorder. A batch twin comes with its per-message hook (a
    twin alone is ignored), which does not raise."""
    calls = Calls()
    hooks = [hook] + ([single] if (single := _twin_of(hook)) else [])
    manager.register(_plugin({h: calls.recorder(h) for h in hooks}), name=RECORDER)
    raising = {hook: _raise(hook)}
    if single := _twin_of(hook):
        raising[single] = lambda **kwargs: None
    manager.register(_plugin(raising), name=RAISER)
    return calls


def _assert_isolated(hook: str, calls: Calls, caplog: pytest.LogCaptureFixture) -> None:
    assert hook in calls.hooks, f"{hook}: the observer after the raising one was not called"
    failures = [r for r in caplog.records if r.name == "mqguard.plugins"]
    assert failures, f"{hook}: the failure was not logged"
    text = failures[0].getMessage()
    assert hook in text and RAISER in text, text
    assert failures[0].exc_info is not None and f"{hook} is broken" in str(
        failures[0].exc_info[1])


def test_the_observer_list_is_derived_from_the_specs() -> None:
    # The hooks the issue named as observers that pluggy's call left unprotected.
    assert {"on_send_exception", "transaction_ended", "after_send", "after_deliver",
            "message_nacked", "message_expired", "message_moved", "before_expiry_scan",
            "after_expiry_scan", "message_acknowledged", "after_send_batch",
            "after_deliver_batch", "message_acknowledged_batch"} == set(OBSERVERS)
    for name in OBSERVERS:
        options = getattr(getattr(hookspecs, name), f"{hookspecs.PROJECT_NAME}_spec")
        assert not options["firstresult"] and name not in hookspecs.LIFECYCLE_HOOKS


# -- the calling helpers -----------------------------------------------------------------


def _manager() -> GuardPluginManager:
    manager = GuardPluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    return manager


def _kwargs(hook: str) -> dict[str, Any]:
    return {name: f"<{name}>" for name in _spec_params(hook)}


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "with-wrapper"])
@pytest.mark.parametrize("path", ["observe", "HotCall.each"])
@pytest.mark.parametrize("hook", OBSERVERS)
def test_a_raising_observer_does_not_stop_the_next(
        hook: str, path: str, wrapped: bool, caplog: pytest.LogCaptureFixture) -> None:
    manager = _manager()
    caplog.set_level(logging.ERROR, logger="mqguard.plugins")
    calls = _register_pair(manager, hook)
    wrapper_saw: list[str] = []
    if wrapped:
        def around(**kwargs: Any) -> Generator[None, object, object]:
            result = yield
            wrapper_saw.append("completed")
            return result
        # tryfirst: the wrapper is outermost, around both implementations.
        manager.register(_plugin({hook: around}, wrapper=True, tryfirst=True), name="wrapper")
    caller = getattr(manager.hook, hook)
    kwargs = _kwargs(hook)
    if path == "observe":
        observe(caller, **kwargs)
    else:
        HotCall(caller, manager).each(*kwargs.values())
    _assert_isolated(hook, calls, caplog)
    # A wrapper sees a normal call: the failure is logged, not passed through it.
    assert wrapper_saw == (["completed"] if wrapped else [])


@pytest.mark.parametrize("hook", [h for h in OBSERVERS if _twin_of(h)])
def test_a_raising_batch_twin_does_not_stop_the_next(
        hook: str, caplog: pytest.LogCaptureFixture) -> None:
    manager = _manager()
    caplog.set_level(logging.ERROR, logger="mqguard.plugins")
    calls = _register_pair(manager, hook)
    single = _twin_of(hook)
    assert single is not None
    rest = tuple(_kwargs(hook).values())[2:]
    BatchCall(getattr(manager.hook, single), getattr(manager.hook, hook), manager).each(
        ["m1", "m2"], ["c1", "c2"], rest, rest)
    _assert_isolated(hook, calls, caplog)


def test_a_raising_wrapper_is_logged_with_its_plugin(caplog: pytest.LogCaptureFixture) -> None:
    manager = _manager()
    caplog.set_level(logging.ERROR, logger="mqguard.plugins")
    calls = Calls()
    manager.register(_plugin({"message_nacked": calls.recorder("message_nacked")}), name="r")

    def broken(**kwargs: Any) -> Generator[None, object, object]:
        yield
        raise RuntimeError("wrapper broke")

    manager.register(_plugin({"message_nacked": broken}, wrapper=True), name="bad-wrapper")
    observe(manager.hook.message_nacked, **_kwargs("message_nacked"))
    assert calls.hooks == ["message_nacked"]
    (record,) = [r for r in caplog.records if r.name == "mqguard.plugins"]
    assert "message_nacked" in record.getMessage() and "bad-wrapper" in record.getMessage()


def test_a_missing_argument_is_the_callers_bug_and_raises() -> None:
    manager = _manager()
    manager.register(_plugin({"message_nacked": lambda **kwargs: None}))
    with pytest.raises(KeyError):
        observe(manager.hook.message_nacked, message="m", ctx="c")


# -- the guard's and the reaper's paths ----------------------------------------------------


def _consume(guard: Guard, adapter: LoopbackAdapter, handler: Callable[[Message], None],
             address: str = "q") -> None:
    with GuardedConsumer(adapter, address, handler, guard):
        adapter.pump()


def _send(guard: Guard, adapter: LoopbackAdapter) -> None:
    GuardedProducer(adapter, guard).send("q", b"x")


def _send_in_transaction(guard: Guard, adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard)
    with producer.transaction() as tx:
        producer.send("q", b"1", transaction=tx)


def _roll_back(guard: Guard, adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard)
    with pytest.raises(KeyError), producer.transaction() as tx:
        producer.send("q", b"1", transaction=tx)
        raise KeyError("application failure")


def _send_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    producer = GuardedProducer(adapter, guard)
    producer.send_batch([producer.message("q", b) for b in (b"0", b"1")])


def _failed_send(guard: Guard, adapter: LoopbackAdapter) -> None:
    adapter.fail_sends = True
    with pytest.raises(AdapterError):
        GuardedProducer(adapter, guard).send("q", b"x")


def _deliver(guard: Guard, adapter: LoopbackAdapter) -> None:
    _send(guard, adapter)
    _consume(guard, adapter, lambda m: None)


def _fail_once(guard: Guard, adapter: LoopbackAdapter) -> None:
    _send(guard, adapter)
    seen: list[int] = []

    def handler(message: Message) -> None:
        seen.append(message.delivery_count)
        if len(seen) == 1:
            raise Nack("once")

    _consume(guard, adapter, handler)
    assert seen == [1, 2]


def _deliver_expired(guard: Guard, adapter: LoopbackAdapter) -> None:
    adapter.loop.enqueue(Message("q", b"x", expiration=1))
    handled: list[Message] = []
    _consume(guard, adapter, handled.append)
    assert handled == []


def _move_at_delivery(guard: Guard, adapter: LoopbackAdapter) -> None:
    mover = _plugin({"before_deliver": lambda **kwargs: Verdict.move("elsewhere", "test")})
    guard.plugins.register(mover, name="mover")
    _deliver(guard, adapter)
    assert adapter.loop.depth("elsewhere") == 1


def _finish_batch(guard: Guard, adapter: LoopbackAdapter) -> None:
    deliveries = [Delivery(Message("q", b"x", message_id=f"m{n}"), "s", (None, 0))
                  for n in range(2)]
    contexts = guard.open_deliveries(adapter, deliveries, ["q"] * 2)
    guard.finish_deliveries(adapter, [(d, c, None) for d, c in zip(deliveries, contexts,
                                                                   strict=True)])


def _reaper_scan(guard: Guard, adapter: LoopbackAdapter) -> None:
    # The loopback broker has no way to find expired messages at rest: the reap step
    # stands in for the broker's, the hooks around it are the reaper's own calls.
    reaper = ExpiryReaper(guard, adapter, ["q"])
    result = reaper._scan("q", "selector", lambda address, ctx: 1)
    assert result.expired == 1


def _reaper_expires(guard: Guard, adapter: LoopbackAdapter) -> None:
    reaper = ExpiryReaper(guard, adapter, ["q"])
    message = Message("q", b"x", expiration=1)
    copy = Message("EXP.q", b"x")
    reaper._notify(message, copy, "EXP.q", reaper._context("q"))


#: Every observer hook, and the real paths that call it.
DRIVERS: dict[str, list[Callable[[Guard, LoopbackAdapter], None]]] = {
    "after_send": [_send, _send_in_transaction, _send_batch],
    "after_send_batch": [_send_batch],
    "on_send_exception": [_failed_send],
    "transaction_ended": [_send_in_transaction, _roll_back],
    "after_deliver": [_deliver, _fail_once],
    "after_deliver_batch": [_finish_batch],
    "message_acknowledged": [_deliver, _move_at_delivery],
    "message_acknowledged_batch": [_finish_batch],
    "message_nacked": [_fail_once],
    "message_expired": [_deliver_expired, _reaper_expires],
    "message_moved": [_move_at_delivery, _reaper_expires],
    "before_expiry_scan": [_reaper_scan],
    "after_expiry_scan": [_reaper_scan],
}


def test_every_observer_has_a_driver() -> None:
    assert set(DRIVERS) == set(OBSERVERS), "a new observer hook needs a driver in DRIVERS"


@pytest.mark.parametrize(("hook", "driver"), [(hook, driver) for hook in OBSERVERS
                                               for driver in DRIVERS.get(hook, [None])],
                         ids=lambda value: getattr(value, "__name__", value))
def test_the_guards_paths_isolate_a_raising_observer(
        hook: str, driver: Callable[[Guard, LoopbackAdapter], None] | None, guard: Guard,
        adapter: LoopbackAdapter, caplog: pytest.LogCaptureFixture) -> None:
    assert driver is not None, f"no driver for observer {hook}"
    caplog.set_level(logging.ERROR, logger="mqguard.plugins")
    calls = _register_pair(guard.plugins, hook)
    driver(guard, adapter)
    _assert_isolated(hook, calls, caplog)


# -- misspelled implementations ------------------------------------------------------------


class Misspelled:
    @hookimpl
    def after_sned(self, message: Message) -> None:  # the hook is after_send
        raise AssertionError("never called")


class Optional:
    @hookimpl(optionalhook=True)
    def some_future_hook(self) -> None:
        raise AssertionError("never called")


def test_a_misspelled_hookimpl_stops_the_guard_at_start(tmp_path: Any) -> None:
    from mqguard.config import parse_config

    config = parse_config({"mqguard": {"event-log": {"directory": str(tmp_path)}}})
    guard = Guard(config)
    guard.plugins.register(Misspelled(), name="typo-plugin")
    with pytest.raises(ConfigError) as raised:
        guard.start()
    text = str(raised.value)
    assert "typo-plugin" in text and "'after_sned'" in text and "after_send" in text
    assert not guard._started
    guard.close()


def test_an_optional_hookimpl_is_accepted() -> None:
    manager = _manager()
    manager.register(Optional(), name="optional")
    check_plugins(manager)  # no error


def test_the_built_in_plugins_pass_the_check(guard: Guard) -> None:
    check_plugins(guard.plugins)
    assert guard._started
