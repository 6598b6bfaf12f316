"""mqguard: Artemis-grade delivery guarantees for existing STOMP and MQTT brokers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from mqguard.hookspecs import hookimpl

try:
    __version__ = version("mqguard")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "hookimpl"]


def __getattr__(name: str) -> object:
    # Lazy public API: importing ``mqguard`` for ``hookimpl`` (what every plugin
    # does) must not import the pipeline, pydantic and the stores.
    lazy = {
        "Guard": "mqguard.pipeline",
        "SendResult": "mqguard.pipeline",
        "GuardedProducer": "mqguard.producer",
        "GuardedConsumer": "mqguard.consumer",
        "Message": "mqguard.message",
        "Verdict": "mqguard.verdict",
        "Action": "mqguard.verdict",
        "AckReason": "mqguard.verdict",
        "HookContext": "mqguard.context",
        "MqguardConfig": "mqguard.config",
        "load_config": "mqguard.config",
        "MemoryStore": "mqguard.stores",
        "open_store": "mqguard.stores",
        "open_adapter": "mqguard.registry",
        "Nack": "mqguard.errors",
    }
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module 'mqguard' has no attribute {name!r}")
