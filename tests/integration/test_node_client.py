"""A STOMP client that is not Python: Node.js (@stomp/stompjs over TCP) against the real brokers.

``tests/node/roundtrip.js`` sends N messages (header ``seq``, each with a receipt), subscribes
with ``ack:client-individual``, acks what it receives and prints one JSON line; see its header
comment.  ``deploy/local/node-setup.sh`` installs Node.js and the script's npm packages; it runs
once per session, and its failure fails the tests (never a skip).  :func:`run_node_roundtrip`
is the reusable runner, e.g. for the same round trip through the sidecar.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from mqguard.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = REPO_ROOT / "tests" / "node"
ROUNDTRIP_JS = NODE_DIR / "roundtrip.js"
NODE_SETUP = REPO_ROOT / "deploy" / "local" / "node-setup.sh"

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq, id="activemq"),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq, id="rabbitmq"),
]
# RabbitMQ takes the CONNECT ``host`` header as the vhost; ActiveMQ accepts any login.
LOGIN: dict[str, Any] = {"login": "guest", "passcode": "guest", "vhost": "/"}


@pytest.fixture(scope="session")
def node_client() -> str:
    """Runs ``deploy/local/node-setup.sh`` once; returns the ``node`` executable."""
    try:
        proc = subprocess.run(["bash", str(NODE_SETUP)], capture_output=True, text=True,
                              timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{NODE_SETUP} timed out after {exc.timeout} s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"{NODE_SETUP} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}",
                    pytrace=False)
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"{NODE_SETUP} succeeded but `node` is not on PATH", pytrace=False)
    return node


def run_node_roundtrip(host: str, port: int, destination: str, count: int, *,
                       node: str = "node", **opts: Any) -> dict[str, Any]:
    """Run ``roundtrip.js`` and return its JSON result, plus ``exit_code`` and ``stderr``.

    ``opts`` become options: ``dup_id_every=3`` -> ``--dup-id-every 3``, ``dup_ids=True`` ->
    ``--dup-ids``; ``None``/``False`` are left out.  Known ones: login, passcode, vhost,
    heartbeat ("out,in" ms), timeout_ms, dup_ids, dup_id_prefix, dup_id_every, linger_ms,
    verbose.  The exit code is not checked here (0 = success, 1 = error, with ``errors``).
    """
    argv = [node, str(ROUNDTRIP_JS), "--host", host, "--port", str(port),
            "--destination", destination, "--count", str(count)]
    for key, value in opts.items():
        if value is None or value is False:
            continue
        argv.append("--" + key.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    budget_s = int(opts.get("timeout_ms") or 20000) / 1000 * 3 + 30  # connect+receipts+receive
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget_s, check=False,
                          cwd=NODE_DIR)
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(f"roundtrip.js printed no JSON line (exit {proc.returncode}):\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}") from None
    result["exit_code"] = proc.returncode
    result["stderr"] = proc.stderr
    return result


def stomp_address(kind: str, request: pytest.FixtureRequest) -> tuple[str, int]:
    url = urlsplit(request.getfixturevalue(f"mqguard_{kind}_server").urls["stomp"])
    assert url.hostname and url.port, url
    return url.hostname, url.port


@pytest.mark.parametrize("kind", BROKERS)
def test_node_client_round_trip(kind: str, request: pytest.FixtureRequest, node_client: str,
                                mqguard_unique_name: str) -> None:
    host, port = stomp_address(kind, request)
    destination = f"/queue/{mqguard_unique_name}"
    count = 20
    result = run_node_roundtrip(host, port, destination, count, node=node_client, **LOGIN)
    assert result["errors"] == [] and result["exit_code"] == 0, result
    assert result["stomp_version"] == "1.2"
    assert (result["sent"], result["receipts"], result["duplicates_sent"]) == (count, count, 0)
    assert result["received"] == list(range(1, count + 1)), "lost, duplicated or reordered"
    sample = result["headers_sample"]
    assert sample["seq"] == "1", sample
    assert sample["destination"] == destination, sample
    assert sample["subscription"] == "node-sub-0" and sample.get("ack"), sample

    # Every MESSAGE was ACKed (client-individual): nothing of the first run is delivered again.
    again = run_node_roundtrip(host, port, destination, 1, node=node_client, linger_ms=500,
                               **LOGIN)
    assert again["errors"] == [] and again["received"] == [1], again


@pytest.mark.parametrize("kind", BROKERS)
def test_node_client_duplicate_ids_reach_a_plain_broker(kind: str,
                                                        request: pytest.FixtureRequest,
                                                        node_client: str,
                                                        mqguard_unique_name: str) -> None:
    """The baseline for the sidecar: a broker without mqguard delivers every resent id."""
    host, port = stomp_address(kind, request)
    prefix = f"{mqguard_unique_name}-"
    result = run_node_roundtrip(host, port, f"/queue/{mqguard_unique_name}", 10, node=node_client,
                                dup_id_every=3, dup_id_prefix=prefix, **LOGIN)
    assert result["errors"] == [] and result["exit_code"] == 0, result
    assert (result["sent"], result["duplicates_sent"], result["receipts"]) == (10, 3, 13)
    assert result["received"] == [1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10]
    assert result["headers_sample"]["_AMQ_DUPL_ID"] == f"{prefix}1"
    assert result["headers_sample"]["seq"] == "1"


def test_node_client_reports_connect_failure(node_client: str) -> None:
    result = run_node_roundtrip("127.0.0.1", free_port(), "/queue/nowhere", 1,
                                node=node_client, timeout_ms=5000)
    assert result["exit_code"] == 1, result
    assert result["errors"] and "ECONNREFUSED" in result["errors"][0], result
    assert result["sent"] == 0 and result["received"] == []


@pytest.mark.rabbitmq
def test_node_client_reports_error_frame(request: pytest.FixtureRequest, node_client: str,
                                         mqguard_unique_name: str) -> None:
    host, port = stomp_address("rabbitmq", request)
    result = run_node_roundtrip(host, port, f"/queue/{mqguard_unique_name}", 1, node=node_client,
                                login="guest", passcode="guest", vhost=f"/{mqguard_unique_name}")
    assert result["exit_code"] == 1, result
    assert any(e.startswith("ERROR frame:") for e in result["errors"]), result


@pytest.mark.parametrize("kind", BROKERS)
def test_node_client_through_the_sidecar(kind: str, request: pytest.FixtureRequest,
                                         node_client: str, mqguard_unique_name: str,
                                         tmp_path: Path) -> None:
    """The same Node.js client through ``mqguard sidecar``: every message once, in order,
    and the resent duplicate ids are rejected by the sidecar (still receipted)."""
    from mqguard.config import parse_config
    from mqguard.events import read_events
    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    upstream = request.getfixturevalue(f"mqguard_{kind}_server").urls["stomp"]
    config = parse_config({"mqguard": {"node-id": "node-sidecar", "event-log": {
        "directory": str(tmp_path / "events"), "flush-interval-ms": 20}}})
    with SidecarThread(Sidecar(config, parse_upstream(upstream))) as proxy:
        result = run_node_roundtrip("127.0.0.1", proxy.port, f"/queue/{mqguard_unique_name}", 10,
                                    node=node_client, dup_id_every=3,
                                    dup_id_prefix=f"{mqguard_unique_name}-", **LOGIN)
        proxy.sidecar.guard.events.flush()
        kinds = [e["type"] for e in read_events(tmp_path / "events")]
    assert result["errors"] == [] and result["exit_code"] == 0, result
    assert (result["sent"], result["duplicates_sent"], result["receipts"]) == (10, 3, 13)
    assert result["stomp_version"] == "1.2"
    assert result["received"] == list(range(1, 11)), "the sidecar let a duplicate through"
    assert result["headers_sample"]["seq"] == "1"
    assert kinds.count("duplicate_rejected") == 3
    assert kinds.count("sent") == 10 and kinds.count("acked") == 10
