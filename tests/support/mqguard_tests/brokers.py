"""The brokers the integration tests run against, and how a test gets one's URL.

Used with ``@pytest.mark.parametrize("<fixture>", BROKERS, indirect=True)``: each param is
(server kind, URL scheme), marked with the kind so ``-m`` can select brokers.
"""

from __future__ import annotations

import pytest

BROKERS = [
    pytest.param(("activemq", "stomp"), marks=pytest.mark.activemq, id="activemq"),
    pytest.param(("rabbitmq", "stomp"), marks=pytest.mark.rabbitmq, id="rabbitmq"),
    pytest.param(("mosquitto", "mqtt"), marks=pytest.mark.mosquitto, id="mosquitto"),
]
STOMP_BROKERS = BROKERS[:2]


def broker_of(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(kind, URL) of the broker a test is parametrized with; starts its server fixture."""
    kind, scheme = request.param
    return kind, request.getfixturevalue(f"mqguard_{kind}_server").urls[scheme]
