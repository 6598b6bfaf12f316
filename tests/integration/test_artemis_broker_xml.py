"""One mqguard.toml drives Artemis too: rendered names are Artemis's, and a setting takes effect."""

from __future__ import annotations

import queue
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from mqguard_tests.artemis_stomp import artemis_stomp

from mqguard.artemis_xml import ADDRESS_SETTINGS_WITHOUT_ARTEMIS, CORE_ELEMENTS
from mqguard.servers import ServerHandle
from mqguard.servers.artemis_dist import artemis_home
from mqguard.settings import AddressSettingsTable
from mqguard.testing.artemis import ApplyConfig

pytestmark = pytest.mark.artemis

XS = "{http://www.w3.org/2001/XMLSchema}"


def xsd_elements(type_name: str) -> set[str]:
    """Element names allowed in the complex type ``type_name`` of Artemis's own schema."""
    schema = ET.parse(artemis_home() / "schema" / "artemis-configuration.xsd").getroot()
    for complex_type in schema.iter(f"{XS}complexType"):
        if complex_type.get("name") == type_name:
            return {e.attrib["name"] for e in complex_type.iter(f"{XS}element")
                    if "name" in e.attrib}
    raise AssertionError(f"{type_name} not in the schema")


@pytest.mark.parametrize("name", [f.replace("_", "-")
                                  for f in AddressSettingsTable.model_fields
                                  if f.replace("_", "-") not in ADDRESS_SETTINGS_WITHOUT_ARTEMIS])
def test_every_address_settings_key_is_an_artemis_element(
        mqguard_artemis_server: ServerHandle, name: str) -> None:
    # The rendering writes each key under its own name: that is only right while Artemis's
    # schema knows every one of them.
    assert name in xsd_elements("addressSettingType")


def test_the_extensions_are_exactly_the_keys_artemis_lacks(
        mqguard_artemis_server: ServerHandle) -> None:
    keys = {f.replace("_", "-") for f in AddressSettingsTable.model_fields}
    assert keys - xsd_elements("addressSettingType") == ADDRESS_SETTINGS_WITHOUT_ARTEMIS


def test_the_core_elements_are_artemis_elements(mqguard_artemis_server: ServerHandle) -> None:
    assert set(CORE_ELEMENTS) <= xsd_elements("configurationType")


def test_max_delivery_attempts_dead_letters_on_artemis(
        mqguard_artemis_server: ServerHandle, mqguard_artemis_config: ApplyConfig,
        mqguard_unique_name: str, tmp_path: Path) -> None:
    address, dla = mqguard_unique_name, f"{mqguard_unique_name}-dla"
    toml = tmp_path / "mqguard.toml"
    toml.write_text(f'[address-settings."{address}"]\nmax-delivery-attempts = 2\n'
                    f'dead-letter-address = "{dla}"\n')
    mqguard_artemis_config(toml)

    with artemis_stomp(mqguard_artemis_server) as watcher:
        # The dead-letter address must exist (Artemis does not create it on a move), so it
        # is subscribed to before anything can be dead-lettered.
        watcher.subscribe(f"/queue/{dla}", "dla")
        watcher.send(f"/queue/{address}", "poison", "r1")
        redelivered = []
        for _ in range(2):  # two deliveries, each ended by a disconnect without ACK
            with artemis_stomp(mqguard_artemis_server) as consumer:
                consumer.subscribe(f"/queue/{address}", "s", ack="client-individual")
                frame = consumer.next()
                assert frame.body == "poison"
                redelivered.append(frame.headers["redelivered"])
        dead = watcher.next()
        with artemis_stomp(mqguard_artemis_server) as consumer:
            consumer.subscribe(f"/queue/{address}", "s", ack="client-individual")
            with pytest.raises(queue.Empty):
                consumer.next(timeout=1.0)
    assert redelivered == ["false", "true"]
    assert dead.body == "poison"
    assert dead.headers["_AMQ_ORIG_ADDRESS"] == address
    assert dead.headers["_AMQ_ORIG_QUEUE"] == address
