"""A local RabbitMQ 3.10 node (Debian's ``rabbitmq-server``) with the STOMP and MQTT plugins.

``/usr/sbin/rabbitmq-server`` switches to the ``rabbitmq`` user and reads ``/etc/rabbitmq``;
instead the scripts in ``/usr/lib/rabbitmq/bin`` run with an environment that points every
path into the state dir: a private ``HOME`` (its ``.erlang.cookie`` is shared by the server and
the CLI tools), an empty ``rabbitmq-env.conf``, a private node name, and a private epmd on its
own loopback port, started by us so that we can end it by PID (the system-wide epmd on port
4369, if any, is never touched).  ``rabbitmq-env.json`` in the state dir records that
environment so a later process (the CLI's ``stop``) can talk to the node again.

Facts that matter to tests (stomp.py 9):

* stomp.py must be given ``vhost='/'``; otherwise it sends ``host:127.0.0.1``, which RabbitMQ
  takes as the vhost name, and CONNECT fails.
* ``message-id`` is the per-delivery ack id and changes on redelivery; a SEND may not carry
  ``message-id`` (ERROR frame): use ``amqp-message-id`` or a custom header.
* ``redelivered`` is always present; NACK requeues at once unless ``requeue:false``.
* Quorum queues (``x-queue-type:quorum`` on SUBSCRIBE) expose ``x-delivery-count``;
  ``x-delivery-limit`` needs a policy (see :func:`rabbitmqctl`), a header is ignored.
* Per-message TTL is the ``expiration`` header (relative ms); dead-lettered copies carry
  ``x-first-death-reason`` and ``x-first-death-queue``.
* MQTT 3.1.1 only (no MQTT 5 in 3.10).  Anonymous MQTT logins map to guest.

Log lines look like ``2026-11-21 15:05:53.236261+00:00 [info] <0.223.0> msg`` and are written
to ``log/<node>.log`` (``handle.log_path``).  First boot takes 10-15 s, a restart ~4 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from mqguard.servers.handle import (
    ServerHandle,
    ServerStartError,
    format_failure,
    make_state_dir,
    spawn,
)
from mqguard.servers.install import RABBITMQ_BIN, ensure_installed, find_binary
from mqguard.servers.ports import LOOPBACK, free_ports, port_open, wait_for_port

__all__ = ["rabbitmqctl", "shutdown_node", "start_rabbitmq"]

_START_TIMEOUT = 120
_ENV_FILE = "rabbitmq-env.json"
_PLUGINS = ("rabbitmq_stomp", "rabbitmq_mqtt")
_VERSION = re.compile(r"Starting RabbitMQ (\S+)")


def _clean_base_env() -> dict[str, str]:
    # Inherited RABBITMQ_*/ERL_* variables (from a developer's shell or a CI image) would
    # silently override the private paths and ports below.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_", "ERLANG_"))
    }
    # The Elixir-based CLI tools warn (and mangle non-ASCII) under a latin1 locale.
    env.setdefault("LC_ALL", "C.UTF-8")
    env.setdefault("LANG", "C.UTF-8")
    return env


def _node_env(sd: Path, nodename: str, epmd_port: int, dist_port: int) -> dict[str, str]:
    return {
        "HOME": str(sd / "home"),
        "RABBITMQ_CONF_ENV_FILE": str(sd / "rabbitmq-env.conf"),
        "RABBITMQ_NODENAME": nodename,
        "RABBITMQ_CONFIG_FILE": str(sd / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(sd / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(sd / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(sd / "mnesia"),
        "RABBITMQ_LOG_BASE": str(sd / "log"),
        "RABBITMQ_PID_FILE": str(sd / "rabbitmq.pid"),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_ADDRESS": LOOPBACK,
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }


def _saved_env(sd: Path) -> dict[str, str]:
    try:
        data = json.loads((sd / _ENV_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def _full_env(overrides: dict[str, str]) -> dict[str, str]:
    env = _clean_base_env()
    env.update(overrides)
    return env


def _run_cli(
    tool: str, env: dict[str, str], args: list[str], timeout: float, what: str
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(RABBITMQ_BIN / tool), *args],
            env=env,
            cwd=env["HOME"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServerStartError(
            f"{what}: {tool} {' '.join(args)} timed out after {timeout}s"
        ) from exc


def rabbitmqctl(handle: ServerHandle, *args: str, timeout: float = 60.0) -> str:
    """Run ``rabbitmqctl ARGS`` against the node of ``handle`` and return its stdout.

    Example: ``rabbitmqctl(h, "set_policy", "--apply-to", "queues", "limit", "^q\\.",
    '{"delivery-limit": 3}')``.  Raises :class:`ServerStartError` on a non-zero exit.
    """
    saved = _saved_env(handle.state_dir)
    if not saved:
        raise ServerStartError(f"no {_ENV_FILE} in {handle.state_dir}: not a local RabbitMQ")
    result = _run_cli("rabbitmqctl", _full_env(saved), list(args), timeout, "rabbitmqctl")
    if result.returncode != 0:
        raise ServerStartError(
            f"rabbitmqctl {' '.join(args)} exited with {result.returncode}:\n"
            f"{result.stdout}{result.stderr}"
        )
    return result.stdout


def shutdown_node(handle: ServerHandle, timeout: float = 60.0) -> None:
    """Orderly ``rabbitmqctl shutdown`` (waits for the node's OS process to exit).

    Errors are swallowed: :meth:`ServerHandle.stop` falls back to signals by PID.
    """
    saved = _saved_env(handle.state_dir)
    if not saved:
        return
    with contextlib.suppress(ServerStartError):
        _run_cli("rabbitmqctl", _full_env(saved), ["shutdown"], timeout, "rabbitmqctl shutdown")


def _write_files(sd: Path, amqp: int, stomp: int, mqtt: int, cookie_value: str | None) -> None:
    home = sd / "home"
    home.mkdir(parents=True, exist_ok=True)
    for d in ("mnesia", "log"):
        (sd / d).mkdir(exist_ok=True)
    cookie = home / ".erlang.cookie"
    if not cookie.exists():
        # Erlang refuses a cookie readable by others; a random one keeps other local users
        # (and other mqguard nodes) from attaching to this node.  The nodes of one cluster
        # must share theirs (``cookie_value``).
        cookie.write_text(cookie_value or secrets.token_hex(20).upper())
        cookie.chmod(0o400)
    (sd / "rabbitmq-env.conf").write_text("# empty on purpose: keeps /etc/rabbitmq out\n")
    (sd / "rabbitmq.conf").write_text(
        "\n".join(
            [
                f"listeners.tcp.1 = {LOOPBACK}:{amqp}",
                f"stomp.listeners.tcp.1 = {LOOPBACK}:{stomp}",
                f"mqtt.listeners.tcp.1 = {LOOPBACK}:{mqtt}",
                "stomp.default_user = guest",
                "stomp.default_pass = guest",
                "mqtt.allow_anonymous = true",
                "mqtt.default_user = guest",
                "mqtt.default_pass = guest",
                # The default (50% of RAM... or 2 GB free) blocks publishers on small CI disks.
                "disk_free_limit.absolute = 50MB",
                "log.console = false",
                "log.file.level = info",
            ]
        )
        + "\n"
    )


def _server_version(log: Path) -> str:
    try:
        match = _VERSION.search(log.read_text(errors="replace"))
    except OSError:
        match = None
    if match:
        return match.group(1)
    libs = sorted((RABBITMQ_BIN.parent / "lib").glob("rabbitmq_server-*"))
    return libs[-1].name.split("-", 1)[1] if libs else "3.10"


def start_rabbitmq(
    state_dir: Path | None = None,
    *,
    epmd_port: int | None = None,
    cookie: str | None = None,
    nodename: str | None = None,
    ports: Mapping[str, int] | None = None,
) -> ServerHandle:
    """Start a RabbitMQ node with AMQP, STOMP and MQTT listeners on 127.0.0.1.

    Reusing the ``state_dir`` of a stopped node restarts the same node (same name and
    cookie, so the Mnesia data and durable queues survive) on new ports, or on ``ports``
    (``{"amqp": P, "stomp": P, "mqtt": P, "dist": P}``, e.g. a crashed node's old ones, so
    that clients configured with its address find it again).

    The members of a cluster (:mod:`mqguard.servers.rabbitmq_cluster`) share one epmd and one
    Erlang cookie: ``epmd_port`` names an epmd that already runs (the node then starts none
    and its handle does not own it), ``cookie`` the cookie a new state dir gets, ``nodename``
    the node's name on first start.
    """
    ensure_installed(["rabbitmq"])
    epmd_bin = find_binary("epmd")
    if epmd_bin is None:
        raise ServerStartError("epmd not found")
    sd = make_state_dir("rabbitmq", state_dir)
    # The CLI tools take distribution ports from a range of their own (35672-35682 by
    # default), so only the node needs one here.
    shared_epmd = epmd_port is not None
    if ports is not None:
        amqp, stomp, mqtt, dist_port = (ports["amqp"], ports["stomp"], ports["mqtt"],
                                        ports["dist"])
        spare = [] if shared_epmd else free_ports(1)
    else:
        amqp, stomp, mqtt, dist_port, *spare = free_ports(4 if shared_epmd else 5)
    epmd_port = epmd_port if epmd_port is not None else spare[0]
    previous = _saved_env(sd)
    nodename = previous.get("RABBITMQ_NODENAME") or nodename or f"mqguard-{amqp}@localhost"
    overrides = _node_env(sd, nodename, epmd_port, dist_port)
    _write_files(sd, amqp, stomp, mqtt, cookie)
    (sd / _ENV_FILE).write_text(json.dumps(overrides, indent=2, sort_keys=True) + "\n")
    env = _full_env(overrides)
    pid_file = sd / "rabbitmq.pid"
    pid_file.unlink(missing_ok=True)
    log = sd / "log" / f"{nodename}.log"
    console = sd / "console.log"

    handle = ServerHandle(
        kind="rabbitmq",
        urls={
            "stomp": f"stomp://{LOOPBACK}:{stomp}",
            "mqtt": f"mqtt://{LOOPBACK}:{mqtt}",
            "amqp": f"amqp://{LOOPBACK}:{amqp}",
        },
        pid=0,
        state_dir=sd,
        log_path=log,
        version="",
        meta={"nodename": nodename, "epmd_port": str(epmd_port), "dist_port": str(dist_port)},
    )
    try:
        # Our own epmd, started before any Erlang VM: a VM that finds no epmd on
        # ERL_EPMD_PORT daemonizes one itself, which we could then not stop by PID.
        if shared_epmd:
            if not port_open(LOOPBACK, epmd_port):
                raise ServerStartError(f"no epmd answers on {LOOPBACK}:{epmd_port}")
        else:
            epmd = spawn(
                [epmd_bin, "-port", str(epmd_port), "-address", LOOPBACK],
                state_dir=sd,
                env=env,
                console_log=sd / "epmd.log",
            )
            handle.record_pid(epmd.pid)
            handle.save()
            wait_for_port(LOOPBACK, epmd_port, 30.0, epmd, sd / "epmd.log")

        result = _run_cli(
            "rabbitmq-plugins", env, ["enable", "--offline", *_PLUGINS], 120.0, "plugins"
        )
        if result.returncode != 0:
            raise ServerStartError(
                f"rabbitmq-plugins enable failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )

        server = spawn([str(RABBITMQ_BIN / "rabbitmq-server")], state_dir=sd, env=env)
        handle.pid = server.pid
        handle.record_pid(server.pid, extra=False)
        handle.save()
        _wait_booted(env, pid_file, server, [log, console])
        # `rabbitmqctl wait` returns once the rabbit app runs; plugin listeners are normally
        # up by then, but checking costs nothing and gives a precise error if one failed.
        for port in (amqp, stomp, mqtt):
            wait_for_port(LOOPBACK, port, 30.0, server, [log, console])
    except BaseException:
        handle.stop(timeout=10.0)
        raise
    handle.version = _server_version(log)
    handle.save()
    return handle


def _wait_booted(
    env: dict[str, str], pid_file: Path, server: subprocess.Popen[bytes], logs: list[Path]
) -> None:
    """``rabbitmqctl wait``, but abandoned as soon as the server process dies.

    On its own, ``rabbitmqctl wait`` keeps waiting for the full timeout when the node crashes
    before writing its pid file (e.g. a port already taken), which would hide the real error
    for two minutes.
    """
    ctl = subprocess.Popen(
        [
            str(RABBITMQ_BIN / "rabbitmqctl"),
            "wait",
            "--timeout",
            str(_START_TIMEOUT),
            str(pid_file),
        ],
        env=env,
        cwd=env["HOME"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + _START_TIMEOUT + 15
    try:
        while ctl.poll() is None:
            if server.poll() is not None:
                raise ServerStartError(
                    format_failure(
                        f"RabbitMQ exited with code {server.returncode} while booting", *logs
                    )
                )
            if time.monotonic() > deadline:
                raise ServerStartError(format_failure("rabbitmqctl wait hung", *logs))
            time.sleep(0.2)
    finally:
        if ctl.poll() is None:
            ctl.kill()
        output = ctl.communicate()[0].decode(errors="replace") if ctl.stdout else ""
    if ctl.returncode != 0:
        raise ServerStartError(
            format_failure(f"rabbitmqctl wait failed ({ctl.returncode}):\n{output}", *logs)
        )
    if not port_open(LOOPBACK, int(env["ERL_EPMD_PORT"])):
        raise ServerStartError(format_failure("private epmd vanished during boot", *logs))
