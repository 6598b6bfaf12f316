"""Built-in broker adapters, installed as ``mqguard.adapters.<protocol>``.

* :mod:`mqguard.adapters.stomp` -- :class:`~mqguard.adapters.stomp.StompAdapter`, STOMP 1.2
  over stomp.py, for ActiveMQ Classic 5.x, RabbitMQ 3.x (``rabbitmq_stomp``) and, by
  declaration only, ActiveMQ Artemis. URLs ``stomp://`` and ``stomp+ssl://``.
* :mod:`mqguard.adapters.mqtt` -- :class:`~mqguard.adapters.mqtt.MqttAdapter`, MQTT 5 (or 3.1.1)
  over paho-mqtt 2, for Mosquitto 2.x and other MQTT brokers. URLs ``mqtt://`` and ``mqtts://``.

Adapters are found by URL scheme through :mod:`mqguard.registry`; nothing in the core imports
these modules directly. Each implements :class:`mqguard.adapter.Adapter` and states what its
broker can do in :class:`mqguard.adapter.Capabilities`; the module docstrings record the
broker behaviour those flags rest on (verified against the real servers by the tests in
``tests/adapters``).
"""
