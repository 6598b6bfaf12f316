"""Doctor probes of an ActiveMQ Classic broker, over STOMP and from its ``activemq.xml``.

ActiveMQ 5 with JMX and Jolokia off (as mqguard's servers and most hardened deployments run
it) shows nothing of its configuration over STOMP, so the facts are learnt by behaviour on a
probe queue, ``mqguard.doctor.probe``; every probe message carries this run's id and is
consumed with a selector on it, so concurrent runs do not meet, and nothing is left queued:

* **clock**: a SEND without a ``timestamp`` header is stamped with the broker's clock on
  arrival (a client-set ``timestamp`` is kept as given, so mqguard never sets it); the round
  trip to the SEND's RECEIPT bounds the skew.
* **scheduler** (``schedulerSupport``): a message sent with ``AMQ_SCHEDULED_DELAY`` must
  arrive no earlier than the delay; without the scheduler it arrives at once.
* **page size** (``maxPageSize``, default 200): a selector subscription only sees messages
  the queue has paged in, so :data:`PAGE_PROBE` non-matching messages are queued before one
  that matches; if it is not delivered, the expiry reaper would be blind past
  ``maxPageSize`` messages too. The probe shows whether the page is larger than
  :data:`PAGE_PROBE`, not its exact size.
* ``persistJMSRedelivered`` (and the exact ``maxPageSize``) cannot be observed without a
  broker restart: they are read from ``activemq.xml`` when ``--broker-config`` gives it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from mqguard.adapter import Adapter, Delivery, SubscribeOptions
from mqguard.config import MqguardConfig
from mqguard.doctor.activemq_xml import read_activemq_xml
from mqguard.doctor.clock import Skew
from mqguard.doctor.model import Check, Status
from mqguard.message import Message, now_ms

__all__ = ["PAGE_PROBE", "PROBE_QUEUE", "SCHEDULE_DELAY_MS", "activemq_config_checks",
           "probe_activemq"]

PROBE_QUEUE = "mqguard.doctor.probe"
#: Delay of the scheduler probe; arriving before 80 % of it means no scheduler.
SCHEDULE_DELAY_MS = 1000
#: Non-matching messages queued ahead of the one the page-size probe looks for.
PAGE_PROBE = 1000
_RUN = "mqguard_doctor_run"
_KIND = "mqguard_doctor_kind"
_WAIT = 3.0


class _Inbox:
    """Deliveries of one subscription, with their arrival times (epoch ms)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.items: list[tuple[float, Delivery]] = []

    def add(self, delivery: Delivery) -> None:
        with self._cond:
            self.items.append((time.time() * 1000, delivery))
            self._cond.notify_all()

    def wait(self, done: Callable[[list[tuple[float, Delivery]]], bool], timeout: float
             ) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: done(self.items), timeout)

    def of_kind(self, kind: str) -> list[tuple[float, Delivery]]:
        with self._cond:
            return [(t, d) for t, d in self.items if d.message.headers.get(_KIND) == kind]


def _needs_delay(config: MqguardConfig | None) -> bool:
    return config is not None and any(
        (table.redelivery_delay or 0) > 0 for table in config.address_settings.values())


def _probe_message(run: str, kind: str, scheduled_delivery: int = 0) -> Message:
    return Message(PROBE_QUEUE, kind.encode(), headers={_RUN: run, _KIND: kind,
                                                         "persistent": "false"},
                   scheduled_delivery=scheduled_delivery)


def _clock_and_scheduler(adapter: Adapter, run: str, needs_delay: bool
                         ) -> tuple[list[Check], Skew | None]:
    inbox = _Inbox()
    sub = adapter.subscribe(PROBE_QUEUE, inbox.add,
                            SubscribeOptions(ack="auto", selector=f"{_RUN} = '{run}'"))
    try:
        t0 = time.time() * 1000
        adapter.send(_probe_message(run, "clock"))
        t1 = time.time() * 1000
        sent_at = time.time() * 1000
        adapter.send(_probe_message(run, "scheduled",
                                    scheduled_delivery=now_ms() + SCHEDULE_DELAY_MS))
        inbox.wait(lambda items: len(items) >= 2, SCHEDULE_DELAY_MS / 1000 + _WAIT)
    finally:
        adapter.unsubscribe(sub)
    checks: list[Check] = []
    skew = None
    clock = inbox.of_kind("clock")
    stamp = clock[0][1].raw_headers.get("timestamp", "") if clock else ""
    if stamp.isdigit():
        skew = Skew.from_round_trip("broker", "STOMP SEND stamped by ActiveMQ, to its RECEIPT",
                                    t0, t1, int(stamp))
    scheduled = inbox.of_kind("scheduled")
    if not scheduled:
        checks.append(Check("broker", "scheduler", Status.WARNING,
                            f"a message sent with AMQ_SCHEDULED_DELAY={SCHEDULE_DELAY_MS} was "
                            f"not delivered within {SCHEDULE_DELAY_MS / 1000 + _WAIT:.0f} s",
                            fix="check the broker log (scheduler store, disk limits)"))
        return checks, skew
    took = scheduled[0][0] - sent_at
    if took >= 0.8 * SCHEDULE_DELAY_MS:
        checks.append(Check("broker", "scheduler", Status.OK,
                            f"schedulerSupport on: a {SCHEDULE_DELAY_MS} ms AMQ_SCHEDULED_DELAY "
                            f"message arrived after {took:.0f} ms", data={"delay_ms": took}))
    else:
        checks.append(Check(
            "broker", "scheduler", Status.ERROR if needs_delay else Status.WARNING,
            f"schedulerSupport off: a {SCHEDULE_DELAY_MS} ms AMQ_SCHEDULED_DELAY message "
            f"arrived after {took:.0f} ms"
            + (" and the configuration has redelivery-delay > 0" if needs_delay else ""),
            fix='set schedulerSupport="true" on <broker> in activemq.xml (broker-side '
                "redelivery delays need it)", data={"delay_ms": took}))
    return checks, skew


def _page_size(adapter: Adapter, run: str) -> Check:
    adapter.send_many([_probe_message(run, "filler") for _ in range(PAGE_PROBE)])
    adapter.send(_probe_message(run, "last"))
    last = _Inbox()
    sub = adapter.subscribe(PROBE_QUEUE, last.add, SubscribeOptions(
        ack="auto", selector=f"{_RUN} = '{run}' AND {_KIND} = 'last'"))
    try:
        seen = last.wait(lambda items: bool(items), _WAIT)
    finally:
        adapter.unsubscribe(sub)
    # Drain the fillers (and "last" if it stayed), so the probe queue is left empty.
    rest = _Inbox()
    expected = PAGE_PROBE + (0 if seen else 1)
    sub = adapter.subscribe(PROBE_QUEUE, rest.add, SubscribeOptions(
        ack="auto", prefetch=1000, selector=f"{_RUN} = '{run}'"))
    try:
        rest.wait(lambda items: len(items) >= expected, 2 * _WAIT)
    finally:
        adapter.unsubscribe(sub)
    if seen:
        return Check("broker", "max-page-size", Status.OK,
                     f"maxPageSize above {PAGE_PROBE}: a selector saw past {PAGE_PROBE} "
                     "non-matching messages", data={"probe": PAGE_PROBE})
    return Check("broker", "max-page-size", Status.WARNING,
                 f"maxPageSize at most {PAGE_PROBE}: a selector did not see past "
                 f"{PAGE_PROBE} non-matching messages, so the expiry reaper cannot reach "
                 "expired messages behind that many live ones",
                 fix='raise maxPageSize on <policyEntry queue=">"> above the deepest queue '
                     "(docs/expiry.md)", data={"probe": PAGE_PROBE})


def probe_activemq(adapter: Adapter, config: MqguardConfig | None
                   ) -> tuple[list[Check], Skew | None]:
    """The behavioural probes (clock, scheduler, page size) on a connected ``adapter``."""
    run = uuid.uuid4().hex
    checks, skew = _clock_and_scheduler(adapter, run, _needs_delay(config))
    checks.append(_page_size(adapter, run))
    return checks, skew


def activemq_config_checks(path: str | None) -> list[Check]:
    """``persistJMSRedelivered`` and ``maxPageSize`` from ``activemq.xml`` at ``path``."""
    if path is None:
        return [Check("broker", "persist-jms-redelivered", Status.SKIPPED,
                      "not visible over STOMP",
                      fix="pass --broker-config PATH/activemq.xml to check it")]
    try:
        facts = read_activemq_xml(path)
    except ValueError as exc:
        return [Check("broker", "broker-config", Status.ERROR, str(exc),
                      fix="give --broker-config the broker's activemq.xml")]
    data = {"path": str(path), "schedulerSupport": facts.scheduler_support,
            "persistJMSRedelivered": facts.persist_jms_redelivered,
            "maxPageSize": facts.max_page_size}
    checks = []
    if facts.persist_jms_redelivered:
        checks.append(Check("broker", "persist-jms-redelivered", Status.OK,
                            f'{path}: persistJMSRedelivered="true" on queue=">"', data=data))
    else:
        checks.append(Check(
            "broker", "persist-jms-redelivered", Status.WARNING,
            f'{path}: persistJMSRedelivered is not "true" on <policyEntry queue=">">: after '
            "a broker crash a message already delivered comes back as a first delivery, so "
            "poison messages may reach their handler more than max-delivery-attempts times",
            fix='add persistJMSRedelivered="true" to <policyEntry queue=">"> '
                "(docs/faults.md)", data=data))
    checks.append(Check("broker", "max-page-size-config", Status.OK,
                        f"{path}: maxPageSize {facts.max_page_size}", data=data)
                  if facts.max_page_size > PAGE_PROBE else
                  Check("broker", "max-page-size-config", Status.WARNING,
                        f"{path}: maxPageSize {facts.max_page_size}: the expiry reaper sees "
                        f"only the first {facts.max_page_size} messages of a queue",
                        fix='raise maxPageSize on <policyEntry queue=">"> above the deepest '
                            "queue (docs/expiry.md)", data=data))
    return checks
