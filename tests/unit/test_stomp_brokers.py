"""The STOMP broker facts: detection, capabilities, address mapping, SEND headers, counts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqguard import stomp_brokers
from mqguard.errors import AdapterError
from mqguard.message import Message, now_ms
from mqguard.stomp_brokers import (
    ACK_MODES,
    BROKER_CAPABILITIES,
    BROKER_MESSAGE_HEADERS,
    BROKERS,
    PREFETCH_HEADERS,
    QUEUE_PREFIX,
    RESERVED_SEND_HEADERS,
    SELECTOR_EXPIRES_HEADER,
    address_of,
    capabilities_of,
    destination_of,
    detect_broker,
    expired_selector,
    is_quorum_queue,
    native_delivery_count,
    send_headers,
)

# -- detection -------------------------------------------------------------------------------

#: CONNECTED ``server`` headers as the brokers send them: ActiveMQ 5.17 and RabbitMQ 3.10 as
#: read by tests/adapters/test_stomp_adapter.py, Artemis as its StompConnection.SERVER_NAME
#: builds it ("ActiveMQ-Artemis/" + full version + " ActiveMQ Artemis Messaging Engine").
SERVER_HEADERS = {
    "ActiveMQ/5.17.2": "activemq",
    "RabbitMQ/3.10.8": "rabbitmq",
    "ActiveMQ-Artemis/2.40.0 ActiveMQ Artemis Messaging Engine": "artemis",
}


@pytest.mark.parametrize(("server", "broker"), sorted(SERVER_HEADERS.items()))
def test_detects_each_broker_from_its_server_header(server: str, broker: str) -> None:
    assert detect_broker(server) == broker


@pytest.mark.parametrize("server", [None, "", "Apache/2.4", "mosquitto/2.0.11",
                                    "ActiveMQ5/5.17.2", "RabbitMQ-Streams/1.0"])
def test_anything_else_is_unknown(server: str | None) -> None:
    assert detect_broker(server) == "unknown"


def test_detection_reads_the_name_only() -> None:
    assert detect_broker("  rabbitmq/3.12.0") == "rabbitmq"
    assert detect_broker("ACTIVEMQ/6.1.0") == "activemq"
    assert detect_broker("ActiveMQ") == "activemq"


@given(st.text(max_size=40))
def test_detection_always_names_a_known_broker(server: str) -> None:
    assert detect_broker(server) in BROKERS


# -- capabilities ----------------------------------------------------------------------------


def test_every_broker_has_capabilities_and_unknown_promises_least() -> None:
    assert set(BROKER_CAPABILITIES) == set(BROKERS)
    unknown = BROKER_CAPABILITIES["unknown"]
    for broker in BROKERS:
        caps = BROKER_CAPABILITIES[broker]
        for flag in dataclasses.fields(caps):
            value = getattr(unknown, flag.name)
            if isinstance(value, bool) and value:
                assert getattr(caps, flag.name), f"{broker} lacks {flag.name}"


def test_capabilities_of_an_unlisted_broker_are_unknowns() -> None:
    assert capabilities_of("rabbitmq") is BROKER_CAPABILITIES["rabbitmq"]
    assert capabilities_of("mosquitto") is BROKER_CAPABILITIES["unknown"]


def test_the_facts_the_guard_relies_on() -> None:
    activemq, rabbitmq = BROKER_CAPABILITIES["activemq"], BROKER_CAPABILITIES["rabbitmq"]
    # ActiveMQ: NACK is a poison ack; no delivery count; scheduler; selector reaping.
    assert not activemq.nack_requeue and not activemq.native_delivery_count
    assert activemq.delayed_delivery and activemq.expiry_reaping == "selector"
    assert activemq.stable_message_id
    # RabbitMQ: NACK requeues; quorum queues count; message-id changes per delivery.
    assert rabbitmq.nack_requeue and rabbitmq.native_delivery_count
    assert not rabbitmq.stable_message_id and rabbitmq.expiry_reaping == "dead-letter"


def test_ack_modes_and_prefetch_headers() -> None:
    assert sorted(ACK_MODES) == ["auto", "client", "client-individual"]
    assert set(PREFETCH_HEADERS) == set(BROKERS)
    assert PREFETCH_HEADERS["unknown"] == (*PREFETCH_HEADERS["activemq"],
                                           *PREFETCH_HEADERS["rabbitmq"])


# -- addresses -------------------------------------------------------------------------------

_WORD = st.text(alphabet=st.sampled_from(list("abz09.-_*#é")), min_size=1, max_size=12)


@pytest.mark.parametrize(("address", "destination"), [
    ("orders", "/queue/orders"),
    ("orders.eu", "/queue/orders.eu"),
    ("/topic/prices", "/topic/prices"),
    ("/exchange/amq.topic/k", "/exchange/amq.topic/k"),
    ("/amq/queue/q", "/amq/queue/q"),
    ("/temp-queue/t", "/temp-queue/t"),
])
def test_address_and_destination(address: str, destination: str) -> None:
    assert destination_of(address) == destination
    assert address_of(destination) == address


@given(_WORD)
def test_a_plain_address_round_trips(address: str) -> None:
    destination = destination_of(address)
    assert destination == QUEUE_PREFIX + address
    assert address_of(destination) == address


@given(st.sampled_from(["/topic/", "/exchange/", "/amq/queue/", "/temp-queue/", "/queue/"]),
       _WORD)
def test_a_destination_round_trips(prefix: str, name: str) -> None:
    destination = prefix + name
    assert destination_of(address_of(destination)) == destination


def test_only_a_queue_destination_is_shortened() -> None:
    # RabbitMQ's /amq/queue/q names the same queue as /queue/q, yet it stays its own address.
    assert address_of("/amq/queue/orders") == "/amq/queue/orders"
    assert address_of("queue/orders") == "queue/orders"


def test_an_empty_address_has_no_destination() -> None:
    with pytest.raises(AdapterError, match="empty address"):
        destination_of("")


# -- SEND headers ----------------------------------------------------------------------------


def test_reserved_send_headers_are_refused() -> None:
    assert {"destination", "receipt", "transaction", "message-id"} <= RESERVED_SEND_HEADERS
    for name in sorted(RESERVED_SEND_HEADERS):
        with pytest.raises(AdapterError, match="reserved"):
            send_headers(Message(address="a", headers={name: "x"}), "activemq",
                         persistent=True)


@pytest.mark.parametrize("name", ["", "a:b", "a\nb", "a\\b"])
def test_header_names_stomp_cannot_carry_are_refused(name: str) -> None:
    with pytest.raises(AdapterError, match="cannot be sent over STOMP"):
        send_headers(Message(address="a", headers={name: "x"}), "rabbitmq", persistent=False)


def test_a_value_must_be_text() -> None:
    message = Message(address="a", headers={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(AdapterError, match="int, not str"):
        send_headers(message, "activemq", persistent=False)


def test_persistence_is_asked_for_and_the_application_may_say_otherwise() -> None:
    plain = Message(address="a", headers={"k": "v"})
    assert send_headers(plain, "rabbitmq", persistent=True) == {"k": "v", "persistent": "true"}
    assert send_headers(plain, "rabbitmq", persistent=False) == {"k": "v"}
    own = Message(address="a", headers={"persistent": "false"})
    assert send_headers(own, "activemq", persistent=True)["persistent"] == "false"


def test_expiration_per_broker() -> None:
    expires = now_ms() + 60_000
    message = Message(address="a", expiration=expires)
    activemq = send_headers(message, "activemq", persistent=False)
    assert activemq[SELECTOR_EXPIRES_HEADER] == str(expires)
    assert "expires" not in activemq  # the guard and its reaper expire it
    native = send_headers(message, "activemq", persistent=False, native_expiry=True)
    assert native["expires"] == str(expires)
    assert send_headers(message, "artemis", persistent=False)["expires"] == str(expires)
    relative = int(send_headers(message, "rabbitmq", persistent=False)["expiration"])
    assert 0 < relative <= 60_000
    unknown = send_headers(message, "unknown", persistent=False)
    assert not {"expires", "expiration", SELECTOR_EXPIRES_HEADER} & set(unknown)


def test_rabbitmq_never_gets_a_negative_expiration() -> None:
    message = Message(address="a", expiration=now_ms() - 5_000)
    assert send_headers(message, "rabbitmq", persistent=False)["expiration"] == "1"


def test_only_activemq_can_hold_a_message_back() -> None:
    message = Message(address="a", scheduled_delivery=now_ms() + 30_000)
    delay = int(send_headers(message, "activemq", persistent=False)["AMQ_SCHEDULED_DELAY"])
    assert 0 < delay <= 30_000
    for broker in ("rabbitmq", "artemis", "unknown"):
        with pytest.raises(AdapterError, match="no delayed delivery"):
            send_headers(message, broker, persistent=False)


def test_what_mqguard_adds_to_a_send_comes_back_as_broker_headers() -> None:
    # A re-sent message must not carry the broker's scheduling or expiry headers along.
    added = {"AMQ_SCHEDULED_DELAY", SELECTOR_EXPIRES_HEADER, "expires", "expiration",
             "persistent"}
    assert added <= BROKER_MESSAGE_HEADERS
    assert {"message-id", "subscription", "ack", "redelivered",
            "x-delivery-count"} <= BROKER_MESSAGE_HEADERS


def test_expired_selector_compares_with_a_long() -> None:
    assert expired_selector(1_700_000_000_000) == f"{SELECTOR_EXPIRES_HEADER} <= 1700000000000"
    # A small value would be an int literal, which ActiveMQ would compare as an int.
    assert expired_selector(5) == f"{SELECTOR_EXPIRES_HEADER} <= {1 << 32}"


# -- delivery counts -------------------------------------------------------------------------


def test_rabbitmq_quorum_queues_count_earlier_deliveries() -> None:
    assert is_quorum_queue({"x-queue-type": "quorum"})
    assert not is_quorum_queue({"x-queue-type": "classic"}) and not is_quorum_queue({})
    assert native_delivery_count("rabbitmq", {}, quorum=True) == 1
    assert native_delivery_count("rabbitmq", {"x-delivery-count": "1"}, quorum=True) == 2
    assert native_delivery_count("rabbitmq", {"x-delivery-count": "4"}, quorum=True) == 5


def test_no_count_where_the_broker_keeps_none() -> None:
    assert native_delivery_count("rabbitmq", {}, quorum=False) is None
    assert native_delivery_count("activemq", {"redelivered": "true"}, quorum=False) is None
    assert native_delivery_count("activemq", {}, quorum=True) is None
    assert native_delivery_count("rabbitmq", {"x-delivery-count": "x"}, quorum=False) is None


def test_public_names_are_listed() -> None:
    module = stomp_brokers
    public = {name for name, value in vars(module).items()
              if not name.startswith("_")
              and (name.isupper()
                   or (callable(value) and getattr(value, "__module__", "") == module.__name__))}
    assert public == set(module.__all__)
