"""Finds adapters by URL scheme and plugins by name.

The core never imports a specific adapter or plugin module directly: it goes
through these tables (built-ins) and the ``mqguard.adapters`` / ``mqguard``
entry-point groups (third parties), so both kinds can be replaced or disabled.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlsplit

from mqguard.adapter import Adapter
from mqguard.errors import ConfigError

# Re-exported: adapters and plugins import the URL masking from here.
from mqguard.redact import redact_url as redact_url

__all__ = [
    "ADAPTER_ENTRY_POINT_GROUP",
    "BUILTIN_ADAPTERS",
    "BUILTIN_PLUGINS",
    "PLUGIN_ENTRY_POINT_GROUP",
    "adapter_factory",
    "load_target",
    "open_adapter",
    "redact_url",
]

#: URL scheme -> "module:factory". Each factory is called as ``factory(url, **options)``.
BUILTIN_ADAPTERS: dict[str, str] = {
    "stomp": "mqguard.adapters.stomp:StompAdapter",
    "stomp+ssl": "mqguard.adapters.stomp:StompAdapter",
    "mqtt": "mqguard.adapters.mqtt:MqttAdapter",
    "mqtts": "mqguard.adapters.mqtt:MqttAdapter",
}

#: Plugin name -> module, or "module:Class" (instantiated once per guard).
#: Registered in this order; later ones are called first (pluggy calls hook
#: implementations LIFO), unless they mark tryfirst/trylast.
BUILTIN_PLUGINS: dict[str, str] = {
    "logging": "mqguard.plugins.logging",
    "duplicate_detection": "mqguard.plugins.duplicate_detection:DuplicateDetectionPlugin",
    "delivery_counting": "mqguard.plugins.delivery_counting:DeliveryCountingPlugin",
    "consumer_audit": "mqguard.plugins.consumer_audit:ConsumerAuditPlugin",
    # After consumer_audit: both are tryfirst on before_deliver and pluggy calls the
    # later one first, so an expired message is expired even if it is also a duplicate.
    "expiry": "mqguard.plugins.expiry:ExpiryPlugin",
}

ADAPTER_ENTRY_POINT_GROUP = "mqguard.adapters"
PLUGIN_ENTRY_POINT_GROUP = "mqguard"


def load_target(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def adapter_factory(scheme: str) -> Any:
    if scheme in BUILTIN_ADAPTERS:
        return load_target(BUILTIN_ADAPTERS[scheme])
    for entry_point in entry_points(group=ADAPTER_ENTRY_POINT_GROUP):
        if entry_point.name == scheme:
            return entry_point.load()
    known = sorted({*BUILTIN_ADAPTERS, *(ep.name for ep in
                                         entry_points(group=ADAPTER_ENTRY_POINT_GROUP))})
    raise ConfigError(f"no adapter for URL scheme {scheme!r}; known: {', '.join(known)}")


def open_adapter(url: str, **options: Any) -> Adapter:
    """Create (not connect) the adapter for ``url``, e.g. ``stomp://127.0.0.1:61613``."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError:  # an unbalanced "[" or "]": the adapter refuses it, the URL masked
        scheme = url.partition("://")[0].lower() if "://" in url else ""
    if not scheme:
        raise ConfigError(f"broker URL {redact_url(url)!r} has no scheme (stomp://, mqtt://)")
    adapter: Adapter = adapter_factory(scheme)(url, **options)
    return adapter
