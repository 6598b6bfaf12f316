"""The local Artemis of the rig: starts from the CLI, speaks STOMP, detects duplicates, stops."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
from pathlib import Path

import pytest
from mqguard_tests.artemis_stomp import artemis_stomp

from mqguard.servers import ServerHandle
from mqguard.servers.handle import pid_alive

pytestmark = pytest.mark.artemis

REPO_ROOT = Path(__file__).resolve().parents[2]


def servers_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "mqguard.servers", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def test_cli_starts_artemis_with_a_config_and_stops_it(tmp_path: Path) -> None:
    config = tmp_path / "mqguard.toml"
    config.write_text('[mqguard]\nid-cache-size = 777\n\n'
                      '[address-settings."orders.#"]\nmax-delivery-attempts = 3\n')
    state = tmp_path / "artemis"
    started = servers_cli("start", "artemis", "--state-dir", str(state), "--config", str(config))
    assert started.returncode == 0, started.stderr
    handle = ServerHandle.from_json(started.stdout)
    try:
        assert handle.kind == "artemis" and handle.version == "2.40.0"
        assert set(handle.urls) == {"stomp", "mqtt", "core"}
        assert all(url.split("://")[1].startswith("127.0.0.1:") for url in handle.urls.values())
        assert handle.log_path.is_relative_to(state)
        broker_xml = (state / "instance" / "etc" / "broker.xml").read_text()
        assert '<address-setting match="orders.#">' in broker_xml
        assert "<max-delivery-attempts>3</max-delivery-attempts>" in broker_xml
        assert "<id-cache-size>777</id-cache-size>" in broker_xml
        assert "<journal-directory>" + str(state / "data") in broker_xml
        status = servers_cli("status", "--state-dir", str(state))
        assert status.returncode == 0 and json.loads(status.stdout)["running"] is True
    finally:
        stopped = servers_cli("stop", "--state-dir", str(state))
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_alive(handle.pid)
    assert servers_cli("status", "--state-dir", str(state)).returncode == 1
    assert "AMQ221002" in handle.log_path.read_text()  # Artemis's own "stopped" line


def test_config_is_refused_for_other_kinds(tmp_path: Path) -> None:
    config = tmp_path / "mqguard.toml"
    config.write_text("")
    result = servers_cli("start", "redis", "--config", str(config))
    assert result.returncode != 0
    assert "--config only applies to artemis" in result.stderr


def test_stomp_round_trip(mqguard_artemis_server: ServerHandle, mqguard_unique_name: str) -> None:
    destination = f"/queue/{mqguard_unique_name}"
    with artemis_stomp(mqguard_artemis_server) as client:
        client.subscribe(destination, "s", ack="client-individual")
        client.send(destination, "hello artemis", "r1", **{"x-custom": "kept"})
        frame = client.next()
        client.conn.ack(frame.headers["ack"])
        assert frame.body == "hello artemis"
        assert frame.headers["x-custom"] == "kept"
        assert frame.headers["destination"] == destination
        assert frame.headers["destination-type"] == "ANYCAST"
        assert frame.headers["persistent"] == "true"
        assert not client.errors


def test_artemis_rejects_a_repeated_duplicate_id(mqguard_artemis_server: ServerHandle,
                                                 mqguard_unique_name: str) -> None:
    destination = f"/queue/{mqguard_unique_name}"
    with artemis_stomp(mqguard_artemis_server) as client:
        client.subscribe(destination, "s")
        # Every send is acknowledged with its receipt, the duplicate included: Artemis
        # drops it silently (outside a transaction), as mqguard does.
        client.send(destination, "first", "r1", _AMQ_DUPL_ID="order-1")
        client.send(destination, "again", "r2", _AMQ_DUPL_ID="order-1")
        client.send(destination, "second", "r3", _AMQ_DUPL_ID="order-2")
        bodies = [client.next().body, client.next().body]
        with pytest.raises(queue.Empty):
            client.next(timeout=1.0)
        assert not client.errors
    assert bodies == ["first", "second"]
    log = mqguard_artemis_server.log_path.read_text()
    assert "AMQ222059: Duplicate message detected" in log
