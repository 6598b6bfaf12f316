"""deploy/compose: the compose file against the compose-spec schema, and what it mounts."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mqguard_tests.deploy import (
    DEPLOY,
    assert_admin_on_loopback,
    hostport,
    load_toml_text,
    sidecar_options,
    upstream,
    yaml_documents,
)

from mqguard.reaper import DEFAULT_HOLDING_QUEUE

COMPOSE_DIR = DEPLOY / "compose"
BROKERS = ("activemq", "rabbitmq", "artemis")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (document,) = yaml_documents(COMPOSE_DIR / "compose.yaml")
    return document


def compose_spec_schema() -> dict[str, Any]:
    # check-jsonschema vendors the compose-spec schema: no network needed.
    schema = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(schema.read_text(encoding="utf-8"))


def test_compose_file_is_valid_against_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = compose_spec_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(compose), key=lambda e: e.path)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_check_can_fail(compose: dict[str, Any]) -> None:
    # Guard against a schema that accepts anything: a misspelt key must be refused.
    schema = compose_spec_schema()
    broken = json.loads(json.dumps(compose))
    broken["services"]["sidecar"]["dependson"] = ["redis"]
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid(broken)


def test_one_profile_per_broker_and_the_sidecar_in_each(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for broker in BROKERS:
        assert services[broker]["profiles"] == [broker]
        # Every broker answers as `broker`, so one sidecar command fits every profile.
        assert "broker" in services[broker]["networks"]["default"]["aliases"]
        assert services["sidecar"]["depends_on"][broker]["required"] is False
    assert sorted(services["sidecar"]["profiles"]) == sorted(BROKERS)
    assert "profiles" not in services["redis"]  # the store runs whatever the broker


def test_redis_keeps_its_data_with_aof(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_sidecar_command_and_configuration(compose: dict[str, Any]) -> None:
    sidecar = compose["services"]["sidecar"]
    options = sidecar_options(sidecar["command"])
    host, port, user, password = upstream(options)
    assert (host, port) == ("broker", 61613)
    published = {int(p.split(":")[-1]) for p in sidecar["ports"]}
    # Clients' STOMP is published; the unauthenticated admin port is not, and stays on the
    # container's loopback (the image HEALTHCHECK asks it there).
    admin = assert_admin_on_loopback(options)
    assert hostport(options["listen"])[1] in published and admin not in published
    mounts = dict(v.split(":")[:2] for v in sidecar["volumes"])
    source = next(s for s, target in mounts.items() if target == options["config_path"])
    config = load_toml_text((COMPOSE_DIR / source).read_text(), "deploy/compose/mqguard.toml")
    store_host = re.match(r"redis://([^:/]+)", config.core.store)
    assert store_host and store_host.group(1) in compose["services"]
    # docker stop waits stop_grace_period, which must outlast the sidecar's drain.
    grace = int(sidecar["stop_grace_period"].rstrip("s")) * 1000
    assert grace > config.core.sidecar.drain_timeout_ms
    # The reaper logs in with the --upstream credentials: they must exist on each broker.
    (rabbit_user,) = _rabbitmq_definitions()["users"]
    assert (user, password) == (rabbit_user["name"], rabbit_user["password"])
    artemis = compose["services"]["artemis"]["environment"]
    assert (user, password) == (artemis["ARTEMIS_USER"], artemis["ARTEMIS_PASSWORD"])


def test_bind_mounted_files_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).is_file(), f"{name}: {source} does not exist"


def _rabbitmq_definitions() -> dict[str, Any]:
    return json.loads((COMPOSE_DIR / "rabbitmq" / "definitions.json").read_text())


def test_rabbitmq_expiry_policy_feeds_the_reapers_holding_queue() -> None:
    definitions = _rabbitmq_definitions()
    (policy,) = definitions["policies"]
    assert policy["apply-to"] == "queues"
    assert policy["definition"]["dead-letter-routing-key"] == DEFAULT_HOLDING_QUEUE
    assert policy["definition"]["dead-letter-exchange"] == ""
    pattern = re.compile(policy["pattern"])
    assert pattern.search("orders.eu")
    for excluded in (DEFAULT_HOLDING_QUEUE, "DLA", "ExpiryQueue"):
        assert not pattern.search(excluded), excluded
    # RabbitMQ drops dead letters it cannot route: the holding queue must exist at boot.
    queues = {q["name"]: q for q in definitions["queues"]}
    assert queues[DEFAULT_HOLDING_QUEUE]["durable"] is True
    users = {u["name"] for u in definitions["users"]}
    assert {p["user"] for p in definitions["permissions"]} <= users
    plugins = (COMPOSE_DIR / "rabbitmq" / "enabled_plugins").read_text()
    assert re.fullmatch(r"\[[a-z_,]+\]\.\n", plugins) and "rabbitmq_stomp" in plugins
    conf = dict(line.split(" = ", 1) for line in
                (COMPOSE_DIR / "rabbitmq" / "rabbitmq.conf").read_text().splitlines()
                if line and not line.startswith("#"))
    assert conf["load_definitions"] == "/etc/rabbitmq/definitions.json"


def activemq_broker(path: Path) -> ET.Element:
    namespace = "{http://activemq.apache.org/schema/core}"
    broker = ET.parse(path).getroot().find(f"{namespace}broker")
    assert broker is not None
    return broker


def test_activemq_configuration_has_what_mqguard_needs() -> None:
    namespace = "{http://activemq.apache.org/schema/core}"
    broker = activemq_broker(COMPOSE_DIR / "activemq" / "activemq.xml")
    assert broker.get("schedulerSupport") == "true"  # AMQ_SCHEDULED_DELAY redeliveries
    entries = broker.findall(f".//{namespace}policyEntry")
    assert any(e.get("queue") == ">" and int(e.get("maxPageSize", "200")) >= 100_000
               for e in entries)
    connectors = {c.get("name"): c.get("uri") for c in
                  broker.findall(f".//{namespace}transportConnector")}
    assert connectors["stomp"].startswith("stomp://0.0.0.0:61613")
