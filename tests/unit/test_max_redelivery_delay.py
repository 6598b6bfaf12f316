"""``max-redelivery-delay``: only an unset value defaults (Artemis ``AddressSettings``).

Artemis keeps the setting as a nullable ``Long``: ``getMaxRedeliveryDelay()`` falls back to
``10 x redelivery-delay`` only when it is null, ``merge`` inherits only null values, and
``QueueImpl.calculateRedeliveryDelay`` caps every delay with it unconditionally. An explicit
0 therefore redelivers at once, whatever ``redelivery-delay`` says.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mqguard.cli import main
from mqguard.config import parse_config
from mqguard.plugins.delivery_counting import redelivery_delay
from mqguard.settings import AddressSettings, AddressSettingsRepository


def repo(tables: dict[str, dict[str, object]]) -> AddressSettingsRepository:
    return parse_config({"address-settings": tables}).address_settings_repository()


def test_explicit_zero_caps_every_delay_at_zero() -> None:
    settings = repo({"q": {"redelivery-delay": 1000, "redelivery-delay-multiplier": 2,
                           "max-redelivery-delay": 0}}).resolve("q")
    assert settings.max_redelivery_delay == 0
    assert [redelivery_delay(settings, n) for n in range(1, 6)] == [0, 0, 0, 0, 0]


def test_explicit_zero_is_inherited_not_replaced_by_the_default() -> None:
    r = repo({"#": {"max-redelivery-delay": 0}, "orders.#": {"redelivery-delay": 500}})
    settings = r.resolve("orders.eu")
    assert (settings.redelivery_delay, settings.max_redelivery_delay) == (500, 0)
    assert redelivery_delay(settings, 3) == 0


def test_unset_still_defaults_to_ten_times_the_delay() -> None:
    settings = repo({"q": {"redelivery-delay": 300, "redelivery-delay-multiplier": 10}}
                    ).resolve("q")
    assert settings.max_redelivery_delay == 3000
    assert [redelivery_delay(settings, n) for n in range(1, 4)] == [300, 3000, 3000]


def test_settings_built_in_code_resolve_an_unset_cap_the_same_way() -> None:
    # A plugin or test building settings directly gets Artemis's getter too.
    assert AddressSettings(redelivery_delay=200).max_redelivery_delay == 2000
    assert AddressSettings(redelivery_delay=200, max_redelivery_delay=0).max_redelivery_delay == 0
    assert redelivery_delay(AddressSettings(redelivery_delay=200, max_redelivery_delay=0), 1) == 0


def test_config_show_prints_the_explicit_zero(tmp_path: Path) -> None:
    path = tmp_path / "mqguard.toml"
    path.write_text('[address-settings."q"]\nredelivery-delay = 1000\n'
                    "max-redelivery-delay = 0\n"
                    '[address-settings."r"]\nredelivery-delay = 1000\n')
    runner = CliRunner()
    shown = json.loads(runner.invoke(main, ["config", "show", "q", "-c", str(path)],
                                     catch_exceptions=False).output)
    assert shown["settings"]["max_redelivery_delay"] == 0
    shown = json.loads(runner.invoke(main, ["config", "show", "r", "-c", str(path)],
                                     catch_exceptions=False).output)
    assert shown["settings"]["max_redelivery_delay"] == 10_000
