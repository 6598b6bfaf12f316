"""The guard's batch API over the MQTT plane's events.

* A client's PUBLISHes of one read are one :meth:`~mqguard.pipeline.Guard.decide_sends`
  call; forwarded ones are settled (:meth:`~mqguard.pipeline.Guard.settle_sends`) when the
  broker acknowledged them (PUBACK, PUBREC) or the connection ended first.
* The broker's PUBLISHes of one read are one
  :meth:`~mqguard.pipeline.Guard.open_deliveries` call; the client's PUBACKs (PUBRECs) of
  one read one :meth:`~mqguard.pipeline.Guard.finish_deliveries` call. A QoS 0 delivery
  has no acknowledgement: it is finished as soon as it is handed on.
* A QoS 1/2 delivery still unacknowledged when the client's side of the connection ends
  is a failed delivery (:class:`SubscriberGone`): the guard counts it and, after
  ``max-delivery-attempts``, publishes its copy to the dead-letter address and
  acknowledges it upstream, over the upstream connection the plane keeps open until
  :meth:`MqttBridge.gone` released it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from mqguard.adapter import Delivery
from mqguard.context import HookContext
from mqguard.errors import AdapterError
from mqguard.jobthread import JobThread
from mqguard.message import derived_message_id, new_message_id
from mqguard.mqtt_sidecar.leg import DeliveryToken, MqttLeg, Publications
from mqguard.mqtt_sidecar.messages import (
    MqttMessage,
    address_to_topic,
    content_message_id,
    delivery_message,
    expiry_interval,
    send_message,
    user_properties,
)
from mqguard.mqtt_sidecar.metrics import MqttMetrics
from mqguard.pipeline import Guard, SendResult

if TYPE_CHECKING:
    from mqguard_native import MqttPlane

__all__ = ["LOST", "MqttBridge", "SubscriberGone"]

log = logging.getLogger("mqguard.mqtt_sidecar")

# Verdict actions of MqttPlane.verdicts (native/src/mqtt_proxy/session.rs).
_FORWARD, _DROP, _REJECT = 0, 1, 2
_WITHHOLD = 1
#: Reason code of an exchange whose connection ended before the broker answered.
LOST: Final = 0xFF


class SubscriberGone(Exception):
    """The subscriber's session dropped before it acknowledged a delivery."""


@dataclass(slots=True)
class _Connection:
    conn: int
    client_id: str
    level: int
    leg: MqttLeg
    #: Forwarded sends waiting for the broker, by token.
    sends: dict[int, SendResult] = field(default_factory=dict)
    #: Deliveries handed to the client and not acknowledged yet, by packet id.
    inflight: dict[int, tuple[Delivery, HookContext]] = field(default_factory=dict)
    gone: bool = False
    #: The connection's producer id; its sends are numbered (the consumer audit's key).
    producer_id: str = field(default_factory=new_message_id)
    sequence: Iterator[int] = field(default_factory=lambda: itertools.count(1))


class MqttBridge:
    """Turns the plane's events into guard calls and the guard's answers into verdicts."""

    def __init__(self, guard: Guard, *, broker: str, metrics: MqttMetrics) -> None:
        self.guard = guard
        self.broker = broker
        self.metrics = metrics
        self.plane: MqttPlane | None = None
        self.publications = Publications()
        self.jobs = JobThread("mqguard-mqtt-sidecar-jobs")
        self.jobs.start()
        self._connections: dict[int, _Connection] = {}
        self._tokens = itertools.count(1)

    def attach(self, plane: MqttPlane) -> None:
        self.plane = plane

    def _plane(self) -> MqttPlane:
        if self.plane is None:
            raise RuntimeError("MqttBridge used before attach()")
        return self.plane

    # -- connections -------------------------------------------------------------------

    def opened(self, conn: int, client_id: str, level: int, clean: bool, peer: str) -> None:
        leg = MqttLeg(self._plane(), conn, level=level, broker=self.broker,
                      publications=self.publications, jobs=self.jobs)
        self._connections[conn] = _Connection(conn, client_id, level, leg)
        self.metrics.connections += 1
        log.debug("MQTT %s client %r connected from %s (clean=%s)",
                  "5" if level == 5 else "3.1.1", client_id, peer, clean)

    def gone(self, conn: int, graceful: bool) -> None:
        connection = self._connections.get(conn)
        if connection is None:
            self._plane().release(conn)
            return
        self._fail_inflight(connection)
        plane = self._plane()

        def release() -> None:
            plane.release(conn)

        # After the dead-letter moves the failures above deferred to the same thread.
        if not self.jobs.submit(release):
            release()

    def closed(self, conn: int, reason: str) -> None:
        connection = self._connections.pop(conn, None)
        if connection is None:
            return
        self.metrics.connections -= 1
        self.metrics.connection("gone" if connection.gone else "closed")
        self._fail_inflight(connection)
        connection.leg.close()
        if connection.sends:
            self.guard.settle_sends(failed=list(connection.sends.values()),
                                    error=AdapterError(f"connection ended: {reason}"))
            connection.sends.clear()
        log.debug("MQTT connection %d closed: %s", conn, reason)

    def _fail_inflight(self, connection: _Connection) -> None:
        connection.gone = True
        connection.leg.alive = False
        if not connection.inflight:
            return
        error = SubscriberGone("the subscriber's session dropped before it acknowledged")
        items = [(delivery, ctx, error) for delivery, ctx in connection.inflight.values()]
        connection.inflight.clear()
        self.metrics.message("deliver", "failed", len(items))
        self.guard.finish_deliveries(connection.leg, items)

    def protocol_error(self, conn: int, side: str, kind: str, detail: str) -> None:
        self.metrics.protocol_error(side, kind)
        # The codec's details never hold a credential (only whether one was given).
        log.warning("MQTT connection %d: the %s sent a %s packet: %s", conn, side, kind, detail)

    # -- sends -------------------------------------------------------------------------

    def sends(self, conn: int, batch: int, messages: list[MqttMessage]) -> None:
        connection = self._connections.get(conn)
        plane = self._plane()
        if connection is None:
            plane.verdicts(batch, [])  # every message refused
            return
        guarded = [send_message(mqtt) for mqtt in messages]
        for mqtt, message in zip(messages, guarded, strict=True):
            if message.producer_id is None:
                message.producer_id = connection.producer_id
                message.sequence = next(connection.sequence)
                if not message.message_id:
                    # MQTT 3.1.1 carries no id to the broker: its deliveries will be known
                    # by their content id, so the send is too (the audit pairs them).
                    message.message_id = (
                        derived_message_id(connection.producer_id, message.sequence)
                        if connection.level == 5 else content_message_id(mqtt))
        try:
            decision = self.guard.decide_sends(guarded, connection.leg.capabilities,
                                               broker=self.broker, sender=f"mqtt:{conn}")
        except Exception:
            log.exception("sends of MQTT connection %d failed inside mqguard; refused", conn)
            plane.verdicts(batch, [(_REJECT, 0, None, None, [], "mqguard failure")] *
                           len(messages))
            return
        v5 = connection.level == 5
        verdicts: list[tuple[int, int, str | None, int | None, list[tuple[str, str]],
                             str | None]] = []
        for mqtt, result in zip(messages, decision.results, strict=False):
            forward = result.forward
            if forward is None:
                action = _REJECT if result.rejected else _DROP
                self.metrics.message("send", "rejected" if result.rejected else "dropped")
                verdicts.append((action, 0, None, None, [], result.reason or None))
                continue
            token = next(self._tokens)
            connection.sends[token] = result
            topic = address_to_topic(forward.address) if result.moved else None
            expiry = self._send_expiry(mqtt, forward.expiration) if v5 else None
            user = user_properties(forward, mqtt.user) if v5 else []
            self.metrics.message("send", "moved" if result.moved else "forwarded")
            verdicts.append((_FORWARD, token, topic, expiry, user, None))
        plane.verdicts(batch, verdicts)

    @staticmethod
    def _send_expiry(mqtt: MqttMessage, expiration: int) -> int | None:
        """The Message Expiry Interval the broker sees. A retained message keeps one (the
        broker drops an expired retained message itself; the guard would otherwise move it
        again for every new subscriber); any other gets none (0 removes the client's):
        its expiration travels as ``mqguard-expires`` and the guard expires it at delivery,
        to the expiry address, instead of the broker dropping it unseen."""
        if mqtt.retain:
            return expiry_interval(expiration)
        return 0 if expiration or mqtt.expiry is not None else None

    def settled(self, conn: int, outcomes: list[tuple[int, int]]) -> None:
        connection = self._connections.get(conn)
        if connection is None:
            return
        confirmed: list[SendResult] = []
        for token, reason in outcomes:
            result = connection.sends.pop(token, None)
            if result is None:
                continue
            if reason < 0x80:
                confirmed.append(result)
                continue
            why = ("the connection ended before the broker acknowledged it" if reason == LOST
                   else f"the broker refused it (reason code 0x{reason:02x})")
            self.guard.settle_sends(failed=(result,), error=AdapterError(why))
        if confirmed:
            self.guard.settle_sends(confirmed)

    # -- deliveries --------------------------------------------------------------------

    def deliveries(self, conn: int, batch: int, messages: list[MqttMessage]) -> None:
        connection = self._connections.get(conn)
        plane = self._plane()
        if connection is None or connection.gone:
            plane.verdicts(batch, [(_WITHHOLD, 0, None, None, [], None)] * len(messages))
            return
        deliveries = [Delivery(delivery_message(mqtt), connection.client_id,
                               DeliveryToken(mqtt.packet_id, mqtt.qos), redelivered=mqtt.dup,
                               raw_headers=dict(mqtt.user))
                      for mqtt in messages]
        for mqtt, delivery in zip(messages, deliveries, strict=True):
            if mqtt.retain:
                # A retained message is handed out again on every new subscription by
                # design: not a duplicate delivery for the consumer audit.
                delivery.message.producer_id = delivery.message.sequence = None
        opened = self.guard.open_deliveries(connection.leg, deliveries,
                                            [connection.client_id] * len(deliveries))
        verdicts: list[tuple[int, int, str | None, int | None, list[tuple[str, str]],
                             str | None]] = []
        finished: list[tuple[Delivery, HookContext, BaseException | None]] = []
        for mqtt, delivery, ctx in zip(messages, deliveries, opened, strict=True):
            if ctx is None:
                self.metrics.message("deliver", "withheld")
                verdicts.append((_WITHHOLD, 0, None, None, [], None))
                continue
            self.metrics.message("deliver", "forwarded")
            # The remaining time, as the subscriber's Message Expiry Interval.
            expiry = (expiry_interval(delivery.message.expiration)
                      if connection.level == 5 else None)
            verdicts.append((_FORWARD, 0, None, expiry, [], None))
            if mqtt.qos == 0:
                finished.append((delivery, ctx, None))
            else:
                connection.inflight[mqtt.packet_id] = (delivery, ctx)
        plane.verdicts(batch, verdicts)
        if finished:
            self.guard.finish_deliveries(connection.leg, finished)

    def acked(self, conn: int, packet_ids: list[int]) -> None:
        connection = self._connections.get(conn)
        if connection is None:
            return
        items: list[tuple[Delivery, HookContext, BaseException | None]] = []
        for packet_id in packet_ids:
            entry = connection.inflight.pop(packet_id, None)
            if entry is None:
                continue
            delivery, ctx = entry
            token = delivery.ack_token
            if isinstance(token, DeliveryToken):
                token.acked = True
            items.append((delivery, ctx, None))
        if items:
            self.guard.finish_deliveries(connection.leg, items)

    def published(self, token: int, reason: int) -> None:
        self.publications.resolve(token, reason)

    def close(self) -> None:
        """After the plane stopped: connections it ended without a word are closed here
        (their unconfirmed sends fail, their open deliveries count as failed)."""
        for conn in list(self._connections):
            self.closed(conn, "sidecar stopped")
        self.jobs.stop(5.0)
