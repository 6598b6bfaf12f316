"""RabbitMQ as people run it: a 3-node cluster with quorum queues, clients on different nodes
whose guards share one Redis store (docs/rabbitmq-cluster.md).

* duplicate detection is shared across nodes: a duplicate sent to node 2 of a message sent to
  node 1 is rejected (rabbitmq-server#3843 asks the broker for this; it has none);
* mqguard's delivery count agrees with the quorum queue's ``x-delivery-count`` while the
  message moves between consumers on different nodes, up to the dead-letter address;
* SIGKILL of the node the producer and the consumer are connected to (the queue's leader):
  the clients fail over to the other nodes, and the Spark audit of the event log (with the
  Redis state) confirms 0 lost and 0 handled twice.

All in one module, in tests/audit for its Spark session, so the cluster starts once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]

from mqguard.adapter import SubscribeOptions
from mqguard.audit.checks import CheckOptions
from mqguard.audit.cross_checks import CrossInputs
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.errors import AdapterError, MessageRejected, Nack
from mqguard.events import read_events
from mqguard.message import Message, now_ms
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.registry import open_adapter
from mqguard.servers.rabbitmq_cluster import RabbitMQCluster
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
from mqguard.testing.waiting import wait_for

pytest_plugins = ["mqguard.testing.rabbitmq_cluster"]
pytestmark = [pytest.mark.rabbitmq_cluster, pytest.mark.redis]

#: Declares a quorum queue on SEND as well as on SUBSCRIBE (whichever comes first); a SEND
#: without them would try to declare a classic queue and fail with PRECONDITION_FAILED.
QUORUM = {"x-queue-type": "quorum", "durable": "true", "auto-delete": "false"}


def quorum_options() -> SubscribeOptions:
    return SubscribeOptions(headers=dict(QUORUM), prefetch=20)


def guard(node: str, address: str, store: str, events: Path, **settings: Any) -> Guard:
    """A guard as one application instance would run it: its own node id, the shared
    store, the shared consumer audit, one event log directory for the audit."""
    config = parse_config({
        "mqguard": {"store": store, "node-id": node,
                    "event-log": {"directory": str(events / node), "flush-interval-ms": 20}},
        "plugins": {"consumer_audit": {"shared": True}},
        "address-settings": {address: {"dead-letter-address": f"{address}.DLA", **settings}},
    })
    return Guard(config).start()


def send_decided(producer: GuardedProducer, address: str, body: str, duplicate_id: str) -> bool:
    """Send; True if it went to the broker, False if it was dropped as a duplicate.

    An id whose first send is confirmed by the broker but not yet in the store (the guard
    confirms within ``confirm-flush-ms``, 20 ms) is refused as in flight: retry until the
    store decides, as an application would.
    """
    deadline = time.monotonic() + 5
    while True:
        try:
            return producer.send(address, body, headers=QUORUM, duplicate_id=duplicate_id).sent
        except MessageRejected as exc:
            if "IN_FLIGHT" not in exc.reason or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def events_of(directory: Path) -> list[dict[str, Any]]:
    return list(read_events(directory)) if directory.exists() else []


def test_cluster_has_three_running_nodes(mqguard_rabbitmq_cluster: RabbitMQCluster) -> None:
    cluster = mqguard_rabbitmq_cluster
    names = {cluster.nodename(i) for i in (1, 2, 3)}
    assert len(names) == 3
    for i in (1, 2, 3):
        assert cluster.running_nodes(i) == names
    assert len({cluster.stomp_url(i) for i in (1, 2, 3)}) == 3
    assert float(cluster.handle.meta["start_seconds"]) > 0


def test_duplicate_sent_to_another_node_is_rejected(
        mqguard_rabbitmq_cluster: RabbitMQCluster, mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name
    got: list[Message] = []
    with guard("app-a", q, mqguard_redis_url, tmp_path) as guard_a, \
            guard("app-b", q, mqguard_redis_url, tmp_path) as guard_b, \
            guard("app-c", q, mqguard_redis_url, tmp_path) as guard_c, \
            GuardedConsumer(open_adapter(cluster.stomp_url(3)), q, got.append, guard_c,
                            options=quorum_options()), \
            GuardedProducer(open_adapter(cluster.stomp_url(1)), guard_a) as on_node_1, \
            GuardedProducer(open_adapter(cluster.stomp_url(2)), guard_b) as on_node_2:
        assert send_decided(on_node_1, q, "first", "order-1")
        assert not send_decided(on_node_2, q, "again", "order-1"), \
            "node 2's guard let a duplicate of node 1's message through"
        assert send_decided(on_node_2, q, "second", "order-2")
        assert not send_decided(on_node_1, q, "again", "order-2")
        wait_for(lambda: len(got) >= 2, 30, "both messages on node 3")
        time.sleep(0.5)  # nothing more may arrive
    assert sorted(m.body for m in got) == [b"first", b"second"]
    kinds = Counter(e["type"] for e in events_of(tmp_path / "app-a") + events_of(
        tmp_path / "app-b"))
    assert kinds["duplicate_rejected"] == 2 and kinds["sent"] == 2
    assert cluster.rabbitmqctl(1, "list_queues", "name", "type").count(f"{q}\tquorum") == 1


def test_without_a_shared_store_the_broker_keeps_both_copies(
        mqguard_rabbitmq_cluster: RabbitMQCluster, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """The control: each guard with its own memory store, nothing is shared and RabbitMQ
    itself has no duplicate detection, so node 3's consumer gets the message twice."""
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name
    got: list[Message] = []
    with guard("solo-a", q, "memory", tmp_path) as guard_a, \
            guard("solo-b", q, "memory", tmp_path) as guard_b, \
            guard("solo-c", q, "memory", tmp_path) as guard_c, \
            GuardedConsumer(open_adapter(cluster.stomp_url(3)), q, got.append, guard_c,
                            options=quorum_options()), \
            GuardedProducer(open_adapter(cluster.stomp_url(1)), guard_a) as on_node_1, \
            GuardedProducer(open_adapter(cluster.stomp_url(2)), guard_b) as on_node_2:
        assert on_node_1.send(q, "first", headers=QUORUM, duplicate_id="order-1").sent
        assert on_node_2.send(q, "again", headers=QUORUM, duplicate_id="order-1").sent
        wait_for(lambda: len(got) >= 2, 30, "both copies on node 3")
    assert sorted(m.body for m in got) == [b"again", b"first"]


class StompClient(stomp.ConnectionListener):  # type: ignore[misc]
    """An unmodified stomp.py 1.2 client (no mqguard in it) that records receipts."""

    def __init__(self, port: int) -> None:
        self.receipts: list[str] = []
        self.errors: list[str] = []
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/")
        self.conn.set_listener("recorder", self)
        self.conn.connect("guest", "guest", wait=True)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", ""))


def test_sidecars_on_two_nodes_share_duplicate_detection(
        mqguard_rabbitmq_cluster: RabbitMQCluster, mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """The same through two sidecars, one in front of node 1 and one in front of node 2, both
    on the same Redis: plain STOMP clients get the duplicate receipted but not routed."""
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name

    def sidecar(node: int) -> SidecarThread:
        config = parse_config({
            "mqguard": {"store": mqguard_redis_url, "node-id": f"sidecar-{node}",
                        "message-expiry-scan-period": -1,
                        "event-log": {"directory": str(tmp_path / f"sidecar-{node}"),
                                      "flush-interval-ms": 20}}})
        return SidecarThread(Sidecar(config, parse_upstream(cluster.stomp_url(node))))

    got: list[Message] = []
    with sidecar(1) as first, sidecar(2) as second, \
            guard("sidecar-reader", q, "memory", tmp_path) as reader, \
            GuardedConsumer(open_adapter(cluster.stomp_url(3)), q, got.append, reader,
                            options=quorum_options()):
        on_node_1, on_node_2 = StompClient(first.port), StompClient(second.port)
        try:
            headers = {**QUORUM, "_AMQ_DUPL_ID": "order-1"}
            on_node_1.conn.send(f"/queue/{q}", "first", headers=headers, receipt="a")
            wait_for(lambda: on_node_1.receipts == ["a"], 10, "the first receipt")
            time.sleep(0.2)  # past confirm-flush-ms: the id is confirmed in Redis
            on_node_2.conn.send(f"/queue/{q}", "again", headers=headers, receipt="b")
            wait_for(lambda: on_node_2.receipts == ["b"], 10, "the duplicate's receipt")
            wait_for(lambda: bool(got), 30, "the message on node 3")
            time.sleep(0.5)  # the duplicate, had it been routed, would be here by now
        finally:
            on_node_1.conn.disconnect()
            on_node_2.conn.disconnect()
    assert [m.body for m in got] == [b"first"]
    assert on_node_1.errors == on_node_2.errors == []
    rejected = [e for e in events_of(tmp_path / "sidecar-2") if e["type"] == "duplicate_rejected"]
    assert len(rejected) == 1


class Failing:
    """Fails every delivery, recording its delivery count."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.first = threading.Event()

    def __call__(self, message: Message) -> None:
        self.calls.append(message.delivery_count)
        self.first.set()
        raise Nack(f"attempt {message.delivery_count} fails")


def test_delivery_counts_agree_with_x_delivery_count_across_nodes(
        mqguard_rabbitmq_cluster: RabbitMQCluster, mqguard_redis_url: str, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """Delivery 1 fails on node 2's consumer, which then goes away while its redelivery is
    held back (redelivery-delay 5 s): the broker takes the message back. Deliveries 2 and 3 fail
    on node 3's consumer (another guard, same Redis), and the third failure dead-letters it.
    Every count mqguard assigned equals the quorum queue's ``x-delivery-count`` + 1.

    The dead-letter address is a quorum queue too: the copy keeps the message's headers, so
    its SEND declares ``x-queue-type: quorum`` (a classic DLA refuses it, PRECONDITION_FAILED).
    """
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name
    settings = {"max-delivery-attempts": 3, "redelivery-delay": 5000}
    dead: list[Message] = []
    on_node_2, on_node_3 = Failing(), Failing()
    with guard("dla", q, mqguard_redis_url, tmp_path) as dla_guard, \
            GuardedConsumer(open_adapter(cluster.stomp_url(1)), f"{q}.DLA", dead.append,
                            dla_guard, options=quorum_options()), \
            guard("sender", q, mqguard_redis_url, tmp_path) as sender, \
            GuardedProducer(open_adapter(cluster.stomp_url(1)), sender) as producer:
        first = GuardedConsumer(open_adapter(cluster.stomp_url(2)), q, on_node_2,
                                guard("count-2", q, mqguard_redis_url, tmp_path, **settings),
                                options=quorum_options()).start()
        try:
            sent = producer.send(q, "poison", headers=QUORUM).message
            assert on_node_2.first.wait(30), "no delivery on node 2"
        finally:
            first.close()  # within the 5 s delay: the broker gets the message back unsettled
            first.guard.close()
        with guard("count-3", q, mqguard_redis_url, tmp_path, **settings) as g3, \
                GuardedConsumer(open_adapter(cluster.stomp_url(3)), q, on_node_3, g3,
                                options=quorum_options()):
            wait_for(lambda: bool(dead), 60, "the dead letter")
            time.sleep(0.5)  # nothing more may arrive
    assert on_node_2.calls == [1]
    assert on_node_3.calls == [2, 3]
    assert len(dead) == 1 and dead[0].body == b"poison"
    delivered = [e for node in ("count-2", "count-3") for e in events_of(tmp_path / node)
                 if e["type"] == "delivered" and e.get("message_id") == sent.message_id]
    assert sorted(e["delivery_count"] for e in delivered) == [1, 2, 3]
    # The broker's count (x-delivery-count + 1; absent on a first delivery) agrees.
    assert [e.get("native_delivery_count") for e in sorted(
        delivered, key=lambda e: e["delivery_count"])] == [1, 2, 3]


def test_a_killed_node_rejoins_on_its_old_ports_with_the_queue(
        mqguard_rabbitmq_cluster: RabbitMQCluster, mqguard_unique_name: str,
        tmp_path: Path) -> None:
    """SIGKILL of node 3 and a restart: the others carry on without it, and it comes back
    under its old name and STOMP port, a member of the queue again, delivering what was sent
    while it was down."""
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name
    url_before, name = cluster.stomp_url(3), cluster.nodename(3)
    got: list[Message] = []
    with guard("rejoin", q, "memory", tmp_path) as g:
        with GuardedConsumer(open_adapter(cluster.stomp_url(1)), q, got.append, g,
                             options=quorum_options()):
            pass  # declares the quorum queue (members: all three nodes)
        cluster.kill_node(3)
        assert not cluster.node(3).is_running()
        assert name not in cluster.running_nodes(1)
        with GuardedProducer(open_adapter(cluster.stomp_url(2)), g) as producer:
            assert producer.send(q, "while node 3 was down", headers=QUORUM).sent
        cluster.restart_node(3)
        assert cluster.stomp_url(3) == url_before and cluster.nodename(3) == name
        assert cluster.running_nodes(2) == {cluster.nodename(i) for i in (1, 2, 3)}
        with GuardedConsumer(open_adapter(cluster.stomp_url(3)), q, got.append, g,
                             options=quorum_options()):
            wait_for(lambda: bool(got), 30, "the message through the restarted node")
    assert [m.body for m in got] == [b"while node 3 was down"]
    assert cluster.handle.pid == cluster.node(1).pid
    assert cluster.node(3).pid in cluster.handle.extra_pids


TOTAL, KILL_AT = 300, b"m100"


class Handler:
    """Counts every handler call per body; slow enough that the stream spans the kill.

    Handling ``KILL_AT`` the first time kills the node the consumer is connected to, so that
    message's ack surely dies with the node: a redelivery the consumer audit must catch.
    """

    def __init__(self, kill: Callable[[], None]) -> None:
        self.calls: Counter[bytes] = Counter()
        self.lock = threading.Lock()
        self.kill = kill

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.calls[message.body] += 1
            first = self.calls[message.body] == 1
        if message.body == KILL_AT and first:
            self.kill()
        time.sleep(0.002)

    def handled(self) -> int:
        with self.lock:
            return len(self.calls)


@pytest.mark.spark
def test_node_killed_mid_stream_loses_nothing_and_handles_nothing_twice(
        spark: Any, mqguard_rabbitmq_cluster: RabbitMQCluster, mqguard_redis_url: str,
        tmp_path: Path, mqguard_unique_name: str) -> None:
    """Producer and consumer connect to node 1, which also leads the quorum queue (it was
    declared there). Node 1 is SIGKILLed mid-stream, from inside the handler of message 100;
    both clients fail over (the adapter's ``failover`` URLs) to nodes 2 and 3, the producer
    re-sends what it could not confirm (same message, same duplicate id), and the consumer's
    guard suppresses the redeliveries of what it had handled but could not ack."""
    cluster, q = mqguard_rabbitmq_cluster, mqguard_unique_name
    events = tmp_path / "events"
    urls = [cluster.stomp_url(i) for i in (1, 2, 3)]

    def adapter() -> Any:
        return open_adapter(urls[0], failover=urls[1:], reconnect_delay=0.1,
                            reconnect_max_delay=1.0, reconnect_attempts=60)

    handler = Handler(lambda: cluster.kill_node(1))
    consumer_adapter, producer_adapter = adapter(), adapter()
    bodies = [f"m{i}".encode() for i in range(TOTAL)]
    retries = 0
    with guard("consumer", q, mqguard_redis_url, events) as consumer_guard, \
            guard("producer", q, mqguard_redis_url, events) as producer_guard, \
            GuardedConsumer(consumer_adapter, q, handler, consumer_guard,
                            options=quorum_options()), \
            GuardedProducer(producer_adapter, producer_guard, producer_id="kill-p") as producer:
        assert cluster.rabbitmqctl(1, "list_queues", "name", "leader").count(
            f"{q}\t{cluster.nodename(1)}") == 1, "node 1 should lead the queue"
        began = time.monotonic()
        for i, body in enumerate(bodies):
            message = producer.message(q, body, headers=QUORUM, duplicate_id=f"d{i}")
            deadline = time.monotonic() + 60
            while True:
                try:
                    producer.send_message(message)
                    break
                except AdapterError:
                    # Unconfirmed: the broker may or may not have it. Re-send the same
                    # message once the adapter is back (on another node).
                    if time.monotonic() > deadline:
                        raise
                    retries += 1
                    time.sleep(0.1)
            time.sleep(0.005)  # paced: the kill lands while both clients are busy
        assert not cluster.node(1).is_running(), "node 1 was not killed mid-stream"
        wait_for(lambda: handler.handled() >= TOTAL, 120, "every message to be handled")
        time.sleep(1.0)  # redeliveries of lost acks arrive and are suppressed
        assert consumer_adapter.sessions >= 2 and producer_adapter.sessions >= 2
        assert retries >= 1, "the kill did not interrupt the producer"
    assert set(handler.calls) == set(bodies), "lost messages"
    twice = {body: n for body, n in handler.calls.items() if n > 1}
    assert twice == {}, f"handled twice: {twice}"

    stream_s = time.monotonic() - began
    audit_began = time.monotonic()
    config = parse_config({"mqguard": {"store": mqguard_redis_url},
                           "plugins": {"consumer_audit": {"shared": True}}})
    result = run_audit(spark, AuditOptions(
        [str(events / "consumer"), str(events / "producer")], out=str(tmp_path / "out"),
        config=config, watermark=now_ms(),
        checks=CheckOptions(assume_drained=True),
        cross=CrossInputs(redis_url=mqguard_redis_url)))
    summary = result.summary
    found = {name: entry["by_address"] for name, entry in summary["classes"].items()
             if entry["count"]}
    assert found == {}, found
    assert result.exit_code == 0 and summary["ok"]
    assert summary["addresses"][q]["sent"] == TOTAL
    assert summary["addresses"][q]["with_fate"] == TOTAL
    kinds = Counter(e["type"] for node in ("consumer", "producer")
                    for e in events_of(events / node))
    # Message 100's ack died with node 1: its redelivery reached the guard, not the handler.
    assert kinds["duplicate_delivery_suppressed"] >= 1, kinds
    print(f"\nkill mid-stream: {retries} send retries, {dict(kinds)}, "
          f"stream {stream_s:.1f} s, audit {time.monotonic() - audit_began:.1f} s")
