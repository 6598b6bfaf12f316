"""``mqguard doctor`` against real servers: the well-configured rig passes, an evicting Redis,
a bad configuration and an unreachable broker fail with exit 2, naming what to fix, without a
traceback and without credentials (docs/doctor.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from click.testing import CliRunner

from mqguard.cli.doctor import doctor
from mqguard.doctor.broker_activemq import PROBE_QUEUE
from mqguard.registry import open_adapter
from mqguard.servers import ServerHandle, start_redis, start_redis_cluster
from mqguard.servers.ports import free_ports
from mqguard.servers.rabbitmq import rabbitmqctl, start_rabbitmq

_DOC = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


def _schema() -> dict[str, Any]:
    block = re.search(r"## JSON output.*?```json\n(.*?)\n```", _DOC.read_text(), re.S)
    assert block is not None, "docs/doctor.md lost its JSON schema"
    schema: dict[str, Any] = json.loads(block.group(1))
    return schema


def _doctor(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """Run ``mqguard doctor --json`` with an empty mqguard.toml unless ``-c`` is given."""
    config = [] if "-c" in args else ["-c", str(_empty_config(tmp_path))]
    result = CliRunner().invoke(doctor, [*config, *args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    payload: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(payload, _schema())
    assert payload["exit_code"] == result.exit_code
    return result.exit_code, payload


def _empty_config(tmp_path: Path) -> Path:
    path = tmp_path / "mqguard.toml"
    if not path.exists():
        path.write_text("[mqguard]\n")
    return path


def _by_name(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['area']}/{c['name']}": c for c in payload["checks"]}


def _with(payload: dict[str, Any], status: str) -> list[str]:
    return sorted(f"{c['area']}/{c['name']}" for c in payload["checks"]
                  if c["status"] == status)


def _probe_queue_depth(url: str) -> int:
    adapter: Any = open_adapter(url, heartbeats=(0, 0))
    adapter.connect()
    try:
        from mqguard.adapter import SubscribeOptions

        seen: list[object] = []
        sub = adapter.subscribe(PROBE_QUEUE, seen.append, SubscribeOptions(browse=True))
        assert adapter.wait_browse_end(sub, 10.0)
        return len(seen)
    finally:
        adapter.close()


@pytest.mark.activemq
@pytest.mark.redis
def test_well_configured_rig_exits_0(tmp_path: Path, mqguard_activemq_server: ServerHandle,
                                     mqguard_fresh_redis_server: ServerHandle) -> None:
    stomp = mqguard_activemq_server.urls["stomp"]
    code, payload = _doctor(tmp_path, "--url", stomp,
                            "--store", mqguard_fresh_redis_server.urls["redis"])
    checks = _by_name(payload)
    assert code == 0, _with(payload, "warning") + _with(payload, "error")
    assert checks["broker/kind"]["data"]["server"] == f"ActiveMQ/{mqguard_activemq_server.version}"
    for name in ("broker/scheduler", "broker/max-page-size", "redis/maxmemory-policy",
                 "redis/persistence", "redis/memory-headroom", "clock/skew-redis",
                 "clock/skew-broker", "clock/skew-broker-redis"):
        assert checks[name]["status"] == "ok", checks[name]
    # Same host: both clocks agree within the measurement.
    for name in ("clock/skew-redis", "clock/skew-broker", "clock/skew-broker-redis"):
        data = checks[name]["data"]
        assert abs(data["offset_ms"]) <= data["uncertainty_ms"] + 50
    assert checks["broker/scheduler"]["data"]["delay_ms"] >= 800
    assert checks["broker/persist-jms-redelivered"]["status"] == "skipped"
    assert _probe_queue_depth(stomp) == 0  # the probes leave nothing behind


@pytest.mark.activemq
def test_activemq_xml_names_persist_jms_redelivered(
        tmp_path: Path, mqguard_activemq_server: ServerHandle) -> None:
    broker_xml = mqguard_activemq_server.state_dir / "conf" / "broker.xml"
    code, payload = _doctor(tmp_path, "--url", mqguard_activemq_server.urls["stomp"],
                            "--broker-config", str(broker_xml))
    # The rig leaves persistJMSRedelivered off (docs/doctor.md): the one warning.
    assert code == 1
    assert _with(payload, "warning") == ["broker/persist-jms-redelivered"]
    check = _by_name(payload)["broker/persist-jms-redelivered"]
    assert 'persistJMSRedelivered="true"' in check["fix"]
    assert _by_name(payload)["broker/max-page-size-config"]["data"]["maxPageSize"] == 100000


@pytest.mark.redis
def test_evicting_redis_exits_2_naming_the_setting(tmp_path: Path) -> None:
    handle = start_redis()  # no AOF, like the session Redis
    try:
        client = redis.Redis.from_url(handle.urls["redis"])
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()
        code, payload = _doctor(tmp_path, "--store", handle.urls["redis"])
        assert code == 2
        assert _with(payload, "error") == ["redis/maxmemory-policy"]
        check = _by_name(payload)["redis/maxmemory-policy"]
        assert "allkeys-lru" in check["detail"] and "noeviction" in check["fix"]
        # Without AOF: a warning, not an error (docs/doctor.md).
        assert _by_name(payload)["redis/persistence"]["status"] == "warning"
        # The table says the same to a person.
        result = CliRunner().invoke(doctor, ["-c", str(_empty_config(tmp_path)),
                                             "--store", handle.urls["redis"]])
        assert result.exit_code == 2
        assert "allkeys-lru" in result.stdout and "noeviction" in result.stdout

        # noeviction, but too small for the rings of 1,000 addresses at 20,000 ids.
        client = redis.Redis.from_url(handle.urls["redis"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(64 * 2**20))
        client.close()
        code, payload = _doctor(tmp_path, "--store", handle.urls["redis"], "--addresses", "1000")
        assert code == 2 and _with(payload, "error") == ["redis/memory-headroom"]
        headroom = _by_name(payload)["redis/memory-headroom"]["data"]
        assert headroom["ring_bytes"] == 1000 * 20000 * 25
        assert headroom["limit_bytes"] == 64 * 2**20
    finally:
        handle.stop()


@pytest.mark.redis
def test_redis_cluster_slots_and_every_primary(
        tmp_path: Path, mqguard_redis_cluster_server: ServerHandle) -> None:
    code, payload = _doctor(tmp_path, "--store", mqguard_redis_cluster_server.urls["redis"])
    checks = _by_name(payload)
    assert checks["redis/reachable"]["data"]["primaries"] == 3
    assert checks["redis/cluster-slots"]["status"] == "ok"
    assert checks["redis/cluster-slots"]["data"]["slots_ok"] == 16384
    # The cluster runs without AOF: the warning names all three primaries.
    persistence = checks["redis/persistence"]
    assert persistence["status"] == "warning" and persistence["detail"].count("127.0.0.1:") == 3
    assert code == 1


@pytest.mark.redis
def test_redis_cluster_with_an_uncovered_slot_is_an_error(tmp_path: Path) -> None:
    handle = start_redis_cluster()  # private: a slot is taken away
    try:
        first = int(handle.meta["ports"].split(",")[0])
        node = redis.Redis(host="127.0.0.1", port=first)
        owned = [slot for start, end, *_ in node.execute_command("CLUSTER", "SLOTS")
                 if int(_[0][1]) == first for slot in range(int(start), int(end) + 1)]
        node.execute_command("CLUSTER", "DELSLOTS", owned[0])
        node.close()
        code, payload = _doctor(tmp_path, "--store", handle.urls["redis"])
        check = _by_name(payload)["redis/cluster-slots"]
        assert check["status"] == "error" and check["data"]["slots_assigned"] == 16383
        assert code == 2
    finally:
        handle.stop()


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[mqguard]\nid-cache-size = "lots"\n')
    code, payload = _doctor(tmp_path, "-c", str(bad))
    assert code == 2
    check = _by_name(payload)["config/validates"]
    assert check["status"] == "error" and "mqguard.id-cache-size" in check["detail"]


def test_unreachable_broker_and_store_exit_2_without_traceback_or_secrets() -> None:
    broker_port, redis_port = free_ports(2)
    url = f"stomp://alice:s3cr3t%2Fpw@127.0.0.1:{broker_port}"
    store = f"redis://:r3dis-pw@127.0.0.1:{redis_port}/0"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # A process of its own: what an operator runs, exit code and streams included.
    command = "from mqguard.cli.doctor import doctor; doctor(prog_name='mqguard doctor')"
    proc = subprocess.run([sys.executable, "-c", command, "--url", url, "--store", store],
                          capture_output=True, text=True, timeout=60, env=env,
                          cwd=Path(__file__).parent)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    for secret in ("s3cr3t", "r3dis-pw"):
        assert secret not in out
    assert "***" in out and "fix: start the broker" in out.replace("\n", " ").replace("│", "")


def test_unreachable_mqtt_broker_exits_2_without_secret(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    code, payload = _doctor(tmp_path, "--url", f"mqtt://bob:hunter2@127.0.0.1:{port}")
    assert code == 2
    assert _with(payload, "error") == ["broker/reachable"]
    assert "hunter2" not in json.dumps(payload)


@pytest.mark.mosquitto
def test_mosquitto_version_and_persistence(tmp_path: Path,
                                           mqguard_mosquitto_server: ServerHandle) -> None:
    conf = mqguard_mosquitto_server.state_dir / "mosquitto.conf"
    code, payload = _doctor(tmp_path, "--url", mqguard_mosquitto_server.urls["mqtt"],
                            "--broker-config", str(conf))
    checks = _by_name(payload)
    assert checks["broker/kind"]["detail"].endswith(mqguard_mosquitto_server.version) or \
        "mosquitto" in checks["broker/kind"]["detail"]
    assert checks["broker/persistence"]["status"] == "ok"
    assert code == 0, _with(payload, "warning") + _with(payload, "error")
    off = tmp_path / "off.conf"
    off.write_text(conf.read_text().replace("persistence true", "persistence false"))
    code, payload = _doctor(tmp_path, "--url", mqguard_mosquitto_server.urls["mqtt"],
                            "--broker-config", str(off))
    assert code == 2 and _with(payload, "error") == ["broker/persistence"]


@pytest.mark.rabbitmq
def test_rabbitmq_without_management_api_skips_what_stomp_cannot_show(
        tmp_path: Path, mqguard_rabbitmq_server: ServerHandle) -> None:
    (closed,) = free_ports(1)
    code, payload = _doctor(tmp_path, "--url", mqguard_rabbitmq_server.urls["stomp"],
                            "--management-url", f"http://guest:guest@127.0.0.1:{closed}")
    checks = _by_name(payload)
    assert checks["broker/kind"]["data"]["kind"] == "rabbitmq"
    assert checks["broker/queue-types"]["status"] == "skipped"
    assert "rabbitmq_management" in checks["broker/queue-types"]["fix"]
    assert code == 0


@pytest.fixture(scope="module")
def rabbitmq_with_management() -> Iterator[tuple[ServerHandle, str]]:
    """A private RabbitMQ node with the management API on a free loopback port (the
    session node has no management plugin), enabled on the running node."""
    handle = start_rabbitmq()
    try:
        port = free_ports(1)[0]
        plugins = handle.state_dir / "enabled_plugins"
        plugins.write_text("[rabbitmq_stomp,rabbitmq_mqtt,rabbitmq_management].\n")
        rabbitmqctl(handle, "eval",
                    f"application:set_env(rabbitmq_management, tcp_config, "
                    f'[{{port, {port}}}, {{ip, "127.0.0.1"}}]), '
                    f'rabbit_plugins:ensure("{plugins}").')
        yield handle, f"http://guest:guest@127.0.0.1:{port}"
    finally:
        handle.stop()


@pytest.mark.rabbitmq
def test_rabbitmq_queue_types_expiry_policy_and_clock_from_the_management_api(
        tmp_path: Path, rabbitmq_with_management: tuple[ServerHandle, str]) -> None:
    handle, management = rabbitmq_with_management
    args = ("--url", handle.urls["stomp"], "--management-url", management)
    code, payload = _doctor(tmp_path, *args)
    checks = _by_name(payload)
    assert checks["broker/expiry-policy"]["status"] == "warning"
    assert "set_policy" in checks["broker/expiry-policy"]["fix"]
    skew = checks["clock/skew-broker"]
    assert skew["status"] == "ok" and skew["data"]["uncertainty_ms"] >= 1000
    assert "guest:guest" not in json.dumps(payload)
    assert code == 1

    rabbitmqctl(handle, "set_policy", "--apply-to", "queues", "mqguard-expiry", r"^orders\.",
                '{"dead-letter-exchange":"","dead-letter-routing-key":"mqguard.expired"}')
    code, payload = _doctor(tmp_path, *args)
    assert "does not exist" in _by_name(payload)["broker/expiry-policy"]["detail"]

    # The holding queue (as `mqguard reap` declares it) and a quorum queue.
    adapter: Any = open_adapter(handle.urls["stomp"], heartbeats=(0, 0))
    adapter.connect()
    try:
        from mqguard.adapter import SubscribeOptions

        adapter.unsubscribe(adapter.subscribe("mqguard.expired", lambda d: None))
        adapter.unsubscribe(adapter.subscribe(
            "orders.quorum", lambda d: None,
            SubscribeOptions(headers={"x-queue-type": "quorum", "durable": "true",
                                      "auto-delete": "false"})))
    finally:
        adapter.close()
    code, payload = _doctor(tmp_path, *args)
    checks = _by_name(payload)
    assert checks["broker/expiry-policy"]["status"] == "ok", checks["broker/expiry-policy"]
    assert checks["broker/queue-types"]["data"].get("quorum") == 1
    assert code == 0, _with(payload, "warning") + _with(payload, "error")


_RABBITMQCTL = """\
import sys
from pathlib import Path

from mqguard.errors import MqguardError
from mqguard.servers import ServerHandle
from mqguard.servers.rabbitmq import rabbitmqctl

try:
    sys.stdout.write(rabbitmqctl(ServerHandle.load(Path(sys.argv[1])), *sys.argv[2:]))
except MqguardError as exc:
    sys.exit(str(exc))
"""


@pytest.mark.rabbitmq
def test_rabbitmq_queue_types_and_clock_through_rabbitmqctl(
        tmp_path: Path, mqguard_rabbitmq_server: ServerHandle, mqguard_unique_name: str) -> None:
    # rabbitmqctl as an operator runs it on the broker's host: here through the launcher,
    # which knows the node's name, cookie and epmd port.
    script = tmp_path / "rabbitmqctl.py"
    script.write_text(_RABBITMQCTL)
    command = f"{sys.executable} {script} {mqguard_rabbitmq_server.state_dir}"
    adapter: Any = open_adapter(mqguard_rabbitmq_server.urls["stomp"], heartbeats=(0, 0))
    adapter.connect()
    try:
        from mqguard.adapter import SubscribeOptions

        adapter.unsubscribe(adapter.subscribe(
            mqguard_unique_name, lambda d: None,
            SubscribeOptions(headers={"x-queue-type": "quorum", "durable": "true",
                                      "auto-delete": "false"})))
    finally:
        adapter.close()
    code, payload = _doctor(tmp_path, "--url", mqguard_rabbitmq_server.urls["stomp"],
                            "--rabbitmqctl", command)
    checks = _by_name(payload)
    assert checks["broker/queue-types"]["status"] == "ok"
    assert checks["broker/queue-types"]["data"]["quorum"] >= 1
    # The session node's policies belong to other tests too: only that it was read.
    assert checks["broker/expiry-policy"]["status"] in ("ok", "warning")
    skew = checks["clock/skew-broker"]
    assert skew["status"] == "ok" and skew["data"]["method"].startswith("rabbitmqctl")
    assert code in (0, 1)

    code, payload = _doctor(tmp_path, "--url", mqguard_rabbitmq_server.urls["stomp"],
                            "--rabbitmqctl", f"{sys.executable} {script} {tmp_path}")
    skipped = _by_name(payload)["broker/queue-types"]
    assert skipped["status"] == "skipped" and "exited with 1" in skipped["detail"]
