"""Doctor checks of the configuration: the file validates, plugins accept their tables, and
what the duplicate-ID rings it configures will need in Redis."""

from __future__ import annotations

from dataclasses import dataclass

from mqguard.config import MqguardConfig, load_config
from mqguard.doctor.model import Check, Status
from mqguard.errors import ConfigError
from mqguard.plugin_manager import make_plugin_manager
from mqguard.redact import redact_urls_in

__all__ = ["BYTES_PER_ID", "RingBudget", "check_config", "ring_budget"]

#: Redis memory per cached duplicate id, measured (docs/duplicate-detection.md).
BYTES_PER_ID = 25


@dataclass(frozen=True, slots=True)
class RingBudget:
    """The duplicate-ID rings the configuration implies: one per address."""

    #: Addresses budgeted for (named ones, one per wildcard match key, and any more asked).
    addresses: int
    #: Ids held when every ring is full.
    ids: int

    @property
    def bytes(self) -> int:
        return self.ids * BYTES_PER_ID


def _representative(match_key: str) -> str:
    """An address a match key applies to: its wildcard words replaced by a plain word."""
    return ".".join("_" if word in ("#", "*") else word for word in match_key.split("."))


def ring_budget(config: MqguardConfig, addresses: int | None = None) -> RingBudget:
    """Ids the rings hold when full: each address named in the configuration (address
    settings, group queues; a wildcard match key counts as one address) at its resolved
    ``id-cache-size``, plus addresses under the defaults up to ``addresses`` in all."""
    repo = config.address_settings_repository()
    named = {_representative(key) for key in config.address_settings}
    for group in config.core.groups.values():
        named.update(group.queues)
    named.discard("_")  # the "#" key: the defaults, counted below
    ids = sum(repo.resolve(address).id_cache_size for address in named)
    count = len(named)
    default_size = repo.resolve("mqguard-doctor-any-address").id_cache_size
    if addresses is not None and addresses > count:
        ids += (addresses - count) * default_size
        count = addresses
    elif count == 0:
        ids, count = default_size, 1
    return RingBudget(addresses=count, ids=ids)


def check_config(path: str | None) -> tuple[list[Check], MqguardConfig | None]:
    """Load and validate ``path`` (default ./mqguard.toml, else the defaults) and every
    plugin's table; the configuration, or None when it is invalid."""
    try:
        config = load_config(path)
        # Plugins validate their own [plugins.<name>] tables when they are configured.
        make_plugin_manager(config)
    except ConfigError as exc:
        return [Check("config", "validates", Status.ERROR, redact_urls_in(str(exc)),
                      fix="correct the key the message names (mqguard config check PATH shows "
                          "every error; docs/configuration.md lists every key)")], None
    return [Check("config", "validates", Status.OK,
                  f"{config.source}: valid ({len(config.address_settings)} address-settings "
                  "entries)", data={"source": config.source})], config
