"""Broker logs: the line parser on fixed sample lines (as the local brokers write them),
and the two broker-log checks on planted events (Spark)."""

from __future__ import annotations

import gzip
import socket
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.synthetic import T0, Cluster

from mqguard.audit.broker_logs import (
    MAX_LINE_BYTES,
    BrokerLog,
    detect_kind,
    expand_broker_logs,
    parse_file,
    parse_line,
)
from mqguard.audit.cross_checks import CrossInputs
from mqguard.audit.events import AuditInputError
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.summary import read_findings
from mqguard.config import parse_config
from mqguard.events import EventType
from mqguard.testing.waiting import wait_for

# Copied from logs the local servers wrote (mqguard/servers/*.py), ids and ports as they were.
ACTIVEMQ = [
    "2026-11-21 17:53:28,748 | INFO  | Apache ActiveMQ 5.17.2 (mqguard, "
    "ID:vm-38133-1795283608266-0:1) is starting | org.apache.activemq.broker.BrokerService "
    "| main",
    "2026-11-21 17:53:29,101 | INFO  | Apache ActiveMQ 5.17.2 (mqguard, "
    "ID:vm-38133-1795283608266-0:1) started | org.apache.activemq.broker.BrokerService | main",
    "2026-11-21 17:54:02,330 | WARN  | Transport Connection to: tcp://127.0.0.1:51234 failed: "
    "java.io.IOException: Broken pipe | org.apache.activemq.broker.TransportConnection.Transport "
    "| ActiveMQ Transport: tcp:///127.0.0.1:51234@61616",
    "java.io.IOException: Broken pipe",
    "\tat java.base/sun.nio.ch.FileDispatcherImpl.write0(Native Method)",
    "2026-11-21 17:55:00,000 | INFO  | Apache ActiveMQ 5.17.2 (mqguard, "
    "ID:vm-38133-1795283608266-0:1) is shutting down | org.apache.activemq.broker.BrokerService "
    "| ActiveMQ ShutdownHook",
]
# The logging broker plugin's lines (not enabled on the local broker; text from its source).
ACTIVEMQ_PLUGIN = [
    "2026-11-21 17:54:10,001 | INFO  | Sending to DLQ: ActiveMQTextMessage {commandId = 5, "
    "responseRequired = true, messageId = ID:vm-1-1:1:1:1:7, originalDestination = null, "
    "destination = queue://orders, transactionId = null} | "
    "org.apache.activemq.broker.util.LoggingBrokerPlugin | ActiveMQ VMTransport: vm://x#1",
    "2026-11-21 17:54:11,002 | INFO  | Message has expired: ActiveMQTextMessage {commandId = 9, "
    "messageId = ID:vm-1-1:1:1:1:8, destination = queue://orders} | "
    "org.apache.activemq.broker.util.LoggingBrokerPlugin | ActiveMQ Broker[mqguard] Scheduler",
    "2026-11-21 17:54:12,003 | INFO  | Removing Connection: ConnectionInfo {commandId = 1, "
    "connectionId = ID:vm-1-1:3, clientId = c1, clientIp = tcp://127.0.0.1:40000, userName = "
    "null} | org.apache.activemq.broker.util.LoggingBrokerPlugin | ActiveMQ Transport",
]
RABBITMQ = [
    "2026-11-21 15:05:53.236261+00:00 [info] <0.223.0> Server startup complete; 3 plugins "
    "started.",
    "2026-11-21 15:06:01.100000+00:00 [info] <0.1055.0> accepting STOMP connection <0.1055.0> "
    "(127.0.0.1:40506 -> 127.0.0.1:61613)",
    "2026-11-21 15:06:02.200000+00:00 [info] <0.1055.0> closing STOMP connection <0.1055.0> "
    "(127.0.0.1:40506 -> 127.0.0.1:61613)",
    "2026-11-21 15:06:03.300000+00:00 [error] <0.1085.0> STOMP error frame sent:",
    "2026-11-21 15:06:09.000000+00:00 [info] <0.223.0> RabbitMQ is asked to stop...",
]
MOSQUITTO = [
    "2026-11-21T16:19:46: mosquitto version 2.0.11 running",
    "2026-11-21T16:19:47: New connection from 127.0.0.1:41109 on port 32957.",
    "2026-11-21T16:19:47: New client connected from 127.0.0.1:41109 as c-raw0 (p5, c0, k60).",
    "2026-11-21T16:19:48: c-raw0 1 p/raw0",
    "2026-11-21T16:19:49: Client c-raw0 disconnected.",
    "2026-11-21T16:19:50: Client c-crash closed its connection.",
    "2026-11-21T16:19:51: Socket error on client c-sock, disconnecting.",
    "2026-11-21T16:19:52: Client c-slow has exceeded timeout, disconnecting.",
    "2026-11-21T16:19:53: mosquitto version 2.0.11 terminating",
]


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def records(path: Path, kind: str | None = None) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    rows = list(parse_file(BrokerLog(str(path), kind)))
    stats = rows[-1]
    assert stats[0] == "stats"
    keys = ("file", "broker", "lines", "parsed", "records", "unknown", "continuation",
            "too_long", "first_ts", "last_ts")
    return [r[1:] for r in rows if r[0] == "rec"], dict(zip(keys, stats[1:], strict=True))


def test_detect_kind_by_line_pattern() -> None:
    assert detect_kind(ACTIVEMQ) == "activemq"
    assert detect_kind(RABBITMQ) == "rabbitmq"
    assert detect_kind(MOSQUITTO) == "mosquitto"
    assert detect_kind(["hello", "world"]) is None


def test_activemq_lines() -> None:
    ts, kind, fields = parse_line(ACTIVEMQ[2], "activemq")  # type: ignore[misc]
    assert (ts, kind, fields["connection"]) == (ms("2026-11-21T17:54:02.330"), "lost",
                                                 "tcp://127.0.0.1:51234")
    assert parse_line(ACTIVEMQ[1], "activemq")[1] == "broker_start"  # type: ignore[index]
    assert parse_line(ACTIVEMQ[5], "activemq")[1] == "broker_stop"  # type: ignore[index]
    assert parse_line(ACTIVEMQ[0], "activemq")[1] == ""  # type: ignore[index]
    assert parse_line(ACTIVEMQ[3], "activemq") is None
    dlq = parse_line(ACTIVEMQ_PLUGIN[0], "activemq")
    assert dlq is not None and dlq[1] == "dead_letter"
    assert (dlq[2]["id"], dlq[2]["dest"]) == ("ID:vm-1-1:1:1:1:7", "queue://orders")
    expired = parse_line(ACTIVEMQ_PLUGIN[1], "activemq")
    assert expired is not None and expired[1] == "expired"
    assert expired[2]["id"] == "ID:vm-1-1:1:1:1:8"
    closed = parse_line(ACTIVEMQ_PLUGIN[2], "activemq")
    assert closed is not None and closed[1:] == (
        "close", {"connection": "tcp://127.0.0.1:40000", "id": None, "dest": None})


def test_rabbitmq_and_mosquitto_lines() -> None:
    kinds = [(parse_line(line, "rabbitmq") or (None, None))[1] for line in RABBITMQ]
    assert kinds == ["broker_start", "open", "close", "", "broker_stop"]
    assert parse_line(RABBITMQ[1], "rabbitmq")[0] == ms("2026-11-21T15:06:01.100")  # type: ignore[index]
    kinds = [(parse_line(line, "mosquitto") or (None, None))[1] for line in MOSQUITTO]
    assert kinds == ["broker_start", "", "open", "", "close", "lost", "lost", "lost",
                     "broker_stop"]
    lost = [parse_line(line, "mosquitto")[2]["connection"]  # type: ignore[index]
            for line in MOSQUITTO[5:8]]
    assert lost == ["c-crash", "c-sock", "c-slow"]
    assert parse_line("1700000000: Client x disconnected.", "mosquitto")[:2] == (  # type: ignore[index]
        1_700_000_000_000, "close")


def test_file_stats_unknown_continuation_long_lines_and_gzip(tmp_path: Path) -> None:
    text = "\n".join([*ACTIVEMQ, "garbage that no broker writes", "x" * (MAX_LINE_BYTES + 10),
                      ACTIVEMQ[2]]) + "\n"
    plain = tmp_path / "activemq.log"
    plain.write_text(text)
    packed = tmp_path / "activemq.log.1.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        rows, stats = records(path)
        assert stats["broker"] == "activemq"
        assert [r[4] for r in rows] == ["broker_start", "lost", "broker_stop", "lost"]
        assert (stats["lines"], stats["parsed"], stats["unknown"], stats["continuation"],
                stats["too_long"]) == (9, 5, 1, 2, 1)
        assert stats["first_ts"] == ms("2026-11-21T17:53:28.748")


def test_unknown_file_is_counted_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "odd.log"
    path.write_text("one\ntwo\n")
    rows, stats = records(path)
    assert rows == [] and stats["broker"] is None and stats["unknown"] == 2
    # A given kind wins over detection: every line is then unknown to that kind.
    rows, stats = records(tmp_path / "odd.log", "mosquitto")
    assert stats["broker"] == "mosquitto" and stats["unknown"] == 2


def test_expand_broker_logs(tmp_path: Path) -> None:
    for name in ("a.log", "b.log.gz"):
        (tmp_path / name).write_text("")
    found = expand_broker_logs([f"mosquitto:{tmp_path}/*.log*", str(tmp_path / "a.log")])
    assert [(Path(b.path).name, b.kind) for b in found] == [
        ("a.log", "mosquitto"), ("b.log.gz", "mosquitto"), ("a.log", None)]
    with pytest.raises(AuditInputError):
        expand_broker_logs([str(tmp_path / "missing.log")])
    with pytest.raises(AuditInputError):
        expand_broker_logs([f"activemq:{tmp_path}/*.nothing"])


# -- real brokers: what their logs say when a client leaves in order or vanishes --------------

def _mqtt_connect(port: int, client_id: str) -> socket.socket:
    """A raw MQTT 3.1.1 CONNECT (clean session, keep-alive 60 s)."""
    ident = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack("!H", len(ident)) + ident
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(bytes([0x10, len(body)]) + body)
    assert sock.recv(4)[:1] == b"\x20"  # CONNACK
    return sock


def _vanish(sock: socket.socket) -> None:
    """Close with a TCP reset and no DISCONNECT: what a killed client looks like."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.mosquitto
def test_real_mosquitto_log_orderly_and_lost_connections(mqguard_mosquitto_server: Any,
                                                         mqguard_unique_name: str) -> None:
    port = int(mqguard_mosquitto_server.urls["mqtt"].rsplit(":", 1)[1])
    orderly, lost = f"{mqguard_unique_name}-orderly"[-60:], f"{mqguard_unique_name}-lost"[-60:]
    sock = _mqtt_connect(port, orderly)
    sock.sendall(b"\xe0\x00")  # DISCONNECT
    sock.close()
    _vanish(_mqtt_connect(port, lost))
    log = Path(mqguard_mosquitto_server.log_path)

    def ended() -> list[tuple[Any, ...]]:
        rows, _ = records(log, "mosquitto")
        return [r for r in rows if r[5] in (orderly, lost) and r[4] in ("close", "lost")]

    wait_for(lambda: len(ended()) == 2, 10, "both connection ends in mosquitto.log")
    assert sorted((r[5], r[4]) for r in ended()) == sorted([(orderly, "close"), (lost, "lost")])
    _, stats = records(log)  # detected, and every line of the real log understood
    assert stats["broker"] == "mosquitto" and stats["unknown"] == 0 and stats["records"] > 0


@pytest.mark.rabbitmq
def test_real_rabbitmq_log_stomp_and_mqtt_connections(mqguard_rabbitmq_server: Any) -> None:
    stomp_port = int(mqguard_rabbitmq_server.urls["stomp"].rsplit(":", 1)[1])
    mqtt_port = int(mqguard_rabbitmq_server.urls["mqtt"].rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", stomp_port), timeout=5)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00")
    assert sock.recv(9) == b"CONNECTED"
    stomp_local = f"127.0.0.1:{sock.getsockname()[1]} -> "
    _vanish(sock)
    sock = _mqtt_connect(mqtt_port, "audit-log-test")
    mqtt_local = f"127.0.0.1:{sock.getsockname()[1]} -> "
    _vanish(sock)
    log = Path(mqguard_rabbitmq_server.log_path)

    def ends() -> dict[str, str]:
        rows, _ = records(log, "rabbitmq")
        return {local: r[4] for r in rows for local in (stomp_local, mqtt_local)
                if r[5] and r[5].startswith(local) and r[4] in ("close", "lost")}

    wait_for(lambda: len(ends()) == 2, 10, "both connection ends in the RabbitMQ log")
    # RabbitMQ logs a vanished STOMP client like an orderly one; MQTT says the peer left.
    assert ends() == {stomp_local: "close", mqtt_local: "lost"}
    _, stats = records(log)
    assert stats["broker"] == "rabbitmq" and stats["unknown"] == 0


# -- the checks (Spark) ------------------------------------------------------------------------

def _stamp(epoch_ms: int, kind: str) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    if kind == "mosquitto":
        return moment.strftime("%Y-%m-%dT%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S,") + f"{epoch_ms % 1000:03d}"


@pytest.mark.spark
def test_planted_broker_log_anomalies_are_found(spark: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path / "events", monkeypatch, flush_each=True)
    # A consumer crash explained by the broker's log: redelivered after a connection loss.
    crash = c.send("crash-explained")
    c.delivered(crash, count=1)
    loss_at = c.clock.advance(1000)
    c.clock.advance(1000)
    c.handled(crash, node="consumer-2", count=2)
    # Failures that were nacked need no explanation.
    retried = c.send("retried")
    c.failed(retried, count=1)
    c.handled(retried, count=2)
    # Ten minutes later, with no connection end anywhere near: unexplained.
    c.clock.advance(600_000)
    ghost = c.send("ghost-redelivery")
    c.delivered(ghost, count=1)
    c.clock.advance(3000)
    c.handled(ghost, node="consumer-2", count=2)
    # Broker dead letters: one mqguard also dead-lettered, one it acknowledged.
    agreed = c.message("dlq-agreed")
    agreed.broker_message_id = "ID:b-1:1:1:1:1"
    c.emit("producer", EventType.SENT, agreed)
    c.delivered(agreed, count=1)
    c.emit("consumer-1", EventType.NACKED, agreed, queue="orders", requeue=False)
    handled = c.message("dlq-disagrees")
    handled.broker_message_id = "ID:b-1:1:1:1:2"
    c.emit("producer", EventType.SENT, handled)
    c.handled(handled)
    end = c.clock.advance(1000)
    c.close()

    mosquitto = tmp_path / "mosquitto.log"
    mosquitto.write_text("\n".join([
        f"{_stamp(T0, 'mosquitto')}: mosquitto version 2.0.11 running",
        f"{_stamp(loss_at, 'mosquitto')}: Client consumer-1 closed its connection.",
        "a line that is no Mosquitto line",
        f"{_stamp(end + 5000, 'mosquitto')}: mosquitto version 2.0.11 terminating",
    ]) + "\n")
    activemq = tmp_path / "activemq.log"
    dlq = ("Sending to DLQ: ActiveMQTextMessage {{commandId = 5, messageId = {}, "
           "destination = queue://orders}}")
    activemq.write_text("\n".join(
        f"{_stamp(end, 'activemq')} | INFO  | {dlq.format(i)} | "
        "org.apache.activemq.broker.util.LoggingBrokerPlugin | x"
        for i in ("ID:b-1:1:1:1:1", "ID:b-1:1:1:1:2")) + "\n")

    result = run_audit(spark, AuditOptions(
        [str(tmp_path / "events")], out=str(tmp_path / "out"),
        config=parse_config({}, "<test>"), watermark=end,
        cross=CrossInputs(broker_logs=(f"mosquitto:{mosquitto}", str(activemq)),
                          tolerance_ms=1500)))
    findings = read_findings(spark, str(tmp_path / "out" / "findings"))
    found: dict[str, set[str]] = {}
    for row in findings.filter("class in ('unexplained_redelivery', "
                               "'broker_dead_letter_unrecorded')").collect():
        found.setdefault(row["class"], set()).add(row["message_id"])
    assert found == {"unexplained_redelivery": {"ghost-redelivery"},
                     "broker_dead_letter_unrecorded": {"dlq-disagrees"}}
    logs = result.summary["broker_logs"]
    assert logs["unknown_lines"] == 1
    assert logs["records"]["dead_letter"] == 2 and logs["records"]["lost"] == 1
    assert logs["redeliveries_judged"] == 2
    assert result.summary["classes"]["unexplained_redelivery"]["count"] == 1
    assert result.exit_code == 1
