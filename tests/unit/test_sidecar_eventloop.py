"""Choosing the sidecar's event loop (mqguard.sidecar.eventloop)."""

from __future__ import annotations

import asyncio

import pytest

from mqguard.errors import ConfigError
from mqguard.sidecar import eventloop


def test_auto_is_uvloop_when_installed_else_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: True)
    assert eventloop.resolve("auto") == "uvloop"
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: False)
    assert eventloop.resolve("auto") == "asyncio"
    assert eventloop.loop_factory("auto") is asyncio.new_event_loop


def test_uvloop_asked_for_but_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "uvloop_available", lambda: False)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        eventloop.resolve("uvloop")
    with pytest.raises(ConfigError, match="must be one of"):
        eventloop.resolve("trio")


def test_each_kind_makes_a_working_loop() -> None:
    for kind in ("asyncio", "uvloop"):
        loop = eventloop.loop_factory(kind)()
        try:
            assert loop.run_until_complete(asyncio.sleep(0, result=kind)) == kind
            assert ("uvloop" in type(loop).__module__) == (kind == "uvloop")
        finally:
            loop.close()
