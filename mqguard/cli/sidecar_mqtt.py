"""``mqguard sidecar --protocol mqtt``: the MQTT proxy's run loop (docs/sidecar-mqtt.md)."""

from __future__ import annotations

import asyncio

import click

from mqguard.cli.serving import serve_until_signalled
from mqguard.config import load_config
from mqguard.errors import MqguardError
from mqguard.mqtt_sidecar.server import MqttSidecar, parse_mqtt_upstream
from mqguard.sidecar.eventloop import loop_factory
from mqguard.sidecar.server import parse_hostport

__all__ = ["refuse_stomp_options", "run_mqtt_sidecar"]


def refuse_stomp_options(*, reap: tuple[str, ...], redistribute: tuple[str, ...]) -> None:
    """The options of the STOMP sidecar that mean nothing with ``--protocol mqtt`` are
    refused rather than silently ignored."""
    given = [name for name, value in (("--reap", reap), ("--redistribute", redistribute))
             if value]
    if given:
        raise click.UsageError(f"{', '.join(given)}: STOMP sidecar only")


def run_mqtt_sidecar(*, listen: str, upstream: str, config_path: str | None,
                     admin: str | None, event_loop: str,
                     tls_files: tuple[str, str] | None = None,
                     upstream_ca: str | None = None, upstream_insecure: bool = False) -> None:
    """Run the MQTT sidecar until SIGTERM or SIGINT."""
    try:
        config = load_config(config_path)
        host, port, broker, tls = parse_mqtt_upstream(upstream)
        listen_on = parse_hostport(listen, "--listen")
        admin_on = parse_hostport(admin, "--admin") if admin else None
        new_loop = loop_factory(event_loop)
        proxy = MqttSidecar(config, (host, port), listen=listen_on, admin=admin_on,
                            broker=broker, tls_files=tls_files,
                            upstream_tls=(upstream_ca, upstream_insecure) if tls else None)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(serve_until_signalled(
                proxy, "mqguard sidecar (mqtt)", "stopping"))
    except OSError as exc:
        raise click.ClickException(f"cannot listen: {exc}") from None
    except ValueError as exc:  # the plane refused its settings (a TLS file, say)
        raise click.ClickException(str(exc)) from None
