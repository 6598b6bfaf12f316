"""Servers in Docker containers, for machines that have a Docker engine.

UNTESTED HERE: the development machine has a ``docker`` client but no engine and cannot pull
images, so this module has never run against a real daemon.  It is kept deliberately small;
the local launchers in this package are the reference.  Importing it never fails: ``docker``
and ``testcontainers`` are imported lazily and :func:`docker_available` answers False on any
error.

Differences from the local launchers that tests must tolerate:

* server logs are only copied to ``handle.log_path`` when the container is stopped;
* ``rabbitmqctl`` is unavailable (the helper needs the local node's environment);
* ``redis-cluster`` is not offered (cluster nodes announce container addresses the host cannot
  reach), so callers fall back to the local launcher for it;
* testcontainers' Ryuk reaper removes the containers when the Python process exits, so a
  container started here does not outlive its process the way a local server can.

Image tags can be overridden with ``MQGUARD_<KIND>_IMAGE`` (e.g. ``MQGUARD_ACTIVEMQ_IMAGE``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

from mqguard.servers.handle import ServerHandle, ServerUnavailable, make_state_dir
from mqguard.servers.ports import LOOPBACK

__all__ = [
    "DOCKER_KINDS",
    "container_running",
    "docker_available",
    "start_in_docker",
    "stop_container",
]

_PING_TIMEOUT = 2.0
_START_TIMEOUT = 180.0


@dataclass(frozen=True)
class _Spec:
    image: str
    ports: dict[str, int]  # url name -> container port
    schemes: dict[str, str]  # url name -> scheme
    ready_log: str
    command: str | None = None


_SPECS: dict[str, _Spec] = {
    "redis": _Spec(
        image="redis:7",
        ports={"redis": 6379},
        schemes={"redis": "redis"},
        ready_log="Ready to accept connections",
    ),
    "activemq": _Spec(
        image="apache/activemq-classic:5.17.6",
        ports={"stomp": 61613, "mqtt": 1883, "openwire": 61616},
        schemes={"stomp": "stomp", "mqtt": "mqtt", "openwire": "tcp"},
        ready_log=") started",
    ),
    "rabbitmq": _Spec(
        image="rabbitmq:3.10-management",
        ports={"stomp": 61613, "mqtt": 1883, "amqp": 5672},
        schemes={"stomp": "stomp", "mqtt": "mqtt", "amqp": "amqp"},
        ready_log="Server startup complete",
        # The official image only enables management; STOMP/MQTT must be enabled offline
        # before the entrypoint starts the node.
        command=(
            "sh -c 'rabbitmq-plugins enable --offline rabbitmq_stomp rabbitmq_mqtt "
            "&& exec docker-entrypoint.sh rabbitmq-server'"
        ),
    ),
    "mosquitto": _Spec(
        image="eclipse-mosquitto:2",
        ports={"mqtt": 1883},
        schemes={"mqtt": "mqtt"},
        ready_log=" running",
        # Mosquitto 2 listens on localhost only without a config; this file ships in the image.
        command="mosquitto -c /mosquitto-no-auth.conf",
    ),
}

DOCKER_KINDS: tuple[str, ...] = tuple(_SPECS)

_available: bool | None = None


def docker_available() -> bool:
    """True if a Docker engine answers a ping within ~2 s (cached; False on any error).

    ``MQGUARD_BACKEND=local`` forces False so a developer with Docker can still test the
    local launchers.
    """
    global _available
    if os.environ.get("MQGUARD_BACKEND", "").lower() == "local":
        return False
    if _available is None:
        _available = _ping()
    return _available


def _ping() -> bool:
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]

        client = docker.from_env(timeout=int(_PING_TIMEOUT))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _docker_client() -> Any:
    import docker  # type: ignore[import-untyped, unused-ignore]

    return docker.from_env(timeout=30)


def start_in_docker(kind: str) -> ServerHandle:
    """Start ``kind`` in a container with its ports published on 127.0.0.1 only."""
    spec = _SPECS.get(kind)
    if spec is None:
        raise ServerUnavailable(f"{kind} is not available in docker (kinds: {DOCKER_KINDS})")
    if not docker_available():
        raise ServerUnavailable("no reachable Docker engine")
    try:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs
    except ImportError as exc:
        raise ServerUnavailable(f"testcontainers is not installed: {exc}") from exc

    image = os.environ.get(f"MQGUARD_{kind.upper()}_IMAGE", spec.image)
    container = DockerContainer(image)
    if spec.command:
        container = container.with_command(spec.command)
    # (ip, None) = random host port on loopback only; testcontainers' with_bind_ports cannot
    # express a host IP, and the default would publish on 0.0.0.0.  The docker SDK accepts
    # the tuple even though testcontainers annotates the mapping as port numbers only.
    bindings: dict[str, Any] = container.ports
    for port in spec.ports.values():
        bindings[f"{port}/tcp"] = (LOOPBACK, None)
    t0 = time.monotonic()
    try:
        container.start()
        wait_for_logs(container, spec.ready_log, timeout=_START_TIMEOUT)
        urls = {
            name: f"{spec.schemes[name]}://{LOOPBACK}:{container.get_exposed_port(port)}"
            for name, port in spec.ports.items()
        }
    except Exception as exc:
        with contextlib.suppress(Exception):
            container.stop()
        raise ServerUnavailable(f"{kind} container ({image}) did not start: {exc}") from exc
    if kind == "redis":
        urls["redis"] += "/0"
    state_dir = make_state_dir(kind)
    handle = ServerHandle(
        kind=kind,
        urls=urls,
        pid=0,
        state_dir=state_dir,
        log_path=state_dir / "container.log",
        version=image.rsplit(":", 1)[-1],
        meta={
            "backend": "docker",
            "container_id": str(container.get_wrapped_container().id),
            "image": image,
            "start_seconds": f"{time.monotonic() - t0:.1f}",
        },
    )
    handle.save()
    return handle


def container_running(handle: ServerHandle) -> bool:
    """True while the handle's container exists and runs."""
    try:
        container = _docker_client().containers.get(handle.meta["container_id"])
        return str(container.status) == "running"
    except Exception:
        return False


def stop_container(handle: ServerHandle) -> None:
    """Save the container's log to ``handle.log_path``, then remove the container."""
    if handle.meta.get("stopped") == "true":
        return
    try:
        container = _docker_client().containers.get(handle.meta["container_id"])
    except Exception:
        handle.meta["stopped"] = "true"
        return
    with contextlib.suppress(Exception):
        handle.log_path.write_bytes(container.logs())
    with contextlib.suppress(Exception):
        container.remove(force=True)
    handle.meta["stopped"] = "true"
    with contextlib.suppress(OSError):
        handle.save()
