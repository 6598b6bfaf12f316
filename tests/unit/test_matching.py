"""Artemis wildcard matching and specificity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqguard.matching import matches, ordered_matches


@pytest.mark.parametrize(
    ("key", "address", "expected"),
    [
        ("news.europe", "news.europe", True),
        ("news.europe", "news.usa", False),
        ("news.*", "news.europe", True),
        ("news.*", "news", False),
        ("news.*", "news.europe.sport", False),
        ("news.#", "news", True),  # '#' matches zero words
        ("news.#", "news.europe", True),
        ("news.#", "news.europe.sport", True),
        ("news.#", "sport", False),
        ("#", "anything.at.all", True),
        ("#.sport", "news.europe.sport", True),
        ("#.sport", "sport", True),
        ("news.#.sport", "news.sport", True),
        ("news.#.sport", "news.europe.uk.sport", True),
        ("news.#.sport", "news.europe.uk", False),
        ("*.europe.*", "news.europe.sport", True),
        ("*.europe.*", "europe.sport", False),
        ("news.*.#", "news", False),
        ("news.*.#", "news.europe", True),
    ],
)
def test_matching_table(key: str, address: str, expected: bool) -> None:
    assert matches(key, address) is expected


def test_exact_beats_wildcards() -> None:
    keys = ["#", "news.#", "news.*", "news.europe"]
    assert ordered_matches(keys, "news.europe") == ["news.europe", "news.*", "news.#", "#"]


def test_any_words_loses_to_single_word_and_longer_any_wins() -> None:
    keys = ["#", "news.europe.#", "news.#", "*.europe.sport"]
    assert ordered_matches(keys, "news.europe.sport") == [
        "*.europe.sport", "news.europe.#", "news.#", "#"]


def test_non_matching_keys_are_excluded() -> None:
    assert ordered_matches(["orders.#", "payments.#"], "orders.eu") == ["orders.#"]


words = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5)


@given(words)
def test_literal_key_matches_only_itself(address_words: list[str]) -> None:
    address = ".".join(address_words)
    assert matches(address, address)
    assert matches("#", address)
    assert not matches(address + ".x", address)


@given(words, words)
def test_hash_suffix_matches_every_extension(prefix: list[str], rest: list[str]) -> None:
    key = ".".join([*prefix, "#"])
    assert matches(key, ".".join(prefix))
    assert matches(key, ".".join(prefix + rest))
