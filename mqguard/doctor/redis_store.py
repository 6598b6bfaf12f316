"""Doctor checks of the Redis store: reachable, eviction off, persistence, Cluster slot
coverage, memory headroom for the duplicate-ID rings, and its clock (``TIME``).

Settings are read from ``INFO`` where Redis reports them there (``maxmemory_policy``,
``maxmemory``, ``aof_enabled``), so that a managed Redis that disables ``CONFIG`` is still
checked; only ``appendfsync`` needs ``CONFIG GET``. On a Cluster every primary is checked,
and a finding names the nodes it applies to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from mqguard.doctor.clock import Skew
from mqguard.doctor.config import RingBudget
from mqguard.doctor.model import Check, Status
from mqguard.redact import AMBIGUOUS_USERINFO, redact_text, redact_url, userinfo_is_ambiguous

__all__ = ["CLUSTER_SLOTS", "check_redis"]

CLUSTER_SLOTS = 16384
_TIMEOUTS: dict[str, Any] = {"socket_timeout": 3.0, "socket_connect_timeout": 2.0,
                             "decode_responses": True}


@dataclass(frozen=True, slots=True)
class _Node:
    name: str
    memory: dict[str, Any]
    persistence: dict[str, Any]
    appendfsync: str | None


def _open(url: str) -> redis.Redis | RedisCluster:
    scheme, _, rest = url.partition("://")
    if scheme.lower() in ("redis+cluster", "rediss+cluster"):
        base = "rediss" if scheme.lower().startswith("rediss") else "redis"
        netloc, sep, tail = rest.partition("/")
        auth, at, hosts = netloc.rpartition("@")
        first, *others = hosts.split(",")
        seeds = []
        for item in others:
            host, _, port = item.strip().rpartition(":")
            seeds.append(ClusterNode(host.strip("[]") or "localhost", int(port or 6379)))
        # Connect even with slots uncovered, so that cluster-slots can say which.
        opts = {**_TIMEOUTS, "require_full_coverage": False}
        if seeds:
            opts["startup_nodes"] = seeds
        return RedisCluster.from_url(f"{base}://{auth}{at}{first}{sep}{tail}", **opts)
    return redis.Redis.from_url(url, **_TIMEOUTS)


def _primaries(client: redis.Redis | RedisCluster) -> list[tuple[str, redis.Redis]]:
    if isinstance(client, RedisCluster):
        return [(node.name, client.get_redis_connection(node))
                for node in client.get_primaries()]
    kwargs = client.connection_pool.connection_kwargs
    name = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
    return [(str(name), client)]


def _read_node(name: str, conn: redis.Redis) -> _Node:
    memory = conn.info("memory")
    persistence = conn.info("persistence")
    try:
        fsync: str | None = conn.config_get("appendfsync").get("appendfsync")
    except RedisError:  # CONFIG renamed or refused (managed Redis)
        fsync = None
    return _Node(name, memory, persistence, fsync)


def _names(nodes: list[_Node]) -> str:
    return ", ".join(node.name for node in nodes)


def _eviction(nodes: list[_Node]) -> Check:
    bad = [n for n in nodes if n.memory.get("maxmemory_policy") != "noeviction"]
    if not bad:
        return Check("redis", "maxmemory-policy", Status.OK, "maxmemory-policy is noeviction",
                     data={"maxmemory-policy": "noeviction"})
    policies = sorted({str(n.memory.get("maxmemory_policy")) for n in bad})
    return Check(
        "redis", "maxmemory-policy", Status.ERROR,
        f"maxmemory-policy is {', '.join(policies)} on {_names(bad)}: an evicting policy "
        "silently forgets duplicate ids and delivery counts (duplicates pass, poison "
        "messages loop)",
        fix="set `maxmemory-policy noeviction` (redis.conf, or CONFIG SET maxmemory-policy "
            "noeviction then CONFIG REWRITE); a full Redis then refuses writes, which "
            "mqguard reports, instead of losing state",
        data={"maxmemory-policy": policies[0] if len(policies) == 1 else policies})


def _persistence(nodes: list[_Node]) -> Check:
    no_aof = [n for n in nodes if str(n.persistence.get("aof_enabled")) != "1"]
    if no_aof:
        rdb = all(int(n.persistence.get("rdb_last_save_time", 0) or 0) > 0 for n in no_aof)
        return Check(
            "redis", "persistence", Status.WARNING,
            f"appendonly is no on {_names(no_aof)}: a Redis restart loses the duplicate ids "
            "and delivery counts written since the last RDB snapshot"
            + ("" if rdb else " (no snapshot either)"),
            fix="set `appendonly yes` with `appendfsync everysec` (or `always` to lose "
                "nothing acknowledged)", data={"appendonly": "no"})
    lax = [n for n in nodes if n.appendfsync == "no"]
    if lax:
        return Check("redis", "persistence", Status.WARNING,
                     f"appendonly yes but appendfsync no on {_names(lax)}: the OS decides "
                     "when the AOF reaches the disk (up to ~30 s lost on a crash)",
                     fix="set `appendfsync everysec` (or `always`)",
                     data={"appendonly": "yes", "appendfsync": "no"})
    policies = sorted({n.appendfsync or "unknown" for n in nodes})
    detail = f"appendonly yes, appendfsync {', '.join(policies)}"
    if "everysec" in policies:
        detail += " (a machine crash may lose the last second of writes)"
    return Check("redis", "persistence", Status.OK, detail,
                 data={"appendonly": "yes", "appendfsync": policies[0]})


def _headroom(nodes: list[_Node], budget: RingBudget) -> Check:
    # Rings are spread over the primaries by hash slot (each address in one slot): each
    # primary is budgeted its share.
    need = budget.bytes // max(1, len(nodes))
    worst: tuple[float, _Node, int, int] | None = None
    for node in nodes:
        used = int(node.memory.get("used_memory", 0))
        limit = int(node.memory.get("maxmemory", 0)) or int(
            node.memory.get("total_system_memory", 0))
        free = max(0, limit - used)
        ratio = need / free if free else float("inf")
        if worst is None or ratio > worst[0]:
            worst = (ratio, node, free, limit)
    assert worst is not None
    ratio, node, free, limit = worst
    data = {"ring_addresses": budget.addresses, "ring_ids": budget.ids,
            "ring_bytes": budget.bytes, "node": node.name, "free_bytes": free,
            "limit_bytes": limit}
    what = (f"full duplicate-ID rings need ~{need / 2**20:.1f} MiB per primary "
            f"({budget.addresses} address(es), {budget.ids} ids x 25 bytes); "
            f"{node.name} has {free / 2**20:.1f} MiB free of "
            f"{'maxmemory' if int(node.memory.get('maxmemory', 0)) else 'system memory'}")
    if ratio > 1:
        return Check("redis", "memory-headroom", Status.ERROR, what,
                     fix="raise maxmemory (or add primaries) or lower id-cache-size", data=data)
    if ratio > 0.5:
        return Check("redis", "memory-headroom", Status.WARNING, what + " (over half)",
                     fix="raise maxmemory: delivery counts, audit windows and schedules need "
                         "room beside the rings", data=data)
    return Check("redis", "memory-headroom", Status.OK, what, data=data)


def _cluster(client: RedisCluster) -> Check:
    info = client.cluster_info()
    state = info.get("cluster_state")
    assigned = int(info.get("cluster_slots_assigned", 0))
    ok = int(info.get("cluster_slots_ok", 0))
    data = {"cluster_state": state, "slots_assigned": assigned, "slots_ok": ok}
    if state != "ok" or assigned < CLUSTER_SLOTS or ok < CLUSTER_SLOTS:
        return Check("redis", "cluster-slots", Status.ERROR,
                     f"cluster_state {state}, {assigned} of {CLUSTER_SLOTS} slots assigned, "
                     f"{ok} ok: addresses in uncovered slots fail every call",
                     fix="assign every slot and bring failed primaries back "
                         "(redis-cli --cluster fix / check)", data=data)
    return Check("redis", "cluster-slots", Status.OK,
                 f"all {CLUSTER_SLOTS} slots assigned and ok", data=data)


def _redis_time(conn: redis.Redis) -> Skew:
    t0 = time.time() * 1000
    seconds, micros = conn.time()
    t1 = time.time() * 1000
    return Skew.from_round_trip("redis", "TIME round trip", t0, t1,
                                seconds * 1000 + micros / 1000)


def _failure(url: str, step: str, exc: BaseException) -> Check:
    text = redact_text(f"{type(exc).__name__}: {exc}", url)
    return Check("redis", step, Status.ERROR, f"{redact_url(url)}: {step} failed: {text}",
                 fix="start Redis or correct --store / [mqguard] store; check its address, "
                     "port, password and TLS")


def _read_all(client: redis.Redis | RedisCluster) -> tuple[list[_Node], str, redis.Redis]:
    """Every primary's settings, the Redis version and one primary's connection."""
    client.ping()
    primaries = _primaries(client)
    nodes = [_read_node(name, conn) for name, conn in primaries]
    first = primaries[0][1]
    return nodes, str(first.info("server").get("redis_version", "?")), first


def check_redis(url: str, budget: RingBudget | None) -> tuple[list[Check], Skew | None]:
    """Every Redis check for the store at ``url``, and its clock skew when measured."""
    where = redact_url(url)
    if userinfo_is_ambiguous(url):
        return [Check("redis", "reachable", Status.ERROR, f"store URL {where}: "
                      f"{AMBIGUOUS_USERINFO}", fix="percent-encode the user name and "
                      "password in the store URL")], None
    errors = (RedisError, RedisClusterException, OSError, ValueError, IndexError)
    try:
        client = _open(url)
    except errors as exc:
        return [_failure(url, "reachable", exc)], None
    try:
        try:
            nodes, version, first = _read_all(client)
        except errors as exc:
            return [_failure(url, "reachable", exc)], None
        cluster = isinstance(client, RedisCluster)
        checks = [Check("redis", "reachable", Status.OK,
                        f"{where}: Redis {version}"
                        + (f", Cluster of {len(nodes)} primaries" if cluster else ""),
                        data={"version": version, "cluster": cluster,
                              "primaries": len(nodes)})]
        if isinstance(client, RedisCluster):
            try:
                checks.append(_cluster(client))
            except errors as exc:
                checks.append(_failure(url, "cluster-slots", exc))
        checks.append(_eviction(nodes))
        checks.append(_persistence(nodes))
        if budget is not None:
            checks.append(_headroom(nodes, budget))
        try:
            skew: Skew | None = _redis_time(first)
        except errors as exc:
            checks.append(_failure(url, "time", exc))
            skew = None
        return checks, skew
    finally:
        client.close()
