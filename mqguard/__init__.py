"""mqguard: Artemis-grade delivery guarantees for existing STOMP and MQTT brokers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from mqguard.hookspecs import hookimpl

if TYPE_CHECKING:
    # Type checkers see the real classes; at run time the same names load on first use
    # (``__getattr__`` below), so ``import mqguard`` for ``hookimpl`` stays cheap.
    from mqguard.config import MqguardConfig, load_config
    from mqguard.consumer import GuardedConsumer
    from mqguard.context import HookContext
    from mqguard.errors import Nack
    from mqguard.message import Message
    from mqguard.pipeline import Guard, SendDecision, SendResult
    from mqguard.producer import GuardedProducer
    from mqguard.registry import open_adapter
    from mqguard.stores import MemoryStore, open_store
    from mqguard.verdict import AckReason, Action, Verdict

try:
    __version__ = version("mqguard")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "AckReason",
    "Action",
    "Guard",
    "GuardedConsumer",
    "GuardedProducer",
    "HookContext",
    "MemoryStore",
    "Message",
    "MqguardConfig",
    "Nack",
    "SendDecision",
    "SendResult",
    "Verdict",
    "__version__",
    "hookimpl",
    "load_config",
    "open_adapter",
    "open_store",
]

#: Where each lazily loaded public name lives.
_LAZY: dict[str, str] = {
    "Guard": "mqguard.pipeline",
    "SendDecision": "mqguard.pipeline",
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

if not TYPE_CHECKING:
    # Hidden from type checkers: they resolve the names imported above, and a name that
    # is not public stays an error instead of typing as whatever this returns.

    def __getattr__(name: str) -> object:
        # Lazy public API: importing ``mqguard`` for ``hookimpl`` (what every plugin
        # does) must not import the pipeline, pydantic and the stores.
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'mqguard' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
