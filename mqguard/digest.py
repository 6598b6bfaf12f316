"""Fixed-size digests of duplicate ids, and duplicate ids taken from a message's content.

Rings hold an 8-byte BLAKE2b digest of each id instead of the id itself, so a
cached id costs the same few bytes whatever its length (a 36-character UUID
would otherwise dominate Redis memory). Two different ids collide with
probability 2**-64 per pair; with a ring of n ids, a new id is wrongly taken
for a duplicate with probability about n / 2**64 (n = 1,000,000: ~5e-14).

:func:`content_id` is the duplicate id of a message that carries none, on an address
with ``duplicate-id-from = "content"``: a BLAKE2b-128 digest of a canonical encoding
of the body and of the chosen headers. Every field is length-prefixed and a missing
header is told apart from an empty one, so two different inputs never encode alike
(body ``ab`` + header ``c`` cannot meet body ``a`` + header ``bc``). The ring then keeps
the 8-byte digest of that id like any other, so the odds above hold for it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from hashlib import blake2b

__all__ = ["CONTENT_ID_PREFIX", "DIGEST_SIZE", "content_id", "content_id_input", "id_digest"]

DIGEST_SIZE = 8
#: Content ids read ``content:<32 hex digits>``: events and consumers tell them apart from
#: ids a producer chose.
CONTENT_ID_PREFIX = "content:"
#: Versions the encoding: a future change of it cannot meet today's ids.
_DOMAIN = b"mqguard-content-id/1"


def id_digest(value: str) -> bytes:
    """The ring key of a duplicate id."""
    return blake2b(value.encode("utf-8"), digest_size=DIGEST_SIZE).digest()


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def content_id_input(body: bytes, headers: Mapping[str, str], names: Sequence[str]) -> bytes:
    """The canonical encoding :func:`content_id` hashes: the domain tag, the body, then per
    chosen header (in the configured order) its name and either ``0`` (absent) or ``1``
    and its value, each of name, body and value preceded by its length (8 bytes)."""
    parts = [_field(_DOMAIN), _field(body)]
    for name in names:
        parts.append(_field(name.encode("utf-8")))
        value = headers.get(name)
        if value is None:
            parts.append(b"\x00")
        else:
            parts.append(b"\x01" + _field(value.encode("utf-8")))
    return b"".join(parts)


def content_id(body: bytes, headers: Mapping[str, str], names: Sequence[str] = ()) -> str:
    """The duplicate id of a message by its content: ``content:`` + BLAKE2b-128 in hex."""
    digest = blake2b(content_id_input(body, headers, names), digest_size=16).hexdigest()
    return CONTENT_ID_PREFIX + digest
