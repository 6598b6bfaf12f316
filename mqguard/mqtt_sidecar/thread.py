"""An MQTT sidecar on an event loop of its own thread (tests, benchmarks, the demo)."""

from __future__ import annotations

import asyncio

from mqguard.loopthread import LoopThread
from mqguard.mqtt_sidecar.server import MqttSidecar

__all__ = ["MqttSidecarThread"]


class MqttSidecarThread(LoopThread[MqttSidecar]):
    """Runs :class:`MqttSidecar` on a private asyncio loop; a context manager."""

    def __init__(self, sidecar: MqttSidecar) -> None:
        super().__init__(sidecar, asyncio.new_event_loop(), "mqguard-mqtt-sidecar")
