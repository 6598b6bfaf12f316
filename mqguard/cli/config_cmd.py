"""``mqguard config``: check a configuration file and show effective settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from xml.etree import ElementTree

import click

from mqguard.artemis_xml import apply_to_broker_xml, not_rendered, render_broker_xml
from mqguard.config import MqguardConfig, load_config
from mqguard.errors import ConfigError
from mqguard.plugin_manager import make_plugin_manager


@click.group()
def config() -> None:
    """Validate mqguard.toml, show what applies to an address, render it for Artemis."""


@config.command("check")
@click.argument("path", required=False, type=click.Path(dir_okay=False))
def check(path: str | None) -> None:
    """Validate PATH (default ./mqguard.toml) and every plugin's table; exit 1 with every
    error named."""
    try:
        cfg = load_config(path)
        # Plugins validate their own [plugins.<name>] tables in their configure hook.
        manager = make_plugin_manager(cfg)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    # A blocked (disabled) plugin is listed by pluggy with None in place of the object.
    plugins = sorted(name for name, plugin in manager.list_name_plugin()
                     if name and plugin is not None)
    disabled = sorted(cfg.core.disabled_plugins)
    click.echo(f"{cfg.source}: OK ({len(cfg.address_settings)} address-settings entries; "
               f"plugins: {', '.join(plugins) or 'none'}"
               + (f"; disabled: {', '.join(disabled)})" if disabled else ")"))


@config.command("show")
@click.argument("address")
@click.option("-c", "--config", "path", type=click.Path(dir_okay=False),
              help="Configuration file (default ./mqguard.toml).")
def show(address: str, path: str | None) -> None:
    """Print the effective settings of ADDRESS as JSON, with the match keys that apply."""
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    repo = cfg.address_settings_repository()
    out = {"address": address, "matched": repo.matching_keys(address),
           "settings": dataclasses.asdict(repo.resolve(address))}
    click.echo(json.dumps(out, indent=2))


@config.command("broker-xml")
@click.argument("path", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rendered XML to FILE instead of standard output.")
@click.option("--into", "broker_xml", type=click.Path(dir_okay=False, exists=True,
                                                        path_type=Path),
              help="Put the settings into this Artemis broker.xml, in place: its "
                   "<address-settings> is replaced (Artemis's management entry kept), "
                   "id-cache-size and message-expiry-scan-period set. A running broker "
                   "rereads it.")
def broker_xml_cmd(path: str | None, output: Path | None, broker_xml: Path | None) -> None:
    """Render PATH's (default ./mqguard.toml) address settings as Artemis broker.xml.

    Prints a <core> element whose children go inside the <core> of an Artemis
    broker.xml: <id-cache-size>, <message-expiry-scan-period> and <address-settings>
    with one <address-setting> per [address-settings."<match>"] table (only the keys the
    table sets: both sides inherit the rest the same way). Settings with no Artemis
    counterpart are named in a comment and on standard error.
    """
    if output is not None and broker_xml is not None:
        raise click.UsageError("--output and --into are exclusive")
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    skipped = not_rendered(cfg)
    if broker_xml is not None:
        text = _applied(broker_xml, cfg)
        tmp = broker_xml.with_name(f".{broker_xml.name}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(broker_xml)  # a running Artemis must never read half a file
        except OSError as exc:
            raise click.ClickException(f"{broker_xml}: cannot write: {exc.strerror}") from None
        click.echo(f"{broker_xml}: {len(cfg.address_settings)} address-settings entries "
                   f"from {cfg.source}", err=True)
    elif output is not None:
        try:
            output.write_text(render_broker_xml(cfg), encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(f"{output}: cannot write: {exc.strerror}") from None
        click.echo(f"{output}: {len(cfg.address_settings)} address-settings entries "
                   f"from {cfg.source}", err=True)
    else:
        click.echo(render_broker_xml(cfg), nl=False)
    if skipped:
        click.echo("not rendered (no Artemis counterpart): " + ", ".join(skipped), err=True)


def _applied(broker_xml: Path, cfg: MqguardConfig) -> str:
    """``broker_xml``'s text with ``cfg`` applied; a file that is not a well-formed
    broker.xml with a ``<core>`` is refused before anything is written."""
    try:
        text = broker_xml.read_text(encoding="utf-8")
        ElementTree.fromstring(text)
        applied = apply_to_broker_xml(text, cfg)
        ElementTree.fromstring(applied)  # never leave the broker a file it cannot parse
    except ElementTree.ParseError as exc:
        raise click.ClickException(f"{broker_xml}: not well-formed XML ({exc})") from None
    except UnicodeDecodeError:
        raise click.ClickException(f"{broker_xml}: not UTF-8 text") from None
    except ValueError as exc:
        raise click.ClickException(f"{broker_xml}: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"{broker_xml}: cannot read: {exc.strerror}") from None
    return applied
