"""Doctor checks of an MQTT broker (Mosquitto): it answers, its version (``$SYS``), and
persistence.

Mosquitto 2.0 publishes its version as the retained ``$SYS/broker/version``, which a new
subscription receives at once. Whether ``persistence`` is on shows nowhere over MQTT (no
``$SYS`` topic, and behaviour would need a restart), so it is read from ``mosquitto.conf``
when ``--broker-config`` gives it. Mosquitto shows no clock either (``$SYS`` has uptime only):
the skew to it is not measured.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from urllib.parse import unquote

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqguard.doctor.model import Check, Status
from mqguard.redact import redact_text, redact_url, split_server_url

__all__ = ["check_mqtt_broker", "mosquitto_persistence"]

_PORTS = {"mqtt": 1883, "mqtts": 8883}
_TIMEOUT = 5.0
_VERSION_TOPIC = "$SYS/broker/version"
_SYS_WAIT = 2.0


def mosquitto_persistence(path: str | Path) -> bool:
    """``persistence`` in ``mosquitto.conf`` at ``path`` (the last setting wins; off by
    default). ValueError naming the file when it cannot be read."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read Mosquitto configuration: {exc}") from None
    value = False
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "persistence":
            value = words[1].lower() in ("true", "1", "yes", "on")
    return value


def _connect_and_version(url: str) -> str:
    parts, host, port = split_server_url(url, _PORTS, what="MQTT URL")
    client = mqtt.Client(CallbackAPIVersion.VERSION2,
                         client_id=f"mqguard-doctor-{uuid.uuid4().hex[:8]}")
    if parts.username:
        client.username_pw_set(unquote(parts.username),
                               unquote(parts.password) if parts.password else None)
    if parts.scheme == "mqtts":
        client.tls_set()
    connected, got = threading.Event(), threading.Event()
    version: list[str] = []
    failure: list[str] = []

    def on_connect(c: mqtt.Client, userdata: object, flags: object, reason: object,
                   properties: object) -> None:
        if getattr(reason, "is_failure", False):
            failure.append(f"connection refused: {reason}")
        else:
            c.subscribe(_VERSION_TOPIC, qos=0)
        connected.set()

    def on_message(c: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        version.append(message.payload.decode("utf-8", "replace"))
        got.set()

    client.on_connect = on_connect
    client.on_message = on_message
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        if not connected.wait(_TIMEOUT):
            raise TimeoutError(f"no CONNACK within {_TIMEOUT:.0f} s")
        if not failure:
            # Retained, so Mosquitto sends it at once; other brokers have no $SYS.
            got.wait(_SYS_WAIT)
    finally:
        client.disconnect()
        client.loop_stop()
    if failure:
        raise ConnectionError(failure[0])
    return version[0] if version else f"an MQTT broker without {_VERSION_TOPIC}"


def check_mqtt_broker(url: str, *, broker_config: str | None) -> list[Check]:
    """Every check of the MQTT broker at ``url``."""
    where = redact_url(url)
    try:
        server = _connect_and_version(url)
    except (OSError, ValueError, TimeoutError) as exc:
        return [Check("broker", "reachable", Status.ERROR,
                      f"{where}: {redact_text(f'{type(exc).__name__}: {exc}', url)}",
                      fix="start the broker or correct --url (host, port, credentials)")]
    checks = [Check("broker", "kind", Status.OK, f"{where}: {server}",
                    data={"kind": "mosquitto" if "mosquitto" in server else "mqtt",
                          "server": server})]
    if broker_config is None:
        checks.append(Check("broker", "persistence", Status.SKIPPED,
                            "not visible over MQTT",
                            fix="pass --broker-config PATH/mosquitto.conf to check it"))
        return checks
    try:
        on = mosquitto_persistence(broker_config)
    except ValueError as exc:
        return [*checks, Check("broker", "broker-config", Status.ERROR, str(exc),
                               fix="give --broker-config the broker's mosquitto.conf")]
    checks.append(
        Check("broker", "persistence", Status.OK, f"{broker_config}: persistence true")
        if on else
        Check("broker", "persistence", Status.ERROR,
              f"{broker_config}: persistence is off: a restart loses queued QoS 1 messages, "
              "the dead-letter topic's included",
              fix="set `persistence true` and `persistence_location` in mosquitto.conf"))
    return checks
