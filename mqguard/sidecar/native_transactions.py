"""A native session's client transactions, decided frame by frame on the Python side.

BEGIN, COMMIT, ABORT and the SENDs and ACK/NACKs inside a transaction come to the
bridge one at a time (a ``TX`` batch); the verdicts are actions the native session
applies in order (see :mod:`mqguard.sidecar.native_verdicts`). The guard's view of the
transaction follows the client's: a transaction made rollback-only (a duplicate inside
it) is aborted at the broker and its COMMIT answered with an ERROR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqguard.adapter import Delivery
from mqguard.context import HookContext
from mqguard.pipeline import TransactionState
from mqguard.sidecar.frames import Frame, encode
from mqguard.sidecar.guarding import message_of_send
from mqguard.sidecar.native_verdicts import (
    ERROR,
    FORWARD,
    LOCAL_VERDICT,
    RESTORE,
    TxItem,
    Verdict,
)
from mqguard.sidecar.upstream import ack_headers
from mqguard.verdict import Action

if TYPE_CHECKING:
    from mqguard.sidecar.native_bridge import BridgedSession, NativeSessions

__all__ = ["BridgedTransaction", "TransactionFrames"]

#: Forward the client's own frame (its receipt through the chain).
_FORWARD_FRAME: Verdict = (FORWARD, 0, "", b"")


@dataclass(slots=True)
class BridgedTransaction:
    state: TransactionState
    #: Deliveries acknowledged inside the transaction: finished at COMMIT.
    acks: list[tuple[Delivery, HookContext]] = field(default_factory=list)


def _error(message: str, detail: str = "") -> Verdict:
    return (ERROR, 0, message[:200], detail.encode()[:2000])


class TransactionFrames:
    """Decides one transaction frame of one session."""

    def __init__(self, owner: NativeSessions, session: BridgedSession) -> None:
        self.owner = owner
        self.guard = owner.guard
        self.session = session

    def handle(self, item: TxItem) -> list[Verdict]:
        seq, command, header_list, body, tokens = item
        headers = dict(header_list)
        if command == "BEGIN":
            return self._begin(headers)
        if command == "SEND":
            return self._send(headers, body)
        if command == "COMMIT":
            return self._commit(seq, headers)
        if command == "ABORT":
            return self._abort(headers)
        return self._settle(command, headers, tokens)

    def _begin(self, headers: dict[str, str]) -> list[Verdict]:
        tx_id = headers.get("transaction")
        if not tx_id:
            return [_error("BEGIN without a transaction header")]
        transactions = self.session.transactions
        if tx_id in transactions:
            return [_error(f"transaction {tx_id!r} is already open")]
        transactions[tx_id] = BridgedTransaction(TransactionState(tx_id))
        return [_FORWARD_FRAME]

    def _send(self, headers: dict[str, str], body: bytes) -> list[Verdict]:
        session = self.session
        tx_id = headers.pop("transaction", "")
        destination = headers.pop("destination", "")
        receipt = headers.pop("receipt", None)
        transaction = session.transactions.get(tx_id)
        if transaction is None:
            return [_error(f"transaction {tx_id!r} was not begun")]
        message = message_of_send(body, destination, headers, producer_id=session.producer_id,
                                  sequence=session.sequence, broker=session.broker)
        decision = self.guard.decide_sends(
            [message], session.leg.capabilities, broker=session.broker, role="sidecar",
            sender=session.producer_id, transaction=transaction.state, batch=False)
        result = decision.results[0]
        self.owner.metrics.message("send", result.verdict.action.value)
        if result.verdict.action is Action.REJECT or result.forward is None:
            # Artemis: a REJECT makes the transaction rollback-only (the guard marked it);
            # its COMMIT fails. A DROP "succeeds" for the client.
            return [LOCAL_VERDICT]
        data, refused = self.owner.send_frame(session, destination, body, result, tx_id)
        if data is None:
            assert refused is not None
            return [refused]
        self.guard.settle_sends((result,))  # the guard holds it for the COMMIT
        # A receipt through the chain only if the client asked: RabbitMQ answers those of
        # a transaction's SENDs only at its COMMIT, and an ABORT would leave the chain
        # (and an ERROR queued behind it) waiting forever.
        return [(FORWARD, 1 if receipt is not None else 0, "", data)]

    def _take(self, headers: dict[str, str]) -> tuple[str, BridgedTransaction | None]:
        tx_id = headers.get("transaction") or ""
        return tx_id, self.session.transactions.pop(tx_id, None)

    def _commit(self, seq: int, headers: dict[str, str]) -> list[Verdict]:
        tx_id, transaction = self._take(headers)
        if transaction is None:
            return [_error(f"COMMIT of unknown transaction {tx_id!r}")]
        session, guard = self.session, self.guard
        state = transaction.state
        ctx = self.owner.transaction_context(session, state)
        reason = guard.commit_check(state, ctx)
        if reason is not None:
            abort = encode(Frame("ABORT", [("transaction", tx_id)]), session.version)
            guard.rolled_back(state, ctx, reason)
            self.owner.metrics.message("commit", "rolled-back")
            return [(FORWARD, 0, "", abort),
                    _error(f"transaction {tx_id} rolled back: {reason}",
                           f"COMMIT of {tx_id} failed, nothing of it was sent: {reason}")]
        leg = session.leg

        def committed() -> None:
            guard.committed(state, ctx)
            for delivery, delivery_ctx in transaction.acks:
                guard.finish_delivery(leg, delivery, delivery_ctx, None, settled=True)

        session.callbacks[seq] = (committed,
                                  lambda why: guard.commit_failed(state, ctx, why))
        commit = encode(Frame("COMMIT", [("transaction", tx_id)]), session.version)
        return [(FORWARD, 1, "", commit)]

    def _abort(self, headers: dict[str, str]) -> list[Verdict]:
        tx_id, transaction = self._take(headers)
        if transaction is None:
            return [_error(f"ABORT of unknown transaction {tx_id!r}")]
        session = self.session
        state = transaction.state
        self.guard.rolled_back(state, self.owner.transaction_context(session, state),
                               "aborted by the client")
        # Acks inside it are void: those deliveries are the client's to settle again.
        verdicts: list[Verdict] = []
        for delivery, delivery_ctx in transaction.acks:
            token = delivery.ack_token
            session.pending[token] = (delivery, delivery_ctx)
            session.leg.delivered(token)
            verdicts.append((RESTORE, 0, token, delivery.subscription_id.encode()))
        verdicts.append(_FORWARD_FRAME)
        return verdicts

    def _settle(self, command: str, headers: dict[str, str], tokens: list[str]
                ) -> list[Verdict]:
        session = self.session
        tx_id = headers.get("transaction") or ""
        transaction = session.transactions.get(tx_id)
        if transaction is None:
            return [_error(f"{command} in unknown transaction {tx_id!r}")]
        verdicts: list[Verdict] = []
        for token in tokens:
            entry = session.pending.pop(token, None)
            if entry is None:
                continue
            delivery, ctx = entry
            if command == "ACK":
                transaction.acks.append((delivery, ctx))
                session.leg.ack(delivery, transaction=tx_id)
            else:
                nack = Frame("NACK", [*ack_headers(session.version, token,
                                                   delivery.subscription_id),
                                      ("transaction", tx_id)])
                verdicts.append((FORWARD, 0, "", encode(nack, session.version)))
                session.leg.forget(token)
        verdicts.append(LOCAL_VERDICT)
        return verdicts
