"""No password of a URL given to mqguard is ever printed: CLI, logs, /health, exceptions.

Each password holds a URL delimiter (``# / ? @ : % [ ]`` or a blank), raw or
percent-encoded, between two halves that must never appear in any output: a parser that
cuts the password short would print the first half as a host or port. A raw ``/``, ``?``,
``#``, ``[`` or ``]`` makes the URL ambiguous (a parser reads part of the password as the
host): such URLs are refused, with the URL masked; the others are used, and masked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from mqguard.errors import AdapterError, StoreError
from mqguard.redact import userinfo_is_ambiguous
from mqguard.registry import open_adapter
from mqguard.stores.redis import RedisStore

DELIMITERS = ["#", "/", "?", "@", ":", "%", "[", "]", " "]
HEAD, TAIL = "Lk9q", "Zx7w"


def _cases() -> list[Any]:
    cases = []
    for d in DELIMITERS:
        cases.append(pytest.param(f"{HEAD}{d}{TAIL}", id=f"raw{d!r}"))
        cases.append(pytest.param(f"{HEAD}{quote(d, safe='')}{TAIL}", id=f"encoded{d!r}"))
    cases.append(pytest.param(HEAD + "".join(DELIMITERS) + TAIL, id="all-raw"))
    cases.append(pytest.param(HEAD + quote("".join(DELIMITERS), safe="") + TAIL,
                              id="all-encoded"))
    return cases


CASES = _cases()


def assert_secret_free(text: str) -> None:
    assert HEAD not in text and TAIL not in text, text


def _hostport(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


# -- the sidecar command, as a real process --------------------------------------------------


def _run_sidecar(upstream: str, cwd: Path) -> tuple[int | None, str, str]:
    """Start ``mqguard sidecar --upstream UPSTREAM``; if it starts, read /health and stop it
    with SIGTERM. Returns (exit code, everything it wrote, the /health body or "")."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mqguard.cli", "sidecar", "--upstream", upstream,
         "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines: list[str] = []
    health = ""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break  # exited
            lines.append(line)
            if "admin on port" in line:
                port = int(line.rsplit("admin on port", 1)[1].split()[0])
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                                timeout=10) as answer:
                        health = answer.read().decode()
                except urllib.error.HTTPError as exc:  # 503: the body is still the report
                    health = exc.read().decode()
                process.send_signal(signal.SIGTERM)
                break
        rest, _ = process.communicate(timeout=30)
        lines.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, "".join(lines), health


@pytest.mark.activemq
@pytest.mark.parametrize("password", CASES)
def test_sidecar_cli_never_prints_the_upstream_password(
        password: str, mqguard_activemq_server: Any, tmp_path: Path) -> None:
    hostport = _hostport(mqguard_activemq_server.urls["stomp"])
    upstream = f"stomp://alice:{password}@{hostport}"
    code, output, health = _run_sidecar(upstream, tmp_path)
    assert_secret_free(output)
    assert_secret_free(health)
    if userinfo_is_ambiguous(upstream):
        # Refused before anything connects, the URL masked, the fix named.
        assert code != 0 and "percent-encode" in output, output
        assert "stomp://alice:***@" in output, output
        assert health == ""
    else:
        assert code == 0, output
        # The INFO line names the upstream, masked; /health too.
        assert f"upstream stomp://alice:***@{hostport}" in output, output
        assert json.loads(health)["upstream"] == f"stomp://alice:***@{hostport}"


@pytest.mark.parametrize("upstream", ["stomp://127.0.0.1:61x13", f"stomp://[{HEAD}:1",
                                      f"stomp://127.0.0.1:{HEAD}{TAIL}"])
def test_sidecar_cli_does_not_echo_an_unparsable_upstream(upstream: str,
                                                          tmp_path: Path) -> None:
    code, output, _ = _run_sidecar(upstream, tmp_path)
    assert code != 0
    assert_secret_free(output)
    assert "61x13" not in output and "stomp://<unparsable URL>" in output, output


# -- exceptions: the STOMP adapter and the Redis store on real servers --------------------------


@pytest.mark.activemq
@pytest.mark.parametrize("password", CASES)
def test_stomp_adapter_errors_never_show_the_password(password: str,
                                                      mqguard_activemq_server: Any) -> None:
    url = f"stomp://alice:{password}@{_hostport(mqguard_activemq_server.urls['stomp'])}"
    with pytest.raises(AdapterError) as raised:
        adapter = open_adapter(url, connect_timeout=5)
        try:
            adapter.connect()  # ActiveMQ refuses the credentials... or accepts any
        finally:
            adapter.close()
        raise AdapterError(f"connected to {adapter.url}")  # still a message to check
    assert_secret_free(str(raised.value))
    assert_secret_free(repr(raised.value))


@pytest.mark.redis
@pytest.mark.parametrize("password", CASES)
def test_redis_store_errors_never_show_the_password(password: str,
                                                    mqguard_redis_server: Any) -> None:
    url = f"redis://alice:{password}@{_hostport(mqguard_redis_server.urls['redis'])}/0"
    with pytest.raises(StoreError) as raised:
        store = RedisStore.from_url(url, retry_timeout=0.3)
        try:
            store.ping()  # no such user: WRONGPASS
        finally:
            store.close()
    text = str(raised.value)
    assert_secret_free(text)
    assert "***" in text, text
    if userinfo_is_ambiguous(url):
        assert "percent-encode" in text
