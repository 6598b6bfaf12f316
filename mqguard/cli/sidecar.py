"""``mqguard sidecar``: the transparent STOMP proxy (see docs/sidecar.md)."""

from __future__ import annotations

import asyncio
import logging
import ssl

import click
import orjson

from mqguard.cli.serving import serve_until_signalled
from mqguard.config import load_config
from mqguard.errors import MqguardError
from mqguard.sidecar.eventloop import LOOP_KINDS, loop_factory
from mqguard.sidecar.server import Sidecar, parse_hostport, parse_upstream


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


@click.command()
@click.option("--protocol", type=click.Choice(("stomp", "mqtt")), default="stomp",
              show_default=True, help="What clients speak: STOMP, or MQTT 3.1.1/5 "
                                      "(--upstream mqtt://HOST:PORT; docs/sidecar-mqtt.md).")
@click.option("--listen", default="127.0.0.1:61623", show_default=True,
              help="HOST:PORT clients connect to (port 0: any free port, printed at start).")
@click.option("--upstream", required=True,
              help="Broker URL: stomp://HOST:PORT or stomp+ssl://HOST:PORT. Credentials in it "
                   "are used by the expiry reaper only; clients' own pass through.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="mqguard.toml (default: ./mqguard.toml if present, else the defaults).")
@click.option("--admin", default=None,
              help="HOST:PORT of the admin HTTP port (/metrics, /health); off by default.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="PEM certificate (chain) to serve clients over TLS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
              help="PEM private key of --tls-cert.")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle to verify a stomp+ssl:// broker with (default: system CAs).")
@click.option("--upstream-insecure", is_flag=True,
              help="Do not verify the broker's TLS certificate (testing only).")
@click.option("--reap", "reap_addresses", multiple=True, metavar="ADDRESS",
              help="Queue the expiry reaper scans from the start (repeatable); addresses that "
                   "receive expiring messages through the sidecar are added automatically.")
@click.option("--redistribute", "redistribute_groups", multiple=True, metavar="GROUP",
              help="Also run the redistributor of this [mqguard.groups.<name>] (repeatable; "
                   "docs/load-balancing.md).")
@click.option("--log-format", type=click.Choice(("text", "json")), default="text",
              show_default=True, help="Log lines as text or as one JSON object each.")
@click.option("--event-loop", "event_loop", type=click.Choice(LOOP_KINDS), default="auto",
              show_default=True,
              help="The event loop of the admin port and signal handling (sessions run "
                   "in the native runtime): asyncio's own, or uvloop (mqguard[sidecar] "
                   "installs it). auto: uvloop when installed.")
def sidecar(protocol: str, listen: str, upstream: str, config_path: str | None, admin: str | None,
            tls_cert: str | None, tls_key: str | None, upstream_ca: str | None,
            upstream_insecure: bool, reap_addresses: tuple[str, ...],
            redistribute_groups: tuple[str, ...], log_format: str, event_loop: str) -> None:
    """Run the transparent STOMP (or, with --protocol mqtt, MQTT) proxy in front of a broker.

    Unmodified STOMP 1.0-1.2 clients connect here instead of to the broker and get
    duplicate detection, expiry, delivery counting with dead letters and the consumer
    audit. Stops gracefully on SIGTERM/SIGINT.
    """
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())
    logging.getLogger("mqguard").setLevel(min(logging.getLogger().level, logging.INFO))
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if protocol == "mqtt":
        from mqguard.cli.sidecar_mqtt import refuse_stomp_options, run_mqtt_sidecar

        refuse_stomp_options(reap=reap_addresses, redistribute=redistribute_groups)

        run_mqtt_sidecar(listen=listen, upstream=upstream, config_path=config_path,
                         admin=admin, event_loop=event_loop,
                         tls_files=(tls_cert, tls_key) if tls_cert and tls_key else None,
                         upstream_ca=upstream_ca, upstream_insecure=upstream_insecure)
        return
    try:
        config = load_config(config_path)
        target = parse_upstream(upstream, cafile=upstream_ca, insecure=upstream_insecure)
        listen_on = parse_hostport(listen, "--listen")
        admin_on = parse_hostport(admin, "--admin") if admin else None
        new_loop = loop_factory(event_loop)
        if redistribute_groups:
            from mqguard.balancing import group_config

            for group in redistribute_groups:
                group_config(config, group)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    tls = None
    if tls_cert and tls_key:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(tls_cert, tls_key)
    try:
        proxy = Sidecar(config, target, listen=listen_on, admin=admin_on, tls=tls,
                        reap_addresses=reap_addresses, redistribute=redistribute_groups,
                        tls_files=(tls_cert, tls_key) if tls_cert and tls_key else None)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(serve_until_signalled(
                proxy, "mqguard sidecar", "stopping (draining connections)"))
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc}") from None
