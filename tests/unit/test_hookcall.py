"""HotCall: pluggy's call semantics without its per-call cost (pure logic, no servers)."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pluggy
import pytest

from mqguard import hookimpl, hookspecs
from mqguard.hookcall import HotCall
from mqguard.plugin_manager import GuardPluginManager


def _manager() -> GuardPluginManager:
    manager = GuardPluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    return manager


class Recorder:
    def __init__(self, name: str, calls: list[tuple[str, tuple[Any, ...]]],
                 result: Any = None) -> None:
        self.name, self.calls, self.result = name, calls, result

    @hookimpl
    def before_deliver(self, message: Any, ctx: Any) -> Any:
        self.calls.append((self.name, (message, ctx)))
        return self.result


class CtxFirst:
    """Takes a subset of the spec's arguments, in another order."""

    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]]) -> None:
        self.calls = calls

    @hookimpl
    def message_acknowledged(self, reason: Any, message: Any) -> None:
        self.calls.append(("ctx-first", (reason, message)))


def test_first_calls_last_registered_first_and_stops_at_a_result() -> None:
    manager, calls = _manager(), []
    manager.register(Recorder("a", calls, result="A"))
    manager.register(Recorder("b", calls, result=None))
    call = HotCall(manager.hook.before_deliver, manager)
    assert call.first("m", "c") == "A"
    assert calls == [("b", ("m", "c")), ("a", ("m", "c"))]


def test_arguments_are_mapped_to_each_implementations_names() -> None:
    manager, calls = _manager(), []
    manager.register(CtxFirst(calls))
    HotCall(manager.hook.message_acknowledged, manager).each("m", "c", "r")
    assert calls == [("ctx-first", ("r", "m"))]


def test_registering_and_unregistering_after_the_first_call_are_seen() -> None:
    manager, calls = _manager(), []
    call = HotCall(manager.hook.before_deliver, manager)
    assert call.first("m", "c") is None and not call
    late = Recorder("late", calls, result="L")
    manager.register(late)
    assert call.first("m", "c") == "L"
    manager.unregister(late)
    assert call.first("m", "c") is None
    assert calls == [("late", ("m", "c"))]


def test_a_plain_pluggy_manager_works_without_the_generation_counter() -> None:
    manager, calls = pluggy.PluginManager(hookspecs.PROJECT_NAME), []
    manager.add_hookspecs(hookspecs)
    call = HotCall(manager.hook.before_deliver, manager)
    assert call.first("m", "c") is None
    manager.register(Recorder("x", calls, result="X"))
    assert call.first("m", "c") == "X"


def test_each_logs_a_failing_observer_and_calls_the_next(
        caplog: pytest.LogCaptureFixture) -> None:
    manager, calls = _manager(), []

    class Failing:
        @hookimpl
        def message_acknowledged(self, message: Any, ctx: Any, reason: Any) -> None:
            raise RuntimeError("observer broke")

    manager.register(CtxFirst(calls))
    manager.register(Failing())
    with caplog.at_level(logging.ERROR, logger="mqguard.plugins"):
        HotCall(manager.hook.message_acknowledged, manager).each("m", "c", "r")
    assert calls == [("ctx-first", ("r", "m"))]
    assert "observer broke" in caplog.text


def test_a_wrapper_goes_through_pluggy_with_named_arguments() -> None:
    manager, seen = _manager(), []

    class Wrapper:
        @hookimpl(wrapper=True)
        def before_deliver(self, message: Any, ctx: Any) -> Generator[None, Any, Any]:
            seen.append((message, ctx))
            result = yield
            return result or "wrapped"

    manager.register(Wrapper())
    assert HotCall(manager.hook.before_deliver, manager).first("m", "c") == "wrapped"
    assert seen == [("m", "c")]


def test_a_hook_without_spec_is_refused() -> None:
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.register(Recorder("unverified", []))  # a hook known only from its implementation
    with pytest.raises(ValueError, match="no hookspec"):
        HotCall(manager.hook.before_deliver, manager)
