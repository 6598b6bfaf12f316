"""Content-based duplicate ids: the canonical encoding, the address settings and the plugin
(against the loopback adapter and the memory store; the real brokers and Redis are in
tests/integration/test_content_dedup.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqguard.config import parse_config
from mqguard.digest import CONTENT_ID_PREFIX, content_id, content_id_input
from mqguard.errors import ConfigError
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter

CONTENT = {"duplicate-id-from": "content"}


def test_content_id_form_and_stability() -> None:
    one = content_id(b"payload", {}, ())
    assert one.startswith(CONTENT_ID_PREFIX) and len(one) == len(CONTENT_ID_PREFIX) + 32
    assert one == content_id(b"payload", {"unchosen": "x"}, ())
    assert one != content_id(b"payload2", {}, ())


@pytest.mark.parametrize(("a", "b"), [
    # Moving bytes between the body and a header value, or between two values.
    ((b"ab", {"h": "c"}, ["h"]), (b"a", {"h": "bc"}, ["h"])),
    ((b"", {"h": "ab", "k": "c"}, ["h", "k"]), (b"", {"h": "a", "k": "bc"}, ["h", "k"])),
    # Between a header's name and its value.
    ((b"", {"ab": "c"}, ["ab"]), (b"", {"a": "bc"}, ["a"])),
    # A missing header is not an empty one.
    ((b"x", {}, ["h"]), (b"x", {"h": ""}, ["h"])),
    # The configured order counts: names are part of the input, in order.
    ((b"x", {"h": "1", "k": "2"}, ["h", "k"]), (b"x", {"h": "1", "k": "2"}, ["k", "h"])),
    # A body that looks like an encoded header does not meet the header.
    ((b"\x00", {}, []), (b"", {}, [""])),
])
def test_canonical_encoding_keeps_inputs_apart(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    assert content_id_input(*a) != content_id_input(*b)
    assert content_id(*a) != content_id(*b)


def test_encoding_is_length_prefixed() -> None:
    data = content_id_input(b"abc", {"h": "v"}, ["h"])
    tag = b"mqguard-content-id/1"
    assert data == (len(tag).to_bytes(8, "big") + tag + (3).to_bytes(8, "big") + b"abc"
                    + (1).to_bytes(8, "big") + b"h" + b"\x01" + (1).to_bytes(8, "big") + b"v")


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"duplicate-id-from": "body"}, "duplicate-id-from", "'header' or 'content'"),
    ({"duplicate-id-from": "content", "duplicate-id-headers": ["a", "a"]},
     "duplicate-id-headers", "must not repeat"),
    ({"duplicate-id-from": "content", "duplicate-id-headers": [" "]},
     "duplicate-id-headers", "must not be blank"),
    ({"duplicate-id-from": "content", "duplicate-id-headers": "a"},
     "duplicate-id-headers", "valid list"),
    ({"duplicate-id-from": "header", "duplicate-id-headers": ["a"]},
     "duplicate-id-headers", 'only with duplicate-id-from = "content"'),
])
def test_settings_errors_name_the_key(table: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"address-settings": {"orders": table}})
    assert key in str(raised.value) and words in str(raised.value)


def test_settings_inherit_like_the_others() -> None:
    config = parse_config({"address-settings": {
        "iot.#": CONTENT, "iot.meters": {"duplicate-id-headers": ["device"]}}})
    repository = config.address_settings_repository()
    assert repository.resolve("iot.meters").duplicate_id_from == "content"
    assert repository.resolve("iot.meters").duplicate_id_headers == ("device",)
    assert repository.resolve("iot.lamps").duplicate_id_headers == ()
    assert repository.resolve("orders").duplicate_id_from == "header"


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[tuple[Guard, LoopbackAdapter, GuardedProducer]]:
    guard = Guard(parse_config({
        "mqguard": {"event-log": {"directory": str(tmp_path / "ev")}},
        "address-settings": {"c": CONTENT, "ch": {**CONTENT, "duplicate-id-headers": ["dev"]},
                             "off": {**CONTENT, "id-cache-size": 0}}}))
    adapter = LoopbackAdapter()
    yield guard, adapter, GuardedProducer(adapter, guard)
    guard.close()


def test_loopback_content_dedup(producer: tuple[Guard, LoopbackAdapter, GuardedProducer],
                                tmp_path: Path) -> None:
    guard, adapter, out = producer
    assert out.send("c", b"same").sent
    assert not out.send("c", b"same").sent
    assert out.send("c", b"other").sent
    # A producer's own id wins over the content.
    assert out.send("c", b"same", duplicate_id="mine").sent
    assert out.send("ch", b"p", headers={"dev": "1"}).sent
    assert out.send("ch", b"p", headers={"dev": "2"}).sent
    assert not out.send("ch", b"p", headers={"dev": "1"}).sent
    # Without the setting, or with detection off, equal bodies pass.
    assert out.send("plain", b"same").sent and out.send("plain", b"same").sent
    assert out.send("off", b"same").sent and out.send("off", b"same").sent
    sent = adapter.loop.drain("c")
    assert [m.duplicate_id for m in sent] == [content_id(b"same", {}), content_id(b"other", {}),
                                             "mine"]
    assert all(m.duplicate_id is None for m in adapter.loop.drain("plain"))
    # The batch path decides the same way as the single sends.
    batch = out.send_batch([Message("c", b"b1"), Message("c", b"b1"), Message("c", b"same")])
    assert [r.sent for r in batch] == [True, False, False]
    guard.events.flush()
    rejected = [e for e in read_events(tmp_path / "ev") if e["type"] == "duplicate_rejected"]
    assert [e["duplicate_id"] for e in rejected] == [
        content_id(b"same", {}), content_id(b"p", {"dev": "1"}, ["dev"]),
        content_id(b"b1", {}), content_id(b"same", {})]
    assert all("content id" in e["reason"] for e in rejected)
