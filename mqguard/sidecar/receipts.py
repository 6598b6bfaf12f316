"""Receipts in the order the client asked for them.

The sidecar answers some frames itself (a duplicate SEND is not forwarded, yet
its receipt is owed) while the broker answers others. A client may rely on
receipts arriving in order (STOMP: a receipt for a frame means every earlier
frame was processed too), so every receipt, local or the broker's, goes through
one chain and leaves it only when everything before it has been confirmed.

Every frame the sidecar forwards with a receipt carries an id of the sidecar's
own (``mqguard-r-<n>``), so client receipt ids never collide with internal ones
and the broker's answer maps back to exactly one entry. Callbacks let the owner
record outcomes (a ``sent`` event only once the broker confirmed the SEND).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: Prefix of the receipt ids the chain puts on forwarded frames.
CHAIN_RECEIPT_PREFIX = "mqguard-r-"


@dataclass(slots=True)
class _Entry:
    receipt_id: str
    #: The client's own receipt id, owed once this entry is confirmed; None if none asked.
    client_receipt: str | None
    on_done: Callable[[], None] | None
    on_fail: Callable[[str], None] | None
    done: bool = False


class ReceiptChain:
    """Pending receipts of one connection, released strictly in order."""

    def __init__(self, send_receipt: Callable[[str], None]) -> None:
        #: Writes a RECEIPT frame with this ``receipt-id`` to the client.
        self._send_receipt = send_receipt
        self._entries: deque[_Entry] = deque()
        self._by_id: dict[str, _Entry] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def expect(self, client_receipt: str | None = None, *,
               on_done: Callable[[], None] | None = None,
               on_fail: Callable[[str], None] | None = None) -> str:
        """Register a frame about to be forwarded; returns the receipt id to put on it."""
        entry = _Entry(f"{CHAIN_RECEIPT_PREFIX}{next(self._ids)}", client_receipt, on_done,
                       on_fail)
        self._entries.append(entry)
        self._by_id[entry.receipt_id] = entry
        return entry.receipt_id

    def local(self, client_receipt: str | None, on_done: Callable[[], None] | None = None
              ) -> None:
        """A frame the sidecar settled itself: its receipt follows every earlier one."""
        if client_receipt is None and on_done is None:
            return
        entry = _Entry("", client_receipt, on_done, None, done=True)
        self._entries.append(entry)
        self._release()

    def hold(self, client_receipt: str | None = None) -> Callable[[], None]:
        """An entry for work the sidecar finishes on its own, off the chain: a delayed
        re-send the guard deferred waits for a RECEIPT of the leg's, not the chain's. Every
        later receipt -- and the DISCONNECT, which waits for an empty chain -- follows it,
        so the broker never sees a DISCONNECT ahead of that work.

        Returns the function that confirms the entry (loop thread only). A second call,
        or one after :meth:`fail_all`, does nothing.
        """
        entry = _Entry("", client_receipt, None, None)
        self._entries.append(entry)

        def release() -> None:
            if entry.done:
                return
            entry.done = True
            self._release()  # a no-op for an entry fail_all already took away

        return release

    def owns(self, receipt_id: str) -> bool:
        return receipt_id in self._by_id

    def confirmed(self, receipt_id: str) -> None:
        """The broker's RECEIPT for one of the chain's ids arrived."""
        entry = self._by_id.pop(receipt_id, None)
        if entry is None:
            return
        entry.done = True
        self._release()

    def client_receipt_of(self, receipt_id: str) -> str | None:
        entry = self._by_id.get(receipt_id)
        return entry.client_receipt if entry else None

    def fail_all(self, reason: str) -> list[str]:
        """The connection ended: every unconfirmed entry failed. Returns the client receipt
        ids that will never come (for the log)."""
        lost: list[str] = []
        entries, self._entries = self._entries, deque()
        self._by_id.clear()
        for entry in entries:
            if entry.done:
                # Confirmed by the broker, only queued behind an unconfirmed one.
                if entry.on_done is not None:
                    entry.on_done()
                continue
            if entry.client_receipt is not None:
                lost.append(entry.client_receipt)
            if entry.on_fail is not None:
                entry.on_fail(reason)
        return lost

    def _release(self) -> None:
        entries = self._entries
        while entries and entries[0].done:
            entry = entries.popleft()
            if entry.on_done is not None:
                entry.on_done()
            if entry.client_receipt is not None:
                self._send_receipt(entry.client_receipt)
