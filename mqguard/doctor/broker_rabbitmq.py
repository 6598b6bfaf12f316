"""Doctor checks of RabbitMQ: queue types, the expiry dead-letter policy, the clock.

STOMP shows none of these, so they are read from one of two sources:

* ``rabbitmqctl`` (``--rabbitmqctl COMMAND``, e.g. ``"rabbitmqctl -n rabbit@host"``, run on
  a machine that holds the node's Erlang cookie): ``list_vhosts``, then per vhost
  ``list_queues name type policy`` and ``list_policies``; the clock from
  ``eval 'os:system_time(millisecond).'``, good to half the command's run time (the CLI
  boots an Erlang VM first: up to about a second).
* otherwise the management HTTP API (``rabbitmq_management``; ``--management-url``, default
  ``http://<broker host>:15672``): ``/api/overview``, ``/api/queues``, ``/api/policies``; the
  clock from the response's ``Date`` header, within 2 s (whole seconds, refreshed by its web
  server once a second).

When neither answers the checks are skipped and say how to enable them.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from mqguard.doctor.clock import Skew
from mqguard.doctor.model import Check, Status
from mqguard.reaper import DEFAULT_HOLDING_QUEUE
from mqguard.redact import redact_text, redact_url

__all__ = ["DEFAULT_MANAGEMENT_PORT", "check_rabbitmq"]

DEFAULT_MANAGEMENT_PORT = 15672
_TIMEOUT = 5.0
_CTL_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class _Facts:
    #: Each queue: name, vhost, type.
    queues: list[dict[str, Any]]
    #: Each policy: name, vhost and its definition (a mapping).
    policies: list[dict[str, Any]]
    skew: Skew | None
    source: str


class _Unavailable(Exception):
    """The source did not answer; the message is safe to print."""


# -- management API ------------------------------------------------------------------------


def _credentials(*urls: str) -> tuple[str, str]:
    for url in urls:
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        if parts.username:
            return unquote(parts.username), unquote(parts.password or "")
    return "guest", "guest"


def _get(base: str, path: str, auth: str) -> tuple[Any, str]:
    request = urllib.request.Request(base + path, headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
        return json.loads(response.read()), response.headers.get("Date", "")


def _from_management(stomp_url: str, management_url: str) -> _Facts:
    user, password = _credentials(management_url, stomp_url)
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    parts = urlsplit(management_url)
    base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}"
    where = redact_url(management_url)
    try:
        t0 = time.time() * 1000
        _, date = _get(base, "/api/overview", auth)
        t1 = time.time() * 1000
        queues, _ = _get(base, "/api/queues?columns=name,vhost,type,policy", auth)
        policies, _ = _get(base, "/api/policies", auth)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        text = redact_text(str(exc), management_url)
        if password:
            text = text.replace(password, "***")
        raise _Unavailable(f"management API {where} not reachable: {text}") from None
    skew = None
    if date:
        remote = parsedate_to_datetime(date).timestamp() * 1000
        # Whole seconds, and the web server (cowboy) refreshes the date it sends once a
        # second: the true time is up to 2 s later than the header.
        skew = Skew.from_round_trip("broker", "management API Date header (2 s resolution)",
                                    t0, t1, remote + 1000, resolution_ms=1000)
    return _Facts(list(queues), list(policies), skew, f"management API {where}")


# -- rabbitmqctl ---------------------------------------------------------------------------


def _ctl(command: list[str], *args: str) -> str:
    try:
        result = subprocess.run([*command, *args], capture_output=True, text=True,
                                timeout=_CTL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unavailable(f"{shlex.join(command)} {args[0]}: {exc}") from None
    if result.returncode != 0:
        first = (result.stderr or result.stdout).strip().splitlines()[:1]
        raise _Unavailable(f"{shlex.join(command)} {args[0]} exited with "
                           f"{result.returncode}: {first[0] if first else ''}")
    return result.stdout


def _ctl_json(command: list[str], *args: str) -> list[dict[str, Any]]:
    out = _ctl(command, *args, "--formatter", "json", "--quiet")
    try:
        rows = json.loads(out or "[]")
    except ValueError:
        raise _Unavailable(f"{shlex.join(command)} {args[0]}: not JSON") from None
    return [row for row in rows if isinstance(row, dict)]


def _from_rabbitmqctl(command: list[str]) -> _Facts:
    queues: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    for vhost in (row["name"] for row in _ctl_json(command, "list_vhosts", "name")):
        for row in _ctl_json(command, "list_queues", "-p", vhost, "name", "type", "policy"):
            queues.append({**row, "vhost": vhost})
        for row in _ctl_json(command, "list_policies", "-p", vhost):
            definition = row.get("definition")
            if isinstance(definition, str):  # rabbitmqctl prints it as JSON text
                try:
                    definition = json.loads(definition)
                except ValueError:
                    definition = {}
            policies.append({**row, "definition": definition})
    t0 = time.time() * 1000
    out = _ctl(command, "eval", "os:system_time(millisecond).")
    t1 = time.time() * 1000
    skew = None
    if out.strip().isdigit():
        skew = Skew.from_round_trip("broker", "rabbitmqctl eval os:system_time", t0, t1,
                                    int(out.strip()))
    return _Facts(queues, policies, skew, shlex.join(command))


# -- verdicts ------------------------------------------------------------------------------


def _queue_types(facts: _Facts) -> Check:
    types = Counter(str(q.get("type") or "classic") for q in facts.queues)
    text = ", ".join(f"{n} {t}" for t, n in sorted(types.items())) or "no queues"
    if types.get("stream"):
        return Check("broker", "queue-types", Status.WARNING,
                     f"queues: {text}: streams are not consumed with acks, so mqguard's "
                     "delivery counting and dead-lettering do not apply",
                     fix="guard classic or quorum queues only", data=dict(types))
    return Check("broker", "queue-types", Status.OK,
                 f"queues: {text} (quorum queues also report x-delivery-count; from "
                 f"{facts.source})", data=dict(types))


def _expiry_policy(facts: _Facts) -> Check:
    expiry = [p for p in facts.policies
              if (p.get("definition") or {}).get("dead-letter-routing-key")
              == DEFAULT_HOLDING_QUEUE]
    names = ", ".join(f"{p.get('name')} (vhost {p.get('vhost')})" for p in expiry)
    if not expiry:
        return Check(
            "broker", "expiry-policy", Status.WARNING,
            f"no policy dead-letters to {DEFAULT_HOLDING_QUEUE}: messages that expire at rest "
            "are dropped by RabbitMQ instead of reaching their expiry address",
            fix="rabbitmqctl set_policy --apply-to queues mqguard-expiry '^orders\\.' "
                f"'{{\"dead-letter-exchange\":\"\",\"dead-letter-routing-key\":"
                f"\"{DEFAULT_HOLDING_QUEUE}\"}}' (docs/expiry.md)")
    if not any(q.get("name") == DEFAULT_HOLDING_QUEUE for q in facts.queues):
        return Check(
            "broker", "expiry-policy", Status.WARNING,
            f"policy {names} dead-letters to {DEFAULT_HOLDING_QUEUE}, which does not exist: "
            "RabbitMQ drops dead letters it cannot route",
            fix=f"run `mqguard reap` once (it declares {DEFAULT_HOLDING_QUEUE}, durable)")
    return Check("broker", "expiry-policy", Status.OK,
                 f"policy {names} dead-letters expired messages to {DEFAULT_HOLDING_QUEUE}")


def check_rabbitmq(stomp_url: str, *, management_url: str | None,
                   rabbitmqctl: str | None) -> tuple[list[Check], Skew | None]:
    """Queue types, the expiry dead-letter policy and the broker's clock skew, from
    ``rabbitmqctl`` (a command line) when given, else from the management API at
    ``management_url`` (default ``http://<broker host>:15672``; credentials from it, else
    from the broker URL, else guest/guest)."""
    try:
        if rabbitmqctl:
            facts = _from_rabbitmqctl(shlex.split(rabbitmqctl))
        else:
            if management_url is None:
                host = urlsplit(stomp_url).hostname or "127.0.0.1"
                management_url = f"http://{host}:{DEFAULT_MANAGEMENT_PORT}"
            facts = _from_management(stomp_url, management_url)
    except _Unavailable as exc:
        fix = ("pass --rabbitmqctl 'rabbitmqctl -n rabbit@host' (on a machine with the "
               "node's cookie)" if rabbitmqctl else
               "enable the rabbitmq_management plugin, pass --management-url "
               "http://user:pass@host:15672, or --rabbitmqctl 'rabbitmqctl -n rabbit@host'")
        return [Check(area, name, Status.SKIPPED, str(exc), fix=fix)
                for area, name in (("broker", "queue-types"), ("broker", "expiry-policy"),
                                   ("clock", "skew-broker"))], None
    return [_queue_types(facts), _expiry_policy(facts)], facts.skew
