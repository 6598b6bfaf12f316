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


class _Draws:
    """A stand-in for random.Random that returns fixed draws, in order."""

    def __init__(self, *values: float) -> None:
        self._values = list(values)

    def random(self) -> float:
        return self._values.pop(0)


def test_delay_truncates_like_java_before_and_after_the_variance() -> None:
    # Artemis: (long)(3 * 1.5) = 4; then 4 + 4 * 0.495 = 5.98 -> 5. Keeping the fraction
    # until the end would give 4.5 * 1.495 = 6.7 -> 6.
    settings = AddressSettings(redelivery_delay=3, redelivery_delay_multiplier=1.5,
                               redelivery_collision_avoidance_factor=0.5,
                               max_redelivery_delay=1000)
    assert redelivery_delay(settings, 2, _Draws(0.1, 0.99)) == 5  # type: ignore[arg-type]
    assert redelivery_delay(settings, 2, _Draws(0.9, 0.5)) == 3  # 4 - 1.0
    assert redelivery_delay(settings, 1, _Draws(0.1, 0.0)) == 3


def test_a_huge_delivery_count_is_capped_not_an_overflow() -> None:
    # Unlimited attempts: the count keeps growing, multiplier^(count-1) overflows a double.
    settings = AddressSettings(redelivery_delay=100, redelivery_delay_multiplier=2.0,
                               redelivery_collision_avoidance_factor=0.3,
                               max_delivery_attempts=-1, max_redelivery_delay=60_000)
    assert redelivery_delay(settings, 5000) == 60_000
    assert redelivery_delay(AddressSettings(redelivery_delay=100,
                                            redelivery_delay_multiplier=2.0,
                                            max_redelivery_delay=0), 5000) == 0
