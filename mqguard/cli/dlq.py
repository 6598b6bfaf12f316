"""``mqguard dlq``: list, show, retry and purge dead letters (docs/dlq.md)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mqguard.adapter import Adapter
from mqguard.cli.table import print_table
from mqguard.config import MqguardConfig, load_config
from mqguard.dlq import (
    DEFAULT_PREVIEW_BYTES,
    PurgeOptions,
    RetryOptions,
    Selection,
    attach,
    configured_addresses,
    is_dead_letter_address,
    open_dlq_adapter,
    parse_duration,
    peek,
    purge,
    retry,
    summarize,
)
from mqguard.dlq.reader import DEFAULT_IDLE_MS, FIRST_WAIT_FACTOR, is_mqtt
from mqguard.errors import MqguardError
from mqguard.events import EventType
from mqguard.matching import is_wildcard, matches
from mqguard.pipeline import Guard
from mqguard.redact import redact_url

__all__ = ["dlq"]

#: ActiveMQ's own dead-letter queue: listed on ActiveMQ whatever the configuration says.
ACTIVEMQ_DLQ = "ActiveMQ.DLQ"

url_option = click.option(
    "--url", required=True, metavar="URL",
    help="Broker URL (stomp://..., mqtt://...); credentials are never printed.")
config_option = click.option(
    "-c", "--config", "config_path", type=click.Path(dir_okay=False), metavar="mqguard.toml",
    help="mqguard.toml (default ./mqguard.toml if present): the dead-letter and expiry "
         "addresses, the store (bridge ids) and the event log.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
idle_option = click.option(
    "--idle-ms", type=click.IntRange(1, 600_000), default=DEFAULT_IDLE_MS, show_default=True,
    metavar="MS",
    help="How long to wait for one more message before taking the address as drained "
         f"({FIRST_WAIT_FACTOR}x as long for the first one). ActiveMQ's browse needs none.")


any_address_option = click.option(
    "--any-address", is_flag=True,
    help="Take ADDRESS even though mqguard.toml does not name it as a dead-letter or expiry "
         "address (a broker's own dead-letter queue). Reading a queue that does not exist "
         "creates it (on MQTT: a session that never expires).")


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _wanted(address: str, pattern: str | None) -> bool:
    return pattern is None or address == pattern or (is_wildcard(pattern)
                                                     and matches(pattern, address))


def _known(config: MqguardConfig, address: str, any_address: bool) -> None:
    """Refuse an address mqguard.toml does not dead-letter to: a typo would otherwise read
    as an empty address, and create the queue (or an MQTT session for good) on the broker."""
    if any_address or address == ACTIVEMQ_DLQ or is_dead_letter_address(config, address):
        return
    known = ", ".join(configured_addresses(config)) or "none"
    raise click.UsageError(
        f"unknown dead-letter address {address!r}: {config.source} names {known} (and "
        f"ActiveMQ keeps its own in {ACTIVEMQ_DLQ}); check the name and -c, or pass "
        "--any-address to take a queue it does not name")


def _when(ms: int | None) -> str:
    """Epoch milliseconds as an operator reads them (UTC); JSON keeps the number."""
    if ms is None:
        return ""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextlib.contextmanager
def _connected(url: str, address: str) -> Iterator[Adapter]:
    try:
        adapter = open_dlq_adapter(url, address)
        adapter.connect()
    except MqguardError as exc:
        raise _fail(exc) from None
    try:
        yield adapter
    finally:
        adapter.close()


def _config(config_path: str | None) -> MqguardConfig:
    try:
        return load_config(config_path)
    except MqguardError as exc:
        raise _fail(exc) from None


@contextlib.contextmanager
def _progress(what: str, total: int | None, show: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr, on a terminal only (JSON output and pipes stay clean)."""
    if not show or not sys.stderr.isatty():
        yield lambda n: None
        return
    columns = [TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


@click.group()
def dlq() -> None:
    """Dead letters: list, show, retry (Artemis retryMessages), purge. See docs/dlq.md."""


@dlq.command("list")
@click.argument("pattern", required=False)
@url_option
@config_option
@click.option("-a", "--address", "addresses", multiple=True, metavar="ADDRESS",
              help="A dead-letter address to look at besides those mqguard.toml names "
                   "(repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="Read at most N messages per address.")
@idle_option
@json_option
def list_cmd(pattern: str | None, url: str, config_path: str | None,
             addresses: tuple[str, ...], limit: int | None, idle_ms: int,
             as_json: bool) -> None:
    """Dead-letter and expiry addresses with their message counts, oldest and newest,
    and counts per original address and per reason.

    The addresses are those mqguard.toml names (dead-letter-address, expiry-address,
    auto-created DLQ./EXP. queues of literal match keys) plus --address, and
    ActiveMQ.DLQ on ActiveMQ; PATTERN (an address or a match key such as `#.DLA`)
    narrows them. Nothing is consumed.
    """
    config = _config(config_path)
    names = configured_addresses(config, addresses, pattern)
    if ACTIVEMQ_DLQ not in names and _wanted(ACTIVEMQ_DLQ, pattern) and not is_mqtt(url):
        with _connected(url, ACTIVEMQ_DLQ) as adapter:
            if adapter.broker == "activemq":
                names.append(ACTIVEMQ_DLQ)
    if not names and pattern is not None:
        known = ", ".join(configured_addresses(config, addresses)) or "none"
        raise click.ClickException(
            f"no dead-letter or expiry address matches {pattern!r}: {config.source} and "
            f"--address name {known}")
    summaries: list[dict[str, Any]] = []
    with Guard(config, role="dlq") as guard:
        for address in names:
            with _connected(url, address) as adapter:
                # On MQTT the subscription attaches the session too.
                letters = peek(adapter, address, limit=limit, idle_ms=idle_ms)
            guard.events.emit(EventType.DLQ_INSPECTED, None, address=address,
                              count=len(letters), reason="list")
            summaries.append(summarize(address, letters).to_json())
    if as_json:
        click.echo(json.dumps({"broker": redact_url(url), "addresses": summaries}, indent=2))
        return
    if not summaries:
        click.echo(f"no dead-letter or expiry address: {config.source} names none; name "
                   "them there (dead-letter-address, expiry-address) or with --address")
        return
    rows = [{**s, "oldest": _when(s["oldest"]), "newest": _when(s["newest"])}
            for s in summaries]
    print_table("mqguard dlq list", rows, ["address", "messages", "expired", "oldest", "newest"])
    for summary in summaries:
        for title, key in (("original address", "by_original"), ("reason", "by_reason")):
            for name, count in summary[key].items():
                click.echo(f"{summary['address']}: {count} x {title} {name}")


@dlq.command("show")
@click.argument("address")
@url_option
@config_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              metavar="N", help="Messages shown.")
@click.option("--preview-bytes", type=click.IntRange(0, 1 << 20), metavar="N",
              default=DEFAULT_PREVIEW_BYTES, show_default=True,
              help="Body bytes shown per message (text, else base64).")
@idle_option
@any_address_option
@json_option
def show(address: str, url: str, config_path: str | None, limit: int, preview_bytes: int,
         idle_ms: int, any_address: bool, as_json: bool) -> None:
    """The dead letters of ADDRESS: original address and queue, delivery count, reason,
    times, headers and a body preview. Nothing is consumed."""
    config = _config(config_path)
    _known(config, address, any_address)
    with Guard(config, role="dlq") as guard:
        with _connected(url, address) as adapter:
            letters = peek(adapter, address, limit=limit, idle_ms=idle_ms)
        guard.events.emit(EventType.DLQ_INSPECTED, None, address=address, count=len(letters),
                          reason="show")
    rows = [letter.to_json(preview_bytes) for letter in letters]
    if as_json:
        click.echo(json.dumps({"address": address, "messages": rows}, indent=2))
        return
    for row in rows:
        click.echo(f"- {row['message_id']}  from {row['original_address']} "
                   f"(queue {row['original_queue']}, message {row['original_message_id']})")
        click.echo(f"  {row['kind']}: {row['reason']}")
        sent = f", original sent at {_when(row['sent_at'])}" if row["sent_at"] else ""
        click.echo(f"  delivery count {row['delivery_count']}, moved at "
                   f"{_when(row['moved_at']) or 'unknown'}{sent}")
        for key, value in row["headers"].items():
            click.echo(f"  {key}: {value}")
        body = row["body"]
        shown = body.get("text", body.get("base64"))
        kind = "text" if "text" in body else "base64"
        more = ", truncated" if body["truncated"] else ""
        click.echo(f"  body ({body['size']} bytes{more}, {kind}): {shown}")
    click.echo(f"{len(rows)} message(s) in {address}")


def _selection(ids: tuple[str, ...], original: str | None, older_than: str | None
               ) -> Selection:
    try:
        older = None if older_than is None else parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    return Selection.of(ids, original, older)


@dlq.command("retry")
@click.argument("address")
@url_option
@config_option
@click.option("--to", "to", metavar="ADDRESS",
              help="Send every copy here instead of its _AMQ_ORIG_ADDRESS.")
@click.option("--original", metavar="ADDRESS",
              help="Only dead letters from this original address (or match key, e.g. "
                   "orders.#).")
@click.option("--id", "ids", multiple=True, metavar="ID",
              help="Only this dead letter (its id, its original message id or the broker's "
                   "id; repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="Retry at most N.")
@click.option("--rate", type=click.FloatRange(min=0.1), default=None, metavar="N",
              help="At most N messages a second, so that the fixed consumers are not "
                   "flooded (default: as fast as the broker confirms).")
@click.option("--batch", type=click.IntRange(1, 1000), default=100, show_default=True,
              metavar="N",
              help="Dead letters per batch (one broker transaction where there are "
                   "transactions).")
@click.option("--dry-run", is_flag=True, help="Say what would be retried; change nothing.")
@idle_option
@any_address_option
@json_option
def retry_cmd(address: str, url: str, config_path: str | None, to: str | None,
              original: str | None, ids: tuple[str, ...], limit: int | None,
              rate: float | None, batch: int, dry_run: bool, idle_ms: int,
              any_address: bool, as_json: bool) -> None:
    """Send the dead letters of ADDRESS back to their original address (Artemis
    retryMessages): a copy with a reset delivery count and no expiration, confirmed by the
    broker before the dead letter is acknowledged, with a bridge duplicate id so that an
    interrupted run sends nothing twice when run again."""
    config = _config(config_path)
    _known(config, address, any_address)
    options = RetryOptions(to=to, selection=_selection(ids, original, None), limit=limit,
                           dry_run=dry_run, batch=batch, rate=rate, idle_ms=idle_ms)
    try:
        with Guard(config, role="dlq") as guard, _connected(url, address) as adapter, \
                _progress("retrying", limit, not as_json) as advance:
            # A dry run acknowledges nothing: closing the connection gives everything back.
            result = retry(guard, adapter, address, options, progress=advance)
    except MqguardError as exc:
        raise _fail(exc) from None
    _report("mqguard dlq retry", result.to_json(), as_json,
            ["address", "retried", "completed", "no_origin", "skipped", "seconds"])


@dlq.command("purge")
@click.argument("address")
@url_option
@config_option
@click.option("--older-than", metavar="DURATION",
              help="Only dead letters moved at least this long ago: a whole number and a "
                   "unit (ms, s, m, h, d, w), e.g. 10m, 2h, 7d.")
@click.option("--original", metavar="ADDRESS",
              help="Only dead letters from this original address (or match key).")
@click.option("--id", "ids", multiple=True, metavar="ID",
              help="Only this dead letter (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="Purge at most N.")
@click.option("--dry-run", is_flag=True, help="Say what would be purged; change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@idle_option
@any_address_option
@json_option
def purge_cmd(address: str, url: str, config_path: str | None, older_than: str | None,
              original: str | None, ids: tuple[str, ...], limit: int | None, dry_run: bool,
              yes: bool, idle_ms: int, any_address: bool, as_json: bool) -> None:
    """Delete dead letters of ADDRESS for good. Asks first, unless --yes or --dry-run."""
    selection = _selection(ids, original, older_than)
    config = _config(config_path)
    _known(config, address, any_address)
    options = PurgeOptions(selection=selection, limit=limit, dry_run=dry_run, idle_ms=idle_ms)
    try:
        with Guard(config, role="dlq") as guard, _connected(url, address) as adapter:
            # Connected first: an unreachable broker is said before anything is asked.
            if not dry_run and not yes:
                what = ", ".join(filter(None, [
                    f"older than {older_than}" if older_than else "",
                    f"from {original}" if original else "", f"{len(ids)} id(s)" if ids else "",
                    f"at most {limit}" if limit else ""])) or "every message"
                click.confirm(f"Delete {what} in {address} at {redact_url(url)}?",
                              abort=True, err=True)
            with _progress("purging", limit, not as_json) as advance:
                result = purge(guard, adapter, address, options, progress=advance)
    except MqguardError as exc:
        raise _fail(exc) from None
    _report("mqguard dlq purge", result.to_json(), as_json,
            ["address", "purged", "skipped", "seconds"])


@dlq.command("attach")
@click.argument("address")
@url_option
@config_option
@any_address_option
def attach_cmd(address: str, url: str, config_path: str | None, any_address: bool) -> None:
    """MQTT: create the persistent session that keeps ADDRESS's dead letters (every dlq
    command does it too). A no-op on STOMP brokers."""
    _known(_config(config_path), address, any_address)
    with _connected(url, address) as adapter:
        attach(adapter, address)
    click.echo(f"{address}: attached")


def _report(title: str, row: dict[str, Any], as_json: bool, columns: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    print_table(title, [row], columns)
    for name in ("by_target", "by_original"):
        for key, count in row.get(name, {}).items():
            click.echo(f"{count} -> {key}" if name == "by_target" else f"{count} from {key}")
