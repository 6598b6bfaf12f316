"""The demo's traffic: one address through the sidecar, one through the wrappers, one
through the MQTT sidecar.

- ``<base>.orders``: an unmodified stomp.py producer and consumer talk to the sidecar,
  which guards them (the way a Java or Node application would be guarded).
- ``<base>.payments``: a :class:`~mqguard.producer.GuardedProducer` sends straight to the
  broker; a :class:`~mqguard.consumer.GuardedConsumer` receives through a fault proxy
  that swallows its acknowledgements for a while and then cuts its connection (the
  injected failover): the broker redelivers what the handler already handled, and the
  consumer audit must keep it from the handler.
- ``<base>.devices`` (MQTT topic ``<base>/devices``, on Mosquitto): an MQTT 3.1.1 device
  and an MQTT 5 application publish through the MQTT sidecar; a subscriber drops its
  session on poison messages (:mod:`mqguard.demo.mqtt_leg`).

Every address gets the same seeded mix (:mod:`mqguard.demo.plan`). Short-lived messages
expire before the consumers start; poison messages fail in the handler on every
delivery. Every leg shares one Redis, so the sidecars and the application see one
duplicate-ID cache and one set of delivery counts.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import stomp

from mqguard.config import MqguardConfig
from mqguard.consumer import GuardedConsumer
from mqguard.demo.faultproxy import FaultProxy
from mqguard.demo.mqtt_leg import DemoMqttLeg, mqtt_host_port
from mqguard.demo.outcome import LegOutcome, wait_for
from mqguard.demo.plan import INDEX_HEADER, POISON_HEADER, DemoPlan, Kind
from mqguard.message import ORIG_MESSAGE_ID_HEADER, now_ms
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.reaper import ExpiryReaper
from mqguard.registry import open_adapter
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

#: Lifetime of the short-lived messages; the consumers start after it has passed.
SHORT_TTL_MS = 300
#: Unacked messages the failover leaves handled on the broker before the cut.
FAILOVER_UNACKED = 10

Report = Callable[[str], None]


class _Inbox(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py listener that counts messages per subscription and receipts."""

    def __init__(self, on_message: Callable[[Any], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()
        #: Distinct originals per subscription: a move whose ack was lost with a cut
        #: connection is made again on redelivery, so a DLQ/EXP may hold two copies of one.
        self.originals: dict[str, set[str]] = {}
        self.receipts = 0
        self.errors: list[str] = []
        self._on_message = on_message

    def on_message(self, frame: Any) -> None:
        with self.lock:
            subscription = frame.headers.get("subscription", "")
            self.count[subscription] += 1
            original = frame.headers.get(ORIG_MESSAGE_ID_HEADER)
            if original is not None:
                self.originals.setdefault(subscription, set()).add(original)
        if self._on_message is not None:
            self._on_message(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts += 1

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame.headers.get("message", "ERROR"))


def _stomp_connection(url: str, listener: _Inbox) -> stomp.Connection:
    """A plain stomp.py connection, as an application would open it.

    The ``host`` header is always sent: without ``vhost`` stomp.py sends the host name,
    which RabbitMQ takes as the virtual host and refuses (through the sidecar too, which
    passes the header on). ``?vhost=`` in the URL chooses it; ``/`` (RabbitMQ's default
    virtual host, ignored by ActiveMQ) otherwise, as in mqguard's own STOMP adapter.
    """
    parts = urlsplit(url)
    vhost = parse_qs(parts.query).get("vhost", ["/"])[0]
    conn = stomp.Connection12([(parts.hostname or "127.0.0.1", parts.port or 61613)],
                            heartbeats=(0, 0), auto_content_length=True, vhost=vhost)
    conn.set_listener("inbox", listener)
    conn.connect(unquote(parts.username or "guest"), unquote(parts.password or "guest"),
                 wait=True)
    return conn


class DemoScenario:
    """Runs both legs against one broker and one Redis; see the module docstring."""

    def __init__(self, broker_url: str, sidecar_config: MqguardConfig,
                 app_config: MqguardConfig, plan: DemoPlan, base: str, *,
                 mqtt_url: str, mqtt_config: MqguardConfig,
                 report: Report = lambda _: None, timeout: float = 120.0) -> None:
        self.broker_url = broker_url
        self.sidecar_config = sidecar_config
        self.app_config = app_config
        self.mqtt_url = mqtt_url
        self.mqtt_config = mqtt_config
        self.plan = plan
        self.report = report
        self.timeout = timeout
        self.orders = LegOutcome(f"{base}.orders", plan.messages_for("orders"))
        self.payments = LegOutcome(f"{base}.payments", plan.messages_for("payments"))
        self.devices = LegOutcome(f"{base}.devices", plan.messages_for("devices"))
        self.mqtt = DemoMqttLeg(self.devices, mqtt_host_port(mqtt_url),
                                name=base.replace(".", "-"), report=report, timeout=timeout)

    def run(self) -> list[LegOutcome]:
        sidecar = Sidecar(self.sidecar_config, parse_upstream(self.broker_url),
                          admin=("127.0.0.1", 0))
        mqtt_sidecar = MqttSidecar(self.mqtt_config, mqtt_host_port(self.mqtt_url),
                                   broker="mosquitto")
        with SidecarThread(sidecar) as running, MqttSidecarThread(mqtt_sidecar) as mqtt:
            sidecar_url = urlunsplit(urlsplit(self.broker_url)._replace(
                netloc=f"127.0.0.1:{running.port}"))
            self.report(f"sidecar listening on 127.0.0.1:{running.port}, MQTT sidecar on "
                        f"127.0.0.1:{mqtt.port}")
            with Guard(self.app_config, role="app") as guard:
                self._prepare_expiry(guard)
                self.mqtt.prepare(mqtt.port)
                # MQTT first: its expiry counts whole seconds, the STOMP sends overlap it.
                mqtt_expired_by = self.mqtt.send(mqtt.port)
                self._send_orders(sidecar_url)
                self._send_payments(guard)
                # Short-lived messages must be dead before anyone consumes.
                expired_by = max(mqtt_expired_by, time.monotonic() + SHORT_TTL_MS / 1000 + 0.5)
                time.sleep(max(0.0, expired_by - time.monotonic()))
                driver = mqtt_sidecar.driver
                self.mqtt.consume(mqtt.port,
                                  lambda: driver.plane.connection_count() if driver else 0)
                self._consume(sidecar_url, guard)
            running.sidecar.guard.events.flush()
            mqtt_sidecar.guard.events.flush()
        return [self.orders, self.payments, self.devices]

    def _prepare_expiry(self, guard: Guard) -> None:
        """On a broker that expires messages itself and dead-letters them to the reaper's
        holding queue (RabbitMQ, through a policy: see ``mqguard demo --help``), that
        queue must exist before the first short-lived message expires, or the broker drops
        it: one scan declares it (the sidecar's own reaper may not have run yet)."""
        adapter = open_adapter(self.broker_url)
        try:
            if adapter.capabilities.expiry_reaping == "dead-letter":
                ExpiryReaper(guard, adapter, []).scan()
        finally:
            adapter.close()

    # -- sending ---------------------------------------------------------------------

    def _send_orders(self, sidecar_url: str) -> None:
        """An unmodified STOMP client; the sidecar does the guarding."""
        inbox = _Inbox()
        conn = _stomp_connection(sidecar_url, inbox)
        try:
            planned = self.orders.planned
            frames = [*planned, *(p for p in planned if p.resent)]
            for sent, item in enumerate(frames, 1):
                headers = {"_AMQ_DUPL_ID": item.duplicate_id, INDEX_HEADER: str(item.index),
                           "persistent": "true"}
                if item.kind is Kind.POISON:
                    headers[POISON_HEADER] = "1"
                elif item.kind is Kind.SHORT_LIVED:
                    headers["expires"] = str(now_ms() + SHORT_TTL_MS)
                conn.send(f"/queue/{self.orders.address}", f"order {item.index}",
                          headers=headers, receipt=f"o{sent}")
            wait_for(lambda: inbox.receipts >= len(frames) or bool(inbox.errors), self.timeout,
                  "the sidecar's receipts")
            if inbox.errors:
                raise RuntimeError(f"the sidecar refused a send: {inbox.errors[0]}")
        finally:
            conn.disconnect()
        self.report(f"{self.orders.address}: {len(frames)} sends through the sidecar "
                    f"({len(frames) - len(planned)} of them duplicates)")

    def _send_payments(self, guard: Guard) -> None:
        """The wrapper: a GuardedProducer straight to the broker."""
        planned = self.payments.planned
        with GuardedProducer(open_adapter(self.broker_url), guard) as producer:
            batch = []
            for item in [*planned, *(p for p in planned if p.resent)]:
                headers = {INDEX_HEADER: str(item.index)}
                if item.kind is Kind.POISON:
                    headers[POISON_HEADER] = "1"
                batch.append(producer.message(
                    self.payments.address, f"payment {item.index}", headers=headers,
                    duplicate_id=item.duplicate_id,
                    ttl_ms=SHORT_TTL_MS if item.kind is Kind.SHORT_LIVED else None))
            for start in range(0, len(batch), 100):
                producer.send_batch(batch[start:start + 100])
        self.report(f"{self.payments.address}: {len(batch)} sends through GuardedProducer "
                    f"({len(batch) - len(planned)} of them duplicates)")

    # -- consuming -------------------------------------------------------------------

    def _consume(self, sidecar_url: str, guard: Guard) -> None:
        orders, payments = self.orders, self.payments
        # Dead letters and expired copies are read straight from the broker: the demo
        # only counts them (they are the end of the road, nothing guards them further).
        tally = _Inbox()
        tally_conn = _stomp_connection(self.broker_url, tally)
        order_conn = None
        try:
            for prefix, leg in (("DLQ", orders), ("EXP", orders), ("DLQ", payments),
                                ("EXP", payments)):
                tally_conn.subscribe(f"/queue/{prefix}.{leg.address}",
                                     id=f"{prefix}.{leg.address}", ack="auto")
            order_conn = self._consume_orders(sidecar_url)
            with FaultProxy(*self._broker_hostport()) as proxy:
                failover = _FailoverHandler(payments, proxy)
                with GuardedConsumer(open_adapter(proxy.through(self.broker_url)),
                                     payments.address, failover, guard):
                    self.report("consumers running; a failover will cut the payments "
                                "consumer while it holds handled, unacknowledged messages")

                    def settled() -> bool:
                        with tally.lock:
                            for leg in (orders, payments):
                                leg.dead_letters = len(tally.originals.get(
                                    f"DLQ.{leg.address}", ()))
                                leg.expired_copies = len(tally.originals.get(
                                    f"EXP.{leg.address}", ()))
                        return orders.complete() and payments.complete()

                    wait_for(settled, self.timeout, lambda: "every message's fate: "
                          f"{orders.progress()}; {payments.progress()}")
                    time.sleep(1.0)  # late redeliveries, if any, would show up now
                    settled()
                    payments.failover_unacked = failover.unacked
                    if proxy.accepted < 2:
                        raise RuntimeError("the payments consumer did not reconnect after "
                                           "the failover")
        finally:
            if order_conn is not None:
                order_conn.disconnect()
            tally_conn.disconnect()

    def _consume_orders(self, sidecar_url: str) -> stomp.Connection:
        orders = self.orders
        holder: dict[str, stomp.Connection] = {}

        def on_message(frame: Any) -> None:
            # Runs on stomp.py's receiver thread, which swallows exceptions: keep it simple.
            index = int(frame.headers.get(INDEX_HEADER, "-1"))
            with orders_lock:
                orders.handled[index] += 1
            conn = holder["conn"]
            if frame.headers.get(POISON_HEADER):
                conn.nack(frame.headers["ack"])  # the sidecar counts, redelivers, dead-letters
            else:
                conn.ack(frame.headers["ack"])

        orders_lock = threading.Lock()
        inbox = _Inbox(on_message)
        conn = _stomp_connection(sidecar_url, inbox)
        holder["conn"] = conn
        conn.subscribe(f"/queue/{orders.address}", id="orders", ack="client-individual")
        return conn

    def _broker_hostport(self) -> tuple[str, int]:
        parts = urlsplit(self.broker_url)
        return parts.hostname or "127.0.0.1", parts.port or 61613


class _FailoverHandler:
    """The payments handler: fails on poison, and injects one failover.

    After the tenth message it swallows the consumer's acknowledgements, so the next
    ``window`` messages are handled but stay unacknowledged on the broker; then it cuts
    the connection. The broker redelivers them after the adapter reconnects.

    The window is FAILOVER_UNACKED, or less on a small run: the cut must come while
    ordinary messages are still arriving. While acknowledgements are swallowed, so are a
    poison message's NACKs, and no redelivery of it comes; with too few messages left the
    cut would never happen and the connection would stay blackholed.
    """

    def __init__(self, leg: LegOutcome, proxy: FaultProxy) -> None:
        self.leg = leg
        self.proxy = proxy
        self.lock = threading.Lock()
        self.calls = 0
        self.unacked = 0
        normal = sum(1 for p in leg.planned if p.kind is Kind.NORMAL)
        self.window = max(1, min(FAILOVER_UNACKED, (normal - 10) // 2))

    def __call__(self, message: Any) -> None:
        index = int(message.headers.get(INDEX_HEADER, "-1"))
        with self.lock:
            self.leg.handled[index] += 1
            self.calls += 1
            calls = self.calls
        if calls == 10:
            self.proxy.blackhole("upstream")
        elif 10 < calls <= 10 + self.window:
            self.unacked += 1
            if calls == 10 + self.window:
                self.proxy.restore()
                self.proxy.cut()
        if message.headers.get(POISON_HEADER):
            raise RuntimeError(f"poison message {index}")
