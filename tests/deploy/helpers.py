"""Shared helpers of the offline checks of deploy/ (nothing here needs Docker or a cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import yaml

from mqguard.cli.sidecar import sidecar
from mqguard.config import MqguardConfig, parse_config
from mqguard.plugin_manager import make_plugin_manager

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file (empty ones dropped)."""
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def sidecar_options(args: list[str]) -> dict[str, Any]:
    """Parse ``mqguard sidecar`` arguments with the real click command: an option that does
    not exist, a missing required one or a bad value raises ``click.UsageError``."""
    context = sidecar.make_context("sidecar", list(args))
    return dict(context.params)


def hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def upstream(options: dict[str, Any]) -> tuple[str, int, str | None, str | None]:
    parts = urlsplit(options["upstream"])
    return parts.hostname or "", parts.port or 61613, parts.username, parts.password


def load_toml_text(text: str, source: str) -> MqguardConfig:
    """Validate a mqguard.toml as the sidecar does: the loader, then every plugin's table."""
    import tomllib

    config = parse_config(tomllib.loads(text), source)
    make_plugin_manager(config)  # plugins validate [plugins.<name>] in their configure hook
    return config


__all__ = ["DEPLOY", "REPO", "click", "hostport", "load_toml_text", "sidecar_options",
           "upstream", "yaml_documents"]
