"""StompAdapter against real ActiveMQ 5.17 and RabbitMQ 3.10 brokers (no mocks).

Each test states a broker fact the adapter relies on; the module docstring of
:mod:`mqguard.adapters.stomp` collects them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mqguard_tests.adapter_contract import DeferContract, Inbox

from mqguard.adapter import SubscribeOptions
from mqguard.adapters.stomp import BROKER_CAPABILITIES, StompAdapter
from mqguard.errors import AdapterError, TransactionRolledBack
from mqguard.message import Message, new_message_id, now_ms

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]

Factory = Callable[..., StompAdapter]

#: Every byte value, NULs included: STOMP frames end with NUL, so this needs content-length.
BINARY_BODY = bytes(range(256)) + b"\x00\x00end"
#: Header values that need STOMP 1.2 escaping, and non-ASCII.
TRICKY_HEADERS = {"colon": "a:b", "newline": "l1\nl2", "backslash": "c:\\d", "unicode": "žluť 🐇",
                  "content-type": "application/octet-stream", "x-app": "1"}


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _factory(url: str) -> Iterator[Factory]:
    adapters: list[StompAdapter] = []

    def make(*, connect: bool = True, **options: Any) -> StompAdapter:
        options.setdefault("receipt_timeout", 5.0)
        options.setdefault("connect_timeout", 5.0)
        adapter = StompAdapter(url, **options)
        adapters.append(adapter)
        if connect:
            adapter.connect()
        return adapter

    yield make
    for adapter in adapters:
        adapter.close()


@pytest.fixture
def stomp(broker: str, request: pytest.FixtureRequest) -> Iterator[Factory]:
    """Adapters on the parametrised broker, closed after the test."""
    yield from _factory(request.getfixturevalue(f"mqguard_{broker}_server").urls["stomp"])


@pytest.fixture
def rabbit(mqguard_rabbitmq_server: Any) -> Iterator[Factory]:
    yield from _factory(mqguard_rabbitmq_server.urls["stomp"])


@pytest.fixture
def amq(mqguard_activemq_server: Any) -> Iterator[Factory]:
    yield from _factory(mqguard_activemq_server.urls["stomp"])


def _guarded(address: str, body: bytes = b"payload", **fields: Any) -> Message:
    fields.setdefault("message_id", new_message_id())
    return Message(address, body, **fields)


# -- identity -------------------------------------------------------------------------------------

def test_detects_broker_and_capabilities(stomp: Factory, broker: str) -> None:
    adapter = stomp()
    assert adapter.broker == broker
    assert adapter.server.startswith({"activemq": "ActiveMQ/5.", "rabbitmq": "RabbitMQ/3."}[broker])
    caps = adapter.capabilities
    assert caps == BROKER_CAPABILITIES[broker]
    assert caps.transactions and caps.native_ttl and caps.persistent
    if broker == "activemq":
        assert (caps.selectors, caps.browse, caps.delayed_delivery, caps.stable_message_id) == (
            True, True, True, True)
        assert not caps.nack_requeue and not caps.native_delivery_count
    else:
        assert caps.nack_requeue and caps.native_delivery_count
        assert not (caps.selectors or caps.browse or caps.delayed_delivery
                    or caps.stable_message_id)


# -- round trips ----------------------------------------------------------------------------------

def test_round_trip_preserves_headers_and_binary_body(stomp: Factory,
                                                      mqguard_unique_name: str) -> None:
    adapter = stomp()
    inbox = Inbox()
    sub_id = adapter.subscribe(mqguard_unique_name, inbox)
    sent = _guarded(mqguard_unique_name, BINARY_BODY, headers=dict(TRICKY_HEADERS),
                    duplicate_id="dup-1", producer_id="producer-a", sequence=7,
                    expiration=now_ms() + 60_000)
    adapter.send(sent)

    (delivery,) = inbox.wait_for(1)
    got = delivery.message
    assert got.address == mqguard_unique_name  # the subscriber's address, not "/queue/..."
    assert got.body == BINARY_BODY
    assert got.headers == TRICKY_HEADERS  # broker/protocol headers are not app headers
    assert (got.message_id, got.duplicate_id, got.producer_id, got.sequence, got.expiration) == (
        sent.message_id, "dup-1", "producer-a", 7, sent.expiration)
    assert delivery.subscription_id == sub_id
    assert delivery.ack_token == delivery.raw_headers["ack"]
    assert delivery.raw_headers["destination"] == f"/queue/{mqguard_unique_name}"
    assert delivery.raw_headers["persistent"] == "true"  # sent persistent by default
    assert delivery.redelivered is False
    adapter.ack(delivery)
    with pytest.raises(AdapterError, match="already acknowledged"):
        adapter.ack(delivery)  # never sent: RabbitMQ would close the connection for it

    # Acked for real: a fresh consumer gets nothing.
    adapter.close()
    again = Inbox()
    stomp().subscribe(mqguard_unique_name, again)
    assert again.quiet(0.5) == []


def test_send_many_pipelines_and_all_arrive(stomp: Factory, mqguard_unique_name: str) -> None:
    adapter = stomp()
    count = 300
    adapter.send_many(_guarded(mqguard_unique_name, str(i).encode(),
                               sequence=i) for i in range(count))
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox, SubscribeOptions(ack="auto", prefetch=1000))
    deliveries = inbox.wait_for(count)
    assert [d.message.sequence for d in deliveries] == list(range(count))
    assert all(d.ack_token is None for d in deliveries)  # ack:auto, nothing to ack


def test_send_many_nowait_writes_parts_and_confirms_them_later(
        stomp: Factory, mqguard_unique_name: str) -> None:
    # The guard writes a batch in parts and waits for all receipts at the end.
    adapter = stomp()
    pending = [adapter.send_many_nowait(_guarded(mqguard_unique_name, str(i).encode(), sequence=i)
                                        for i in range(start, start + 50))
               for start in range(0, 150, 50)]
    for part in pending:
        part.wait()
    with adapter._lock:
        assert adapter._pending == {}  # every receipt arrived and was resolved
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox, SubscribeOptions(ack="auto", prefetch=1000))
    assert [d.message.sequence for d in inbox.wait_for(150)] == list(range(150))


def test_send_many_nowait_refuses_on_a_closed_adapter(stomp: Factory,
                                                      mqguard_unique_name: str) -> None:
    adapter = stomp(reconnect_attempts=0)
    adapter.close()
    with pytest.raises(AdapterError, match="cannot send"):
        adapter.send_many_nowait([_guarded(mqguard_unique_name, b"x")])


def test_an_ack_after_unsubscribe_fails_locally_and_keeps_the_connection(
        stomp: Factory, mqguard_unique_name: str) -> None:
    # A handler still running when its consumer closes: the late ACK must not reach the
    # broker after the UNSUBSCRIBE (RabbitMQ: ERROR "Subscription not found", connection
    # closed). It fails here, and the message is redelivered.
    adapter = stomp()
    adapter.send(_guarded(mqguard_unique_name, b"late"))
    inbox = Inbox()
    sub = adapter.subscribe(mqguard_unique_name, inbox)
    (delivery,) = inbox.wait_for(1)
    adapter.unsubscribe(sub)
    with pytest.raises(AdapterError, match="subscription was closed"):
        adapter.ack(delivery)
    adapter.send(_guarded(mqguard_unique_name, b"after"))  # same session: nothing was closed
    assert adapter.sessions == 1
    adapter.close()
    again = Inbox()
    stomp().subscribe(mqguard_unique_name, again)
    assert sorted(d.message.body for d in again.wait_for(2)) == [b"after", b"late"]


def test_message_id_is_stable_across_a_redelivery(
        stomp: Factory, broker: str, mqguard_unique_name: str) -> None:
    producer = stomp()
    sent = _guarded(mqguard_unique_name, b"once")
    producer.send(sent)

    first_consumer = stomp()
    first = Inbox()
    first_consumer.subscribe(mqguard_unique_name, first)
    (d1,) = first.wait_for(1)
    first_consumer.close()  # without ack: the broker redelivers to the next consumer

    second = Inbox()
    stomp().subscribe(mqguard_unique_name, second)
    (d2,) = second.wait_for(1)
    assert d2.redelivered is True
    assert d1.message.message_id == d2.message.message_id == sent.message_id
    if broker == "activemq":
        assert d1.message.broker_message_id == d2.message.broker_message_id  # stable
    else:
        assert d1.message.broker_message_id != d2.message.broker_message_id  # per delivery
        assert d1.raw_headers["redelivered"] == "false"  # RabbitMQ always sends the header
    assert d1.native_delivery_count is None  # no quorum queue, no count


# -- transactions ---------------------------------------------------------------------------------

def test_transaction_commit_delivers_and_abort_delivers_nothing(
        stomp: Factory, mqguard_unique_name: str) -> None:
    adapter = stomp()
    committed = adapter.begin()
    adapter.send(_guarded(mqguard_unique_name, b"c1"), transaction=committed)
    adapter.send_many([_guarded(mqguard_unique_name, b"c2")], transaction=committed)
    adapter.commit(committed)

    aborted = adapter.begin()
    adapter.send(_guarded(mqguard_unique_name, b"a1"), transaction=aborted)
    adapter.abort(aborted)

    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox)
    assert [d.message.body for d in inbox.wait_for(2)] == [b"c1", b"c2"]
    assert [d.message.body for d in inbox.quiet(0.5)] == [b"c1", b"c2"]
    with pytest.raises(AdapterError, match="no open transaction"):
        adapter.send(_guarded(mqguard_unique_name), transaction=committed)


@pytest.mark.rabbitmq
def test_rabbitmq_failed_send_inside_transaction_rolls_it_back(
        rabbit: Factory, mqguard_unique_name: str) -> None:
    # RabbitMQ reports the bad SEND at once (no receipt-id) and would commit the rest: the
    # adapter's barrier catches the ERROR before COMMIT and aborts instead.
    adapter = rabbit()
    tx = adapter.begin()
    adapter.send(_guarded(mqguard_unique_name, b"good"), transaction=tx)
    adapter.send(_guarded("/bogus/destination", b"bad"), transaction=tx)
    with pytest.raises(TransactionRolledBack, match="Unknown destination"):
        adapter.commit(tx)
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox)
    assert inbox.quiet(0.5) == []


# -- errors ---------------------------------------------------------------------------------------

@pytest.mark.rabbitmq
def test_rabbitmq_error_frame_surfaces_as_adapter_error(rabbit: Factory,
                                                        mqguard_unique_name: str) -> None:
    adapter = rabbit()
    with pytest.raises(AdapterError, match="Unknown destination") as info:
        adapter.send(_guarded("/bogus/destination"))
    assert "is not a valid destination" in str(info.value)  # the ERROR body is in the message
    adapter.send(_guarded(mqguard_unique_name))  # the connection survived this kind of ERROR
    with pytest.raises(AdapterError, match="does not support message selectors"):
        adapter.subscribe(mqguard_unique_name, Inbox(), SubscribeOptions(selector="a = 1"))
    with pytest.raises(AdapterError, match="does not support browsing"):
        adapter.subscribe(mqguard_unique_name, Inbox(), SubscribeOptions(browse=True))


@pytest.mark.activemq
def test_activemq_error_frame_surfaces_as_adapter_error(amq: Factory,
                                                        mqguard_unique_name: str) -> None:
    adapter = amq()
    with pytest.raises(AdapterError, match="InvalidSelectorException"):
        adapter.subscribe(mqguard_unique_name, Inbox(), SubscribeOptions(selector="a = = ="))
    adapter.send(_guarded(mqguard_unique_name))


def test_reserved_and_invalid_headers_are_refused_before_sending(
        stomp: Factory, mqguard_unique_name: str) -> None:
    adapter = stomp()
    for headers in ({"message-id": "x"}, {"receipt": "r"}, {"bad:name": "v"}, {"": "v"}):
        with pytest.raises(AdapterError):
            adapter.send(Message(mqguard_unique_name, b"x", headers=headers))
    adapter.send(Message(mqguard_unique_name, b"x"))  # still connected and fine


def test_connection_loss_fails_the_send_then_reconnects_and_resubscribes(
        stomp: Factory, broker: str, mqguard_unique_name: str) -> None:
    adapter = stomp(reconnect_delay=0.05)
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox)
    # Frames that make each broker drop the connection: ActiveMQ closes it on a SEND to an
    # empty queue name, RabbitMQ on a negative per-message TTL (a channel error).
    killer = (Message("/queue/", b"x") if broker == "activemq"
              else Message(mqguard_unique_name, b"x", headers={"expiration": "-5"}))
    with pytest.raises(AdapterError):
        adapter.send(killer)
    deadline = time.monotonic() + 10
    while adapter.sessions < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert adapter.sessions == 2 and adapter.connected
    adapter.send(_guarded(mqguard_unique_name, b"after"))
    assert [d.message.body for d in inbox.wait_for(1)] == [b"after"]


def test_closed_and_unreachable_adapters_raise_without_leaking_credentials(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    adapter = StompAdapter("stomp://user:s3cr3t-pw@127.0.0.1:1", connect_timeout=1.0)
    with pytest.raises(AdapterError) as info:
        adapter.connect()
    assert "s3cr3t-pw" not in str(info.value)
    with pytest.raises(AdapterError, match="connect\\(\\) has not been called"):
        adapter.send(Message("q", b"x"))
    adapter.close()
    adapter.close()
    assert "s3cr3t-pw" not in caplog.text


@pytest.mark.rabbitmq
def test_bad_login_is_refused_without_leaking_the_passcode(
        mqguard_rabbitmq_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # stomp.py logs the CONNECT frame at DEBUG
    url = mqguard_rabbitmq_server.urls["stomp"].replace("stomp://", "stomp://guest:wr0ng-pa55@")
    adapter = StompAdapter(url, connect_timeout=5.0)
    with pytest.raises(AdapterError, match="refused the connection") as info:
        adapter.connect()
    adapter.close()
    assert "wr0ng-pa55" not in str(info.value)
    assert "wr0ng-pa55" not in caplog.text
    assert "passcode:********" in caplog.text


def test_callback_exception_does_not_kill_the_receiver(
        stomp: Factory, mqguard_unique_name: str, caplog: pytest.LogCaptureFixture) -> None:
    adapter = stomp()
    inbox = Inbox()

    def explode_once(delivery: Any) -> None:
        inbox(delivery)
        if len(inbox.deliveries) == 1:
            raise RuntimeError("boom")
        adapter.ack(delivery)

    adapter.subscribe(mqguard_unique_name, explode_once, SubscribeOptions(ack="client-individual"))
    adapter.send_many([_guarded(mqguard_unique_name, b"1"), _guarded(mqguard_unique_name, b"2")])
    assert [d.message.body for d in inbox.wait_for(2)] == [b"1", b"2"]
    assert "boom" in caplog.text
    assert adapter.connected


# -- threads: callbacks inline on the receiver thread, blocking work through defer() --------------

def test_callbacks_run_inline_on_the_delivery_thread(stomp: Factory,
                                                     mqguard_unique_name: str) -> None:
    adapter = stomp()
    inbox = Inbox()
    seen: list[tuple[bool, str]] = []

    def callback(delivery: Any) -> None:
        seen.append((adapter.on_delivery_thread(), threading.current_thread().name))
        adapter.ack(delivery)  # never waits: fine inline
        inbox(delivery)

    assert adapter.on_delivery_thread() is False
    adapter.subscribe(mqguard_unique_name, callback)
    adapter.send_many([_guarded(mqguard_unique_name, str(i).encode()) for i in range(5)])
    assert [d.message.body for d in inbox.wait_for(5)] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(inline for inline, _ in seen)
    names = {name for _, name in seen}
    assert len(names) == 1  # one thread, in arrival order
    assert names != {threading.current_thread().name}
    assert "dispatcher" not in names.pop()
    assert adapter.on_delivery_thread() is False

    adapter.close()  # the inline acks went through: a fresh consumer gets nothing
    again = Inbox()
    stomp().subscribe(mqguard_unique_name, again)
    assert again.quiet(0.5) == []


def test_blocking_calls_in_a_callback_raise_at_once_and_defer_can_send(
        stomp: Factory, mqguard_unique_name: str) -> None:
    # Only the receiver thread reads RECEIPTs: a callback waiting for one would deadlock, so
    # the adapter refuses at once; the guard moves messages (send a copy, ack the original)
    # through defer(), whose jobs run on the dispatcher thread and may wait.
    adapter = stomp(receipt_timeout=3.0)
    dla = f"{mqguard_unique_name}-dla"
    moved = Inbox()
    adapter.subscribe(dla, moved)
    calls: dict[str, Callable[[], object]] = {
        "send": lambda: adapter.send(_guarded(dla, b"direct")),
        "send_many": lambda: adapter.send_many([_guarded(dla, b"direct")]),
        "send_many_nowait": lambda: adapter.send_many_nowait([_guarded(dla, b"direct")]),
        "subscribe": lambda: adapter.subscribe(f"{mqguard_unique_name}-other", Inbox()),
        "begin": adapter.begin,
        "commit": lambda: adapter.commit("tx-unknown"),
        "abort": lambda: adapter.abort("tx-unknown"),
    }

    contract = DeferContract(adapter, calls, lambda body: _guarded(dla, body))
    adapter.subscribe(mqguard_unique_name, contract)
    stomp().send_many([_guarded(mqguard_unique_name, b"m1"), _guarded(mqguard_unique_name, b"m2")])
    contract.check(moved, [b"m1", b"m2"])

    adapter.close()  # the deferred acks went through: a fresh consumer gets nothing
    again = Inbox()
    stomp().subscribe(mqguard_unique_name, again)
    assert again.quiet(0.5) == []


def test_unsubscribe_and_close_in_a_callback_do_not_wait(stomp: Factory,
                                                         mqguard_unique_name: str) -> None:
    adapter = stomp(receipt_timeout=5.0)
    inbox = Inbox()
    timings: dict[str, float] = {}

    def callback(delivery: Any) -> None:
        adapter.ack(delivery)
        started = time.monotonic()
        adapter.unsubscribe(sub_id)
        timings["unsubscribe"] = time.monotonic() - started
        started = time.monotonic()
        adapter.close()
        timings["close"] = time.monotonic() - started
        inbox(delivery)

    sub_id = adapter.subscribe(mqguard_unique_name, callback)
    stomp().send_many([_guarded(mqguard_unique_name, b"first"), _guarded(mqguard_unique_name,
                                                                         b"second")])
    assert [d.message.body for d in inbox.wait_for(1)] == [b"first"]
    assert [d.message.body for d in inbox.quiet(0.3)] == [b"first"]
    assert timings["unsubscribe"] < 1.0 and timings["close"] < 1.0, timings
    assert not adapter.connected
    with pytest.raises(AdapterError, match="closed"):
        adapter.defer(lambda: None)

    # "first" was acked before the UNSUBSCRIBE; "second" goes back to the queue.
    again = Inbox()
    stomp().subscribe(mqguard_unique_name, again)
    assert [d.message.body for d in again.wait_for(1)] == [b"second"]
    assert len(again.quiet(0.3)) == 1


def test_dispatch_thread_option_lets_callbacks_send(stomp: Factory,
                                                    mqguard_unique_name: str) -> None:
    # The old behaviour, kept as an option: callbacks on the dispatcher thread may wait.
    adapter = stomp(receipt_timeout=3.0, dispatch_thread=True)
    moved = Inbox()
    adapter.subscribe(f"{mqguard_unique_name}-dla", moved)
    inline: list[bool] = []

    def move(delivery: Any) -> None:
        inline.append(adapter.on_delivery_thread())
        adapter.send(_guarded(f"{mqguard_unique_name}-dla", delivery.message.body))
        adapter.ack(delivery)

    adapter.subscribe(mqguard_unique_name, move)
    adapter.send_many([_guarded(mqguard_unique_name, b"m1"), _guarded(mqguard_unique_name, b"m2")])
    assert [d.message.body for d in moved.wait_for(2)] == [b"m1", b"m2"]
    assert inline == [False, False]


# -- negative acknowledgement and delivery counts -------------------------------------------------

@pytest.mark.rabbitmq
def test_rabbitmq_nack_requeues_and_quorum_queue_counts_deliveries(
        rabbit: Factory, mqguard_unique_name: str) -> None:
    adapter = rabbit()
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox,
                      SubscribeOptions(headers={"x-queue-type": "quorum"}))
    sent = _guarded(mqguard_unique_name, b"again")
    adapter.send(sent)

    d1 = inbox.wait_for(1)[0]
    assert (d1.redelivered, d1.native_delivery_count) == (False, 1)
    assert "x-delivery-count" not in d1.raw_headers  # absent on the first delivery
    adapter.nack(d1, requeue=True)

    d2 = inbox.wait_for(2)[1]
    assert (d2.redelivered, d2.native_delivery_count) == (True, 2)
    assert d2.raw_headers["x-delivery-count"] == "1"
    assert d2.message.message_id == sent.message_id
    adapter.nack(d2, requeue=False)  # dropped (no dead-letter exchange configured)
    assert len(inbox.quiet(0.5)) == 2


@pytest.mark.activemq
def test_activemq_nack_is_a_poison_ack_to_the_dlq(amq: Factory, mqguard_unique_name: str) -> None:
    adapter = amq()
    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox)
    sent = _guarded(mqguard_unique_name, b"poison", headers={"trace": mqguard_unique_name})
    adapter.send(sent)
    adapter.nack(inbox.wait_for(1)[0], requeue=True)  # requeue is not honoured by ActiveMQ 5
    assert len(inbox.quiet(0.5)) == 1

    dlq = Inbox()
    # JMS selectors cannot name "mqguard-id" (not an identifier), hence the trace header.
    adapter.subscribe("ActiveMQ.DLQ", dlq,
                      SubscribeOptions(ack="auto", selector=f"trace = '{mqguard_unique_name}'"))
    (dead,) = dlq.wait_for(1)
    assert dead.message.message_id == sent.message_id


# -- expiry, selectors, browsing ------------------------------------------------------------------

def test_expiration_maps_to_the_native_ttl(stomp: Factory, broker: str,
                                           mqguard_unique_name: str) -> None:
    """RabbitMQ: native ``expiration``. ActiveMQ: native ``expires`` only with
    ``native_expiry=True`` (otherwise the guard and its reaper expire, see below)."""
    adapter = stomp(native_expiry=True) if broker == "activemq" else stomp()
    adapter.send(_guarded(mqguard_unique_name, b"expired", expiration=now_ms() - 1000))
    live = _guarded(mqguard_unique_name, b"live", expiration=now_ms() + 60_000)
    adapter.send(live)
    time.sleep(0.1)  # RabbitMQ's 1 ms TTL has run out before anyone subscribes

    inbox = Inbox()
    adapter.subscribe(mqguard_unique_name, inbox)
    assert [d.message.body for d in inbox.wait_for(1)] == [b"live"]
    assert [d.message.body for d in inbox.quiet(0.5)] == [b"live"]  # the broker dropped it
    raw = inbox.deliveries[0].raw_headers
    if broker == "activemq":
        assert raw["expires"] == str(live.expiration)  # absolute epoch ms
    else:
        assert 0 < int(raw["expiration"]) <= 60_000  # relative ms
    assert inbox.deliveries[0].message.expiration == live.expiration  # guard header too


@pytest.mark.activemq
def test_activemq_expiry_is_left_to_the_guard_with_a_selectable_header(
        amq: Factory, mqguard_unique_name: str) -> None:
    adapter = amq()
    stale = _guarded(mqguard_unique_name, b"expired", expiration=now_ms() - 1000)
    fresh = _guarded(mqguard_unique_name, b"fresh", expiration=now_ms() + 60_000)
    adapter.send_many([stale, fresh, _guarded(mqguard_unique_name, b"never")])
    expired = Inbox()
    # What the reaper does: select only what has expired; everything else stays put.
    # ActiveMQ converts the string property to the literal's type: compare with a long only
    # ("MQGUARD_EXPIRES > 0" converts to int and never matches a 13-digit value).
    adapter.subscribe(mqguard_unique_name, expired,
                      SubscribeOptions(selector=f"MQGUARD_EXPIRES <= {now_ms()}"))
    (got,) = expired.wait_for(1)
    assert got.message.body == b"expired" and got.message.expiration == stale.expiration
    assert "MQGUARD_EXPIRES" not in got.message.headers  # a transport detail
    assert len(expired.quiet(0.3)) == 1
    adapter.ack(got)
    rest = Inbox()
    adapter.subscribe(mqguard_unique_name, rest)
    assert [d.message.body for d in rest.wait_for(2)] == [b"fresh", b"never"]


@pytest.mark.activemq
def test_activemq_selector_and_browse(amq: Factory, mqguard_unique_name: str) -> None:
    adapter = amq()
    adapter.send_many([_guarded(mqguard_unique_name, b"red", headers={"colour": "red"}),
                       _guarded(mqguard_unique_name, b"blue", headers={"colour": "blue"})])

    browser = Inbox()
    browse_id = adapter.subscribe(mqguard_unique_name, browser, SubscribeOptions(browse=True))
    assert adapter.wait_browse_end(browse_id, 5.0)
    assert sorted(d.message.body for d in browser.deliveries) == [b"blue", b"red"]
    adapter.unsubscribe(browse_id)

    reds = Inbox()
    adapter.subscribe(mqguard_unique_name, reds, SubscribeOptions(selector="colour = 'red'"))
    assert [d.message.body for d in reds.wait_for(1)] == [b"red"]  # browsing consumed nothing
    assert len(reds.quiet(0.3)) == 1
