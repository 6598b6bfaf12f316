"""``mqguard audit --redis``: the state read in parallel from a real Redis (standalone and
the local 3-master Cluster), and every planted Redis anomaly found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mqguard_tests.synthetic import Cluster

from mqguard.audit.cross_checks import CrossInputs
from mqguard.audit.redis_state import RedisStateError, cluster_nodes, read_state
from mqguard.audit.runner import AuditOptions, run_audit
from mqguard.audit.summary import read_findings
from mqguard.config import parse_config
from mqguard.digest import id_digest
from mqguard.events import EventType
from mqguard.stores.redis import RedisStore

pytestmark = [pytest.mark.spark, pytest.mark.redis]

CONFIG = parse_config({"address-settings": {
    "orders": {"max-delivery-attempts": 3, "dead-letter-address": "DLA", "id-cache-size": 5},
    "other": {"id-cache-size": 5},
}}, "<test>")
STATE_CLASSES = ("ring_mismatch", "rejected_without_twin", "count_over_max", "count_behind",
                 "dead_letter_untraced", "count_stale")


@pytest.fixture(params=["standalone", "cluster"])
def any_redis_url(request: pytest.FixtureRequest) -> str:
    name = "mqguard_redis_url" if request.param == "standalone" else "mqguard_redis_cluster_url"
    return str(request.getfixturevalue(name))


def accept(c: Cluster, store: RedisStore, message_id: str, duplicate_id: str,
           address: str = "orders") -> Any:
    """What the guard does for an accepted send: the ring add, then the ``sent`` event."""
    (duplicate,) = store.ring_check_and_add(address, [id_digest(duplicate_id)], 5)
    assert not duplicate
    message = c.message(message_id, address)
    message.duplicate_id = duplicate_id
    c.emit("producer", EventType.SENT, message)
    return message


def reject(c: Cluster, message_id: str, duplicate_id: str, address: str = "orders") -> None:
    message = c.message(message_id, address)
    message.duplicate_id = duplicate_id
    c.emit("producer", EventType.DUPLICATE_REJECTED, message,
           reason=f"duplicate id {duplicate_id!r} already in the cache of {address}")


def test_state_is_read_from_every_node(spark: Any, any_redis_url: str) -> None:
    store = RedisStore.from_url(any_redis_url)
    try:
        names = [f"addr-{n}" for n in range(12)]  # spread over the Cluster's slots
        for n, name in enumerate(names):
            store.ring_check_and_add(name, [id_digest(f"{name}-{i}") for i in range(n + 1)], 4)
            store.delivery_count_incr(name, f"m-{n}")
        store.audit_mark("scope", "producer-1", [1, 2, 3], 64, 60_000)
        state = read_state(spark, any_redis_url, partitions=3)
    finally:
        store.close()
    rings = {r["address"]: (r["capacity"], r["size"]) for r in state.rings.collect()}
    assert rings == {name: (4, min(4, n + 1)) for n, name in enumerate(names)}
    ids = state.ring_ids.filter("address = 'addr-11'").orderBy("pos").collect()
    # Ring order: oldest first, the last 4 added.
    assert [r["digest"] for r in ids] == [id_digest(f"addr-11-{i}").hex() for i in range(8, 12)]
    counts = {(r["queue"], r["message_id"]): r["count"] for r in state.counts.collect()}
    assert counts == {(name, f"m-{n}"): 1 for n, name in enumerate(names)}
    audit = state.audit.collect()
    assert [(a["scope"], a["producer_id"], a["window"], a["marked"]) for a in audit] == [
        ("scope", "producer-1", 64, 3)]
    expected_nodes = 3 if "cluster" in any_redis_url else 1
    assert state.nodes == expected_nodes == len(cluster_nodes(any_redis_url))
    state.unpersist()


def test_unreachable_redis_is_a_clear_error_without_the_password(spark: Any) -> None:
    with pytest.raises(RedisStateError) as caught:
        read_state(spark, "redis://user:s3cret-pw@127.0.0.1:1/0")
    assert "s3cret-pw" not in str(caught.value) and "***" in str(caught.value)
    with pytest.raises(RedisStateError) as caught:
        cluster_nodes("redis+cluster://:s3cret-pw@127.0.0.1:1")
    assert "s3cret-pw" not in str(caught.value)


def test_planted_redis_anomalies_are_found(spark: Any, any_redis_url: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path / "events", monkeypatch, flush_each=True)
    store = RedisStore.from_url(any_redis_url)
    expected: dict[str, set[str]] = {}
    try:
        # -- rings: "orders" agrees (8 accepted, capacity 5: the last 5 are held).
        for i in range(8):
            accept(c, store, f"o-{i}", f"d{i}")
        reject(c, "twin-in-window", "d6")  # fine: d6 is among the last 5
        reject(c, "no-twin", "never-sent")
        reject(c, "twin-evicted", "d0")  # d1..d7 accepted since: d0 was evicted
        expected["rejected_without_twin"] = {"no-twin", "twin-evicted"}
        # "other" disagrees: o-b2 never reached the ring, a phantom id did.
        accept(c, store, "o-b0", "b0", "other")
        accept(c, store, "o-b1", "b1", "other")
        message = c.message("o-b2", "other")
        message.duplicate_id = "b2"
        c.emit("producer", EventType.SENT, message)
        store.ring_check_and_add("other", [id_digest("phantom")], 5)
        expected["ring_mismatch"] = {"o-b2", "digest:" + id_digest("phantom").hex()}

        # -- delivery counts (max-delivery-attempts 3 on "orders").
        over = c.send("count-over")
        for n in (1, 2, 3):
            c.failed(over, count=n)
        for _ in range(4):
            store.delivery_count_incr("orders", "count-over")
        behind = c.send("count-behind")
        c.failed(behind, count=1)
        c.failed(behind, count=2)  # Redis lost both counts (never written here)
        retrying = c.send("count-fine")
        c.failed(retrying, count=1)
        store.delivery_count_incr("orders", "count-fine")
        stale = c.send("count-stale")
        c.handled(stale)
        store.delivery_count_incr("orders", "count-stale")
        expected |= {"count_over_max": {"count-over"}, "count_behind": {"count-behind"},
                     "count_stale": {"count-stale"}}

        # -- dead letters: a traced copy, and a message on the DLA with no original.
        poison = c.send("poison")
        c.failed(poison, count=1)
        c.failed(poison, count=2)
        store.delivery_count_incr("orders", "poison")  # cleared below, as the plugin does
        store.delivery_count_clear("orders", "poison")
        copy = c.dead_lettered(poison, count=3)
        c.handled(copy, node="dla-consumer")
        rogue = c.send("rogue-on-dla", "DLA")
        c.handled(rogue, node="dla-consumer")
        expected["dead_letter_untraced"] = {"rogue-on-dla"}
        end = c.clock.advance(10)
    finally:
        c.close()
        store.close()

    result = run_audit(spark, AuditOptions(
        [str(tmp_path / "events")], out=str(tmp_path / "out"), config=CONFIG, watermark=end,
        cross=CrossInputs(redis_url=any_redis_url, tolerance_ms=0)))
    findings = read_findings(spark, str(tmp_path / "out" / "findings"))
    found: dict[str, set[str]] = {}
    for row in findings.filter(findings["class"].isin(list(STATE_CLASSES))).collect():
        found.setdefault(row["class"], set()).add(row["message_id"])
    assert found == expected
    summary = result.summary
    assert summary["redis"]["rings"] == 2 and summary["redis"]["ring_ids"] == 5 + 3
    assert summary["classes"]["count_stale"]["anomaly"] is False
    assert summary["classes"]["ring_mismatch"]["by_address"]["other"]["count"] == 2
    assert result.exit_code == 1


def test_cli_broker_log_typo_is_a_usage_error_before_spark(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from mqguard.cli.audit import audit

    (tmp_path / "events-n.jsonl").write_text("")
    result = CliRunner().invoke(audit, [str(tmp_path), "--broker-log",
                                        str(tmp_path / "missing.log")])
    assert result.exit_code == 2 and "missing.log: no such file" in result.output


def test_cli_unreachable_redis_fails_without_printing_the_password(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from mqguard.cli.audit import audit

    c = Cluster(tmp_path / "events", monkeypatch, flush_each=True)
    c.handled(c.send("m-1"))
    c.close()
    result = CliRunner().invoke(audit, [
        str(tmp_path / "events"), "--out", str(tmp_path / "out"), "--json",
        "--redis", "redis://auditor:pw-S3cret@127.0.0.1:1/0"])
    assert result.exit_code == 3, result.output
    assert "pw-S3cret" not in result.output and "redis://auditor:***@127.0.0.1:1/0" in result.output
