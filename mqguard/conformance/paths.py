"""The paths a scenario runs on: Artemis itself (the oracle) and mqguard in front of ActiveMQ
and RabbitMQ, as a sidecar and through the wrappers.

How each path expresses the scenario's actions:

* a failed delivery is a STOMP NACK through mqguard (sidecar) and a handler raising
  :class:`~mqguard.errors.Nack` (wrappers). Over STOMP, Artemis 2.40 treats NACK as an ACK
  (``StompFrameHandlerV11.onNack`` calls ``onAck``), so on Artemis a failed delivery is the
  one STOMP way Artemis counts as one: the connection is dropped with the message
  unacknowledged (``StompSession.updateDeliveryCountAfterCancel`` keeps the count). That NACK
  difference is listed in docs/artemis-compat.md;
* the wrappers have no way to drop their connection from inside a handler, so scenarios with
  ``disconnect`` do not run on them (:meth:`ConformancePath.skip_reason`);
* dead letters and expired messages of an auto-created target are read from Artemis's queue
  ``<prefix><address>`` on the target address (``<target>::<queue>``), and from the queue of
  that name on the other brokers (mqguard sends to it by name).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mqguard.config import parse_config
from mqguard.conformance.model import (
    PATH_NAMES,
    Observation,
    Scenario,
    dead_letter_address,
    expiry_address,
)
from mqguard.conformance.stomp_client import StompEndpoint
from mqguard.conformance.stomp_runner import (
    DEFAULT_TIMING,
    FailAs,
    StompPlan,
    Target,
    Timing,
    run_stomp_scenario,
)
from mqguard.conformance.wrapper_runner import run_wrapper_scenario
from mqguard.pipeline import Guard
from mqguard.reaper import DEFAULT_HOLDING_QUEUE, ExpiryReaper
from mqguard.registry import open_adapter
from mqguard.servers import ServerHandle, rabbitmqctl, reload_artemis_config
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

__all__ = [
    "ADDRESS_PREFIX",
    "PATH_NAMES",
    "ConformancePath",
    "artemis_path",
    "prepare_rabbitmq",
    "sidecar_path",
    "wrapper_path",
]

#: The login mqguard's local RabbitMQ gives STOMP clients; ActiveMQ and Artemis ignore it.
_LOGIN = ("guest", "guest")


@dataclass
class ConformancePath:
    """A named way of running scenarios."""

    name: str
    run: Callable[[Scenario, str], Observation]
    wrappers: bool = False
    #: Artemis takes ``_AMQ_BRIDGE_DUP`` only as bytes, which STOMP cannot send: a SEND with
    #: a text bridge id is refused (ERROR AMQ339011).
    refuses_text_bridge_ids: bool = False

    def skip_reason(self, scenario: Scenario) -> str | None:
        """Why this path cannot run ``scenario`` (None: it can)."""
        if self.refuses_text_bridge_ids and "bridge-id" in scenario.uses:
            return "Artemis refuses a text _AMQ_BRIDGE_DUP over STOMP"
        if self.wrappers and "disconnect" in scenario.uses:
            return "a wrapper handler cannot drop its connection"
        return None


def _endpoint(url: str, login: bool = True) -> StompEndpoint:
    parts = urlsplit(url)
    user, password = _LOGIN if login else (None, None)
    return StompEndpoint(parts.hostname or "127.0.0.1", parts.port or 61613, user, password)


def _targets(scenario: Scenario, address: str, artemis: bool) -> tuple[Target, ...]:
    out = []
    s = scenario.settings
    for sub_id, mode, target, prefix in (("dla", s.dead_letter, dead_letter_address(address),
                                          "DLQ."),
                                         ("exp", s.expiry, expiry_address(address), "EXP.")):
        if mode == "address":
            out.append(Target(sub_id, f"/queue/{target}", early=True))
        elif mode == "auto":
            queue = f"{prefix}{address}"
            dest = f"/queue/{target}::{queue}" if artemis else f"/queue/{queue}"
            out.append(Target(sub_id, dest, early=False))
    return tuple(out)


def artemis_path(handle: ServerHandle, timing: Timing = DEFAULT_TIMING) -> ConformancePath:
    """Artemis over STOMP, its address settings reloaded for each scenario."""
    endpoint = _endpoint(handle.urls["stomp"], login=False)

    def run(scenario: Scenario, address: str) -> Observation:
        reload_artemis_config(handle, parse_config(
            {"address-settings": scenario.settings.address_settings(address)}))
        plan = StompPlan(endpoint, endpoint, "disconnect",
                         _targets(scenario, address, artemis=True))
        return run_stomp_scenario(plan, address, scenario, timing)

    return ConformancePath("artemis", run, refuses_text_bridge_ids=True)


def sidecar_path(kind: str, url: str, timing: Timing = DEFAULT_TIMING,
                 workdir: Path | None = None, fail_as: FailAs = "nack") -> ConformancePath:
    """A fresh sidecar (memory store) in front of the broker at ``url`` per scenario."""
    broker = _endpoint(url)

    def run(scenario: Scenario, address: str) -> Observation:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            config = parse_config({
                "mqguard": {"node-id": "sidecar", "store": "memory",
                            "message-expiry-scan-period": 500,
                            "event-log": {"directory": str(Path(tmp) / "events"),
                                          "flush-interval-ms": 50}},
                "address-settings": scenario.settings.address_settings(address)})
            sidecar = Sidecar(config, parse_upstream(url), admin=("127.0.0.1", 0))
            with SidecarThread(sidecar) as running:
                client = StompEndpoint("127.0.0.1", running.port, *_LOGIN)
                plan = StompPlan(client, broker, fail_as,
                                 _targets(scenario, address, artemis=False),
                                 rabbitmq=kind == "rabbitmq")
                return run_stomp_scenario(plan, address, scenario, timing)

    return ConformancePath(f"sidecar-{kind}", run)


def wrapper_path(kind: str, url: str, timing: Timing = DEFAULT_TIMING,
                 workdir: Path | None = None) -> ConformancePath:
    """``GuardedProducer`` / ``GuardedConsumer`` on the broker at ``url`` (memory store)."""
    broker = _endpoint(url)

    def run(scenario: Scenario, address: str) -> Observation:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            plan = StompPlan(broker, broker, "nack",
                             _targets(scenario, address, artemis=False),
                             rabbitmq=kind == "rabbitmq")
            return run_wrapper_scenario(url, plan, address, scenario, Path(tmp), timing)

    return ConformancePath(f"wrapper-{kind}", run, wrappers=True)


#: Scenario addresses start with this (the RabbitMQ expiry policy matches it).
ADDRESS_PREFIX = "mqconf."


def prepare_rabbitmq(handle: ServerHandle, url: str) -> None:
    """What a RabbitMQ deployment of mqguard's expiry needs (docs/expiry.md): the policy that
    dead-letters expired messages of the guarded queues to the holding queue, and the
    holding queue itself (declared by a first reaper scan)."""
    pattern = "^" + ADDRESS_PREFIX.replace(".", r"\.")
    rabbitmqctl(handle, "set_policy", "--apply-to", "queues", "mqguard-conformance-expiry",
                pattern, json.dumps({"dead-letter-exchange": "",
                                     "dead-letter-routing-key": DEFAULT_HOLDING_QUEUE}))
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config({"mqguard": {"store": "memory",
                                           "event-log": {"directory": tmp}}})
        with Guard(config) as guard:
            adapter = open_adapter(url)
            adapter.connect()
            try:
                ExpiryReaper(guard, adapter, [f"{ADDRESS_PREFIX}declare"]).scan()
            finally:
                adapter.close()
