"""Command line: ``python -m mqguard.servers {install,start,stop,status}``.

``start`` leaves the server running after this process exits (it runs in its own session) and
prints the handle as JSON; ``stop --state-dir D`` ends it later using ``D/handle.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mqguard.errors import ConfigError
from mqguard.servers import KINDS, ServerHandle, ServerUnavailable, ensure_installed, start
from mqguard.servers.handle import HANDLE_FILE


@click.group()
def main() -> None:
    """Install, start and stop the real servers mqguard is tested against."""


@main.command()
@click.argument("kinds", nargs=-1, type=click.Choice(KINDS))
def install(kinds: tuple[str, ...]) -> None:
    """Install the Debian packages (ActiveMQ's MQTT jars, Artemis from Maven) for KINDS
    (default: all)."""
    try:
        ensure_installed(kinds or KINDS)
    except ServerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"installed: {', '.join(kinds or KINDS)}")


@main.command(name="start")
@click.argument("kind", type=click.Choice(KINDS))
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for config, data and logs (default: a new mqguard-KIND-* temp dir).",
)
@click.option("--appendonly", is_flag=True, help="redis: enable the AOF (for restarts).")
@click.option("--port", type=int, help="redis: port to reuse when restarting a state dir.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="artemis: an mqguard.toml whose address settings the broker gets.",
)
def start_cmd(
    kind: str, state_dir: Path | None, appendonly: bool, port: int | None,
    config_path: Path | None,
) -> None:
    """Start KIND in the background and print its handle as JSON."""
    if state_dir is not None and (state_dir / HANDLE_FILE).exists():
        previous = ServerHandle.load(state_dir)
        if previous.is_running():
            raise click.ClickException(
                f"a {previous.kind} server (pid {previous.pid}) already runs in {state_dir}; "
                "stop it first"
            )
    kwargs: dict[str, object] = {"state_dir": state_dir}
    if kind == "redis":
        kwargs.update(appendonly=appendonly, port=port)
    elif appendonly or port is not None:
        raise click.UsageError("--appendonly/--port only apply to redis")
    if config_path is not None:
        if kind != "artemis":
            raise click.UsageError("--config only applies to artemis")
        kwargs["config"] = config_path
    try:
        handle = start(kind, **kwargs)
    except (ServerUnavailable, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(handle.to_json())


@main.command()
@click.option(
    "--state-dir",
    "state_dirs",
    required=True,
    multiple=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="State dir of a server started by `start` (repeatable).",
)
def stop(state_dirs: tuple[Path, ...]) -> None:
    """Stop the server(s) recorded in STATE_DIR/handle.json."""
    for state_dir in state_dirs:
        try:
            handle = ServerHandle.load(state_dir)
        except ServerUnavailable as exc:
            raise click.ClickException(str(exc)) from exc
        handle.stop()
        click.echo(f"stopped {handle.kind} ({state_dir})")


@main.command()
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
)
def status(state_dir: Path) -> None:
    """Print the handle of STATE_DIR with a `running` flag; exit 1 if it is not running."""
    try:
        handle = ServerHandle.load(state_dir)
    except ServerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    data = json.loads(handle.to_json())
    data["running"] = handle.is_running()
    click.echo(json.dumps(data, indent=2, sort_keys=True))
    sys.exit(0 if data["running"] else 1)


if __name__ == "__main__":
    main(prog_name="python -m mqguard.servers")
