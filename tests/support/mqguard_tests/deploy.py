"""Shared helpers of the offline checks of deploy/ (nothing here needs Docker or a cluster)."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import yaml

from mqguard.cli.sidecar import sidecar
from mqguard.config import MqguardConfig, parse_config
from mqguard.plugin_manager import make_plugin_manager

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file (empty ones dropped)."""
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def sidecar_options(args: list[str]) -> dict[str, Any]:
    """Parse ``mqguard sidecar`` arguments with the real click command: an option that does
    not exist, a missing required one or a bad value raises ``click.UsageError``."""
    context = sidecar.make_context("sidecar", list(args))
    return dict(context.params)


def hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def upstream(options: dict[str, Any]) -> tuple[str, int, str | None, str | None]:
    parts = urlsplit(options["upstream"])
    return parts.hostname or "", parts.port or 61613, parts.username, parts.password


def load_toml_text(text: str, source: str) -> MqguardConfig:
    """Validate a mqguard.toml as the sidecar does: the loader, then every plugin's table."""
    import tomllib

    config = parse_config(tomllib.loads(text), source)
    make_plugin_manager(config)  # plugins validate [plugins.<name>] in their configure hook
    return config


__all__ = ["DEPLOY", "REPO", "click", "hostport", "load_toml_text", "sidecar_options",
           "upstream", "yaml_documents"]


def assert_admin_on_loopback(options: dict[str, Any]) -> int:
    """The admin port (unauthenticated /metrics and /health) is bound to loopback: returns
    its port number."""
    host, port = hostport(options["admin"])
    assert host == "127.0.0.1", f"--admin {options['admin']}: bind it to loopback by default"
    return port


class FakeStompBroker:
    """A listening socket that answers every CONNECT with CONNECTED (enough for the
    sidecar's /health probe); :meth:`close` stops it. Nothing else of STOMP is spoken."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            with client:
                client.settimeout(5)
                data = b""
                try:
                    while b"\x00" not in data and (chunk := client.recv(4096)):
                        data += chunk
                    if data.lstrip(b"\r\n").startswith((b"CONNECT", b"STOMP")):
                        client.sendall(b"CONNECTED\nversion:1.2\n\n\x00")
                        client.recv(4096)  # DISCONNECT, or the close
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the thread (close() alone would leave the
        # socket listening until that accept returns).
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(5)
