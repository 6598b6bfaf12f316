"""How a message is given back for another delivery, per broker.

A plugin decides *that* a failed delivery is redelivered and *when*
(``Verdict.redeliver(delay_ms)``); this module decides *how*, from the
adapter's :class:`~mqguard.adapter.Capabilities`, so that the delay is honoured
and no message is lost if the consumer process dies at any moment:

================  ========================================================  ===================
mechanism         what happens                                              chosen when
================  ========================================================  ===================
``nack``          NACK with requeue now; the broker redelivers at once      ``nack_requeue`` and
                                                                            no delay (RabbitMQ)
``broker-delay``  send the same message again with a broker-side delay      ``delayed_delivery``
                  (ActiveMQ ``AMQ_SCHEDULED_DELAY``) and ack the original,  (ActiveMQ)
                  both in one broker transaction when the broker has them
``hold-nack``     keep the delivery unacknowledged in this process; at the  ``nack_requeue`` and
                  due time NACK it with requeue                             a delay (RabbitMQ)
``hold-local``    keep the delivery unacknowledged; at the due time hand    everything else
                  it to the handler again, in this process                  (MQTT, unknown STOMP)
================  ========================================================  ===================

Why these and not one mechanism: an ActiveMQ 5 NACK is a poison ack (straight
to ActiveMQ.DLQ), MQTT has no NACK at all and republishing to an MQTT topic
would fan the copy out to every subscriber, and RabbitMQ has no delayed
delivery without a plugin. Where a message is *held*, the broker still owns it
(unacknowledged): a crash hands it to the next consumer at once, so nothing is
lost but the delay restarts from zero; a held message also occupies one slot of
the subscription's prefetch / receive window until it is due.

A consumer that leaves cleanly right after a failure keeps the delay only with
``broker-delay``: the re-send and the original's ACK are deferred work on the
consumer's connection, which a close (the wrapper) or a DISCONNECT (the sidecar)
waits for. A held delivery goes back to the broker with its connection, at once.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from mqguard.adapter import Capabilities

log = logging.getLogger("mqguard.redelivery")


class Mechanism(enum.StrEnum):
    """How a redelivery is carried out (see the module documentation)."""

    NACK = "nack"
    BROKER_DELAY = "broker-delay"
    HOLD_NACK = "hold-nack"
    HOLD_LOCAL = "hold-local"


def choose_mechanism(capabilities: Capabilities, delay_ms: int) -> Mechanism:
    """The mechanism that honours ``delay_ms`` on a broker with ``capabilities``."""
    if capabilities.nack_requeue and delay_ms <= 0:
        return Mechanism.NACK
    if capabilities.delayed_delivery:
        return Mechanism.BROKER_DELAY
    if capabilities.nack_requeue:
        return Mechanism.HOLD_NACK
    return Mechanism.HOLD_LOCAL


class RedeliveryTimer:
    """Runs jobs at their due time on one daemon thread (started on first use).

    Holds the in-process redeliveries (``hold-nack``, ``hold-local``). Jobs run
    one at a time, in due order; an exception in a job is logged and the thread
    goes on. :meth:`close` drops the jobs not yet due: their deliveries are still
    unacknowledged, so the broker hands them out again once the consumer's
    connection closes.
    """

    def __init__(self, name: str = "mqguard-redelivery") -> None:
        self._name = name
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)

    def call_later(self, delay_ms: int, job: Callable[[], None]) -> None:
        """Run ``job`` after ``delay_ms``. RuntimeError once closed."""
        due = time.monotonic() + max(0, delay_ms) / 1000.0
        with self._cond:
            if self._closed:
                raise RuntimeError("the redelivery timer is closed")
            heapq.heappush(self._heap, (due, next(self._order), job))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._heap:
                        wait = self._heap[0][0] - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                _due, _order, job = heapq.heappop(self._heap)
            try:
                job()
            except Exception:
                log.exception("a held redelivery failed; the message stays unacknowledged and "
                              "the broker redelivers it when the consumer's connection closes")

    def close(self, timeout: float = 5.0) -> int:
        """Stop; returns how many jobs were dropped. Waits for a running job (bounded)."""
        with self._cond:
            self._closed = True
            dropped = len(self._heap)
            self._heap.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return dropped
