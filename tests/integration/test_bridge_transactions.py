"""Duplicate ids in transactions against REAL brokers and both stores, through the wrapper
(GuardedProducer) and the sidecar (STOMP BEGIN / SEND / COMMIT / ABORT).

Issue 21, defects 1-3 (bridge ids in transactions, the ``BRIDGE.<address>`` cache's own
settings) and the deliberate deviations of docs/artemis-compat.md. What arrives is read by
a plain stomp.py client straight from the broker: no guarded consumer could hide a
duplicate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import stomp  # type: ignore[import-untyped]
from mqguard_tests.brokers import STOMP_BROKERS, broker_of

from mqguard.config import parse_config
from mqguard.errors import MessageRejected, TransactionRolledBack
from mqguard.events import read_events
from mqguard.message import BRIDGE_DUPLICATE_ID_HEADER
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

BRIDGE = BRIDGE_DUPLICATE_ID_HEADER
#: Short, so that a reservation left behind would be taken over within the test.
PENDING_MS = 400
STORES = [pytest.param("memory", id="memory"),
          pytest.param("redis", marks=pytest.mark.redis, id="redis")]


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    return broker_of(request)[1]


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else request.getfixturevalue("mqguard_redis_url")


def make_config(tmp_path: Path, store: str, **settings: Any) -> Any:
    return parse_config({
        "mqguard": {"store": store, "node-id": "bridge-tx",
                    "event-log": {"directory": str(tmp_path / "events"),
                                  "flush-interval-ms": 20}},
        "plugins": {"duplicate_detection": {"pending-timeout-ms": PENDING_MS}},
        "address-settings": settings})


def events(guard: Guard, tmp_path: Path) -> list[dict[str, Any]]:
    guard.events.flush()
    return list(read_events(tmp_path / "events"))


class Reader(stomp.ConnectionListener):  # type: ignore[misc]
    """A plain stomp.py client reading a queue straight from the broker (or the sidecar)."""

    def __init__(self, port: int) -> None:
        self.bodies: list[str] = []
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.lock = threading.Lock()
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("reader", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.bodies.append(frame.body)

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def read(self, queue: str, expected: int, settle: float = 1.0) -> list[str]:
        """Subscribe; return what arrived once ``expected`` came and nothing more did for
        ``settle`` s (a duplicate that slipped through would arrive meanwhile)."""
        self.conn.subscribe(f"/queue/{queue}", id="reader", ack="auto")
        wait_for(lambda: len(self.bodies) >= expected, 20, f"{expected} message(s)")
        time.sleep(settle)
        with self.lock:
            return list(self.bodies)

    def wait_receipt(self, receipt: str) -> None:
        wait_for(lambda: receipt in self.receipts or self.errors, 15, f"receipt {receipt}")

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()


def read_broker(broker_url: str, queue: str, expected: int) -> list[str]:
    reader = Reader(urlsplit(broker_url).port or 61613)
    try:
        return reader.read(queue, expected)
    finally:
        reader.close()


# -- through the wrapper ----------------------------------------------------------------------


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_wrapper_committed_bridge_id_is_confirmed_at_commit(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Defect 1: after COMMIT the bridge id is a plain duplicate, never "in flight", and is
    not taken over once pending-timeout-ms has passed."""
    with Guard(make_config(tmp_path, store_url)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer:
        with producer.transaction() as tx:
            producer.send(mqguard_unique_name, b"copy", headers={BRIDGE: "b1"}, transaction=tx)
        # Artemis: the duplicate is dropped and the send succeeds.
        assert not producer.send(mqguard_unique_name, b"again", headers={BRIDGE: "b1"}).sent
        time.sleep(PENDING_MS / 1000 + 0.3)
        assert not producer.send(mqguard_unique_name, b"late", headers={BRIDGE: "b1"}).sent
        with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"in-tx", headers={BRIDGE: "b1"}, transaction=tx)
        dropped = [e for e in events(guard, tmp_path) if e["type"] == "duplicate_rejected"]
    assert read_broker(broker_url, mqguard_unique_name, 1) == ["copy"]
    assert len(dropped) == 3


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_wrapper_rolled_back_transaction_releases_every_id(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Defect 2: an aborted transaction, and one rolled back for a duplicate, release their
    bridge ids and duplicate ids: the retries go through at once."""
    with Guard(make_config(tmp_path, store_url)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer:
        with pytest.raises(RuntimeError), producer.transaction() as tx:
            producer.send(mqguard_unique_name, b"a", headers={BRIDGE: "b1"}, transaction=tx)
            producer.send(mqguard_unique_name, b"a", duplicate_id="d1", transaction=tx)
            raise RuntimeError("the application gives up: ABORT")
        assert producer.send(mqguard_unique_name, b"seed", duplicate_id="seen").sent
        with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"b", headers={BRIDGE: "b2"}, transaction=tx)
                producer.send(mqguard_unique_name, b"b", duplicate_id="seen", transaction=tx)
        # The retries, at once (well within pending-timeout-ms): none refused in flight.
        with producer.transaction() as tx:
            producer.send(mqguard_unique_name, b"retry-b1", headers={BRIDGE: "b1"}, transaction=tx)
            producer.send(mqguard_unique_name, b"retry-d1", duplicate_id="d1", transaction=tx)
        assert producer.send(mqguard_unique_name, b"retry-b2", headers={BRIDGE: "b2"}).sent
    assert read_broker(broker_url, mqguard_unique_name, 4) == ["seed", "retry-b1", "retry-d1",
                                                       "retry-b2"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_wrapper_bridge_cache_has_its_own_settings(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Defect 3: bridge ids are checked although the address has id-cache-size 0, in a
    cache sized by the settings matching BRIDGE.<address>."""
    settings = {mqguard_unique_name: {"id-cache-size": 0}, "BRIDGE.#": {"id-cache-size": 2}}
    with Guard(make_config(tmp_path, store_url, **settings)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer:
        sent = [producer.send(mqguard_unique_name, f"b{n}".encode(), headers={BRIDGE: f"b{n}"}).sent
                for n in (1, 1, 2, 3)]
        with pytest.raises(TransactionRolledBack, match="DUPLICATE_ID_REJECTED"):
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"tx-b3", headers={BRIDGE: "b3"}, transaction=tx)
        # Capacity 2: b3 overwrote b1, which is new again.
        assert producer.send(mqguard_unique_name, b"b1-again", headers={BRIDGE: "b1"}).sent
        stats = guard.store.ring_stats(f"BRIDGE.{mqguard_unique_name}")
        assert guard.store.ring_stats(mqguard_unique_name) is None
    assert sent == [True, False, True, True]
    assert stats is not None and stats.capacity == 2
    assert read_broker(broker_url, mqguard_unique_name, 4) == ["b1", "b2", "b3", "b1-again"]


# -- through the sidecar ----------------------------------------------------------------------


@pytest.fixture
def sidecar(broker_url: str, store_url: str, tmp_path: Path) -> Iterator[SidecarThread]:
    config = make_config(tmp_path, store_url)
    proxy = Sidecar(config, parse_upstream(broker_url), admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        yield running


@pytest.fixture
def clients(sidecar: SidecarThread) -> Iterator[list[Reader]]:
    made: list[Reader] = []
    yield made
    for client in made:
        client.close()


def connect(sidecar: SidecarThread, clients: list[Reader]) -> Reader:
    client = Reader(sidecar.port)
    clients.append(client)
    return client


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_sidecar_committed_bridge_id_is_confirmed_at_commit(
        sidecar: SidecarThread, clients: list[Reader], broker_url: str,
        mqguard_unique_name: str) -> None:
    """Defect 1 through the sidecar: after COMMIT a repeat of the bridge id is receipted
    (no DUPLICATE_ID_IN_FLIGHT error) and not routed, also after pending-timeout-ms."""
    queue = f"/queue/{mqguard_unique_name}"
    client = connect(sidecar, clients)
    tx = client.conn.begin()
    client.conn.send(queue, "copy", headers={BRIDGE: "b1"}, transaction=tx)
    client.conn.commit(tx, receipt="commit")
    client.wait_receipt("commit")
    client.conn.send(queue, "again", headers={BRIDGE: "b1"}, receipt="again")
    client.wait_receipt("again")
    time.sleep(PENDING_MS / 1000 + 0.3)
    client.conn.send(queue, "late", headers={BRIDGE: "b1"}, receipt="late")
    client.wait_receipt("late")
    assert client.errors == []
    assert client.receipts == ["commit", "again", "late"]
    assert read_broker(broker_url, mqguard_unique_name, 1) == ["copy"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_sidecar_aborted_transaction_releases_its_ids(
        sidecar: SidecarThread, clients: list[Reader], broker_url: str,
        mqguard_unique_name: str) -> None:
    """Defect 2 through the sidecar: ABORT releases bridge and duplicate ids."""
    queue = f"/queue/{mqguard_unique_name}"
    client = connect(sidecar, clients)
    tx = client.conn.begin()
    client.conn.send(queue, "first", headers={BRIDGE: "b1"}, transaction=tx)
    client.conn.send(queue, "first-d", headers={"_AMQ_DUPL_ID": "d1"}, transaction=tx)
    client.conn.abort(tx, receipt="abort")
    client.wait_receipt("abort")
    tx = client.conn.begin()
    client.conn.send(queue, "retry", headers={BRIDGE: "b1"}, transaction=tx)
    client.conn.send(queue, "retry-d", headers={"_AMQ_DUPL_ID": "d1"}, transaction=tx)
    client.conn.commit(tx, receipt="commit")
    client.wait_receipt("commit")
    assert client.errors == []
    assert read_broker(broker_url, mqguard_unique_name, 2) == ["retry", "retry-d"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_sidecar_session_end_releases_an_open_transactions_ids(
        sidecar: SidecarThread, clients: list[Reader], broker_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """Defect 2: a connection that ends without COMMIT or ABORT (the broker drops its
    transaction) releases the transaction's ids; the retry on a new connection goes."""
    queue = f"/queue/{mqguard_unique_name}"
    first = connect(sidecar, clients)
    tx = first.conn.begin()
    first.conn.send(queue, "lost", headers={BRIDGE: "b1"}, transaction=tx)
    first.conn.send(queue, "sync", receipt="sync")  # the SEND above was decided
    first.wait_receipt("sync")
    first.close()
    second = connect(sidecar, clients)
    tx = second.conn.begin()
    second.conn.send(queue, "retry", headers={BRIDGE: "b1"}, transaction=tx)
    second.conn.commit(tx, receipt="commit")
    second.wait_receipt("commit")
    assert second.errors == []
    assert sorted(read_broker(broker_url, mqguard_unique_name, 2)) == ["retry", "sync"]
    guard = sidecar.sidecar.guard
    rolled_back = [e for e in events(guard, tmp_path) if e["type"] == "tx_rolled_back"]
    assert len(rolled_back) == 1 and "session ended" in rolled_back[0]["reason"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_sidecar_same_transaction_id_on_two_connections(
        sidecar: SidecarThread, clients: list[Reader], broker_url: str,
        mqguard_unique_name: str) -> None:
    """Clients choose transaction ids: one connection's ABORT of ``tx1`` must not end the
    other connection's ``tx1``, whose COMMIT then confirms its own ids."""
    queue = f"/queue/{mqguard_unique_name}"
    one, two = connect(sidecar, clients), connect(sidecar, clients)
    one.conn.begin("tx1")
    one.conn.send(queue, "one", headers={"_AMQ_DUPL_ID": "d-one"}, transaction="tx1")
    one.conn.send(queue, "one-b", headers={BRIDGE: "b-one"}, transaction="tx1")
    # A later frame's receipt: connection one's tx1 SENDs were decided before two begins
    # (RabbitMQ answers a transaction's receipts only at COMMIT).
    one.conn.send(queue, "sync", receipt="sync")
    one.wait_receipt("sync")
    two.conn.begin("tx1")
    two.conn.send(queue, "two", headers={"_AMQ_DUPL_ID": "d-two"}, transaction="tx1")
    two.conn.abort("tx1", receipt="abort")
    two.wait_receipt("abort")
    one.conn.commit("tx1", receipt="commit")
    one.wait_receipt("commit")
    one.conn.send(queue, "one-again", headers={BRIDGE: "b-one"}, receipt="r1")
    one.conn.send(queue, "d-one-again", headers={"_AMQ_DUPL_ID": "d-one"}, receipt="r2")
    one.wait_receipt("r2")
    two.conn.send(queue, "two-retry", headers={"_AMQ_DUPL_ID": "d-two"}, receipt="r3")
    two.wait_receipt("r3")
    assert one.errors == [] and two.errors == []
    assert sorted(read_broker(broker_url, mqguard_unique_name, 4)) == ["one", "one-b", "sync",
                                                                "two-retry"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_sidecar_bridge_ids_checked_when_the_address_has_id_cache_size_zero(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Defect 3 through the sidecar: BRIDGE.<address> is a cache of its own."""
    config = make_config(tmp_path, store_url, **{mqguard_unique_name: {"id-cache-size": 0}})
    queue = f"/queue/{mqguard_unique_name}"
    with SidecarThread(Sidecar(config, parse_upstream(broker_url),
                               admin=("127.0.0.1", 0))) as running:
        client = Reader(running.port)
        try:
            client.conn.send(queue, "b1", headers={BRIDGE: "b1"}, receipt="r1")
            client.conn.send(queue, "b1-again", headers={BRIDGE: "b1"}, receipt="r2")
            tx = client.conn.begin()
            client.conn.send(queue, "b2", headers={BRIDGE: "b2"}, transaction=tx)
            client.conn.commit(tx, receipt="commit")
            client.wait_receipt("commit")
            client.conn.send(queue, "b2-again", headers={BRIDGE: "b2"}, receipt="r3")
            client.conn.send(queue, "d", headers={"_AMQ_DUPL_ID": "d"}, receipt="r4")
            client.conn.send(queue, "d-again", headers={"_AMQ_DUPL_ID": "d"}, receipt="r5")
            client.wait_receipt("r5")
            assert client.errors == []
        finally:
            client.close()
        stats = running.sidecar.guard.store.ring_stats(f"BRIDGE.{mqguard_unique_name}")
    assert stats is not None and stats.capacity == 20000
    assert read_broker(broker_url, mqguard_unique_name, 4) == ["b1", "b2", "d", "d-again"]


# -- deliberate deviations (docs/artemis-compat.md) --------------------------------------------


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_deviation_commit_rechecks_an_id_committed_meanwhile(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Deviation (a): Artemis commits both transactions (no re-check at COMMIT); mqguard
    rolls back the one that commits second, so the id reaches the broker once."""
    with Guard(make_config(tmp_path, store_url)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer, \
            GuardedProducer(open_adapter(broker_url), guard) as other:
        with pytest.raises(TransactionRolledBack, match="by another producer"):
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"mine", duplicate_id="R", transaction=tx)
                with other.transaction() as tx2:
                    other.send(mqguard_unique_name, b"theirs", duplicate_id="R", transaction=tx2)
        rolled_back = [e for e in events(guard, tmp_path) if e["type"] == "tx_rolled_back"]
    assert read_broker(broker_url, mqguard_unique_name, 1) == ["theirs"]
    assert len(rolled_back) == 1


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_deviation_same_id_twice_in_one_transaction_rolls_back(
        sidecar: SidecarThread, clients: list[Reader], broker_url: str, store_url: str,
        tmp_path: Path, mqguard_unique_name: str) -> None:
    """Deviation (b): Artemis routes both messages of a transaction that carries one
    duplicate id twice; mqguard rolls the transaction back (wrapper and sidecar)."""
    with Guard(make_config(tmp_path / "wrapper", store_url)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer:
        with pytest.raises(TransactionRolledBack, match="already in this transaction"):
            with producer.transaction() as tx:
                producer.send(mqguard_unique_name, b"w1", duplicate_id="X", transaction=tx)
                producer.send(mqguard_unique_name, b"w2", duplicate_id="X", transaction=tx)
    queue = f"/queue/{mqguard_unique_name}"
    client = connect(sidecar, clients)
    tx = client.conn.begin()
    client.conn.send(queue, "s1", headers={"_AMQ_DUPL_ID": "Y"}, transaction=tx)
    client.conn.send(queue, "s2", headers={"_AMQ_DUPL_ID": "Y"}, transaction=tx)
    client.conn.commit(tx, receipt="commit")
    wait_for(lambda: client.errors, 10, "the ERROR answering COMMIT")
    assert "already in this transaction" in client.errors[0].headers["message"]
    assert "commit" not in client.receipts
    # The ERROR ended that connection; nothing of the transaction was cached.
    again = connect(sidecar, clients)
    again.conn.send(queue, "after", headers={"_AMQ_DUPL_ID": "Y"}, receipt="after")
    again.wait_receipt("after")
    assert read_broker(broker_url, mqguard_unique_name, 1) == ["after"]


@pytest.mark.parametrize("store_url", STORES, indirect=True)
@pytest.mark.parametrize("broker_url", STOMP_BROKERS, indirect=True)
def test_deviation_unconfirmed_id_is_refused_in_flight(
        broker_url: str, store_url: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    """Two-phase ids: Artemis has no "in flight" state; mqguard refuses a send of an id
    whose earlier send is reserved and unconfirmed, and takes it over after the timeout."""
    from mqguard.digest import id_digest

    with Guard(make_config(tmp_path, store_url)) as guard, \
            GuardedProducer(open_adapter(broker_url), guard) as producer:
        # Another sender's reservation (killed between reserving and its broker receipt).
        guard.store.ring_reserve(mqguard_unique_name, [id_digest("A")], 20000, PENDING_MS)
        with pytest.raises(MessageRejected, match="DUPLICATE_ID_IN_FLIGHT"):
            producer.send(mqguard_unique_name, b"refused", duplicate_id="A")
        time.sleep(PENDING_MS / 1000 + 0.2)
        assert producer.send(mqguard_unique_name, b"taken-over", duplicate_id="A").sent
    assert read_broker(broker_url, mqguard_unique_name, 1) == ["taken-over"]
