"""The plain data of the native data plane's bridge: batch kinds and verdict codes, as
``native/src/session/bridge.rs`` defines them."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACKS", "CONFIRMED", "DISCONNECT", "ENDED", "ERROR", "FORWARD", "FORWARD_VERDICT",
    "GUARD", "HOLD", "LEG_RECEIPT", "LOCAL", "LOCAL_VERDICT", "MESSAGES", "OPEN", "OVERSIZED",
    "RESTORE",
    "SENDS", "STARTED", "SYNC", "TX", "UNSUBSCRIBED", "TxItem", "Verdict",
]

#: ``Plane.drain`` event kind of a guard batch.
GUARD: Final = 8
# Batch kinds.
OPEN: Final = 0
SENDS: Final = 1
MESSAGES: Final = 2
ACKS: Final = 3
DISCONNECT: Final = 4
CONFIRMED: Final = 5
LEG_RECEIPT: Final = 6
UNSUBSCRIBED: Final = 7
ENDED: Final = 8
TX: Final = 9
#: Nothing to decide: answered once the batches before it are handled.
SYNC: Final = 10
#: Notice: a client was accepted; its session starts.
STARTED: Final = 11
#: A MESSAGE over the broker leg's limits (see ``mqguard.sidecar.native_oversized``).
OVERSIZED: Final = 12
# Verdict codes.
LOCAL: Final = 0
FORWARD: Final = 1
ERROR: Final = 2
HOLD: Final = 3
RESTORE: Final = 4

#: ``(code, number, text, data)``.
Verdict = tuple[int, int, str, bytes]
LOCAL_VERDICT: Final[Verdict] = (LOCAL, 0, "", b"")
FORWARD_VERDICT: Final[Verdict] = (FORWARD, 0, "", b"")
#: A transaction frame: sequence number, command, headers, body, tokens it settles.
TxItem = tuple[int, str, list[tuple[str, str]], bytes, list[str]]
