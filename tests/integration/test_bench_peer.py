"""``mqguard bench peer`` with tiny counts: every path measured, the figures consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.bench.peer import Workload
from mqguard.cli import main
from mqguard.servers import ServerHandle

pytestmark = [pytest.mark.artemis, pytest.mark.activemq, pytest.mark.rabbitmq]


def test_duplicate_ids_repeat_one_in_n_from_a_batch_earlier() -> None:
    ids = Workload(messages=50, batch=10, duplicate_every=10).duplicate_ids("q")
    assert len(ids) == 50
    # Positions 19, 29, 39, 49 repeat 9, 19 (= 9), 29 (= 9), 39 (= 9): already sent.
    assert [k for k in range(50) if ids[k] in ids[:k]] == [19, 29, 39, 49]
    assert len(set(ids)) == 46
    assert Workload(messages=50, batch=10, duplicate_every=0).duplicate_ids("q") == [
        f"q-{k}" for k in range(50)]


def test_bench_peer_small(mqguard_artemis_server: ServerHandle,
                          mqguard_activemq_server: ServerHandle,
                          mqguard_rabbitmq_server: ServerHandle, tmp_path: Path) -> None:
    out = tmp_path / "peer.json"
    rounds, messages = 2, 200
    result = CliRunner().invoke(main, [
        "bench", "peer", "--store", "memory", "-n", str(messages), "--rounds", str(rounds),
        "--latency-samples", "10", "--warmup", "0", "--batch", "20",
        "--via", "sidecar", "--via", "wrappers", "--via", "direct",
        "--artemis-url", mqguard_artemis_server.urls["stomp"],
        "--activemq-url", mqguard_activemq_server.urls["stomp"],
        "--rabbitmq-url", mqguard_rabbitmq_server.urls["stomp"],
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["benchmark"] == "peer"
    paths = {p["path"]: p for p in data["paths"]}
    assert list(paths) == ["artemis", "activemq+sidecar", "activemq+wrappers",
                           "activemq+direct", "rabbitmq+sidecar", "rabbitmq+wrappers",
                           "rabbitmq+direct"]
    unique = len(set(Workload(messages=messages, batch=20).duplicate_ids("q")))
    assert unique == 182
    for name, path in paths.items():
        assert path["sent"] == rounds * messages, name
        assert path["unique"] == rounds * unique, name
        if path["via"] == "direct":
            # The broker alone keeps every duplicate: all of them are consumed.
            assert path["delivered"] == rounds * messages, name
            assert path["duplicates_delivered"] == rounds * (messages - unique), name
        else:
            assert path["delivered"] == rounds * unique, name
            assert path["duplicates_delivered"] == 0, name
        for figure in ("send_per_s", "consume_per_s"):
            assert len(path["runs"][figure]) == rounds, name
            assert min(path["runs"][figure]) <= path[figure] <= max(path["runs"][figure])
            assert path[figure] > 0, name
        assert 0 < path["p50_ms"] <= path["p99_ms"], name
    assert "artemis" in result.output and "dups through" in result.output
