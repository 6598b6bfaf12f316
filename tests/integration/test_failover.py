"""Failover: the consumer's connection is cut while it holds handled-but-unacked messages.

A fault-injection proxy sits between the consumer and the REAL broker. After 10 messages
its ACKs (PUBACKs) are swallowed, so the next 10 are handled but stay unacknowledged on
the broker; then the connection is cut. The adapter reconnects and the broker redelivers
those 10: the consumer audit must keep every one of them from the handler (zero double
invocations) without dead-lettering anything. The same run without the audit shows the
double invocations it prevents, so the test can tell the difference.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.demo.faultproxy import FaultProxy
from mqguard.events import read_events
from mqguard.message import Message
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter

BROKERS = [
    pytest.param(("activemq", "stomp"), marks=pytest.mark.activemq, id="activemq"),
    pytest.param(("rabbitmq", "stomp"), marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param(("mosquitto", "mqtt"), marks=pytest.mark.mosquitto, id="mosquitto"),
]

TOTAL, BLACKHOLE_AT, CUT_AT = 50, 10, 20


class FailoverHandler:
    """Handles messages; swallows acks after BLACKHOLE_AT and cuts the link at CUT_AT."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.calls: Counter[str] = Counter()
        self.unacked_handled = 0
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls[message.message_id] += 1
            handled = sum(self.calls.values())
        if handled == BLACKHOLE_AT:
            self.proxy.blackhole("upstream")  # from now on acks never reach the broker
        elif BLACKHOLE_AT < handled <= CUT_AT:
            self.unacked_handled += 1
            if handled == CUT_AT:
                self.proxy.restore()
                self.proxy.cut()  # this message's ack goes nowhere either

    def distinct(self) -> int:
        with self.lock:
            return len(self.calls)


def run_failover(url: str, scheme: str, tmp_path: Path, address: str,
                 audit: bool) -> tuple[FailoverHandler, list[dict[str, Any]], list[Message]]:
    events_dir = tmp_path / ("audit" if audit else "no-audit")
    config = parse_config({
        "mqguard": {"node-id": "failover", "disabled-plugins": [] if audit else
                    ["consumer_audit"],
                    "event-log": {"directory": str(events_dir), "flush-interval-ms": 20}},
        "address-settings": {address: {"dead-letter-address": f"{address}.DLA"}},
    })
    parts = urlsplit(url)
    dead: list[Message] = []
    with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy, \
            Guard(config) as guard, \
            GuardedConsumer(open_adapter(url), f"{address}.DLA", dead.append, guard):
        handler = FailoverHandler(proxy)
        options = {"client_id": f"failover-{address[-12:]}"} if scheme == "mqtt" else {}
        with GuardedConsumer(open_adapter(proxy.through(url), **options), address, handler,
                             guard):
            with GuardedProducer(open_adapter(url), guard) as producer:
                producer.send_batch([producer.message(address, b"%d" % i)
                                     for i in range(TOTAL)])
            deadline = time.monotonic() + 40
            while handler.distinct() < TOTAL and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # let any further redelivery arrive
            assert proxy.accepted >= 2, "the consumer did not reconnect through the proxy"
        guard.events.flush()
        return handler, list(read_events(events_dir)), dead


@pytest.mark.parametrize("kind", BROKERS)
def test_failover_with_audit_has_no_double_invocations(kind: tuple[str, str],
                                                       request: pytest.FixtureRequest,
                                                       tmp_path: Path,
                                                       mqguard_unique_name: str) -> None:
    server, scheme = kind
    url = request.getfixturevalue(f"mqguard_{server}_server").urls[scheme]
    handler, events, dead = run_failover(url, scheme, tmp_path, mqguard_unique_name, audit=True)
    assert handler.distinct() == TOTAL, "messages lost across the failover"
    assert handler.unacked_handled == CUT_AT - BLACKHOLE_AT
    doubles = {mid: n for mid, n in handler.calls.items() if n > 1}
    assert doubles == {}, f"handler invoked twice for {len(doubles)} messages"
    suppressed = [e for e in events if e["type"] == "duplicate_delivery_suppressed"]
    # Every handled-but-unacked message came back and was suppressed (the BLACKHOLE_AT-th
    # one too: its ack was written after the blackhole started).
    assert len(suppressed) >= CUT_AT - BLACKHOLE_AT
    assert {e["message_id"] for e in suppressed} <= set(handler.calls)
    assert dead == [] and not [e for e in events if e["type"] in ("moved", "dead_lettered")]


@pytest.mark.parametrize("kind", BROKERS)
def test_failover_without_audit_double_invokes(kind: tuple[str, str],
                                               request: pytest.FixtureRequest,
                                               tmp_path: Path, mqguard_unique_name: str) -> None:
    """The control: the same failover with consumer_audit disabled runs handlers twice."""
    server, scheme = kind
    url = request.getfixturevalue(f"mqguard_{server}_server").urls[scheme]
    handler, _events, _dead = run_failover(url, scheme, tmp_path, mqguard_unique_name, audit=False)
    assert handler.distinct() == TOTAL
    doubles = [mid for mid, n in handler.calls.items() if n > 1]
    assert len(doubles) >= CUT_AT - BLACKHOLE_AT
