"""Fixed-size digests of duplicate ids.

Rings hold an 8-byte BLAKE2b digest of each id instead of the id itself, so a
cached id costs the same few bytes whatever its length (a 36-character UUID
would otherwise dominate Redis memory). Two different ids collide with
probability 2**-64 per pair; with a ring of n ids, a new id is wrongly taken
for a duplicate with probability about n / 2**64 (n = 1,000,000: ~5e-14).
"""

from __future__ import annotations

from hashlib import blake2b

DIGEST_SIZE = 8


def id_digest(value: str) -> bytes:
    """The ring key of a duplicate id."""
    return blake2b(value.encode("utf-8"), digest_size=DIGEST_SIZE).digest()
