"""``mqguard config``: check a configuration file and show effective settings."""

from __future__ import annotations

import dataclasses
import json

import click

from mqguard.config import load_config
from mqguard.errors import ConfigError
from mqguard.plugin_manager import make_plugin_manager


@click.group()
def config() -> None:
    """Validate mqguard.toml and show what applies to an address."""


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
