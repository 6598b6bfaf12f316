"""ReceiptChain.hold: work the sidecar finishes off the chain still orders the receipts."""

from __future__ import annotations

from mqguard.sidecar.receipts import ReceiptChain


def test_a_hold_keeps_later_receipts_until_released() -> None:
    sent: list[str] = []
    chain = ReceiptChain(sent.append)
    release = chain.hold("nack")
    chain.local("ack-after")
    broker = chain.expect("send-after")
    chain.confirmed(broker)
    assert sent == [] and len(chain) == 3  # a DISCONNECT waits for an empty chain
    release()
    assert sent == ["nack", "ack-after", "send-after"] and len(chain) == 0
    release()  # a second release does nothing
    assert sent == ["nack", "ack-after", "send-after"]


def test_a_hold_without_a_client_receipt_only_orders() -> None:
    sent: list[str] = []
    chain = ReceiptChain(sent.append)
    release = chain.hold()
    chain.local("after")
    assert sent == []
    release()
    assert sent == ["after"]


def test_a_hold_outstanding_when_the_connection_ends_is_lost_and_its_release_is_inert() -> None:
    sent: list[str] = []
    chain = ReceiptChain(sent.append)
    release = chain.hold("nack")
    assert chain.fail_all("gone") == ["nack"]
    chain.local("later")  # a new entry after the loss is released on its own
    release()
    assert sent == ["later"] and len(chain) == 0
