"""Doctor checks of a STOMP broker: it answers, which broker and version it is (the
CONNECTED ``server`` header), then the per-broker checks (ActiveMQ probes and
``activemq.xml``; RabbitMQ's management API or ``rabbitmqctl``)."""

from __future__ import annotations

from mqguard.config import MqguardConfig
from mqguard.doctor.broker_activemq import activemq_config_checks, probe_activemq
from mqguard.doctor.broker_rabbitmq import check_rabbitmq
from mqguard.doctor.clock import Skew
from mqguard.doctor.model import Check, Status
from mqguard.errors import MqguardError
from mqguard.redact import redact_text, redact_url
from mqguard.registry import open_adapter

__all__ = ["TESTED_VERSIONS", "check_stomp_broker"]

#: Broker versions mqguard's suite runs against (others work if they behave the same).
TESTED_VERSIONS = {"activemq": "5.17", "rabbitmq": "3.10", "artemis": "2.40"}
_TIMEOUT = 5.0


def _version_check(broker: str, server: str, where: str) -> Check:
    version = server.partition("/")[2].split(" ")[0]
    data = {"kind": broker, "server": server, "version": version}
    if broker == "unknown":
        return Check("broker", "kind", Status.WARNING,
                     f"{where} answers as {server or 'an unnamed STOMP server'}: an unknown "
                     "broker gets only what STOMP 1.2 guarantees (no selectors, browse, "
                     "delayed delivery or native TTL)",
                     fix="use ActiveMQ, RabbitMQ or Artemis, or accept the reduced "
                         "capabilities (docs/brokers.md)", data=data)
    tested = TESTED_VERSIONS.get(broker, "")
    note = "" if version.startswith(tested) else f" (mqguard is tested on {tested}.x)"
    return Check("broker", "kind", Status.OK, f"{where}: {broker} {version}{note}", data=data)


def check_stomp_broker(url: str, config: MqguardConfig | None, *, broker_config: str | None,
                       management_url: str | None, rabbitmqctl: str | None = None
                       ) -> tuple[list[Check], Skew | None]:
    """Every check of the STOMP broker at ``url``, and its clock skew when measured."""
    where = redact_url(url)
    try:
        adapter = open_adapter(url, connect_timeout=_TIMEOUT, receipt_timeout=_TIMEOUT,
                               reconnect_attempts=0, heartbeats=(0, 0), persistent=False)
    except MqguardError as exc:
        return [Check("broker", "reachable", Status.ERROR,
                      f"{where}: {redact_text(str(exc), url)}",
                      fix="correct --url (stomp://host:61613)")], None
    try:
        adapter.connect()
    except MqguardError as exc:
        adapter.close()
        return [Check("broker", "reachable", Status.ERROR,
                      f"{where}: {redact_text(str(exc), url)}",
                      fix="start the broker or correct --url (host, port, credentials, "
                          "vhost)")], None
    try:
        server = str(getattr(adapter, "server", "") or "")
        broker = str(getattr(adapter, "broker", "unknown"))
        checks = [_version_check(broker, server, where)]
        skew: Skew | None = None
        if broker == "activemq":
            try:
                probes, skew = probe_activemq(adapter, config)
            except MqguardError as exc:
                probes = [Check("broker", "probe", Status.ERROR,
                                f"probe on {where} failed: {redact_text(str(exc), url)}",
                                fix="check the broker log; the probe needs to send to and "
                                    "consume from the queue mqguard.doctor.probe")]
            checks += probes
            checks += activemq_config_checks(broker_config)
        elif broker == "rabbitmq":
            facts, skew = check_rabbitmq(url, management_url=management_url,
                                         rabbitmqctl=rabbitmqctl)
            checks += facts
        if broker_config is not None and broker != "activemq":
            checks.append(Check("broker", "broker-config", Status.SKIPPED,
                                f"--broker-config is read for ActiveMQ (activemq.xml) and "
                                f"Mosquitto (mosquitto.conf), not for {broker}"))
        return checks, skew
    finally:
        adapter.close()
