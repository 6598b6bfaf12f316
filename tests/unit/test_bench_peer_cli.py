"""``mqguard bench peer`` refuses a bad broker URL before it starts or reaches anything, and
never shows the URL's password."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from mqguard.cli import main


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("url", ["http://alice:s3cret@127.0.0.1:61613",
                                 "stomp://alice:s3cret@127.0.0.1:6x13",
                                 "stomp://alice:s3cret@:61613"])
def test_a_url_that_is_not_stomp_host_port_is_refused(url: str) -> None:
    result = CliRunner().invoke(main, ["bench", "peer", "--artemis-url", url])
    assert result.exit_code == 2
    assert "Invalid value for '--artemis-url'" in result.output
    assert "expected stomp://HOST[:PORT]" in result.output
    assert "s3cret" not in result.output


@pytest.mark.parametrize("option", ["--artemis-url", "--activemq-url", "--rabbitmq-url"])
def test_a_broker_that_does_not_answer_is_named_before_anything_starts(option: str) -> None:
    url = f"stomp://alice:s3cret@127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(main, ["bench", "peer", option, url, "--store", "memory"])
    assert result.exit_code == 1
    assert f"{option} stomp://alice:***@127.0.0.1:" in result.output
    assert "cannot connect" in result.output
    assert "s3cret" not in result.output
    assert "starting or reaching" not in result.output
