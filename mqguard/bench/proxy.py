"""``mqguard bench proxy``: a stomp.py client direct to the broker vs through the sidecar.

Everything is measured in the same run, per broker, with one sidecar started for the
whole case (default plugins, the chosen store, the event log in a temporary
directory: what a deployment pays for). The client code is *identical* on both
paths; only the URL it connects to differs (the broker's, or the sidecar's), so the
difference is the sidecar's cost.

Send throughput
    ``n`` persistent messages of ``size`` bytes, each with a receipt and a unique
    ``_AMQ_DUPL_ID`` (so duplicate detection does its full work in the sidecar; the
    direct sends carry the same header), pipelined ``batch`` at a time: the client
    waits for every receipt of a batch before sending the next one
    (:func:`mqguard.bench.raw.stomp_produce`, the method of ``bench client``).
    Timed from the first SEND to the last RECEIPT; connecting is not timed. The queue
    is drained afterwards, untimed, with a direct consumer that also checks that all
    ``n`` arrived.

Consume throughput
    Two fresh queues are filled with the same ``n`` messages *through the sidecar*
    (untimed), so both carry the headers the sidecar stamps (message id, producer id
    and sequence) and the broker hands out byte-identical frames on both paths; the
    proxied consumer then pays the full delivery-side guard (duplicate-delivery
    check, consumer audit, delivery counting). One is consumed direct, one through
    the sidecar: ``client-individual`` subscription with ``prefetch`` unacked
    messages in flight, one ACK per message; timed from SUBSCRIBE until the ``n``-th
    MESSAGE arrived (:func:`mqguard.bench.raw.stomp_consume`).

Latency
    One connection subscribes (``client-individual``, receipt awaited) to a fresh
    queue, then sends one persistent message at a time and waits for it to come back;
    a sample is the time from calling ``send`` to the MESSAGE arriving in stomp.py's
    listener (stamped there, before the hand-off to the sending thread); the message
    is then acked. The first 100 exchanges of each round are not recorded. The client
    sets TCP_NODELAY: stomp.py leaves Nagle on, and its ACK and next SEND, two small
    writes, would make both paths measure Linux's 40 ms delayed-ack timer instead.
    Samples of all rounds are pooled per path; ``added_p50_ms`` / ``added_p99_ms`` are
    the proxied percentile minus the direct one (so the client's and the broker's own
    latency cancel out).

Rounds alternate which path goes first (direct/proxy, then proxy/direct, ...) so
warm-up and drift favour neither; throughput figures are the median of the rounds
and ``*_ratio = proxy / direct``. Before the first round, ``warmup`` messages are sent
and consumed on both paths, untimed; before the first latency round, up to
:data:`LATENCY_WARMUP` exchanges (at most twice ``latency_samples``) run on both paths,
untimed: a freshly started broker's JIT compiler was still busy with the exchange's code
paths during the first two latency rounds, and the goal is about the steady state.
Every round uses fresh unique queue names and leaves its queues empty.

Where the sidecar runs: ``process`` (the default) runs ``mqguard sidecar`` as a separate
process, as it is deployed; ``thread`` hosts it in the benchmark's own process
(:class:`~mqguard.sidecar.server.SidecarThread`), where it shares the GIL with the
stomp.py client's threads (the goals are about the deployed shape). On a machine with
few cores both compete with the broker for CPU either way: read the figures with
``environment.cpus`` and the load averages recorded before and after the run in mind (a
shared machine's other work shows up in the tail latencies first). ``sidecar_cpu_us`` is
the sidecar's own CPU time per proxied message (send, consume) or exchange (latency),
from ``/proc`` (Linux): it depends far less on what else the machine runs than rates and
percentiles do, so it is the figure to compare when optimising the sidecar.

Baselines (``--baselines``): two more paths in every round, each a process of its own in
front of the same broker. ``bare`` is the sidecar with every built-in plugin disabled and
no event log: frames decoded, relayed with the sidecar's receipts, re-encoded, but no
guarantee. ``relay`` is a do-nothing TCP relay (:mod:`mqguard.bench.relay`): the extra hop
alone. Their ratios and added latencies are against the same rounds' direct path, so the
sidecar's cost splits into the hop (``relay``), the relaying (``bare`` minus ``relay``)
and the guarantees (the sidecar minus ``bare``). The goals apply to the sidecar only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import stomp

from mqguard.bench import raw
from mqguard.bench.stats import median
from mqguard.config import parse_config
from mqguard.message import new_message_id
from mqguard.registry import BUILTIN_PLUGINS
from mqguard.sidecar.eventloop import resolve as resolve_loop

SIDECAR_MODES = ("thread", "process")

#: Paths ``--baselines`` adds to every round, to split the sidecar's cost: ``bare``, the
#: sidecar with every built-in plugin disabled and no event log (the relaying of frames
#: without the guarantees); ``relay``, a do-nothing TCP relay (:mod:`mqguard.bench.relay`:
#: the extra hop alone, nothing decoded). Both run as processes of their own.
BASELINES: tuple[str, ...] = ("bare", "relay")

#: The targets the sidecar path is measured against (docs/benchmarks.md): throughput
#: ratios, added p99, and the sidecar's CPU per message sent or consumed with every
#: built-in plugin on, and bare (the ``bare`` baseline).
GOALS: dict[str, float] = {"send_ratio": 0.9, "consume_ratio": 0.9, "added_p99_ms": 1.0,
                           "sidecar_cpu_us": 30.0, "bare_cpu_us": 8.0}


@dataclass
class ProxyCase:
    broker: str
    store: str
    sidecar: str
    direct_send_per_s: float
    proxy_send_per_s: float
    send_ratio: float
    direct_consume_per_s: float
    proxy_consume_per_s: float
    consume_ratio: float
    direct_p50_ms: float
    direct_p99_ms: float
    proxy_p50_ms: float
    proxy_p99_ms: float
    added_p50_ms: float
    added_p99_ms: float
    #: CPU time of the sidecar per proxied message (send, consume) or request/response
    #: (latency), in microseconds; None where it cannot be read (not Linux).
    sidecar_cpu_us: dict[str, float | None] = field(default_factory=dict)
    #: Per-round figures, in round order, for judging the spread.
    runs: dict[str, list[float]] = field(default_factory=dict)
    #: The sidecar's event loop: ``asyncio`` or ``uvloop`` (:mod:`mqguard.sidecar.eventloop`).
    event_loop: str = "asyncio"
    #: Per baseline measured (``--baselines``): the same figures through it, ratios and
    #: added latencies against the direct path of the same rounds (see :data:`BASELINES`).
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def goals_met(self) -> dict[str, bool]:
        """Each goal the run measured: met or not (CPU only where it could be read)."""
        met = {"send_ratio": self.send_ratio >= GOALS["send_ratio"],
               "consume_ratio": self.consume_ratio >= GOALS["consume_ratio"],
               "added_p99_ms": self.added_p99_ms <= GOALS["added_p99_ms"]}
        cpu = worst_cpu_us(self.sidecar_cpu_us)
        if cpu is not None:
            met["sidecar_cpu_us"] = cpu <= GOALS["sidecar_cpu_us"]
        bare = worst_cpu_us(self.baselines.get("bare", {}).get("cpu_us", {}))
        if bare is not None:
            met["bare_cpu_us"] = bare <= GOALS["bare_cpu_us"]
        return met

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "goals_met": self.goals_met}


def worst_cpu_us(cpu: dict[str, float | None]) -> float | None:
    """The larger of the send and consume CPU per message; None if either is unknown."""
    send, consume = cpu.get("send"), cpu.get("consume")
    return None if send is None or consume is None else max(send, consume)


# -- the sidecar under test ----------------------------------------------------------------

@dataclass(frozen=True)
class RunningSidecar:
    #: Where clients connect: the upstream URL with the sidecar's port, so credentials
    #: and query (vhost) stay the same and a client connects exactly as to the broker.
    url: str
    #: CPU seconds the sidecar has used so far: its event-loop thread (``thread``
    #: mode; the event log's writer thread is not included) or its whole process.
    cpu_seconds: Callable[[], float | None]


def sidecar_settings(store_url: str, events_dir: str, *, bare: bool = False
                     ) -> dict[str, Any]:
    """The ``[mqguard]`` table of a measured sidecar: default plugins, ``store_url``, the
    event log in ``events_dir``; ``bare``: every built-in plugin disabled and no event log
    (the ``bare`` baseline: the relaying without the guarantees)."""
    settings: dict[str, Any] = {"store": store_url,
                                "event-log": {"directory": events_dir}}
    if bare:
        settings["disabled-plugins"] = sorted(BUILTIN_PLUGINS)
        settings["event-log"]["enabled"] = False
    return settings


@contextmanager
def running_sidecar(upstream_url: str, store_url: str, mode: str = "thread",
                    event_loop: str = "auto", *, bare: bool = False
                    ) -> Iterator[RunningSidecar]:
    """A sidecar in front of ``upstream_url`` (:func:`sidecar_settings`), on a thread of
    this process or as a process of its own, with the ``event_loop`` given
    (:mod:`mqguard.sidecar.eventloop`)."""
    if mode not in SIDECAR_MODES:
        raise ValueError(f"sidecar mode must be one of {SIDECAR_MODES}, not {mode!r}")
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-proxy-") as tmp:
        settings = sidecar_settings(store_url, os.path.join(tmp, "events"), bare=bare)
        if mode == "thread":
            from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

            config = parse_config({"mqguard": settings}, "mqguard bench proxy")
            sidecar = Sidecar(config, parse_upstream(upstream_url), listen=("127.0.0.1", 0))
            with SidecarThread(sidecar, event_loop=event_loop) as running:
                loop_thread = next((t for t in threading.enumerate()
                                    if t.name == "mqguard-sidecar"), None)
                task = (f"/proc/self/task/{loop_thread.native_id}/stat"
                        if loop_thread is not None and loop_thread.native_id else None)
                yield RunningSidecar(_with_port(upstream_url, running.port),
                                     lambda: _proc_cpu_seconds(task))
        else:
            with _sidecar_process(upstream_url, settings, Path(tmp), event_loop) as proc:
                port = _wait_for_listening(proc, Path(tmp) / "sidecar.log", SIDECAR_READY)
                stat = f"/proc/{proc.pid}/stat"
                yield RunningSidecar(_with_port(upstream_url, port),
                                     lambda: _proc_cpu_seconds(stat))


@contextmanager
def running_relay(upstream_url: str, event_loop: str = "auto") -> Iterator[RunningSidecar]:
    """A do-nothing TCP relay (:mod:`mqguard.bench.relay`) in front of ``upstream_url``,
    as a process of its own: the ``relay`` baseline, what one more hop costs."""
    from mqguard.bench.relay import READY_MARKER

    parts = urlsplit(upstream_url)
    upstream = f"{parts.hostname}:{parts.port or 61613}"
    with tempfile.TemporaryDirectory(prefix="mqguard-bench-relay-") as tmp:
        log_path = Path(tmp) / "relay.log"
        command = [sys.executable, "-m", "mqguard.bench.relay", "--upstream", upstream,
                   "--event-loop", event_loop]
        with _process(command, log_path) as proc:
            port = _wait_for_listening(proc, log_path, READY_MARKER)
            stat = f"/proc/{proc.pid}/stat"
            yield RunningSidecar(_with_port(upstream_url, port),
                                 lambda: _proc_cpu_seconds(stat))


def _proc_cpu_seconds(stat_path: str | None) -> float | None:
    """User + system CPU seconds from a Linux ``/proc/.../stat`` file; None elsewhere."""
    if stat_path is None:
        return None
    try:
        fields = Path(stat_path).read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: What ``mqguard sidecar`` logs once it accepts connections.
SIDECAR_READY = "mqguard sidecar listening on "


@contextmanager
def _sidecar_process(upstream_url: str, settings: dict[str, Any], tmp: Path,
                     event_loop: str) -> Iterator[subprocess.Popen[bytes]]:
    config = tmp / "mqguard.toml"
    config.write_text(_toml({"mqguard": settings}))
    command = [sys.executable, "-m", "mqguard.cli", "sidecar", "--listen", "127.0.0.1:0",
               "--upstream", upstream_url, "-c", str(config), "--event-loop", event_loop]
    with _process(command, tmp / "sidecar.log") as proc:
        yield proc


def _toml(tables: dict[str, Any], prefix: str = "") -> str:
    """TOML text of nested tables of strings, booleans and lists of strings (JSON strings
    are valid TOML basic strings)."""
    lines: list[str] = []
    nested: list[tuple[str, dict[str, Any]]] = []
    for key, value in tables.items():
        if isinstance(value, dict):
            nested.append((f"{prefix}{key}", value))
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    text = (f"[{prefix[:-1]}]\n" if prefix else "") + "".join(f"{line}\n" for line in lines)
    for name, table in nested:
        text += "\n" + _toml(table, f"{name}.")
    return text


@contextmanager
def _process(command: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` running with its output in ``log_path``; stopped (SIGTERM, then
    SIGKILL after 30 s) when the block ends."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_for_listening(proc: subprocess.Popen[bytes], log_path: Path, marker: str,
                        timeout: float = 30.0) -> int:
    """The port in the ``marker HOST:PORT`` line ``proc`` writes to ``log_path``."""
    what = marker.partition(" listening")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith(marker):
                hostport = line[len(marker):].split(",")[0].strip()
                return int(hostport.rpartition(":")[2])
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{text[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {timeout:g} s")


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return urlunsplit(("stomp", netloc, parts.path, parts.query, ""))


# -- the client's side ---------------------------------------------------------------------

class _Echo(stomp.ConnectionListener):  # type: ignore[misc]
    """Receipts and messages of the latency client, stamped on arrival."""

    def __init__(self) -> None:
        self.arrived: queue.SimpleQueue[tuple[float, Any]] = queue.SimpleQueue()
        self.receipts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.errors: list[Any] = []

    def on_message(self, frame: Any) -> None:
        self.arrived.put((time.perf_counter(), frame))

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers.get("receipt-id", ""))

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)


def stomp_latency(url: str, address: str, samples: int, size: int, warmup: int = 0,
                  timeout: float = 10.0) -> list[float]:
    """Send one message at a time to a queue this client consumes; seconds per round trip."""
    parts = urlsplit(url)
    vhost = parse_qs(parts.query).get("vhost", ["/"])[0]
    conn = stomp.Connection12([(parts.hostname or "127.0.0.1", parts.port or 61613)],
                              vhost=vhost, heartbeats=(0, 0))
    listener = _Echo()
    conn.set_listener("latency", listener)
    conn.connect(parts.username or "guest", parts.password or "guest", wait=True)
    # stomp.py leaves Nagle on: the ACK and the next SEND are two small writes, and the
    # SEND would wait for the TCP ack of the ACK, which Linux delays by 40 ms. Both paths
    # would then measure that timer instead of the broker and the sidecar.
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    destination = raw.stomp_destination(address)
    body = b"x" * size
    out: list[float] = []
    try:
        conn.subscribe(destination, id="latency", ack="client-individual",
                       headers={"receipt": "subscribed", "activemq.prefetchSize": "1",
                                "prefetch-count": "1"})
        if listener.receipts.get(timeout=timeout) != "subscribed":
            raise RuntimeError("unexpected receipt before the subscription's")
        for i in range(warmup + samples):
            started = time.perf_counter()
            conn.send(destination, body, headers={"persistent": "true",
                                                  "_AMQ_DUPL_ID": f"{address}-{i}"})
            try:
                arrived, frame = listener.arrived.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"message {i} did not come back within {timeout:g} s "
                                   f"(errors: {listener.errors})") from None
            conn.ack(frame.headers["ack"])
            if i >= warmup:
                out.append(arrived - started)
        return out
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _bodies(count: int, size: int) -> list[bytes]:
    return [(b"%08d" % i).ljust(size, b"x") for i in range(count)]


def _queue_name(phase: str) -> str:
    return f"mqguard.bench.proxy.{phase}.{new_message_id()[:12]}"


# -- one case ------------------------------------------------------------------------------

def _alternate(rounds: int, run: Callable[[str], float], sides: Sequence[str]
               ) -> dict[str, list[float]]:
    """``run`` each side once per round; even rounds in the order given, odd ones reversed."""
    results: dict[str, list[float]] = {side: [] for side in sides}
    for round_number in range(rounds):
        order = sides if round_number % 2 == 0 else list(reversed(sides))
        for side in order:
            results[side].append(run(side))
    return results


#: Untimed request/response exchanges per path before the first latency round (at most
#: twice ``latency_samples``; none with ``warmup`` 0).
LATENCY_WARMUP = 5000


def _ratio(proxy: float, direct: float) -> float:
    return proxy / direct if direct else 0.0


def run_case(broker: str, broker_url: str, store_name: str, store_url: str, *,
             messages: int, size: int, rounds: int, latency_samples: int, batch: int = 100,
             prefetch: int = 100, warmup: int = 500, sidecar_mode: str = "process",
             event_loop: str = "auto", baselines: Sequence[str] = (),
             progress: Callable[[str], None] | None = None) -> ProxyCase:
    """Measure one broker: send, consume and latency, direct vs through a sidecar (and
    through each of ``baselines``, see :data:`BASELINES`, in the same rounds)."""
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        raise ValueError(f"unknown baseline(s) {sorted(unknown)}; known: {BASELINES}")
    say = progress or (lambda text: None)
    bodies = _bodies(messages, size)
    sides = ["direct", "proxy", *dict.fromkeys(baselines)]
    cpu: dict[str, dict[str, list[float]]] = {
        side: {"send": [], "consume": [], "latency": []} for side in sides[1:]}
    with contextlib.ExitStack() as stack:
        sidecar = stack.enter_context(running_sidecar(broker_url, store_url, sidecar_mode,
                                                      event_loop))
        paths = {"proxy": sidecar}
        if "bare" in baselines:
            paths["bare"] = stack.enter_context(running_sidecar(
                broker_url, store_url, sidecar_mode, event_loop, bare=True))
        if "relay" in baselines:
            paths["relay"] = stack.enter_context(running_relay(broker_url, event_loop))
        urls = {"direct": broker_url, **{side: path.url for side, path in paths.items()}}

        def timed_cpu(side: str, phase: str, count: int, run: Callable[[], float]) -> float:
            path = paths.get(side)
            before = path.cpu_seconds() if path is not None else None
            seconds = run()
            after = path.cpu_seconds() if path is not None and before is not None else None
            if before is not None and after is not None:
                cpu[side][phase].append((after - before) / count * 1e6)
            return seconds

        if warmup:
            warm = _bodies(warmup, size)
            for side in sides:
                address = _queue_name("warmup")
                raw.stomp_produce(urls[side], address, warm, batch)
                raw.stomp_consume(urls[side], address, len(warm), prefetch)
            say(f"{broker}: warmed up ({warmup} messages each way)")

        def send(side: str) -> float:
            address = _queue_name("send")
            seconds = timed_cpu(side, "send", messages, lambda: raw.stomp_produce(
                urls[side], address, bodies, batch))
            raw.stomp_consume(broker_url, address, messages, prefetch)  # drain, check count
            return messages / seconds

        def consume(side: str) -> float:
            address = _queue_name("consume")
            raw.stomp_produce(sidecar.url, address, bodies, batch)
            return messages / timed_cpu(side, "consume", messages, lambda: raw.stomp_consume(
                urls[side], address, messages, prefetch))

        latencies: dict[str, list[float]] = {side: [] for side in sides}

        def latency(side: str) -> float:
            warm_exchanges = min(100, latency_samples)
            found: list[float] = []

            def run() -> float:
                found.extend(stomp_latency(urls[side], _queue_name("latency"),
                                           latency_samples, size, warmup=warm_exchanges))
                return 0.0

            timed_cpu(side, "latency", latency_samples + warm_exchanges, run)
            latencies[side].extend(found)
            return percentile(found, 99) * 1000

        sends = _alternate(rounds, send, sides)
        say(f"{broker}: send " + ", ".join(f"{side} {median(sends[side]):,.0f}/s"
                                           for side in sides))
        consumes = _alternate(rounds, consume, sides)
        say(f"{broker}: consume " + ", ".join(f"{side} {median(consumes[side]):,.0f}/s"
                                              for side in sides))
        if warmup:
            # The broker's JIT compiles the one-at-a-time exchange's code paths during the
            # first latency rounds (a fresh ActiveMQ: its compiler threads at 10-28% of a
            # core through rounds 1-2, nothing after; those rounds' p99 7.3 / 9.4 ms, the
            # next ones 1.96 / 1.78; 2,000 exchanges per path first still left 1 s of
            # compiling in round 1): untimed exchanges first, so that the rounds measure the
            # steady state the goal is about.
            for side in sides:
                stomp_latency(urls[side], _queue_name("latency-warmup"),
                              min(LATENCY_WARMUP, 2 * latency_samples), size)
            say(f"{broker}: latency warmed up")
        p99s = _alternate(rounds, latency, sides)

    send_rate = {side: median(sends[side]) for side in sides}
    consume_rate = {side: median(consumes[side]) for side in sides}
    ms = {side: (percentile(found, 50) * 1000, percentile(found, 99) * 1000)
          for side, found in latencies.items()}

    def cpu_us(side: str) -> dict[str, float | None]:
        return {phase: median(values) if values else None
                for phase, values in cpu[side].items()}

    direct_send, proxy_send = send_rate["direct"], send_rate["proxy"]
    direct_consume, proxy_consume = consume_rate["direct"], consume_rate["proxy"]
    case = ProxyCase(
        broker=broker, store=store_name, sidecar=sidecar_mode,
        direct_send_per_s=direct_send, proxy_send_per_s=proxy_send,
        send_ratio=_ratio(proxy_send, direct_send),
        direct_consume_per_s=direct_consume, proxy_consume_per_s=proxy_consume,
        consume_ratio=_ratio(proxy_consume, direct_consume),
        direct_p50_ms=ms["direct"][0], direct_p99_ms=ms["direct"][1],
        proxy_p50_ms=ms["proxy"][0], proxy_p99_ms=ms["proxy"][1],
        added_p50_ms=ms["proxy"][0] - ms["direct"][0],
        added_p99_ms=ms["proxy"][1] - ms["direct"][1],
        sidecar_cpu_us=cpu_us("proxy"),
        runs={"direct_send_per_s": sends["direct"], "proxy_send_per_s": sends["proxy"],
              "direct_consume_per_s": consumes["direct"],
              "proxy_consume_per_s": consumes["proxy"],
              "direct_p99_ms": p99s["direct"], "proxy_p99_ms": p99s["proxy"]},
        event_loop=resolve_loop(event_loop),
        baselines={side: {
            "send_per_s": send_rate[side],
            "send_ratio": _ratio(send_rate[side], direct_send),
            "consume_per_s": consume_rate[side],
            "consume_ratio": _ratio(consume_rate[side], direct_consume),
            "p50_ms": ms[side][0], "p99_ms": ms[side][1],
            "added_p50_ms": ms[side][0] - ms["direct"][0],
            "added_p99_ms": ms[side][1] - ms["direct"][1],
            "cpu_us": cpu_us(side),
            "runs": {"send_per_s": sends[side], "consume_per_s": consumes[side],
                     "p99_ms": p99s[side]},
        } for side in sides[2:]})
    say(f"{broker}: latency p50 direct {case.direct_p50_ms:.3f} ms proxy "
        f"{case.proxy_p50_ms:.3f} ms, p99 direct {case.direct_p99_ms:.3f} ms proxy "
        f"{case.proxy_p99_ms:.3f} ms")
    return case


def table_rows(case: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure of a case (its JSON form), for :func:`print_table`."""
    met = case["goals_met"]
    return [
        {"broker": case["broker"], "figure": "send msg/s", "direct": case["direct_send_per_s"],
         "proxy": case["proxy_send_per_s"], "result": f"ratio {case['send_ratio']:.2f}",
         "goal": f">= {GOALS['send_ratio']}", "met": _yes(met["send_ratio"])},
        {"broker": case["broker"], "figure": "consume msg/s",
         "direct": case["direct_consume_per_s"], "proxy": case["proxy_consume_per_s"],
         "result": f"ratio {case['consume_ratio']:.2f}",
         "goal": f">= {GOALS['consume_ratio']}", "met": _yes(met["consume_ratio"])},
        {"broker": case["broker"], "figure": "p50 ms", "direct": case["direct_p50_ms"],
         "proxy": case["proxy_p50_ms"], "result": f"{case['added_p50_ms']:+.2f} ms",
         "goal": "", "met": ""},
        {"broker": case["broker"], "figure": "p99 ms", "direct": case["direct_p99_ms"],
         "proxy": case["proxy_p99_ms"], "result": f"{case['added_p99_ms']:+.2f} ms",
         "goal": f"<= +{GOALS['added_p99_ms']}", "met": _yes(met["added_p99_ms"])},
        *_cpu_rows(case, met),
        *_baseline_rows(case),
    ]


def _cpu_rows(case: dict[str, Any], met: dict[str, bool]) -> list[dict[str, Any]]:
    """The CPU goals' rows: with every plugin, and bare when that baseline ran."""
    rows = []
    for goal, name, cpu in (
            ("sidecar_cpu_us", "cpu us/msg", case["sidecar_cpu_us"]),
            ("bare_cpu_us", "cpu us/msg (bare)",
             case.get("baselines", {}).get("bare", {}).get("cpu_us", {}))):
        if goal in met:
            rows.append({"broker": case["broker"], "figure": name, "direct": "",
                         "proxy": "", "result": f"{cpu['send']:.0f} / {cpu['consume']:.0f}",
                         "goal": f"<= {GOALS[goal]:.0f}", "met": _yes(met[goal])})
    return rows


def _baseline_rows(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The baselines' figures, in the ``proxy`` column, marked with their name."""
    rows = []
    for name, figures in case.get("baselines", {}).items():
        cpu = figures["cpu_us"]
        rows += [
            {"broker": case["broker"], "figure": f"send msg/s ({name})",
             "direct": case["direct_send_per_s"], "proxy": figures["send_per_s"],
             "result": f"ratio {figures['send_ratio']:.2f}", "goal": "",
             "met": _cpu_note(cpu.get("send"))},
            {"broker": case["broker"], "figure": f"consume msg/s ({name})",
             "direct": case["direct_consume_per_s"], "proxy": figures["consume_per_s"],
             "result": f"ratio {figures['consume_ratio']:.2f}", "goal": "",
             "met": _cpu_note(cpu.get("consume"))},
            {"broker": case["broker"], "figure": f"p99 ms ({name})",
             "direct": case["direct_p99_ms"], "proxy": figures["p99_ms"],
             "result": f"{figures['added_p99_ms']:+.2f} ms", "goal": "",
             "met": _cpu_note(cpu.get("latency"))},
        ]
    return rows


def _cpu_note(micros: float | None) -> str:
    return "" if micros is None else f"cpu {micros:.0f} us"


def _yes(value: bool) -> str:
    return "yes" if value else "NO"
