"""mqguard's address settings as Apache ActiveMQ Artemis ``broker.xml``.

mqguard takes its address-settings vocabulary from Artemis, so every key of an
``[address-settings."<match>"]`` table has an ``<address-setting>`` element of the same name,
and the match keys use the same wildcards (``#``, ``*``, ``.``-separated words). Only the
values written in ``mqguard.toml`` are rendered: what a table leaves unset is inherited from
less specific matches, down to the built-in defaults, in Artemis as in mqguard (whose defaults
are Artemis's). The global ``[mqguard] id-cache-size`` and ``message-expiry-scan-period`` become
the ``<core>`` elements of the same names.

:func:`render_broker_xml` is what ``mqguard config broker-xml`` prints: a ``<core>`` element
whose children go inside the ``<core>`` of a ``broker.xml``. :func:`apply_to_broker_xml` puts
them into an existing ``broker.xml`` (the local Artemis of :mod:`mqguard.servers` does this for
the instance it creates), replacing its ``<address-settings>`` so that the broker sees exactly
what ``mqguard.toml`` says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from mqguard.config import MqguardConfig
from mqguard.settings import AddressSettingsTable

__all__ = [
    "ADDRESS_SETTINGS_WITHOUT_ARTEMIS",
    "CORE_ELEMENTS",
    "MANAGEMENT_ADDRESS_SETTING",
    "SEMANTIC_NOTES",
    "address_settings_element",
    "apply_to_broker_xml",
    "core_values",
    "not_rendered",
    "render_broker_xml",
    "set_core_element",
]

#: ``[mqguard]`` keys that are Artemis ``<core>`` elements of the same name.
CORE_ELEMENTS: tuple[str, ...] = ("id-cache-size", "message-expiry-scan-period")

#: Keys rendered as written whose effect differs between the two sides; each rendered
#: entry that sets one carries the note as an XML comment.
SEMANTIC_NOTES: dict[str, str] = {
    "auto-create-dead-letter-resources": (
        "Artemis creates the queue <prefix><address><suffix> on the dead-letter address, "
        "filtered on _AMQ_ORIG_ADDRESS; mqguard sends dead letters to that queue by name"),
    "auto-create-expiry-resources": (
        "Artemis creates the queue <prefix><address><suffix> on the expiry address, "
        "filtered on _AMQ_ORIG_ADDRESS; mqguard sends expired messages to that queue by name"),
    "redistribution-delay": (
        "Artemis redistributes between cluster nodes; mqguard between the nodes of a "
        "[mqguard.groups] broker group"),
    "auto-create-queues": "Artemis acts on it; mqguard accepts it and does not use it yet",
    "auto-create-addresses": "Artemis acts on it; mqguard accepts it and does not use it yet",
    "send-to-dla-on-no-route": "Artemis acts on it; mqguard accepts it and does not use it yet",
}

#: Artemis needs its management address to auto-create its reply queues; ``artemis create``
#: writes this entry and a ``broker.xml`` rendered for a rig keeps it.
MANAGEMENT_ADDRESS_SETTING = """<address-setting match="activemq.management#">
   <dead-letter-address>DLQ</dead-letter-address>
   <expiry-address>ExpiryQueue</expiry-address>
   <redelivery-delay>0</redelivery-delay>
   <max-size-bytes>-1</max-size-bytes>
   <message-counter-history-day-limit>10</message-counter-history-day-limit>
   <address-full-policy>PAGE</address-full-policy>
   <auto-create-queues>true</auto-create-queues>
   <auto-create-addresses>true</auto-create-addresses>
</address-setting>"""

#: Address-settings keys that are mqguard's extensions (content-based duplicate ids):
#: Artemis's schema has no such element and refuses a broker.xml that has one, so they are
#: listed in the notes instead of rendered.
ADDRESS_SETTINGS_WITHOUT_ARTEMIS: frozenset[str] = frozenset(
    {"duplicate-id-from", "duplicate-id-headers"})

# [mqguard] keys with no Artemis counterpart, in the order the notes list them.
_CORE_ONLY: tuple[str, ...] = ("node_id", "store", "disabled_plugins", "event_log", "sidecar",
                               "groups")


@dataclass(frozen=True)
class _Entry:
    match: str
    values: list[tuple[str, str]]


def _xml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(str(value))


def _entry(match: str, table: AddressSettingsTable) -> _Entry:
    # Only what the table writes: Artemis merges address settings by match specificity
    # just as mqguard does, so unset values must stay unset on both sides.
    values = [(name.replace("_", "-"), _xml_value(value))
              for name, value in table.model_dump(exclude_none=True).items()
              if name.replace("_", "-") not in ADDRESS_SETTINGS_WITHOUT_ARTEMIS]
    return _Entry(match, values)


def _comment(text: str) -> str:
    # "--" may not appear inside an XML comment.
    return f"<!-- {text.replace('--', '- -')} -->"


def address_settings_element(config: MqguardConfig, *, indent: str = "   ",
                             keep_management: bool = False) -> str:
    """The ``<address-settings>`` element for ``config``'s tables, in file order.

    ``keep_management`` adds Artemis's own ``activemq.management#`` entry (for a complete
    ``broker.xml``; a fragment for a user to merge leaves it out).
    """
    lines = ["<address-settings>"]
    if keep_management:
        lines += [indent + line for line in MANAGEMENT_ADDRESS_SETTING.splitlines()]
    for match, table in config.address_settings.items():
        entry = _entry(match, table)
        lines.append(f"{indent}<address-setting match={quoteattr(entry.match)}>")
        for name, value in entry.values:
            if name in SEMANTIC_NOTES:
                lines.append(f"{indent * 2}{_comment(SEMANTIC_NOTES[name])}")
            lines.append(f"{indent * 2}<{name}>{value}</{name}>")
        lines.append(f"{indent}</address-setting>")
    lines.append("</address-settings>")
    return "\n".join(lines)


def core_values(config: MqguardConfig) -> dict[str, str]:
    """The ``<core>`` elements (besides ``<address-settings>``) rendered from ``[mqguard]``."""
    return {
        "id-cache-size": str(config.core.id_cache_size),
        "message-expiry-scan-period": str(config.core.message_expiry_scan_period),
    }


def not_rendered(config: MqguardConfig) -> list[str]:
    """The settings ``config`` sets that have no Artemis counterpart (not rendered)."""
    notes = [f"[mqguard] {name.replace('_', '-')}"
             for name in _CORE_ONLY if name in config.core.model_fields_set]
    notes += [f"[address-settings.{json.dumps(match)}] {name.replace('_', '-')}"
              for match, table in config.address_settings.items()
              for name in table.model_dump(exclude_none=True)
              if name.replace("_", "-") in ADDRESS_SETTINGS_WITHOUT_ARTEMIS]
    notes += [f"[plugins.{name}]" for name in config.plugins]
    return notes


def render_broker_xml(config: MqguardConfig, *, indent: str = "   ") -> str:
    """A ``<core>`` element holding what goes inside the ``<core>`` of a ``broker.xml``."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        _comment(f"Rendered by `mqguard config broker-xml` from {config.source}. Copy the "
                 "children of <core> into the <core> of broker.xml; an <address-settings> "
                 "there is replaced, not merged."),
    ]
    skipped = not_rendered(config)
    if skipped:
        lines.append(_comment("Not rendered, no Artemis counterpart: " + ", ".join(skipped)))
    lines.append('<core xmlns="urn:activemq:core">')
    for name, value in core_values(config).items():
        lines.append(f"{indent}<{name}>{value}</{name}>")
    lines += [indent + line for line in address_settings_element(config, indent=indent)
              .splitlines()]
    lines.append("</core>")
    return "\n".join(lines) + "\n"


_ADDRESS_SETTINGS = re.compile(r"[ \t]*<address-settings\b.*?</address-settings>", re.S)
_CORE_END = re.compile(r"[ \t]*</core>")


def set_core_element(broker_xml: str, name: str, value: str) -> str:
    """Set ``<name>value</name>`` directly in ``<core>``: replaced if present, else added."""
    element = re.compile(rf"<{re.escape(name)}>[^<]*</{re.escape(name)}>")
    if element.search(broker_xml):
        return element.sub(f"<{name}>{escape(value)}</{name}>", broker_xml, count=1)
    end = _CORE_END.search(broker_xml)
    if end is None:
        raise ValueError("broker.xml has no </core>")
    insert = f"      <{name}>{escape(value)}</{name}>\n"
    return broker_xml[:end.start()] + insert + broker_xml[end.start():]


def apply_to_broker_xml(broker_xml: str, config: MqguardConfig) -> str:
    """``broker_xml`` with ``config``'s address settings and ``<core>`` values applied.

    The ``<address-settings>`` element is replaced as a whole (Artemis's management entry
    kept), so what ``artemis create`` wrote for ``#`` (a ``DLQ`` and ``ExpiryQueue`` for
    every address) does not mix with ``mqguard.toml``.
    """
    element = address_settings_element(config, keep_management=True)
    block = "\n".join("      " + line for line in element.splitlines())
    # The <core> values are set while the address settings are out of the text: an
    # <address-setting> may hold an <id-cache-size> of its own.
    placeholder = "<!-- mqguard:address-settings -->"
    if _ADDRESS_SETTINGS.search(broker_xml):
        out = _ADDRESS_SETTINGS.sub(placeholder, broker_xml, count=1)
    else:
        end = _CORE_END.search(broker_xml)
        if end is None:
            raise ValueError("broker.xml has no </core>")
        out = broker_xml[:end.start()] + placeholder + "\n" + broker_xml[end.start():]
    for name, value in core_values(config).items():
        out = set_core_element(out, name, value)
    return out.replace(placeholder, block, 1)
