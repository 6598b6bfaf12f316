"""``mqguard sidecar --protocol mqtt``: the guard in front of an MQTT broker (docs/sidecar-mqtt.md).

The sockets and the MQTT session state live in the native extension (``MqttPlane``);
:mod:`.plane` turns its events into calls, :mod:`.bridge` makes those calls into the
guard's batch API, :mod:`.server` runs the whole.
"""

__all__: list[str] = []
