"""The MQTT sidecar as the integration tests run it: a config with the event log in the
test's directory, the sidecar on a thread of its own, and the events it wrote."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mqguard.config import MqguardConfig, parse_config
from mqguard.events import read_events
from mqguard.mqtt_sidecar.server import MqttSidecar
from mqguard.mqtt_sidecar.thread import MqttSidecarThread
from mqguard.servers import ServerHandle

__all__ = ["mqtt_sidecar_config", "running_mqtt_sidecar", "sidecar_events"]


def mqtt_sidecar_config(tmp_path: Path, node_id: str, *, address: dict[str, Any] | None = None,
                        sidecar: dict[str, Any] | None = None) -> MqguardConfig:
    """``address``: the settings of every address (`#`); ``sidecar``: [mqguard.sidecar]."""
    mqguard: dict[str, Any] = {"node-id": node_id,
                               "event-log": {"directory": str(tmp_path / "events"),
                                             "flush-interval-ms": 20}}
    if sidecar:
        mqguard["sidecar"] = dict(sidecar)
    return parse_config({"mqguard": mqguard, "address-settings": {"#": dict(address or {})}})


@contextmanager
def running_mqtt_sidecar(config: MqguardConfig, server: ServerHandle,
                         **options: Any) -> Iterator[MqttSidecarThread]:
    """The sidecar in front of ``server``'s MQTT listener (``options``: MqttSidecar's)."""
    sidecar = MqttSidecar(config, ("127.0.0.1", server.port("mqtt")), **options)
    with MqttSidecarThread(sidecar) as running:
        yield running


def sidecar_events(tmp_path: Path, proxy: MqttSidecarThread) -> list[dict[str, Any]]:
    """Every event the sidecar wrote so far (flushed first)."""
    proxy.sidecar.guard.events.flush()
    return list(read_events(tmp_path / "events"))
