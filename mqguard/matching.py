"""Artemis-style address matching: ``.``-separated words, ``#`` and ``*`` wildcards.

``*`` matches exactly one word, ``#`` matches zero or more words, so
``news.#`` matches ``news``, ``news.europe`` and ``news.europe.sport``, while
``news.*`` matches only ``news.europe``.

When several match keys fit one address, the most specific one wins. Artemis
orders matches in ``HierarchicalObjectRepository``'s comparator; we keep its
observable rules and make the tie-breaks explicit (documented in
``docs/address-settings.md``):

1. an exact key (no wildcard) beats every wildcard key;
2. a key without ``#`` beats a key with ``#``;
3. among keys of the same kind, more literal words win, then fewer
   wildcards, then the key whose first wildcard comes later, then the longer key.
"""

from __future__ import annotations

from functools import lru_cache

ANY_WORDS = "#"
ONE_WORD = "*"
DELIMITER = "."


def is_wildcard(key: str) -> bool:
    return any(word in (ANY_WORDS, ONE_WORD) for word in key.split(DELIMITER))


@lru_cache(maxsize=4096)
def _split(key: str) -> tuple[str, ...]:
    return tuple(key.split(DELIMITER))


def matches(key: str, address: str) -> bool:
    """True when match key ``key`` applies to ``address``."""
    if key == address:
        return True
    return _match_words(_split(key), _split(address))


def _match_words(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    # Iterative matcher with one backtrack point per '#', the classic glob
    # algorithm on words: linear in practice, no recursion depth limits.
    p = w = 0
    star_p = star_w = -1
    while w < len(words):
        if p < len(pattern) and pattern[p] == ANY_WORDS:
            star_p, star_w = p, w
            p += 1
        elif p < len(pattern) and (pattern[p] == ONE_WORD or pattern[p] == words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            p = star_p + 1
            star_w += 1
            w = star_w
        else:
            return False
    while p < len(pattern) and pattern[p] == ANY_WORDS:
        p += 1
    return p == len(pattern)


def specificity(key: str) -> tuple[int, ...]:
    """Sort key: larger means more specific. See the module docstring for the rules."""
    words = _split(key)
    has_any = ANY_WORDS in words
    wildcards = [i for i, word in enumerate(words) if word in (ANY_WORDS, ONE_WORD)]
    literal = len(words) - len(wildcards)
    first_wildcard = wildcards[0] if wildcards else len(words)
    return (
        0 if wildcards else 1,
        0 if has_any else 1,
        literal,
        -len(wildcards),
        first_wildcard,
        len(key),
    )


def ordered_matches(keys: list[str], address: str) -> list[str]:
    """The keys that match ``address``, most specific first."""
    found = [key for key in keys if matches(key, address)]
    found.sort(key=specificity, reverse=True)
    return found
