"""``split_server_url``: one parser for every server URL, with masked errors."""

from __future__ import annotations

import pytest

from mqguard.redact import split_server_url

PORTS = {"stomp": 61613, "stomp+ssl": 61614}


def test_host_and_default_port_per_scheme() -> None:
    assert split_server_url("stomp://h", PORTS, what="URL")[1:] == ("h", 61613)
    assert split_server_url("stomp+ssl://u:p@h", PORTS, what="URL")[1:] == ("h", 61614)
    assert split_server_url("stomp://h:7", PORTS, what="URL")[1:] == ("h", 7)


@pytest.mark.parametrize(("url", "says"), [
    ("stomp://alice:Lk9q/Zx7w@broker:61613", "percent-encode"),
    ("stomp://[broker", "not a valid URL"),
    ("http://alice:s3cret@broker", "scheme must be stomp:// or stomp+ssl://"),
    ("stomp://alice:s3cret@:61613", "has no host"),
    ("stomp://alice:s3cret@broker:port", "has an invalid port"),
])
def test_errors_name_the_url_masked(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"^--upstream ") as raised:
        split_server_url(url, PORTS, what="--upstream")
    message = str(raised.value)
    assert says in message
    assert "s3cret" not in message and "Zx7w" not in message
