"""``mqguard dedup``: inspect and clear duplicate-ID caches."""

from __future__ import annotations

import json

import click

from mqguard.cli.table import print_table
from mqguard.config import MqguardConfig, load_config
from mqguard.errors import MqguardError
from mqguard.registry import redact_url
from mqguard.stores import Store, open_store

_store_option = click.option(
    "--store", "store_url",
    help="Store URL (memory, redis://..., redis+cluster://...); default: the config's.")
_config_option = click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
                              help="mqguard.toml (default ./mqguard.toml if present).")


def _open(config_path: str | None, store_url: str | None) -> tuple[MqguardConfig, Store]:
    try:
        config = load_config(config_path)
        url = store_url or config.core.store
        if url == "memory":
            raise click.ClickException(
                "the memory store lives inside one process; give --store redis://... "
                "(or set [mqguard] store) to inspect a shared cache")
        return config, open_store(url)
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def dedup() -> None:
    """Duplicate-ID caches (Artemis id-cache) held in the store."""


@dedup.command("stats")
@click.argument("address", required=False)
@_store_option
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def stats(address: str | None, store_url: str | None, config_path: str | None,
          as_json: bool) -> None:
    """Capacity and fill of the cache of ADDRESS (and BRIDGE.ADDRESS), or of every cache."""
    config, store = _open(config_path, store_url)
    try:
        names = [address, f"BRIDGE.{address}"] if address else store.ring_names()
        settings = config.address_settings_repository()
        rows = []
        for name in names:
            ring = store.ring_stats(name)
            if ring is None:
                continue
            # Each cache is sized by the settings matching its own name: BRIDGE.<address>
            # is a cache of its own in Artemis, not a view of <address>'s.
            rows.append({"cache": name, "count": ring.count, "capacity": ring.capacity,
                         "configured_id_cache_size": settings.resolve(name).id_cache_size})
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
    if address and not rows:
        raise click.ClickException(f"no duplicate-ID cache for {address!r} in "
                                   f"{redact_url(store_url or config.core.store)}")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        print_table("duplicate-ID caches", rows,
                    ["cache", "count", "capacity", "configured_id_cache_size"])


@dedup.command("clear")
@click.argument("address")
@_store_option
@_config_option
@click.option("--bridge/--no-bridge", default=True, show_default=True,
              help="Also clear BRIDGE.ADDRESS.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(address: str, store_url: str | None, config_path: str | None, bridge: bool,
          yes: bool) -> None:
    """Delete the duplicate-ID cache of ADDRESS: its ids will be accepted again."""
    if not yes:
        click.confirm(f"Clear the duplicate-ID cache of {address!r}?", abort=True)
    _, store = _open(config_path, store_url)
    try:
        names = [address] + ([f"BRIDGE.{address}"] if bridge else [])
        cleared = [name for name in names if store.ring_clear(name)]
    except MqguardError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
    if not cleared:
        raise click.ClickException(f"no duplicate-ID cache for {address!r}")
    click.echo(f"cleared: {', '.join(cleared)}")
