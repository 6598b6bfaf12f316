"""Use the servers the user named, or start local ones for the duration of a command.

Every ``mqguard bench ...`` and ``mqguard demo`` runs with no arguments on a
fresh machine: what it is not given a URL for, it installs, starts (in
parallel, RabbitMQ alone takes ~15 s on first boot) and stops afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from mqguard.servers import ServerHandle, ensure_installed, start

#: Which URL of a started server a command uses, per server kind.
PRIMARY_SCHEME = {
    "activemq": "stomp",
    "rabbitmq": "stomp",
    "mosquitto": "mqtt",
    "redis": "redis",
    "redis-cluster": "redis",
    "artemis": "stomp",
}


@contextmanager
def server_urls(kinds: Iterable[str], given: Mapping[str, str | None] | None = None, *,
                started: dict[str, ServerHandle] | None = None) -> Iterator[dict[str, str]]:
    """Yield ``{kind: url}``: the given URL, or that of a local server started here.

    ``started``, when given, receives the handle of each server started here (for its
    log path, say), by kind.
    """
    given = dict(given or {})
    wanted = list(dict.fromkeys(kinds))
    missing = [kind for kind in wanted if not given.get(kind)]
    handles: list[ServerHandle] = []
    try:
        if missing:
            ensure_installed(missing)
            with ThreadPoolExecutor(max_workers=len(missing)) as pool:
                futures = {kind: pool.submit(start, kind) for kind in missing}
                errors: list[BaseException] = []
                for kind, future in futures.items():
                    try:
                        handle = future.result()
                    except BaseException as exc:  # report all failures, stop the rest
                        errors.append(exc)
                        continue
                    handles.append(handle)
                    if started is not None:
                        started[kind] = handle
                    given[kind] = handle.urls[PRIMARY_SCHEME[kind]]
                if errors:
                    raise errors[0]
        yield {kind: str(given[kind]) for kind in wanted}
    finally:
        for handle in handles:
            handle.stop()
