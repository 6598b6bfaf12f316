"""Real servers for tests and benchmarks: Redis (standalone and cluster), ActiveMQ Classic,
RabbitMQ (one node or a cluster), Mosquitto and ActiveMQ Artemis, started as background
processes on free 127.0.0.1 ports.

Each server keeps its config, data and logs in its own state dir under the system temp dir
(``mqguard-<kind>-*``) and is described by a :class:`ServerHandle`, which also knows how to stop
it (only ever the processes it started).  Packages are installed from Debian on demand
(:func:`ensure_installed`; Artemis, which Debian lacks, from Maven Central).  ``python -m
mqguard.servers`` is the command-line front end.

>>> with start("redis") as h:          # doctest: +SKIP
...     print(h.urls["redis"])
redis://127.0.0.1:41234/0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mqguard.servers.activemq import restart_activemq, start_activemq
from mqguard.servers.artemis import reload_artemis_config, restart_artemis, start_artemis
from mqguard.servers.docker import docker_available, start_in_docker
from mqguard.servers.handle import ServerHandle, ServerStartError, ServerUnavailable
from mqguard.servers.install import KINDS, ensure_installed
from mqguard.servers.mosquitto import start_mosquitto
from mqguard.servers.ports import free_port, free_ports, wait_for_port
from mqguard.servers.rabbitmq import rabbitmqctl, start_rabbitmq
from mqguard.servers.rabbitmq_cluster import start_rabbitmq_cluster
from mqguard.servers.redis import restart_redis, start_redis, start_redis_cluster

__all__ = [
    "KINDS",
    "ServerHandle",
    "ServerStartError",
    "ServerUnavailable",
    "docker_available",
    "ensure_installed",
    "free_port",
    "free_ports",
    "rabbitmqctl",
    "reload_artemis_config",
    "restart_activemq",
    "restart_artemis",
    "restart_redis",
    "start",
    "start_activemq",
    "start_artemis",
    "start_in_docker",
    "start_mosquitto",
    "start_rabbitmq",
    "start_rabbitmq_cluster",
    "start_redis",
    "start_redis_cluster",
    "wait_for_port",
]

_LAUNCHERS: dict[str, Callable[..., ServerHandle]] = {
    "redis": start_redis,
    "redis-cluster": start_redis_cluster,
    "activemq": start_activemq,
    "rabbitmq": start_rabbitmq,
    "rabbitmq-cluster": start_rabbitmq_cluster,
    "mosquitto": start_mosquitto,
    "artemis": start_artemis,
}


def start(kind: str, **kw: Any) -> ServerHandle:
    """Start a local server of ``kind`` (one of :data:`KINDS`); ``kw`` go to its launcher.

    All launchers accept ``state_dir``; see each ``start_*`` function for the rest.
    """
    try:
        launcher = _LAUNCHERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown server kind {kind!r}; expected one of {', '.join(KINDS)}"
        ) from None
    return launcher(**kw)
