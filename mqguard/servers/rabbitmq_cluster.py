"""A local RabbitMQ cluster: three nodes on loopback, joined with ``rabbitmqctl join_cluster``.

Layout of the state dir (``mqguard-rabbitmq-cluster-*``)::

    handle.json      the cluster's ServerHandle (kind ``rabbitmq-cluster``)
    epmd.log         the one epmd every node registers with (started and owned by the cluster)
    node1/ node2/ node3/
                     each a complete single-node state dir (see :mod:`mqguard.servers.rabbitmq`)
                     with its own ``handle.json``, ports, Mnesia dir and log

Erlang nodes find each other through epmd, so the nodes of one cluster share one private epmd
(on its own loopback port) and one random Erlang cookie; each node has its own name
(``mqguard-c<port>-<i>@localhost``), distribution port and AMQP/STOMP/MQTT listeners.

The cluster handle's ``urls`` hold ``stomp``/``amqp``/``mqtt`` (node 1) and ``stomp-<i>``,
``amqp-<i>``, ``mqtt-<i>`` for every node ``i``; ``meta["nodes"]`` lists the nodes' state dirs.
Its PIDs are node 1 (main), the other nodes and epmd (last), so ``stop()`` ends the nodes
before their epmd.  :class:`RabbitMQCluster` adds what a test needs: a node's handle, SIGKILL
one node (:meth:`RabbitMQCluster.kill_node`) and start it again on the same ports
(:meth:`RabbitMQCluster.restart_node`), ``rabbitmqctl`` against any node.

A fresh cluster takes tens of seconds (three boots, two joins), a restarted node a few: the
measured figures are in docs/rabbitmq-cluster.md.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    format_failure,
    make_state_dir,
    spawn,
)
from mqguard.servers.install import ensure_installed, find_binary
from mqguard.servers.ports import LOOPBACK, free_ports, wait_for_port
from mqguard.servers.rabbitmq import rabbitmqctl, start_rabbitmq

__all__ = [
    "CLUSTER_KIND",
    "DEFAULT_NODES",
    "RabbitMQCluster",
    "running_from_eval",
    "start_rabbitmq_cluster",
]

CLUSTER_KIND = "rabbitmq-cluster"
DEFAULT_NODES = 3
_JOIN_TIMEOUT = 120.0


class RabbitMQCluster:
    """The nodes of a cluster started by :func:`start_rabbitmq_cluster` (indices from 1)."""

    def __init__(self, handle: ServerHandle) -> None:
        if handle.kind != CLUSTER_KIND:
            raise ValueError(f"not a {CLUSTER_KIND} handle: {handle.kind!r}")
        self.handle = handle
        self._nodes = [ServerHandle.load(d) for d in handle.meta["nodes"].split(",")]

    @classmethod
    def load(cls, state_dir: Path | str) -> RabbitMQCluster:
        """The cluster whose ``handle.json`` is in ``state_dir``."""
        return cls(ServerHandle.load(state_dir))

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self._nodes)

    def node(self, index: int) -> ServerHandle:
        """Handle of node ``index`` (1-based), as of its last (re)start."""
        if not 1 <= index <= len(self._nodes):
            raise IndexError(f"node {index}: the cluster has nodes 1..{len(self._nodes)}")
        return self._nodes[index - 1]

    def nodename(self, index: int) -> str:
        """Erlang node name of node ``index``, e.g. ``mqguard-c41234-2@localhost``."""
        return self.node(index).meta["nodename"]

    def stomp_url(self, index: int) -> str:
        """STOMP URL of node ``index``."""
        return self.node(index).urls["stomp"]

    def rabbitmqctl(self, index: int, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl ARGS`` against node ``index`` (stdout; raises on failure)."""
        return rabbitmqctl(self.node(index), *args, timeout=timeout)

    def running_nodes(self, index: int = 1) -> set[str]:
        """The node names that node ``index`` sees running in its cluster."""
        return running_from_eval(self.rabbitmqctl(index, "eval", "rabbit_nodes:all_running()."))

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index`` (its Erlang VM and helpers, by PID): a crash, no shutdown."""
        self.node(index).kill()

    def restart_node(self, index: int, *, timeout: float = _JOIN_TIMEOUT) -> ServerHandle:
        """Start a stopped or killed node again on its old ports and wait until it runs in
        the cluster again (seen by every other running node)."""
        old = self.node(index)
        if old.is_running():
            raise ServerStartError(f"node {index} ({old.meta['nodename']}) still runs")
        ports = {scheme: old.port(scheme) for scheme in ("amqp", "stomp", "mqtt")}
        ports["dist"] = int(old.meta["dist_port"])
        new = start_rabbitmq(old.state_dir, epmd_port=int(self.handle.meta["epmd_port"]),
                             ports=ports)
        self._nodes[index - 1] = new
        _set_pids(self.handle, self._nodes)
        self.wait_running(timeout)
        return new

    def wait_running(self, timeout: float = _JOIN_TIMEOUT) -> None:
        """Wait until every node's process runs and node 1..n all see every node running."""
        wanted = {self.nodename(i) for i in range(1, self.size + 1)}
        deadline = time.monotonic() + timeout
        seen: dict[int, set[str]] = {}
        while True:
            for i in range(1, self.size + 1):
                with contextlib.suppress(ServerStartError):
                    seen[i] = self.running_nodes(i)
            if all(seen.get(i) == wanted for i in range(1, self.size + 1)):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(format_failure(
                    f"cluster not complete after {timeout:g}s: wanted {sorted(wanted)}, "
                    f"seen {({i: sorted(s) for i, s in seen.items()})}",
                    *(n.log_path for n in self._nodes)))
            time.sleep(0.5)

def _set_pids(handle: ServerHandle, nodes: list[ServerHandle]) -> None:
    """Make the cluster handle own the nodes' current PIDs (node 1 main, epmd last)."""
    epmd = int(handle.meta["epmd_pid"])
    handle.pid = nodes[0].pid
    handle.extra_pids = [n.pid for n in nodes[1:]] + [epmd]
    for node in nodes:
        start = node.pid_start_times.get(str(node.pid))
        if start is not None:
            handle.pid_start_times[str(node.pid)] = start
    # Start times of PIDs that no longer belong to the cluster (a killed node's) go.
    keep = {str(p) for p in handle.all_pids()}
    handle.pid_start_times = {k: v for k, v in handle.pid_start_times.items() if k in keep}
    handle.save()


def running_from_eval(text: str) -> set[str]:
    """Node names in ``rabbitmqctl eval`` output such as ``['a@localhost','b@localhost']``."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    return {part.strip().strip("'") for part in inner.split(",") if part.strip()}


def start_rabbitmq_cluster(
    state_dir: Path | None = None, *, nodes: int = DEFAULT_NODES
) -> ServerHandle:
    """Start ``nodes`` RabbitMQ nodes on loopback and join them into one cluster.

    The nodes boot at the same time, each a single-node cluster; then nodes 2.. each do
    ``stop_app``, ``join_cluster <node 1>``, ``start_app``, one after the other.  The handle's main
    process is node 1; wrap it in :class:`RabbitMQCluster` to reach the other nodes.  A state
    dir is not restartable as a whole: start a new cluster, or restart single nodes.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    ensure_installed(["rabbitmq"])
    epmd_bin = find_binary("epmd")
    if epmd_bin is None:
        raise ServerStartError("epmd not found")
    sd = make_state_dir(CLUSTER_KIND, state_dir)
    if any(sd.glob("node*/handle.json")):
        raise ServerStartError(f"{sd} already holds a cluster; start a new one in a fresh dir")
    (epmd_port,) = free_ports(1)
    cookie = secrets.token_hex(20).upper()
    handle = ServerHandle(
        kind=CLUSTER_KIND, urls={}, pid=0, state_dir=sd, log_path=sd / "epmd.log",
        version="", meta={"epmd_port": str(epmd_port)},
    )
    node_handles: list[ServerHandle] = []
    began = time.monotonic()
    try:
        epmd = spawn([epmd_bin, "-port", str(epmd_port), "-address", LOOPBACK],
                     state_dir=sd, console_log=sd / "epmd.log")
        handle.record_pid(epmd.pid)
        handle.meta["epmd_pid"] = str(epmd.pid)
        handle.save()
        wait_for_port(LOOPBACK, epmd_port, 30.0, epmd, sd / "epmd.log")

        def boot(i: int) -> ServerHandle:
            return start_rabbitmq(sd / f"node{i}", epmd_port=epmd_port, cookie=cookie,
                                  nodename=f"mqguard-c{epmd_port}-{i}@localhost")

        # All nodes boot at once (a boot is mostly waiting); they join node 1 afterwards.
        with ThreadPoolExecutor(max_workers=nodes) as pool:
            futures = [pool.submit(boot, i) for i in range(1, nodes + 1)]
            errors: list[BaseException] = []
            for future in futures:
                try:
                    node_handles.append(future.result())
                except BaseException as exc:  # every booted node must be stopped below
                    errors.append(exc)
            if errors:
                raise errors[0]
        first = node_handles[0]
        target = first.meta["nodename"]
        for node in node_handles[1:]:
            _join(node, target)
        for i, node in enumerate(node_handles, start=1):
            for scheme in ("stomp", "amqp", "mqtt"):
                handle.urls[f"{scheme}-{i}"] = node.urls[scheme]
        handle.urls = {**{s: first.urls[s] for s in ("stomp", "amqp", "mqtt")}, **handle.urls}
        handle.meta["nodes"] = ",".join(str(n.state_dir) for n in node_handles)
        handle.log_path = first.log_path
        handle.version = first.version
        _set_pids(handle, node_handles)
        RabbitMQCluster(handle).wait_running()
        handle.meta["start_seconds"] = f"{time.monotonic() - began:.1f}"
        handle.save()
    except BaseException:
        for node in reversed(node_handles):
            with contextlib.suppress(Exception):
                node.stop(timeout=10.0)
        handle.stop(timeout=10.0)
        raise
    return handle


def _join(node: ServerHandle, target: str) -> None:
    """Make ``node`` (a running, empty single node) a member of ``target``'s cluster."""
    rabbitmqctl(node, "stop_app", timeout=_JOIN_TIMEOUT)
    try:
        rabbitmqctl(node, "join_cluster", target, timeout=_JOIN_TIMEOUT)
    except ServerStartError as exc:
        raise ServerStartError(format_failure(
            f"{node.meta['nodename']} could not join {target}: {exc}", node.log_path)) from exc
    rabbitmqctl(node, "start_app", timeout=_JOIN_TIMEOUT)

