"""The real-server rig works: each server starts, speaks its protocols and stops completely."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
import pytest
import redis
import stomp
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqguard.servers import (
    ServerHandle,
    ServerStartError,
    rabbitmqctl,
    restart_redis,
    start_mosquitto,
    start_rabbitmq,
    start_redis,
)
from mqguard.servers.handle import pid_alive

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 10.0


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def gone(pid: int) -> bool:
    # A zombie (exited, not yet reaped by its parent) counts as gone: it holds no ports,
    # files or memory.
    return not pid_alive(pid)


# -- Redis ------------------------------------------------------------------------------------


@pytest.mark.redis
def test_redis_ping_set_get(mqguard_redis_url: str, mqguard_unique_name: str) -> None:
    assert mqguard_redis_url.startswith("redis://127.0.0.1:")
    client = redis.Redis.from_url(mqguard_redis_url)
    try:
        assert client.ping()
        client.set(mqguard_unique_name, b"value")
        assert client.get(mqguard_unique_name) == b"value"
        assert client.dbsize() == 1  # the fixture flushed everything else
    finally:
        client.close()


@pytest.mark.redis
def test_redis_cluster_spreads_keys(mqguard_redis_cluster_url: str,
                                    mqguard_unique_name: str) -> None:
    assert mqguard_redis_cluster_url.startswith("redis+cluster://127.0.0.1:")
    client = redis.RedisCluster.from_url(mqguard_redis_cluster_url.replace("redis+cluster://",
                                                                           "redis://"))
    try:
        keys = [f"{mqguard_unique_name}:{i}" for i in range(30)]
        for i, key in enumerate(keys):
            client.set(key, i)
        assert [int(client.get(key)) for key in keys] == list(range(30))
        slots = {client.keyslot(key) for key in keys}
        nodes = {client.get_node_from_key(key).name for key in keys}
        assert len(slots) > 1
        assert len(nodes) == 3, nodes
    finally:
        client.close()


@pytest.mark.redis
def test_redis_restart_keeps_aof_data(mqguard_fresh_redis_server: ServerHandle) -> None:
    url = mqguard_fresh_redis_server.urls["redis"]
    client = redis.Redis.from_url(url)
    client.set("survivor", b"1")
    client.close()
    old_pid = mqguard_fresh_redis_server.pid
    restarted = restart_redis(mqguard_fresh_redis_server)
    assert gone(old_pid)
    assert restarted.urls["redis"] == url
    assert restarted.state_dir == mqguard_fresh_redis_server.state_dir
    client = redis.Redis.from_url(url)
    try:
        assert client.get("survivor") == b"1"
    finally:
        client.close()


@pytest.mark.redis
def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        with pytest.raises(ServerStartError) as info:
            start_redis(state_dir=tmp_path, port=blocker.getsockname()[1])
    finally:
        blocker.close()
    message = str(info.value)
    assert "exited" in message  # failed early, not after the timeout
    assert "Address already in use" in message  # the log tail is included


# -- STOMP ------------------------------------------------------------------------------------


class Collector(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.errors: list[Any] = []

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)


def stomp_roundtrip(url: str, destination: str, **connect_kw: Any) -> Any:
    host, port = host_port(url)
    conn = stomp.Connection([(host, port)], **connect_kw)
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect("guest", "guest", wait=True)
    try:
        conn.subscribe(destination, id="1", ack="auto")
        conn.send(destination, "hello", headers={"x-test": "yes"})
        frame = listener.messages.get(timeout=TIMEOUT)
    finally:
        conn.disconnect()
    assert not listener.errors
    return frame


@pytest.mark.activemq
def test_activemq_stomp_send_receive(mqguard_activemq_server: ServerHandle,
                                     mqguard_unique_name: str) -> None:
    frame = stomp_roundtrip(mqguard_activemq_server.urls["stomp"], f"/queue/{mqguard_unique_name}")
    assert frame.body == "hello"
    assert frame.headers["x-test"] == "yes"
    assert frame.headers["message-id"].startswith("ID:")
    assert mqguard_activemq_server.version.startswith("5.17")
    assert ") started" in mqguard_activemq_server.log_path.read_text()


@pytest.mark.rabbitmq
def test_rabbitmq_stomp_send_receive(mqguard_rabbitmq_server: ServerHandle,
                                     mqguard_unique_name: str) -> None:
    frame = stomp_roundtrip(mqguard_rabbitmq_server.urls["stomp"], f"/queue/{mqguard_unique_name}",
                            vhost="/")
    assert frame.body == "hello"
    assert frame.headers["x-test"] == "yes"
    assert mqguard_rabbitmq_server.version.startswith("3.10")
    assert mqguard_unique_name in rabbitmqctl(mqguard_rabbitmq_server, "list_queues", "name")
    assert "Server startup complete" in mqguard_rabbitmq_server.log_path.read_text()


# -- MQTT -------------------------------------------------------------------------------------


def mqtt_roundtrip(url: str, topic: str, protocol: mqtt.MQTTProtocolVersion) -> Any:
    host, port = host_port(url)
    received: queue.Queue[Any] = queue.Queue()
    subscribed = threading.Event()
    client = mqtt.Client(
        # 23 characters is the longest client id MQTT 3.1.1 brokers must accept.
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"t-{uuid.uuid4().hex[:21]}",
        protocol=protocol,
    )
    client.on_message = lambda _c, _u, msg: received.put(msg)
    client.on_subscribe = lambda *_args: subscribed.set()
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        assert subscribed.wait(TIMEOUT), "no SUBACK"
        props = None
        if protocol == mqtt.MQTTv5:
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("x-test", "yes")]
        info = client.publish(topic, b"hello", qos=1, properties=props)
        info.wait_for_publish(TIMEOUT)
        return received.get(timeout=TIMEOUT)
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.activemq
def test_activemq_mqtt311_publish_subscribe(
    mqguard_activemq_server: ServerHandle, mqguard_unique_name: str
) -> None:
    msg = mqtt_roundtrip(mqguard_activemq_server.urls["mqtt"], f"t/{mqguard_unique_name}",
                         mqtt.MQTTv311)
    assert msg.payload == b"hello"
    assert msg.qos == 1


@pytest.mark.mosquitto
def test_mosquitto_mqtt5_qos1_roundtrip(mqguard_mosquitto_server: ServerHandle,
                                        mqguard_unique_name: str) -> None:
    msg = mqtt_roundtrip(mqguard_mosquitto_server.urls["mqtt"], f"t/{mqguard_unique_name}",
                         mqtt.MQTTv5)
    assert msg.payload == b"hello"
    assert msg.qos == 1
    assert ("x-test", "yes") in msg.properties.UserProperty
    assert "running" in mqguard_mosquitto_server.log_path.read_text()


# -- lifecycle --------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.mosquitto
def test_stop_ends_processes_and_is_idempotent() -> None:
    handles = [start_redis(), start_mosquitto()]
    try:
        for h in handles:
            assert h.is_running()
            assert h.state_dir.name.startswith(f"mqguard-{h.kind}-")
            assert ServerHandle.load(h.state_dir).to_json() == h.to_json()
    finally:
        for h in handles:
            h.stop()
    for h in handles:
        assert gone(h.pid)
        assert not h.is_running()
        h.stop()  # idempotent
        shutil.rmtree(h.state_dir)


@pytest.mark.mosquitto
def test_cli_start_detached_then_stop() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "mqguard.servers"]
    started = subprocess.run(
        [*cmd, "start", "mosquitto"], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0, started.stderr
    data = json.loads(started.stdout)
    handle = ServerHandle.from_json(started.stdout)
    try:
        # The CLI process has exited; the server must have outlived it.
        assert handle.is_running()
        assert data["urls"]["mqtt"].startswith("mqtt://127.0.0.1:")
    finally:
        stopped = subprocess.run(
            [*cmd, "stop", "--state-dir", data["state_dir"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert stopped.returncode == 0, stopped.stderr
    assert gone(handle.pid)
    shutil.rmtree(handle.state_dir)


@pytest.mark.rabbitmq
def test_rabbitmq_stop_ends_node_and_private_epmd() -> None:
    handle = start_rabbitmq()
    pids = handle.all_pids()
    assert len(pids) == 2  # the node's launcher script and our private epmd
    node_group = handle.pid
    handle.stop()
    assert all(gone(pid) for pid in pids)
    # beam.smp and its helpers ran in the launcher's process group; none may survive.
    leftovers = subprocess.run(
        ["pgrep", "-g", str(node_group)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftovers == []
    assert "stopped" in handle.log_path.read_text().lower()
    shutil.rmtree(handle.state_dir)
