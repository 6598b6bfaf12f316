"""Doctor checks of RabbitMQ through its management HTTP API (``rabbitmq_management``).

STOMP shows nothing of queue types or policies, so they are read from the API: ``/api/overview``
(version; the response's ``Date`` header for the clock, within 2 s), ``/api/queues``
(types, effective policies) and ``/api/policies``. Without the plugin these checks are
skipped and say how to enable them.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from mqguard.doctor.clock import Skew
from mqguard.doctor.model import Check, Status
from mqguard.reaper import DEFAULT_HOLDING_QUEUE
from mqguard.redact import redact_text, redact_url

__all__ = ["DEFAULT_MANAGEMENT_PORT", "check_rabbitmq_management"]

DEFAULT_MANAGEMENT_PORT = 15672
_TIMEOUT = 5.0


def _credentials(*urls: str) -> tuple[str, str]:
    for url in urls:
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        if parts.username:
            return unquote(parts.username), unquote(parts.password or "")
    return "guest", "guest"


def _base(management_url: str) -> str:
    parts = urlsplit(management_url)
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def _get(base: str, path: str, auth: str) -> tuple[Any, str]:
    request = urllib.request.Request(base + path, headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
        return json.loads(response.read()), response.headers.get("Date", "")


def check_rabbitmq_management(stomp_url: str, management_url: str | None
                              ) -> tuple[list[Check], Skew | None]:
    """Queue types, the expiry dead-letter policy and the clock, from the management API
    at ``management_url`` (default ``http://<broker host>:15672``; credentials from it, else
    from the broker URL, else guest/guest)."""
    if management_url is None:
        host = urlsplit(stomp_url).hostname or "127.0.0.1"
        management_url = f"http://{host}:{DEFAULT_MANAGEMENT_PORT}"
    user, password = _credentials(management_url, stomp_url)
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    base = _base(management_url)
    where = redact_url(management_url)
    try:
        t0 = time.time() * 1000
        overview, date = _get(base, "/api/overview", auth)
        t1 = time.time() * 1000
        queues, _ = _get(base, "/api/queues?columns=name,vhost,type,policy", auth)
        policies, _ = _get(base, "/api/policies", auth)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        text = redact_text(str(exc), management_url).replace(password, "***") if password \
            else redact_text(str(exc), management_url)
        reason = f"management API {where} not reachable: {text}"
        fix = ("enable the rabbitmq_management plugin, or pass --management-url "
               "http://user:pass@host:15672")
        return [Check(area, name, Status.SKIPPED, reason, fix=fix)
                for area, name in (("broker", "queue-types"), ("broker", "expiry-policy"),
                                   ("clock", "skew-broker"))], None
    checks: list[Check] = []
    types = Counter(str(q.get("type", "classic")) for q in queues)
    type_text = ", ".join(f"{n} {t}" for t, n in sorted(types.items())) or "no queues"
    if types.get("stream"):
        checks.append(Check("broker", "queue-types", Status.WARNING,
                            f"queues: {type_text}: streams are not consumed with acks, so "
                            "mqguard's delivery counting and dead-lettering do not apply",
                            fix="guard classic or quorum queues only", data=dict(types)))
    else:
        checks.append(Check("broker", "queue-types", Status.OK,
                            f"RabbitMQ {overview.get('rabbitmq_version', '?')}; queues: "
                            f"{type_text} (quorum queues also report x-delivery-count)",
                            data=dict(types)))
    expiry = [p for p in policies
              if (p.get("definition") or {}).get("dead-letter-routing-key")
              == DEFAULT_HOLDING_QUEUE]
    holding = any(q.get("name") == DEFAULT_HOLDING_QUEUE for q in queues)
    names = ", ".join(f"{p.get('name')} (vhost {p.get('vhost')})" for p in expiry)
    if not expiry:
        checks.append(Check(
            "broker", "expiry-policy", Status.WARNING,
            f"no policy dead-letters to {DEFAULT_HOLDING_QUEUE}: messages that expire at rest "
            "are dropped by RabbitMQ instead of reaching their expiry address",
            fix="rabbitmqctl set_policy --apply-to queues mqguard-expiry '^orders\\.' "
                f"'{{\"dead-letter-exchange\":\"\",\"dead-letter-routing-key\":"
                f"\"{DEFAULT_HOLDING_QUEUE}\"}}' (docs/expiry.md)"))
    elif not holding:
        checks.append(Check(
            "broker", "expiry-policy", Status.WARNING,
            f"policy {names} dead-letters to {DEFAULT_HOLDING_QUEUE}, which does not exist: "
            "RabbitMQ drops dead letters it cannot route",
            fix=f"run `mqguard reap` once (it declares {DEFAULT_HOLDING_QUEUE}, durable)"))
    else:
        checks.append(Check("broker", "expiry-policy", Status.OK,
                            f"policy {names} dead-letters expired messages to "
                            f"{DEFAULT_HOLDING_QUEUE}"))
    skew = None
    if date:
        remote = parsedate_to_datetime(date).timestamp() * 1000
        # The Date header is whole seconds, and the management API's web server (cowboy)
        # refreshes the date it sends once a second: the true time is up to 2 s later.
        skew = Skew.from_round_trip("broker", "management API Date header (2 s resolution)",
                                    t0, t1, remote + 1000, resolution_ms=1000)
    return checks, skew
