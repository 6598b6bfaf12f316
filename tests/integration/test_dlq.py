"""``mqguard dlq`` on real brokers: ``list`` / ``show`` JSON, ``purge`` with filters. The
retry (SIGKILLed halfway, then run again, then audited) is in tests/audit/test_dlq_audit.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from mqguard_tests.dlq import BROKERS, Scenario, broker_url, write_toml
from mqguard_tests.mqtt_raw import RawMqtt
from mqguard_tests.mqtt_sidecar import running_mqtt_sidecar

from mqguard.adapter import Adapter
from mqguard.cli.dlq import _when, dlq
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.dlq import attach, open_dlq_adapter
from mqguard.errors import Nack
from mqguard.message import ORIG_ADDRESS_HEADER, SENT_AT_HEADER, Message, now_ms
from mqguard.pipeline import Guard
from mqguard.registry import open_adapter
from mqguard.servers import ServerHandle
from mqguard.servers.ports import free_ports
from mqguard.testing.waiting import wait_for


@pytest.mark.parametrize("kind", BROKERS)
def test_list_show_and_filtered_purge(kind: str, request: pytest.FixtureRequest,
                                      tmp_path: Path, mqguard_unique_name: str) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    bodies = scenario.dead_letter(6, binary=True)

    listing = json.loads(scenario.run("list", "--json"))
    (summary,) = [a for a in listing["addresses"] if a["address"] == scenario.dla]
    assert summary["messages"] == 6
    assert summary["by_original"] == {scenario.name: 6}
    assert list(summary["by_reason"].values()) == [6]
    assert "poison" in next(iter(summary["by_reason"]))
    assert summary["oldest"] <= summary["newest"]

    shown = json.loads(scenario.run("show", scenario.dla, "--limit", "3", "--json"))
    assert len(shown["messages"]) == 3
    for row in shown["messages"]:
        assert row["original_address"] == scenario.name
        assert row["original_queue"] == scenario.name
        assert row["delivery_count"] == 1
        assert row["moved_at"] > 0
        body = row["body"]
        assert (body["text"].encode() in bodies if "text" in body
                else base64.b64decode(body["base64"]) == bodies[-1][:256])
        assert row["headers"][ORIG_ADDRESS_HEADER] == scenario.name
    # The binary one: bounded, base64, byte for byte (the order of a read is the broker's).
    every = json.loads(scenario.run("show", scenario.dla, "--preview-bytes", "100", "--json"))
    (binary,) = [r["body"] for r in every["messages"] if "base64" in r["body"]]
    assert (binary["size"], binary["truncated"]) == (1024, True)
    assert base64.b64decode(binary["base64"]) == bodies[-1][:100]
    assert {r["body"].get("text", "").encode() for r in every["messages"]} >= set(bodies[:5])
    # Reading consumed nothing.
    assert len(scenario.dla_contents()) == 6

    # Without a configured dead-letter address only ActiveMQ has one of its own to list.
    empty = write_toml(tmp_path / "empty.toml", {"mqguard": {"node-id": "empty"}})
    result = CliRunner().invoke(dlq, ["list", "--url", scenario.url, "-c", str(empty),
                                      "--json"])
    assert result.exit_code == 0, result.output
    listed = [a["address"] for a in json.loads(result.stdout)["addresses"]]
    assert listed == (["ActiveMQ.DLQ"] if kind == "activemq" else [])

    # purge connects, then asks; "n" deletes nothing (the purges below account for all 6).
    result = scenario.cli("purge", scenario.dla, stdin="n\n")
    assert result.exit_code == 1 and f"Delete every message in {scenario.dla}" in result.output

    # Filters: nothing is older than a day; another original address matches nothing.
    out = json.loads(scenario.run("purge", scenario.dla, "--older-than", "1d", "--yes",
                                  "--json"))
    assert out["purged"] == 0 and out["skipped"] == 6
    out = json.loads(scenario.run("purge", scenario.dla, "--original", "elsewhere", "--yes",
                                  "--json"))
    assert out["purged"] == 0
    victim = shown["messages"][0]["message_id"]
    out = json.loads(scenario.run("purge", scenario.dla, "--id", victim, "--yes", "--json"))
    assert out["purged"] == 1
    time.sleep(0.2)
    left = scenario.dla_contents()
    assert len(left) == 5 and victim not in {x.message_id for x in left}
    out = json.loads(scenario.run("purge", scenario.dla, "--original", scenario.name,
                                  "--older-than", "0s", "--yes", "--json"))
    assert out["purged"] == 5
    assert scenario.dla_contents() == []
    kinds = [e["type"] for e in scenario.read_events()]
    assert kinds.count("dlq_purged") == 6
    assert "dlq_inspected" in kinds


def test_purge_refuses_a_bad_duration_and_an_unreachable_broker_before_asking(
        tmp_path: Path) -> None:
    (port,) = free_ports(1)
    scenario = Scenario("activemq", f"stomp://alice:s3cr3t@127.0.0.1:{port}", "q", tmp_path)
    result = scenario.cli("purge", "q.DLA", "--older-than", "10 parsecs")
    assert result.exit_code == 2 and "--older-than" in result.output and "7d" in result.output
    result = scenario.cli("purge", "q.DLA", stdin="y\n")
    assert result.exit_code == 1 and "cannot connect" in result.output
    assert "Delete" not in result.output and "s3cr3t" not in result.output


@pytest.mark.parametrize("kind", BROKERS)
def test_retry_filters_dry_run_and_to(kind: str, request: pytest.FixtureRequest,
                                      tmp_path: Path, mqguard_unique_name: str) -> None:
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    scenario.dead_letter(4)
    if kind == "rabbitmq":
        # An unreachable store stops the retry before it takes anything (a transaction
        # would otherwise commit a batch before its bridge ids fail to be recorded).
        (port,) = free_ports(1)
        config = scenario.config("no-store")
        config["mqguard"]["store"] = f"redis://:r3dis-pw@127.0.0.1:{port}/0"
        bad = write_toml(tmp_path / "no-store.toml", config)
        result = CliRunner().invoke(dlq, ["retry", scenario.dla, "--url", scenario.url,
                                          "-c", str(bad), "--idle-ms", "200"])
        assert result.exit_code == 1 and "ping failed" in result.output, result.output
        assert "r3dis-pw" not in result.output
        assert len(scenario.dla_contents()) == 4
    out = json.loads(scenario.run("retry", scenario.dla, "--dry-run", "--json"))
    assert (out["retried"], out["dry_run"], out["by_target"]) == (4, True, {scenario.name: 4})
    assert len(scenario.dla_contents()) == 4  # nothing moved
    assert "dlq_retried" not in {e["type"] for e in scenario.read_events()}

    out = json.loads(scenario.run("retry", scenario.dla, "--original", "elsewhere", "--json"))
    assert (out["retried"], out["skipped"]) == (0, 4)

    letters = scenario.dla_contents()
    chosen = letters[0].original_message_id
    other = f"{scenario.name}.fixed"
    if kind == "mosquitto":  # a topic keeps nothing without a subscribed session
        holder = scenario.adapter("holder")
        holder.connect()
        holder.subscribe(other, lambda delivery: None)
        holder.close()
    out = json.loads(scenario.run("retry", scenario.dla, "--id", str(chosen), "--to", other,
                                  "--json"))
    assert (out["retried"], out["by_target"]) == (1, {other: 1})
    left = scenario.dla_contents()
    assert len(left) == 3 and chosen not in {x.original_message_id for x in left}
    received = []
    reader = scenario.adapter("holder")
    reader.connect()
    try:
        reader.subscribe(other, received.append)
        wait_for(lambda: received, 10, "the copy at --to")
    finally:
        reader.close()
    (copy,) = [d.message for d in received]
    assert copy.headers[ORIG_ADDRESS_HEADER] == scenario.dla
    assert copy.message_id.endswith("~r") and copy.expiration == 0
    assert copy.body in {f"m-{i}".encode() for i in range(4)}

    if kind == "activemq":
        # As an operator sees it on a terminal: a progress bar on standard error while it
        # runs (paced, so that it draws), then the summary.
        code, stdout, terminal = _on_a_terminal(
            "dlq", "retry", scenario.dla, "--limit", "2", "--rate", "4", "--batch", "1",
            "--url", scenario.url, "-c", str(scenario.toml("dlq")), "--idle-ms", "200")
        assert code == 0, stdout + terminal
        assert "retrying" in terminal and "0/2" in terminal and "2/2" in terminal
        assert "mqguard dlq retry" in stdout and f"2 -> {scenario.name}" in stdout
    else:
        out = json.loads(scenario.run("retry", scenario.dla, "--limit", "2", "--json"))
        assert out["retried"] == 2
    assert len(scenario.dla_contents()) == 1


def _shown_with_times(scenario: Scenario, count: int) -> list[dict[str, Any]]:
    """``dlq show``'s rows of the ``count`` dead letters, after checking that the text
    output gives the same send and move times."""
    rows = json.loads(scenario.run("show", scenario.dla, "--json"))["messages"]
    assert len(rows) == count
    text = scenario.run("show", scenario.dla)
    for row in rows:
        assert SENT_AT_HEADER not in row["headers"]  # the guard's field, shown as sent_at
        assert (f"moved at {_when(row['moved_at'])}, original sent at "
                f"{_when(row['sent_at'])}") in text
    return rows


@pytest.mark.parametrize("kind", BROKERS)
def test_show_gives_the_original_send_time_of_mqguard_s_copies(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """The guard stamps ``mqguard-sent-at`` at the first send (the address has a
    dead-letter address), the dead-letter copy keeps it, ``show`` gives it."""
    scenario = Scenario(kind, broker_url(kind, request), mqguard_unique_name, tmp_path)
    before = now_ms()
    scenario.dead_letter(3)
    after = now_ms()
    rows = _shown_with_times(scenario, 3)
    for row in rows:
        assert before <= row["sent_at"] <= row["moved_at"] <= after
    sent = {e["message_id"]: e["ts"] for e in scenario.read_events() if e["type"] == "sent"}
    assert {row["original_message_id"] for row in rows} == set(sent)


@pytest.mark.parametrize("kind", [pytest.param("activemq", marks=pytest.mark.activemq),
                                  pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_a_sidecar_send_s_dead_letter_shows_its_send_time(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path,
        mqguard_unique_name: str) -> None:
    """A stock STOMP client through the sidecar: its SEND gets the send time, the
    sidecar's move of the NACKed message carries it."""
    import stomp  # type: ignore[import-untyped]

    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    url = broker_url(kind, request)
    scenario = Scenario(kind, url, mqguard_unique_name, tmp_path)
    sidecar = Sidecar(parse_config(scenario.config("sidecar")), parse_upstream(url))
    frames: list[Any] = []
    with SidecarThread(sidecar) as running:
        conn = stomp.Connection12([("127.0.0.1", running.port)], vhost="/")
        conn.set_listener("c", type("L", (stomp.ConnectionListener,), {
            "on_message": lambda self, frame: frames.append(frame)})())
        conn.connect("guest", "guest", wait=True)
        try:
            before = now_ms()
            conn.send(f"/queue/{scenario.name}", "poison", receipt="sent")
            conn.subscribe(f"/queue/{scenario.name}", id="s", ack="client-individual")
            wait_for(lambda: frames, 10, "the message")
            # The client sees the stamp as the message's own header (no guard beyond it).
            assert before <= int(frames[0].headers[SENT_AT_HEADER]) <= now_ms()
            conn.nack(frames[0].headers["ack"])
            wait_for(lambda: scenario.dla_contents(), 10, "the dead letter")
            after = now_ms()
        finally:
            conn.disconnect()
    (row,) = _shown_with_times(scenario, 1)
    assert row["sent_at"] == int(frames[0].headers[SENT_AT_HEADER])
    assert before <= row["sent_at"] <= row["moved_at"] <= after


@pytest.mark.activemq
def test_activemq_own_dead_letters_keep_their_send_time_and_go_back_to_their_queue(
        mqguard_activemq_server: ServerHandle, tmp_path: Path, mqguard_unique_name: str
        ) -> None:
    import stomp  # type: ignore[import-untyped]

    url = mqguard_activemq_server.urls["stomp"]
    scenario = Scenario("activemq", url, mqguard_unique_name, tmp_path)
    frames: list[Any] = []
    conn = stomp.Connection12([("127.0.0.1", urlsplit(url).port)], vhost="/")
    conn.set_listener("c", type("L", (stomp.ConnectionListener,), {
        "on_message": lambda self, frame: frames.append(frame)})())
    conn.connect(wait=True)
    try:
        # Sent past mqguard and NACKed: ActiveMQ dead-letters it itself (a poison ack).
        before = int(time.time() * 1000)
        conn.send(f"/queue/{scenario.name}", "own", headers={"persistent": "true"},
                  receipt="sent")
        conn.subscribe(f"/queue/{scenario.name}", id="s", ack="client-individual")
        wait_for(lambda: frames, 10, "the message")
        after = int(time.time() * 1000)
        conn.nack(frames[0].headers["ack"])
        conn.unsubscribe(id="s")
        frames.clear()

        def ours() -> list[dict[str, Any]]:
            shown = json.loads(scenario.run("show", "ActiveMQ.DLQ", "--limit", "10000",
                                            "--json"))
            return [r for r in shown["messages"] if r["original_address"] == scenario.name]

        wait_for(ours, 10, "the dead letter in ActiveMQ.DLQ")
        (row,) = ours()
        assert row["reason"] == "dead-lettered by ActiveMQ" and row["moved_at"] is None
        assert before - 5 <= row["sent_at"] <= after + 5  # ActiveMQ kept the send time

        out = json.loads(scenario.run("retry", "ActiveMQ.DLQ", "--original", scenario.name,
                                      "--json"))
        assert (out["retried"], out["by_target"]) == (1, {scenario.name: 1})
        conn.subscribe(f"/queue/{scenario.name}", id="again", ack="client-individual")
        wait_for(lambda: frames, 10, "the retried copy")
        assert frames[0].body == "own"
        assert frames[0].headers[ORIG_ADDRESS_HEADER] == "ActiveMQ.DLQ"
        conn.ack(frames[0].headers["ack"])
        assert ours() == []
    finally:
        conn.disconnect()


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """``mqguard ARGS`` with standard error on a pseudo-terminal: exit code, standard
    output, and what the terminal got."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mqguard.cli", *args],
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    stdout, _ = proc.communicate(timeout=60)
    return proc.returncode, stdout, seen.decode(errors="replace")


@pytest.mark.mosquitto
def test_mqtt311_dead_letters_are_read_from_their_topic_and_retried_to_it(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path, mqguard_unique_name: str
        ) -> None:
    """An MQTT 3.1.1 subscriber through the MQTT sidecar fails poison messages until they
    are dead-lettered to ``<dla topic>/<count>/<original topic>`` (no properties): ``dlq
    list`` counts them, ``show`` gives their original address and delivery count, ``retry``
    sends each back to its original topic, where the fixed subscriber gets each once, and
    the dead-letter address is empty after. The sidecar's metrics name the address."""
    scenario = Scenario("mosquitto", mqguard_mosquitto_server.urls["mqtt"],
                        mqguard_unique_name, tmp_path)
    topic = scenario.name.replace(".", "/")
    dla_topic = scenario.dla.replace(".", "/")
    # The dead-letter session first: MQTT drops a publish no session subscribes to.
    attached = CliRunner().invoke(dlq, ["attach", scenario.dla, "--url", scenario.url,
                                        "-c", str(scenario.toml("dlq"))])
    assert attached.exit_code == 0 and f"{scenario.dla}: attached" in attached.stdout
    # What goes to the dead-letter topic, as published (MQTT 5: properties would show).
    spy = RawMqtt(mqguard_mosquitto_server.port("mqtt"), f"{scenario.name}-spy")
    spy.subscribe(f"{dla_topic}/#")
    settings = scenario.config("sidecar")
    settings["address-settings"][scenario.name]["max-delivery-attempts"] = 2
    bodies = [f"poison-{i}".encode() for i in range(3)]

    def count(kind: str) -> int:
        return sum(e["type"] == kind and e.get("address") == scenario.name
                   for e in scenario.read_events())

    with running_mqtt_sidecar(parse_config(settings), mqguard_mosquitto_server,
                              admin=("127.0.0.1", 0), broker="mosquitto") as running:
        def device() -> RawMqtt:
            return RawMqtt(running.port, f"{scenario.name}-device", version="3.1.1",
                           clean=False)

        sub = device()
        sub.subscribe(topic)
        pub = RawMqtt(running.port, f"{scenario.name}-p", version="3.1.1")
        for i, body in enumerate(bodies):
            pub.publish(topic, body, packet_id=i + 1)
            pub.expect("PUBACK")
        pub.disconnect()
        for attempt in (1, 2):
            got = [sub.expect("PUBLISH") for _ in bodies]
            assert sorted(p.payload for p in got) == bodies, f"attempt {attempt}"
            sub.drop()  # crashed while handling them
            wait_for(lambda n=attempt: count("handler_failed") >= n * len(bodies), 20,
                     f"the failures of attempt {attempt}")
            if attempt == 1:
                sub = device()
        wait_for(lambda: count("dead_lettered") >= len(bodies), 20, "the dead letters")
        admin = f"http://127.0.0.1:{running.sidecar.admin_port}/metrics"
        with urllib.request.urlopen(admin, timeout=5) as response:
            metrics = response.read().decode()
        # Labelled by the dead-letter address, not by each letter's long topic.
        assert f'mqguard_dla_moved_total{{address="{scenario.dla}"}} 3.0' in metrics
        assert f'address="{scenario.dla}.' not in metrics
        dead_ids = {e["message_id"] for e in scenario.read_events()
                    if e["type"] == "dead_lettered" and e.get("address") == scenario.name}


        listing = json.loads(scenario.run("list", "--json"))
        (summary,) = [a for a in listing["addresses"] if a["address"] == scenario.dla]
        assert summary["messages"] == 3
        assert summary["by_original"] == {scenario.name: 3}
        rows = json.loads(scenario.run("show", scenario.dla, "--json"))["messages"]
        assert sorted(_body(row) for row in rows) == bodies
        for row in rows:
            assert row["in_topic"] and row["headers"] == {}
            assert (row["address"], row["original_address"], row["delivery_count"]) == (
                scenario.dla, scenario.name, 2)
        # The original's id is the one the sidecar dead-lettered it under.
        assert {row["original_message_id"] for row in rows} == dead_ids
        # A dead letter's id is stable across reads: --id takes it.
        (again,) = json.loads(scenario.run("show", scenario.dla, "--json",
                                           "--limit", "1"))["messages"]
        assert again["message_id"] in {row["message_id"] for row in rows}
        dry = json.loads(scenario.run("retry", scenario.dla, "--id", again["message_id"],
                                      "--dry-run", "--json"))
        assert (dry["retried"], dry["by_target"]) == (1, {scenario.name: 1})

        # The fixed subscriber is back (its session holds the topic): the originals were
        # acknowledged upstream when they were dead-lettered, so nothing comes yet.
        sub = device()
        assert sub.collect("PUBLISH", 0.5) == []
        out = json.loads(scenario.run("retry", scenario.dla, "--json"))
        assert (out["retried"], out["no_origin"], out["by_target"]) == (
            3, 0, {scenario.name: 3})
        handled = []
        for _ in bodies:
            publish = sub.expect("PUBLISH")
            assert publish.topic == topic
            handled.append(publish.payload)
            sub.ack(publish.packet_id)
        assert sorted(handled) == bodies  # each once
        assert sub.collect("PUBLISH", 1.0) == []
        sub.disconnect()
        sub = device()
        assert sub.collect("PUBLISH", 0.5) == []  # acknowledged upstream: none comes back
        sub.disconnect()

    # Every dead letter was on its long topic, each seen once by the spy.
    seen = spy.collect("PUBLISH", 0.5)
    spy.disconnect()
    assert sorted(p.topic for p in seen) == [f"{dla_topic}/2/{topic}"] * 3
    assert not any(p.user_properties for p in seen)
    # And the dead-letter address is empty.
    listing = json.loads(scenario.run("list", "--json"))
    (summary,) = [a for a in listing["addresses"] if a["address"] == scenario.dla]
    assert summary["messages"] == 0
    assert [e["type"] for e in scenario.read_events()].count("dlq_retried") == 3


def _body(row: dict[str, Any]) -> bytes:
    body = row["body"]
    return body["text"].encode() if "text" in body else base64.b64decode(body["base64"])


@pytest.mark.mosquitto
def test_the_wrappers_dead_letter_over_mqtt311_to_the_long_topic_and_retry_from_it(
        mqguard_mosquitto_server: ServerHandle, tmp_path: Path, mqguard_unique_name: str
        ) -> None:
    """A GuardedConsumer on an MQTT 3.1.1 connection fails poison messages: the guard's
    copies go to ``<dla topic>/<count>/<original topic>`` (3.1.1 carries no properties),
    ``mqguard dlq`` reads and retries them, and the fixed consumer handles each once."""
    scenario = Scenario("mosquitto", mqguard_mosquitto_server.urls["mqtt"],
                        mqguard_unique_name, tmp_path)
    held = open_dlq_adapter(scenario.url, scenario.dla)
    held.connect()
    attach(held, scenario.dla)  # MQTT drops a publish no session subscribes to
    held.close()
    bodies = [f"w-{i}".encode() for i in range(4)]

    def consumer() -> Adapter:
        return open_adapter(scenario.url, protocol="3.1.1", broker="mosquitto",
                            client_id=f"c311-{scenario.name}"[-60:])

    def poison(message: Message) -> None:
        raise Nack("poison")

    with Guard(parse_config(scenario.config("poison"))) as guard, \
            GuardedConsumer(consumer(), scenario.name, poison, guard):
        producer = open_adapter(scenario.url, protocol="3.1.1")
        producer.connect()
        try:
            producer.send_many([Message(address=scenario.name, body=b) for b in bodies])
        finally:
            producer.close()
        wait_for(lambda: sum(e["type"] == "dead_lettered" for e in scenario.read_events())
                 >= len(bodies), 30, "the dead letters")

    listing = json.loads(scenario.run("list", "--json"))
    (summary,) = [a for a in listing["addresses"] if a["address"] == scenario.dla]
    assert (summary["messages"], summary["by_original"]) == (4, {scenario.name: 4})
    rows = json.loads(scenario.run("show", scenario.dla, "--json"))["messages"]
    assert sorted(_body(row) for row in rows) == bodies
    assert {(row["in_topic"], row["original_address"], row["delivery_count"])
            for row in rows} == {(True, scenario.name, 1)}

    handled: list[bytes] = []
    with Guard(parse_config(scenario.config("fixed"))) as guard, \
            GuardedConsumer(consumer(), scenario.name, lambda m: handled.append(m.body),
                            guard):
        out = json.loads(scenario.run("retry", scenario.dla, "--json"))
        assert (out["retried"], out["by_target"]) == (4, {scenario.name: 4})
        wait_for(lambda: len(handled) >= len(bodies), 20, "the retried messages")
        time.sleep(0.5)  # room for a copy that should not come
    assert sorted(handled) == bodies  # each once
    assert scenario.dla_contents() == []
