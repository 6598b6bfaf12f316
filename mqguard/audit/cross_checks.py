"""The checks that need an input besides the event log: Redis state and broker logs.

:func:`prepare` reads them (Redis in parallel by Spark partitions, broker logs
one task per file) and returns the findings to write with the event-log
findings, the figures for the summary, and a cleanup. The runner calls it only
when ``--redis`` or ``--broker-log`` was given, so an event-log-only audit pays
nothing for it. These checks read the event files a second time with the few
extra fields they need (``duplicate_id``, ``broker_message_id``, ``reason``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from mqguard.audit.broker_logs import (
    BROKER_CLASSES,
    BrokerLogs,
    broker_findings,
    expand_broker_logs,
    read_broker_logs,
)
from mqguard.audit.checks import FindingClass
from mqguard.audit.redis_state import RedisState, read_state, state_summary
from mqguard.audit.state_checks import (
    STATE_CLASSES,
    StateCheckOptions,
    load_state_events,
    state_findings,
)
from mqguard.config import MqguardConfig
from mqguard.stores.redis import DEFAULT_NAMESPACE

#: Every class these checks may report (registered with the summary).
CROSS_CLASSES: tuple[FindingClass, ...] = (*STATE_CLASSES, *BROKER_CLASSES)


@dataclass(frozen=True)
class CrossInputs:
    """What ``--redis`` / ``--broker-log`` asked for."""

    redis_url: str | None = None
    redis_namespace: str = DEFAULT_NAMESPACE
    broker_logs: Sequence[str] = ()
    #: Events of different processes (and broker log lines) this close may be in either order.
    tolerance_ms: int = 2000

    @property
    def wanted(self) -> bool:
        return bool(self.redis_url or self.broker_logs)


@dataclass
class CrossChecks:
    findings: DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    _cleanup: list[Callable[[], object]] = field(default_factory=list)

    def close(self) -> None:
        for step in self._cleanup:
            step()
        self._cleanup.clear()


def validate(inputs: CrossInputs) -> None:
    """Raise :class:`~mqguard.audit.events.AuditInputError` for a broker log naming nothing
    (before Spark starts)."""
    expand_broker_logs(inputs.broker_logs)


def prepare(spark: SparkSession, files: Sequence[str], inputs: CrossInputs,
            config: MqguardConfig, *, max_delivery_attempts: int | None = None,
            progress: Callable[[str], None] = lambda stage: None) -> CrossChecks:
    """Read the extra inputs and plan their findings (computed when they are written)."""
    logs = expand_broker_logs(inputs.broker_logs)
    events = load_state_events(spark, files).persist(StorageLevel.MEMORY_AND_DISK)
    cleanup: list[Callable[[], object]] = [events.unpersist]
    parts: list[DataFrame] = []
    summary: dict[str, Any] = {}
    state: RedisState | None = None
    broker: BrokerLogs | None = None
    if inputs.redis_url:
        progress("reading Redis")
        state = read_state(spark, inputs.redis_url, namespace=inputs.redis_namespace)
        cleanup.append(state.unpersist)
        parts.append(state_findings(spark, events, state, config, StateCheckOptions(
            tolerance_ms=inputs.tolerance_ms, max_delivery_attempts=max_delivery_attempts)))
        summary["redis"] = {**state_summary(state), "namespace": inputs.redis_namespace}
    if logs:
        progress(f"parsing {len(logs)} broker log(s)")
        broker = read_broker_logs(spark, logs)
        cleanup.append(broker.unpersist)
        found, info = broker_findings(spark, events, broker, inputs.tolerance_ms)
        parts.append(found)
        summary["broker_logs"] = {**broker.summary(), **info}
    if not parts:
        raise ValueError("prepare() needs --redis or --broker-log inputs")
    findings = parts[0]
    for part in parts[1:]:
        findings = findings.unionByName(part)
    return CrossChecks(findings, summary, cleanup)


__all__ = ["CROSS_CLASSES", "CrossChecks", "CrossInputs", "prepare", "validate"]
