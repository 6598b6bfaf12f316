"""Address settings: Artemis defaults, inheritance from less specific matches."""

from __future__ import annotations

from mqguard.config import parse_config
from mqguard.settings import AddressSettings


def repo(tables: dict[str, dict[str, object]], **core: object):
    return parse_config({"address-settings": tables, "mqguard": core}).address_settings_repository()


def test_artemis_defaults() -> None:
    s = repo({}).resolve("any.address")
    assert s == AddressSettings()
    assert (s.max_delivery_attempts, s.id_cache_size, s.redelivery_delay) == (10, 20000, 0)
    assert s.redelivery_delay_multiplier == 1.0
    assert s.max_redelivery_delay == 0  # 10 x redelivery-delay
    assert s.redelivery_collision_avoidance_factor == 0.0
    assert (s.expiry_delay, s.min_expiry_delay, s.max_expiry_delay) == (-1, -1, -1)
    assert s.dead_letter_queue_prefix == "DLQ." and s.expiry_queue_prefix == "EXP."
    assert not s.auto_create_queues and not s.auto_create_dead_letter_resources
    assert not s.auto_create_expiry_resources and not s.auto_create_addresses
    assert s.redistribution_delay == -1
    assert s.dead_letter_address is None and s.expiry_address is None


def test_most_specific_wins_and_inherits_unset_values() -> None:
    r = repo({
        "#": {"max-delivery-attempts": 7, "dead-letter-address": "DLA"},
        "orders.#": {"max-delivery-attempts": 3, "redelivery-delay": 100},
        "orders.eu": {"redelivery-delay": 250},
    })
    eu = r.resolve("orders.eu")
    assert eu.redelivery_delay == 250  # exact key
    assert eu.max_delivery_attempts == 3  # inherited from orders.#
    assert eu.dead_letter_address == "DLA"  # inherited from #
    assert eu.max_redelivery_delay == 2500  # derived from the resolved delay
    us = r.resolve("orders.us")
    assert (us.redelivery_delay, us.max_delivery_attempts) == (100, 3)
    assert r.resolve("payments").max_delivery_attempts == 7


def test_explicit_max_redelivery_delay_is_kept() -> None:
    s = repo({"a": {"redelivery-delay": 10, "max-redelivery-delay": 15}}).resolve("a")
    assert s.max_redelivery_delay == 15


def test_global_id_cache_size_applies_unless_overridden() -> None:
    r = repo({"big.#": {"id-cache-size": 50000}}, **{"id-cache-size": 100})
    assert r.resolve("small").id_cache_size == 100
    assert r.resolve("big.x").id_cache_size == 50000


def test_queue_name_helpers() -> None:
    s = repo({"#": {"dead-letter-queue-suffix": ".dlq"}}).resolve("x")
    assert s.dead_letter_queue_for("orders") == "DLQ.orders.dlq"
    assert s.expiry_queue_for("orders") == "EXP.orders"


def test_resolution_is_cached() -> None:
    r = repo({"#": {"max-delivery-attempts": 2}})
    assert r.resolve("a") is r.resolve("a")
