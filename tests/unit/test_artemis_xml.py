"""mqguard.toml rendered as Artemis broker.xml: what is rendered, what is noted, how it applies."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqguard.artemis_xml import (
    MANAGEMENT_ADDRESS_SETTING,
    SEMANTIC_NOTES,
    apply_to_broker_xml,
    not_rendered,
    render_broker_xml,
)
from mqguard.cli import main
from mqguard.config import MqguardConfig, parse_config

NS = {"a": "urn:activemq:core"}

CONFIG = {
    "mqguard": {"store": "memory", "id-cache-size": 5000, "message-expiry-scan-period": 250},
    "address-settings": {
        "#": {"max-delivery-attempts": 5, "redelivery-delay": 100,
              "redelivery-delay-multiplier": 2, "dead-letter-address": "DLA"},
        "orders.*": {"id-cache-size": 0, "auto-create-dead-letter-resources": True,
                     "expiry-delay": 60000},
    },
    "plugins": {"size_limit": {"max-bytes": 10}},
}

# What `artemis create` writes, cut down to the parts apply_to_broker_xml touches.
BROKER_XML = """<?xml version='1.0'?>
<configuration xmlns="urn:activemq">
   <core xmlns="urn:activemq:core">
      <name>0.0.0.0</name>
      <id-cache-size>20000</id-cache-size>
      <address-settings>
         <address-setting match="#">
            <dead-letter-address>DLQ</dead-letter-address>
            <expiry-address>ExpiryQueue</expiry-address>
         </address-setting>
      </address-settings>
   </core>
</configuration>
"""


def config() -> MqguardConfig:
    return parse_config(CONFIG, "mqguard.toml")


def entries(core: ET.Element) -> dict[str, dict[str, str]]:
    found = core.find("a:address-settings", NS)
    assert found is not None
    return {e.attrib["match"]: {child.tag.split("}")[1]: child.text or "" for child in e}
            for e in found.findall("a:address-setting", NS)}


def test_only_the_keys_a_table_sets_are_rendered_with_their_names() -> None:
    core = ET.fromstring(render_broker_xml(config()).split("\n", 1)[1])
    assert core.findtext("a:id-cache-size", namespaces=NS) == "5000"
    assert core.findtext("a:message-expiry-scan-period", namespaces=NS) == "250"
    assert entries(core) == {
        "#": {"max-delivery-attempts": "5", "redelivery-delay": "100",
              "redelivery-delay-multiplier": "2.0", "dead-letter-address": "DLA"},
        "orders.*": {"id-cache-size": "0", "auto-create-dead-letter-resources": "true",
                     "expiry-delay": "60000"},
    }


def test_settings_without_an_artemis_counterpart_are_named() -> None:
    assert not_rendered(config()) == ["[mqguard] store", "[plugins.size_limit]"]
    assert not_rendered(MqguardConfig()) == []
    text = render_broker_xml(config())
    assert "Not rendered, no Artemis counterpart: [mqguard] store, [plugins.size_limit]" in text
    # A key whose effect differs between the two sides carries its note.
    assert SEMANTIC_NOTES["auto-create-dead-letter-resources"] in text


def test_content_duplicate_ids_are_named_not_rendered() -> None:
    dedup = parse_config({"address-settings": {"sensors.#": {
        "duplicate-id-from": "content", "duplicate-id-headers": ["device"],
        "max-delivery-attempts": 3}}}, "mqguard.toml")
    text = render_broker_xml(dedup)
    assert entries(ET.fromstring(text.split("\n", 1)[1])) == {
        "sensors.#": {"max-delivery-attempts": "3"}}
    assert not_rendered(dedup) == ['[address-settings."sensors.#"] duplicate-id-from',
                                   '[address-settings."sensors.#"] duplicate-id-headers']


def test_special_characters_are_escaped() -> None:
    cfg = parse_config({"address-settings": {'a"<b>&.#': {"dead-letter-address": "x&<y>"}}})
    core = ET.fromstring(render_broker_xml(cfg).split("\n", 1)[1])
    assert entries(core) == {'a"<b>&.#': {"dead-letter-address": "x&<y>"}}


def test_apply_replaces_the_address_settings_and_keeps_management() -> None:
    out = apply_to_broker_xml(BROKER_XML, config())
    core = ET.fromstring(out).find("a:core", NS)
    assert core is not None
    got = entries(core)
    assert list(got) == ["activemq.management#", "#", "orders.*"]
    assert got["#"]["dead-letter-address"] == "DLA"
    assert "expiry-address" not in got["#"]  # artemis create's ExpiryQueue is gone
    # The global value is set; the per-address one inside <address-setting> is untouched.
    assert core.findtext("a:id-cache-size", namespaces=NS) == "5000"
    assert got["orders.*"]["id-cache-size"] == "0"
    assert core.findtext("a:message-expiry-scan-period", namespaces=NS) == "250"
    assert core.findtext("a:name", namespaces=NS) == "0.0.0.0"
    assert "activemq.management#" in MANAGEMENT_ADDRESS_SETTING


def test_apply_is_idempotent_and_reverts_to_defaults() -> None:
    once = apply_to_broker_xml(BROKER_XML, config())
    assert apply_to_broker_xml(once, config()) == once
    core = ET.fromstring(apply_to_broker_xml(once, MqguardConfig())).find("a:core", NS)
    assert core is not None
    assert list(entries(core)) == ["activemq.management#"]
    assert core.findtext("a:id-cache-size", namespaces=NS) == "20000"


def test_cli_prints_writes_and_applies(tmp_path: Path) -> None:
    toml = tmp_path / "mqguard.toml"
    toml.write_text('[mqguard]\nstore = "memory"\n\n'
                    '[address-settings."orders.#"]\nmax-delivery-attempts = 3\n')
    runner = CliRunner()
    printed = runner.invoke(main, ["config", "broker-xml", str(toml)])
    assert printed.exit_code == 0, printed.output
    assert "<max-delivery-attempts>3</max-delivery-attempts>" in printed.stdout
    assert "not rendered (no Artemis counterpart): [mqguard] store" in printed.stderr

    out = tmp_path / "out.xml"
    written = runner.invoke(main, ["config", "broker-xml", str(toml), "--output", str(out)])
    assert written.exit_code == 0
    assert out.read_text() == printed.stdout

    broker = tmp_path / "broker.xml"
    broker.write_text(BROKER_XML)
    applied = runner.invoke(main, ["config", "broker-xml", str(toml), "--into", str(broker)])
    assert applied.exit_code == 0
    assert broker.read_text() == apply_to_broker_xml(BROKER_XML, parse_config(
        {"mqguard": {"store": "memory"},
         "address-settings": {"orders.#": {"max-delivery-attempts": 3}}}))

    both = runner.invoke(main, ["config", "broker-xml", str(toml), "--output", str(out),
                                "--into", str(broker)])
    assert both.exit_code == 2 and "exclusive" in both.output


def test_cli_names_the_bad_key(tmp_path: Path) -> None:
    toml = tmp_path / "mqguard.toml"
    toml.write_text('[address-settings."q"]\nmax-delivery-attempts = "many"\n')
    result = CliRunner().invoke(main, ["config", "broker-xml", str(toml)])
    assert result.exit_code == 1
    assert "max-delivery-attempts" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("content", "message"), [
    (b"not xml", "not well-formed XML (syntax error: line 1, column 0)"),
    (b'<configuration xmlns="urn:activemq"><x/></configuration>', "broker.xml has no </core>"),
    (b"\xff\xfe<core/>", "not UTF-8 text"),
])
def test_cli_refuses_a_broker_xml_it_cannot_apply_to_and_leaves_it(
        tmp_path: Path, content: bytes, message: str) -> None:
    toml = tmp_path / "mqguard.toml"
    toml.write_text('[address-settings."q"]\nmax-delivery-attempts = 3\n')
    broker = tmp_path / "broker.xml"
    broker.write_bytes(content)
    result = CliRunner().invoke(main, ["config", "broker-xml", str(toml), "--into", str(broker)])
    assert result.exit_code == 1
    assert f"{broker}: {message}" in result.output
    assert broker.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker.xml", "mqguard.toml"]


def test_cli_names_an_output_it_cannot_write(tmp_path: Path) -> None:
    toml = tmp_path / "mqguard.toml"
    toml.write_text('[address-settings."q"]\nmax-delivery-attempts = 3\n')
    out = tmp_path / "missing" / "out.xml"
    result = CliRunner().invoke(main, ["config", "broker-xml", str(toml), "-o", str(out)])
    assert result.exit_code == 1
    assert f"{out}: cannot write: No such file or directory" in result.output
