"""Dead letters an operator can act on: list, show, retry, purge (``mqguard dlq``).

Works through the ordinary adapters on every broker mqguard fronts (ActiveMQ and RabbitMQ
over STOMP, Mosquitto over MQTT); see docs/dlq.md for each broker's particulars.

    >>> from mqguard.dlq import RetryOptions, retry
    >>> with Guard(config, role="dlq") as guard:
    ...     adapter = open_dlq_adapter(url, "orders.DLA"); adapter.connect()
    ...     result = retry(guard, adapter, "orders.DLA", RetryOptions(limit=100))
"""

from __future__ import annotations

from mqguard.dlq.duration import parse_duration
from mqguard.dlq.model import DEFAULT_PREVIEW_BYTES, DeadLetter, body_preview
from mqguard.dlq.purge import PurgeOptions, PurgeResult, purge
from mqguard.dlq.reader import attach, open_dlq_adapter, peek, session_client_id
from mqguard.dlq.retry import RetryOptions, RetryResult, bridge_id_of, retry, retry_copy
from mqguard.dlq.selection import Selection
from mqguard.dlq.summary import (
    AddressSummary,
    configured_addresses,
    is_dead_letter_address,
    summarize,
)

__all__ = ["DEFAULT_PREVIEW_BYTES", "AddressSummary", "DeadLetter", "PurgeOptions",
           "PurgeResult", "RetryOptions", "RetryResult", "Selection", "attach",
           "body_preview", "bridge_id_of", "configured_addresses", "is_dead_letter_address",
           "open_dlq_adapter",
           "parse_duration", "peek", "purge", "retry", "retry_copy", "session_client_id",
           "summarize"]
