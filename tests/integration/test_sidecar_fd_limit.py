"""The sidecar under a low limit of open files (issue 21, defect 13), against REAL brokers.

Each session holds up to three descriptors (the client's socket, the broker's, and a
duplicate of the broker's for TCP quick-acks), so ``max-connections`` 1024 needs
about 3,100 of them. At start the sidecar raises its soft ``RLIMIT_NOFILE`` to the
hard one and warns when ``max-connections`` still cannot be met; it then admits only
as many sessions as the descriptors allow, and every client it cannot serve gets an
ERROR frame, never a silent close or a traceback in the log -- on asyncio and uvloop.
Even when something else has used every descriptor up (accept() fails with EMFILE), a
spare descriptor lets the sidecar accept the client, tell it why, and close it.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mqguard_tests.sidecar_process import SidecarProcess
from mqguard_tests.stomp_clients import (
    RawClient,
    connect_frame,
    decode_server_bytes,
    healthy_round_trip,
)

from mqguard.servers import ServerHandle

BROKERS_AND_LOOPS = [
    pytest.param("activemq", "asyncio", marks=pytest.mark.activemq, id="activemq-asyncio"),
    pytest.param("activemq", "uvloop", marks=pytest.mark.activemq, id="activemq-uvloop"),
    pytest.param("rabbitmq", "uvloop", marks=pytest.mark.rabbitmq, id="rabbitmq-uvloop"),
]

#: The sidecar's limit on open files: far below what max-connections (1024) needs.
NOFILE = 160
CLIENTS = 150


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    server: ServerHandle = request.getfixturevalue(f"mqguard_{request.param}_server")
    return server.urls["stomp"]


def connect_and_hold(port: int, results: list[str], index: int,
                     release: threading.Event) -> None:
    """CONNECT, then hold the session until ``release``; records what the client got:
    "connected", "error: <message>", or how it was left without a frame."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), 10)
    except OSError as exc:
        results[index] = f"connect failed: {exc}"
        return
    try:
        sock.sendall(connect_frame())
        data = b""
        deadline = time.monotonic() + 15
        while b"\0" not in data and time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                results[index] = f"reset without a frame: {exc}"
                return
            if not chunk:
                break
            data += chunk
        frames = decode_server_bytes(data)[0] if b"\0" in data else []
        if not frames:
            results[index] = f"closed without a frame ({data[:100]!r})"
        elif frames[0].command == "CONNECTED":
            results[index] = "connected"
            release.wait(30)
            sock.sendall(b"DISCONNECT\n\n\0")
        else:
            results[index] = f"error: {frames[0].get('message')}"
    finally:
        sock.close()


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS,
                         indirect=["broker_url"])
def test_low_descriptor_limit_every_client_gets_a_frame(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    with SidecarProcess(broker_url, tmp_path, event_loop=event_loop,
                        sidecar={"connect-timeout-ms": 20_000, "drain-timeout-ms": 1000},
                        nofile=(NOFILE, NOFILE)) as sidecar:
        start_log = sidecar.log()
        results = [""] * CLIENTS
        release = threading.Event()
        threads = [threading.Thread(target=connect_and_hold,
                                    args=(sidecar.port, results, i, release), daemon=True)
                   for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 40
        while any(not r for r in results) and time.monotonic() < deadline:
            time.sleep(0.1)
        release.set()
        for thread in threads:
            thread.join(40)
        # Once they have gone, the sidecar serves again.
        time.sleep(0.5)
        healthy_round_trip(sidecar.port, f"/queue/{mqguard_unique_name}")
        assert sidecar.stop() == 0
        log = sidecar.log()
    connected = results.count("connected")
    refused = [r for r in results if r.startswith("error: ")]
    silent = [r for r in results if r != "connected" and not r.startswith("error: ")]
    assert not silent, f"{len(silent)} clients got no frame, e.g. {silent[:3]}"
    assert connected >= 20, results
    assert refused and all("too many connections" in r or "descriptor" in r
                           for r in refused), refused[:5]
    assert "Traceback" not in log, log[-4000:]
    assert "unreachable" not in log, log[-4000:]
    # Warned at start: max-connections cannot be met under this limit.
    assert "max-connections" in start_log and "descriptor" in start_log, start_log


@pytest.mark.activemq
def test_soft_descriptor_limit_is_raised_to_the_hard_one(mqguard_activemq_server: ServerHandle,
                                                         tmp_path: Path) -> None:
    with SidecarProcess(mqguard_activemq_server.urls["stomp"], tmp_path,
                        nofile=(256, 4096)) as sidecar:
        limits = sidecar.nofile_limits()
        healthy_round_trip(sidecar.port, "/queue/mqg-fd-limit-raised")
        log = sidecar.log()
    assert limits == (4096, 4096), limits
    # 4096 descriptors are enough for max-connections 1024: no warning.
    assert "descriptor" not in log, log


#: A sidecar on a thread of a process that then opens descriptors until none is left.
_EXHAUSTED_SIDECAR = textwrap.dedent("""
    import os, sys
    from mqguard.config import parse_config
    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream
    url, event_loop, events = sys.argv[1:4]
    # No event log: its converter thread would meet the exhausted limit too (out of scope).
    config = parse_config({"mqguard": {"node-id": "fd-exhausted", "message-expiry-scan-period": -1,
                                       "event-log": {"enabled": False, "directory": events}}})
    with SidecarThread(Sidecar(config, parse_upstream(url)), event_loop=event_loop) as proxy:
        fillers = []
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        print(proxy.port, len(fillers), flush=True)
        while (command := sys.stdin.readline().strip()) in ("one", "all"):
            for fd in fillers[-1:] if command == "one" else fillers:
                os.close(fd)
            del fillers[-1 if command == "one" else 0:]
            print("freed", flush=True)
""")


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.parametrize("broker_url,event_loop", BROKERS_AND_LOOPS[:2],
                         indirect=["broker_url"])
def test_out_of_descriptors_at_accept_the_client_still_gets_an_error(
        broker_url: str, event_loop: str, tmp_path: Path, mqguard_unique_name: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXHAUSTED_SIDECAR, broker_url, event_loop,
         str(tmp_path / "events")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=_limit_open_files)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        port, filled = map(int, proc.stdout.readline().split())
        assert filled > 0
        answers = []
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", port), 5)
            sock.settimeout(5)
            data = b""
            try:
                while chunk := sock.recv(4096):
                    data += chunk
            except OSError as exc:
                data += f"<{exc}>".encode()
            sock.close()
            answers.append(data)
        # One descriptor free: the client is accepted, the broker connection fails.
        proc.stdin.write("one\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "freed"
        raw = RawClient(port)
        raw.send(connect_frame())
        raw.read_to_close(timeout=10)
        upstream_answer = raw.frames()
        raw.close()
        proc.stdin.write("all\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "freed"
        healthy_round_trip(port, f"/queue/{mqguard_unique_name}")
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
        log = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for data in answers:
        frames = decode_server_bytes(data)[0] if b"\0" in data else []
        assert [f.command for f in frames] == ["ERROR"], data
        assert "out of file descriptors" in (frames[0].get("message") or ""), frames
    assert [f.command for f in upstream_answer] == ["ERROR"], upstream_answer
    assert "out of file descriptors" in (upstream_answer[0].get("message") or "")
    assert "out of file descriptors" in log and "no file descriptor left" in log, log
    assert "Traceback" not in log, log[-4000:]
