"""An MQTT sidecar on an event loop of its own thread (tests, benchmarks, the demo)."""

from __future__ import annotations

import asyncio
import threading

from mqguard.mqtt_sidecar.server import MqttSidecar

__all__ = ["MqttSidecarThread"]


class MqttSidecarThread:
    """Runs :class:`MqttSidecar` on a private asyncio loop; a context manager."""

    def __init__(self, sidecar: MqttSidecar) -> None:
        self.sidecar = sidecar
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mqguard-mqtt-sidecar",
                                        daemon=True)

    def start(self, timeout: float = 30.0) -> MqttSidecarThread:
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError("MQTT sidecar did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.sidecar.start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    @property
    def port(self) -> int:
        return self.sidecar.port

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop)
        try:
            future.result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> MqttSidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
