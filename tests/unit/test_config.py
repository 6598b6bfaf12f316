"""Configuration errors name the file, the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqguard.config import load_config, parse_config
from mqguard.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mqguard.toml"
    path.write_text(text)
    return path


def test_bad_value_names_file_key_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, '[address-settings."orders.#"]\nmax-delivery-attempts = "ten"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert str(path) in text
    assert 'address-settings."orders.#".max-delivery-attempts' in text
    assert "'ten'" in text


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, '[address-settings."#"]\nmax-delivery-attemps = 3\n')
    with pytest.raises(ConfigError, match="max-delivery-attemps: unknown key"):
        load_config(path)


def test_out_of_range_values(tmp_path: Path) -> None:
    path = write(tmp_path, '[address-settings."#"]\nredelivery-collision-avoidance-factor = 2.5\n'
                 'id-cache-size = -1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "redelivery-collision-avoidance-factor = 2.5" in str(info.value)
    assert "id-cache-size = -1" in str(info.value)


def test_integer_multiplier_is_accepted() -> None:
    cfg = parse_config({"address-settings": {"#": {"redelivery-delay-multiplier": 2}}})
    assert cfg.address_settings_repository().resolve("x").redelivery_delay_multiplier == 2.0


def test_bad_match_key() -> None:
    with pytest.raises(ConfigError, match="whole words"):
        parse_config({"address-settings": {"orders.ab#": {}}})
    with pytest.raises(ConfigError, match="empty word"):
        parse_config({"address-settings": {"orders..x": {}}})


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[mqguard\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml")


def test_store_url_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"mqguard\.store = 'mysql://x'"):
        parse_config({"mqguard": {"store": "mysql://x"}})


def test_defaults_without_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.core.store == "memory"
    assert cfg.core.event_log.directory == "mqguard-events"


def test_full_example_file_loads() -> None:
    example = Path(__file__).parents[2] / "mqguard.example.toml"
    cfg = load_config(example)
    assert cfg.address_settings
