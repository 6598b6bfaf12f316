"""Reading the facts mqguard relies on from an ActiveMQ Classic ``activemq.xml``.

ActiveMQ 5 shows none of them over STOMP: ``schedulerSupport`` is an attribute of
``<broker>`` (default false), ``persistJMSRedelivered`` and ``maxPageSize`` (default 200) are
attributes of the ``<policyEntry>`` that applies to a queue (``queue=">"`` applies to all).
Without JMX or Jolokia the configuration file is the only source for the last two.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_MAX_PAGE_SIZE", "ActiveMQConfig", "read_activemq_xml"]

#: ActiveMQ's default ``maxPageSize`` (PolicyEntry).
DEFAULT_MAX_PAGE_SIZE = 200


@dataclass(frozen=True, slots=True)
class ActiveMQConfig:
    """What mqguard needs to know from ``activemq.xml``."""

    scheduler_support: bool
    #: ``persistJMSRedelivered`` of the policy for every queue (``queue=">"``).
    persist_jms_redelivered: bool
    #: ``maxPageSize`` of that policy (the default when it sets none).
    max_page_size: int


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def read_activemq_xml(path: str | Path) -> ActiveMQConfig:
    """Parse ``path``; ValueError naming the file when it is not an ActiveMQ configuration.

    Spring property placeholders (``${...}``) are not resolved: such a value reads as unset.
    """
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"{path}: cannot read ActiveMQ configuration: {exc}") from None
    brokers = [e for e in root.iter() if _local(e.tag) == "broker"]
    if not brokers:
        raise ValueError(f"{path}: no <broker> element: not an ActiveMQ configuration")
    broker = brokers[0]
    persist, page = False, DEFAULT_MAX_PAGE_SIZE
    for entry in broker.iter():
        if _local(entry.tag) != "policyEntry" or entry.get("queue") != ">":
            continue
        persist = _true(entry.get("persistJMSRedelivered"))
        raw = entry.get("maxPageSize")
        if raw is not None and raw.strip().isdigit():
            page = int(raw)
    return ActiveMQConfig(scheduler_support=_true(broker.get("schedulerSupport")),
                          persist_jms_redelivered=persist, max_page_size=page)
