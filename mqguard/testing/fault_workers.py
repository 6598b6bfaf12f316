"""Killable producer and consumer processes for the fault-injection suite.

(tests/audit/test_faults.py).
Each worker is its own OS process so that :mod:`mqguard.testing.chaos` can SIGKILL it at any
instruction and start it again::

    python -m mqguard.testing.fault_workers produce --via wrapped  --spec SPEC.json
    python -m mqguard.testing.fault_workers consume --via sidecar  --spec SPEC.json

``--via wrapped`` uses :class:`~mqguard.producer.GuardedProducer` /
:class:`~mqguard.consumer.GuardedConsumer` straight to the broker; ``--via sidecar`` uses
plain stomp.py clients through ``mqguard sidecar`` (the way an unmodified application is
guarded). What each sends is the seeded :class:`~mqguard.demo.plan.DemoPlan` of its leg.

Crash-safety of the workers themselves (so that what the audit finds is mqguard's doing):

- A producer keeps, in its progress file, how many frames of its plan the broker (or the
  sidecar) confirmed; it writes it after each confirmed window, by atomic rename. Restarted, it
  re-sends from there with the *same duplicate ids*, so whatever the broker already had is
  dropped by duplicate detection.
- A consumer's handler appends one line per invocation to its handled file with a single
  unbuffered ``write`` (O_APPEND) before it returns: a SIGKILL of the process cannot lose a line
  the kernel accepted, so duplicate handler invocations are measured, not assumed.
- Any error a worker cannot ride out (the broker, Redis or the sidecar gone for longer than its
  retry budget, the sidecar connection dropped) ends the process with a non-zero code; the chaos
  supervisor starts it again. Exit code 0 means "my part is done" (producers only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mqguard.demo.plan import INDEX_HEADER, POISON_HEADER, DemoPlan, Kind, Planned
from mqguard.message import PRODUCER_ID_HEADER, SEQUENCE_HEADER, Message

log = logging.getLogger("mqguard.testing.fault_workers")

#: Frames confirmed together before the progress file is advanced.
WINDOW = 100
#: Seconds a worker keeps retrying a connection before it exits (and is restarted).
CONNECT_BUDGET = 30.0
#: ``[plugins.duplicate_detection] pending-timeout-ms`` of every guard of the run.
PENDING_TIMEOUT_MS = 3000
#: Exit codes.
DONE, RETRY = 0, 3


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, written once as JSON by the chaos runner."""

    broker_url: str
    sidecar_url: str
    redis_url: str
    events_dir: str
    work_dir: str
    base: str
    messages: int
    seed: int
    #: Absolute expiration (epoch ms, in the past) of every short-lived message: they are
    #: expired whenever they are delivered, also after a producer restart.
    short_expiration: int
    max_delivery_attempts: int = 3

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        return cls(**json.loads(path.read_text()))

    def address(self, via: str) -> str:
        return f"{self.base}.{via}"

    def planned(self, via: str) -> list[Planned]:
        return DemoPlan(self.messages, seed=self.seed).messages_for(via)

    def frames(self, via: str) -> list[Planned]:
        """What the producer sends, in order: every message, then the resent copies."""
        planned = self.planned(via)
        return [*planned, *(p for p in planned if p.resent)]

    def progress_path(self, via: str) -> Path:
        return Path(self.work_dir) / f"progress-{via}.txt"

    def handled_path(self, via: str) -> Path:
        return Path(self.work_dir) / f"handled-{via}.log"


def id_cache_size(spec: WorkerSpec) -> int:
    """Room for every id of a leg: the plan re-sends its copies after all the originals, and
    a copy whose original left a full cache passes (Artemis semantics). With the default
    20,000, a 100,000-message run re-handled 2,915 + 2,895 copies (docs/faults.md)."""
    return max(20_000, 2 * len(spec.frames("wrapped")))


def guard_config(spec: WorkerSpec, node: str) -> dict[str, Any]:
    """Settings of every guard of the run (the sidecar's TOML says the same)."""
    return {
        "mqguard": {"node-id": node, "store": spec.redis_url,
                    "message-expiry-scan-period": 1000,
                    # sync: a SIGKILL must not take the events of what was done with it.
                    "event-log": {"directory": spec.events_dir, "sync": True}},
        "address-settings": {"#": {
            "id-cache-size": id_cache_size(spec),
            "max-delivery-attempts": spec.max_delivery_attempts,
            "redelivery-delay": 50,
            "auto-create-dead-letter-resources": True,
            "auto-create-expiry-resources": True}},
        "plugins": {"consumer_audit": {"shared": True},
                    # A killed sender's unconfirmed ids are taken over after 3 s (not 10):
                    # its restarted self retries them sooner.
                    "duplicate_detection": {"pending-timeout-ms": PENDING_TIMEOUT_MS}},
    }


def sidecar_toml(spec: WorkerSpec, node: str) -> str:
    """``guard_config`` as the TOML file ``mqguard sidecar -c`` reads."""
    return "\n".join([
        "[mqguard]", f'node-id = "{node}"', f'store = "{spec.redis_url}"',
        "message-expiry-scan-period = 1000",
        "[mqguard.event-log]", f"directory = {json.dumps(spec.events_dir)}",
        "sync = true",
        '[address-settings."#"]', f"id-cache-size = {id_cache_size(spec)}",
        f"max-delivery-attempts = {spec.max_delivery_attempts}",
        "redelivery-delay = 50", "auto-create-dead-letter-resources = true",
        "auto-create-expiry-resources = true",
        "[plugins.consumer_audit]", "shared = true",
        "[plugins.duplicate_detection]", f"pending-timeout-ms = {PENDING_TIMEOUT_MS}", ""])


# -- progress --------------------------------------------------------------------------------


def read_progress(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except FileNotFoundError:
        return 0


def write_progress(path: Path, confirmed: int) -> None:
    # Atomic rename: a kill leaves the old or the new number, never a torn one. No fsync:
    # only the process is killed, never the machine, and the page cache survives it.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(confirmed))
    tmp.replace(path)


def read_handled(path: Path) -> list[tuple[int, int]]:
    """(index, delivery count -- through the sidecar: 1 if redelivered) per invocation."""
    out: list[tuple[int, int]] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), int(parts[1])))
    return out


class HandledLog:
    """Append-only record of handler invocations: one ``write`` per line, O_APPEND."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, index: int, delivery_count: int) -> None:
        with self._lock:
            os.write(self._fd, f"{index} {delivery_count}\n".encode())


# -- producers -------------------------------------------------------------------------------


def _headers(item: Planned) -> dict[str, str]:
    headers = {INDEX_HEADER: str(item.index)}
    if item.kind is Kind.POISON:
        headers[POISON_HEADER] = "1"
    return headers


def stable_producer_id(spec: WorkerSpec, leg: str) -> str:
    """The producer id of every incarnation of a leg's producer; with the plan index as the
    sequence number, a message re-sent after a restart carries the (producer id, sequence)
    of its first copy. The consumer audit then hands at most one copy to the handler when a
    killed incarnation's send reached the broker unconfirmed and the retry went out too
    (docs/duplicate-detection.md, "Two-phase ids")."""
    return f"faults-{leg}-{spec.address(leg)}"


def produce_wrapped(spec: WorkerSpec, node: str) -> int:
    from mqguard.config import parse_config
    from mqguard.pipeline import Guard
    from mqguard.producer import GuardedProducer
    from mqguard.registry import open_adapter

    frames = spec.frames("wrapped")
    progress = spec.progress_path("wrapped")
    done = read_progress(progress)
    address = spec.address("wrapped")
    with Guard(parse_config(guard_config(spec, node)), role="app") as guard, \
            GuardedProducer(open_adapter(spec.broker_url, reconnect_attempts=0), guard,
                            producer_id=stable_producer_id(spec, "wrapped")) as producer:
        while done < len(frames):
            window = frames[done:done + WINDOW]
            batch = [Message(
                address=address, body=f"wrapped {item.index}".encode(),
                headers=_headers(item), duplicate_id=item.duplicate_id,
                expiration=spec.short_expiration if item.kind is Kind.SHORT_LIVED else 0,
                producer_id=producer.producer_id, sequence=item.index + 1)
                for item in window]
            producer.send_batch(batch)
            done += len(window)
            write_progress(progress, done)
    return DONE


def produce_sidecar(spec: WorkerSpec, node: str) -> int:
    import stomp

    frames = spec.frames("sidecar")
    progress = spec.progress_path("sidecar")
    done = read_progress(progress)
    address = spec.address("sidecar")
    inbox = _Inbox()
    conn = _stomp_connect(spec.sidecar_url, inbox)
    try:
        while done < len(frames):
            window = frames[done:done + WINDOW]
            with inbox.lock:
                inbox.receipts.clear()
            for offset, item in enumerate(window):
                headers = {**_headers(item), "_AMQ_DUPL_ID": item.duplicate_id,
                           "persistent": "true",
                           PRODUCER_ID_HEADER: stable_producer_id(spec, "sidecar"),
                           SEQUENCE_HEADER: str(item.index + 1)}
                if item.kind is Kind.SHORT_LIVED:
                    headers["expires"] = str(spec.short_expiration)
                conn.send(f"/queue/{address}", f"sidecar {item.index}", headers=headers,
                          receipt=f"r{done + offset}")
            want = {f"r{done + offset}" for offset in range(len(window))}
            deadline = time.monotonic() + CONNECT_BUDGET
            while True:
                with inbox.lock:
                    if inbox.errors:
                        raise RuntimeError(f"the sidecar refused a send: {inbox.errors[0]}")
                    if want <= inbox.receipts:
                        break
                if inbox.disconnected.is_set() or time.monotonic() > deadline:
                    raise ConnectionError("no receipts from the sidecar")
                time.sleep(0.005)
            done += len(window)
            write_progress(progress, done)
    finally:
        if conn.is_connected():
            conn.disconnect()
    del stomp
    return DONE


# -- consumers -------------------------------------------------------------------------------


def consume_wrapped(spec: WorkerSpec, node: str) -> int:
    from mqguard.config import parse_config
    from mqguard.consumer import GuardedConsumer
    from mqguard.pipeline import Guard
    from mqguard.registry import open_adapter

    handled = HandledLog(spec.handled_path("wrapped"))

    def handle(message: Message) -> None:
        index = int(message.headers.get(INDEX_HEADER, "-1"))
        handled.record(index, message.delivery_count)
        if message.headers.get(POISON_HEADER):
            raise RuntimeError(f"poison message {index}")

    guard = Guard(parse_config(guard_config(spec, node)), role="app").start()
    consumer = GuardedConsumer(
        open_adapter(spec.broker_url, reconnect_attempts=1000, reconnect_max_delay=1.0),
        spec.address("wrapped"), handle, guard)
    _retry(consumer.start, "the broker")
    while True:  # until killed; the adapter reconnects by itself
        time.sleep(1.0)


def consume_sidecar(spec: WorkerSpec, node: str) -> int:
    """An unmodified STOMP application, as careful as STOMP allows: each ACK / NACK asks for
    a receipt, and the next message is handled only once it came. The sidecar sends that
    receipt after it settled the delivery (consumer-audit mark written, broker acked), so a
    kill of this process or of the sidecar can leave at most one handled message unsettled
    -- the window docs/consumer-audit.md describes. (Acknowledging without receipts, the
    handler runs ahead of the sidecar and one kill can leave many handled messages whose
    ACKs were still in socket buffers: measured 179 re-handled in one run.)"""
    import queue

    handled = HandledLog(spec.handled_path("sidecar"))
    frames: queue.Queue[Any] = queue.Queue()
    inbox = _Inbox(frames.put)
    conn = _stomp_connect(spec.sidecar_url, inbox)
    # A small prefetch keeps what a kill strands on this connection small too.
    conn.subscribe(f"/queue/{spec.address('sidecar')}", id="faults", ack="client-individual",
                   headers={"activemq.prefetchSize": "10"})
    settled = 0
    while not inbox.disconnected.is_set():
        try:
            frame = frames.get(timeout=0.2)
        except queue.Empty:
            continue
        index = int(frame.headers.get(INDEX_HEADER, "-1"))
        handled.record(index, int(frame.headers.get("redelivered") == "true"))
        settled += 1
        receipt = f"s{settled}"
        if frame.headers.get(POISON_HEADER):
            conn.nack(frame.headers["ack"], receipt=receipt)  # the sidecar counts, redelivers
        else:
            conn.ack(frame.headers["ack"], receipt=receipt)
        if not inbox.wait_receipt(receipt, CONNECT_BUDGET):
            return RETRY
    return RETRY  # the sidecar went away: the supervisor starts a fresh consumer


# -- stomp.py plumbing -------------------------------------------------------------------------


class _Inbox:
    """stomp.py listener: receipts, errors, disconnection, and an optional message callback."""

    def __init__(self, on_message: Any = None) -> None:
        self.lock = threading.Condition()
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.disconnected = threading.Event()
        self._on_message = on_message

    def on_message(self, frame: Any) -> None:
        if self._on_message is not None:
            self._on_message(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.lock.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.lock:
            self.errors.append(frame.headers.get("message", "ERROR"))
            self.lock.notify_all()

    def on_disconnected(self) -> None:
        self.disconnected.set()
        with self.lock:
            self.lock.notify_all()

    def wait_receipt(self, receipt: str, timeout: float) -> bool:
        """True once ``receipt`` came; False on disconnection, an ERROR or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while receipt not in self.receipts:
                left = deadline - time.monotonic()
                if self.disconnected.is_set() or self.errors or left <= 0:
                    return False
                self.lock.wait(min(left, 0.5))
            self.receipts.discard(receipt)
            return True


def _stomp_connect(url: str, inbox: _Inbox) -> Any:
    import stomp

    parts = urlsplit(url)

    def connect() -> Any:
        conn = stomp.Connection12([(parts.hostname or "127.0.0.1", parts.port or 61613)],
                                  heartbeats=(0, 0), auto_content_length=True,
                                  reconnect_attempts_max=1)
        conn.set_listener("inbox", inbox)
        conn.connect(parts.username or "guest", parts.password or "guest", wait=True)
        return conn

    return _retry(connect, "the sidecar")


def _retry(action: Any, what: str) -> Any:
    deadline = time.monotonic() + CONNECT_BUDGET
    while True:
        try:
            return action()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"{what} unreachable for {CONNECT_BUDGET:.0f} s: "
                                      f"{exc}") from exc
            time.sleep(0.2)


ROLES = {("produce", "wrapped"): produce_wrapped, ("produce", "sidecar"): produce_sidecar,
         ("consume", "wrapped"): consume_wrapped, ("consume", "sidecar"): consume_sidecar}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqguard.testing.fault_workers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("produce", "consume"))
    parser.add_argument("--via", choices=("wrapped", "sidecar"), required=True)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--node", required=True, help="event-log node id of this incarnation")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = WorkerSpec.load(args.spec)
    try:
        return ROLES[(args.role, args.via)](spec, args.node)
    except Exception as exc:
        log.warning("%s %s: %r; exiting for a restart", args.role, args.via, exc)
        return RETRY


if __name__ == "__main__":
    sys.exit(main())
