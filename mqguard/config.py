"""Loading and validating ``mqguard.toml``.

Every mistake becomes a :class:`~mqguard.errors.ConfigError` that names the
file, the key (as a TOML path) and the offending value, because operators read
these at 3 a.m.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mqguard.errors import ConfigError
from mqguard.redact import AMBIGUOUS_USERINFO, redact_urls_in, userinfo_is_ambiguous
from mqguard.settings import AddressSettingsRepository, AddressSettingsTable

DEFAULT_CONFIG_FILE = "mqguard.toml"


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=_kebab, populate_by_name=True,
                              frozen=True, strict=True)


class EventLogConfig(_Section):
    """``[mqguard.event-log]``: where and how events are written."""

    #: Write events at all; off, the audit has nothing to read.
    enabled: bool = True
    #: Directory of the JSONL files; each process writes its own file in it.
    directory: str = "mqguard-events"
    #: Rotate the current file once it exceeds this many bytes.
    max_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    #: Rotated files kept per process; 0 keeps them all.
    backup_count: int = Field(20, ge=0)
    #: Format of rotated files: ``parquet`` (columnar, what ``mqguard audit`` reads
    #: fastest) or ``jsonl.gz`` (gzipped lines, as before). The current file is JSONL.
    rotated_format: Literal["parquet", "jsonl.gz"] = "parquet"
    #: Upper bound on how long an event may sit in memory before it is written.
    flush_interval_ms: int = Field(200, ge=1, le=60_000)
    #: Events buffered before a write is forced regardless of the time bound.
    buffer_events: int = Field(4096, ge=1, le=1_000_000)
    #: fsync after each write: survives power loss, costs throughput.
    fsync: bool = False
    #: Write each event before the guard goes on (one write per event, no buffering): a
    #: process killed with SIGKILL then loses no event it emitted. Costs throughput.
    sync: bool = False


class SidecarConfig(_Section):
    """``[mqguard.sidecar]``: limits and behaviour of ``mqguard sidecar`` (docs/sidecar.md)."""

    #: Largest frame (headers and body) accepted from a client. The broker leg accepts
    #: more (what the broker and mqguard add to a message), so whatever a client may send
    #: can be delivered back (docs/sidecar.md, "Message size and the broker leg").
    max_frame_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: Most headers in one frame from a client (the broker leg: 80 more).
    max_header_count: int = Field(128, ge=8, le=100_000)
    #: Longest ``name:value`` header line from a client, in bytes, as sent (escaped); the
    #: broker leg takes twice that (STOMP escaping at most doubles a line), 8 KiB at least.
    max_header_line_bytes: int = Field(8192, ge=256, le=16 * 1024 * 1024)
    #: Client connections served at once; more are refused with an ERROR frame.
    max_connections: int = Field(1024, ge=1, le=1_000_000)
    #: Largest frame a client may send before the broker's CONNECTED (its CONNECT is tiny):
    #: an unauthenticated connection cannot make the sidecar buffer more than this.
    max_handshake_frame_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    #: Connections still waiting for their CONNECT, at most (and at most half of the
    #: sessions served); when full, the oldest one is closed with an ERROR frame, so a
    #: flood of idle connections cannot crowd out clients.
    max_pending_handshakes: int = Field(256, ge=1, le=1_000_000)
    #: Time allowed for a client's CONNECT frame, and for the broker to answer it.
    connect_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    #: On shutdown, how long in-flight frames (unconfirmed sends, receipts) may take.
    drain_timeout_ms: int = Field(5_000, ge=0, le=600_000)
    #: Also send ActiveMQ's native ``expires`` (ActiveMQ then expires messages to
    #: ActiveMQ.DLQ itself, before mqguard's expiry address sees them).
    native_expiry: bool = False
    #: The data plane: ``native``, the only one (sockets, framing and sessions in the
    #: Rust runtime, the guard called once per read batch; docs/sidecar.md, "Data plane").
    #: ``native-session``, its earlier name, is accepted too.
    data_plane: Literal["native", "native-session"] = "native"

    @field_validator("data_plane", mode="before")
    @classmethod
    def _no_python_plane(cls, value: object) -> object:
        if value == "python":
            raise ValueError("the python data plane was removed: the sidecar's sessions run "
                             "in the native runtime; remove data-plane or set it to "
                             "\"native\"")
        return value


#: Artemis ``MessageLoadBalancingType`` values (cluster-connection ``message-load-balancing``).
LOAD_BALANCING_TYPES = ("OFF", "STRICT", "ON_DEMAND", "OFF_WITH_REDISTRIBUTION")


class GroupConfig(_Section):
    """``[mqguard.groups.<name>]``: independent brokers holding queues of the same names,
    balanced like an Artemis cluster (docs/load-balancing.md)."""

    #: Broker URLs (``stomp://host:port``...), at least one; the first is the local node
    #: unless ``local`` names another.
    nodes: list[str] = Field(min_length=1, max_length=64)
    #: The node this process sends to under OFF / OFF_WITH_REDISTRIBUTION and falls back to.
    local: str | None = None
    #: Artemis ``message-load-balancing``: OFF, STRICT, ON_DEMAND (Artemis's default) or
    #: OFF_WITH_REDISTRIBUTION.
    message_load_balancing: str = "ON_DEMAND"
    #: A consumer's presence lapses this long after its last heartbeat (beats every third).
    presence_ttl_ms: int = Field(10_000, ge=300, le=3_600_000)
    #: Queues the redistributor watches (it cannot list a broker's queues).
    queues: list[str] = Field(default_factory=list, max_length=10_000)
    #: How often the redistributor looks at every queue of the group, in ms.
    redistribution_scan_period_ms: int = Field(1000, ge=10, le=3_600_000)

    @field_validator("message_load_balancing", mode="before")
    @classmethod
    def _known_type(cls, value: object) -> object:
        if isinstance(value, str):
            normal = value.strip().upper().replace("-", "_")
            if normal not in LOAD_BALANCING_TYPES:
                raise ValueError(f"must be one of {', '.join(LOAD_BALANCING_TYPES)}")
            return normal
        return value

    @field_validator("nodes")
    @classmethod
    def _node_urls(cls, value: list[str]) -> list[str]:
        from urllib.parse import urlsplit

        seen: set[str] = set()
        for url in value:
            parts = urlsplit(url)
            try:
                port = parts.port
            except ValueError:
                port = None
            where = _redact(url)
            if userinfo_is_ambiguous(url):
                raise ValueError(f"node {where!r}: {AMBIGUOUS_USERINFO}")
            if not parts.scheme or not parts.hostname or port is None:
                raise ValueError(f"node {where!r} must be a broker URL with scheme, host "
                                 "and port (stomp://127.0.0.1:61613)")
            where = f"{parts.scheme}://{parts.hostname}:{port}"
            if where in seen:
                raise ValueError(f"node {where!r} is listed twice")
            seen.add(where)
        return value

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip() or any(c in name for c in "#*"):
                raise ValueError(f"queue {name!r} must be a non-blank name without wildcards")
        return value

    def local_node(self) -> str:
        """URL of the local node."""
        return self.local if self.local is not None else self.nodes[0]

    def model_post_init(self, _context: Any) -> None:
        if self.local is not None and self.local not in self.nodes:
            raise ValueError(f"local {self.local!r} is not one of the nodes")


class CoreConfig(_Section):
    """``[mqguard]``: the process-wide settings."""

    #: Identifies this process in events and store keys; default ``<host>-<pid>``.
    node_id: str | None = None
    #: ``memory`` (one process, the default) or a Redis URL: ``redis://``, ``rediss://``,
    #: ``unix://``, ``redis+cluster://host:port`` for Redis Cluster.
    store: str = "memory"
    #: Built-in or third-party plugin names not to load.
    disabled_plugins: list[str] = Field(default_factory=list)
    #: Artemis global ``id-cache-size``; per-address settings override it.
    id_cache_size: int = Field(20000, ge=0)
    #: Artemis ``message-expiry-scan-period`` in ms; -1 turns the reaper off.
    message_expiry_scan_period: int = Field(30000, ge=-1)
    #: ``[mqguard.event-log]`` table.
    event_log: EventLogConfig = Field(default_factory=EventLogConfig)
    #: ``[mqguard.sidecar]`` table.
    sidecar: SidecarConfig = Field(default_factory=SidecarConfig)
    #: ``[mqguard.groups.<name>]``: broker groups for load balancing and redistribution.
    groups: dict[str, GroupConfig] = Field(default_factory=dict)

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        schemes = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
        if value != "memory" and not value.startswith(schemes):
            raise ValueError("must be 'memory' or a redis://, rediss://, unix:// or "
                             "redis+cluster:// URL")
        return value


class MqguardConfig(BaseModel):
    """The whole of ``mqguard.toml``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    #: ``[mqguard]`` table.
    core: CoreConfig = Field(default_factory=CoreConfig, alias="mqguard")
    #: ``[address-settings."<match>"]`` tables, keyed by match key.
    address_settings: dict[str, AddressSettingsTable] = Field(
        default_factory=dict, alias="address-settings")
    #: Free-form ``[plugins.<name>]`` tables; each plugin validates its own.
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: Where the configuration came from, for error messages.
    source: str = Field("<defaults>", exclude=True)

    @field_validator("address_settings")
    @classmethod
    def _valid_match_keys(cls, value: dict[str, AddressSettingsTable]
                          ) -> dict[str, AddressSettingsTable]:
        for key in value:
            words = key.split(".")
            if not key or any(word == "" for word in words):
                raise ValueError(f"match key {key!r} has an empty word")
            if any(("#" in w or "*" in w) and w not in ("#", "*") for w in words):
                raise ValueError(f"match key {key!r}: '#' and '*' must be whole words")
        return value

    @property
    def node_id(self) -> str:
        return self.core.node_id or f"{socket.gethostname()}-{os.getpid()}"

    def address_settings_repository(self) -> AddressSettingsRepository:
        return AddressSettingsRepository(self.address_settings,
                                         global_id_cache_size=self.core.id_cache_size)

    def plugin_options(self, name: str) -> dict[str, Any]:
        return dict(self.plugins.get(name, {}))

    def with_overrides(self, **core_changes: Any) -> MqguardConfig:
        """A copy with some ``[mqguard]`` values replaced (used by the CLI and tests)."""
        core = self.core.model_copy(update=core_changes)
        return self.model_copy(update={"core": core})


def _format_location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        text = str(item)
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        text = _kebab(text)
        needs_quotes = not text.replace("-", "").replace("_", "").isalnum()
        parts.append(f'"{text}"' if needs_quotes else text)
    return ".".join(parts).replace(".[", "[")


def _redact(text: str) -> str:
    """``text`` with the user-info of every URL in it masked (passwords holding URL
    delimiters included: :func:`mqguard.redact.redact_urls_in`)."""
    return redact_urls_in(text)


def _validation_error(source: str, error: ValidationError,
                      prefix: tuple[str, ...] = ()) -> ConfigError:
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        location = ".".join((*prefix, _format_location(tuple(item["loc"]))))
        value = item.get("input")
        if item["type"] == "extra_forbidden":
            lines.append(f"  {location}: unknown key (value {_redact(repr(value))})")
        else:
            # Broker URLs (groups) may carry credentials: never print a password.
            lines.append(f"  {location} = {_redact(repr(value))}: {_redact(item['msg'])}")
    return ConfigError("\n".join(lines))


class PluginOptions(BaseModel):
    """Base of a plugin's ``[plugins.<name>]`` table: kebab-case keys, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", alias_generator=_kebab, populate_by_name=True,
                              frozen=True, strict=True)


_Options = TypeVar("_Options", bound=PluginOptions)


def parse_plugin_options(config: MqguardConfig, name: str, model: type[_Options]) -> _Options:
    """Validate ``[plugins.<name>]`` with ``model``; ConfigError naming file, key and value."""
    try:
        return model.model_validate(config.plugin_options(name))
    except ValidationError as exc:
        raise _validation_error(config.source, exc, ("plugins", name)) from None


def parse_config(data: dict[str, Any], source: str = "<inline>") -> MqguardConfig:
    """Validate an already-parsed TOML document."""
    try:
        return MqguardConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise _validation_error(source, exc) from None


def load_config(path: str | os.PathLike[str] | None = None) -> MqguardConfig:
    """Load ``path``; with no path, ``./mqguard.toml`` if present, else the defaults."""
    if path is None:
        candidate = Path(DEFAULT_CONFIG_FILE)
        if not candidate.exists():
            return MqguardConfig()
        path = candidate
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read configuration: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_config(data, str(file))
