"""mqguard.redact: no URL mqguard prints shows a password, whatever the password holds."""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest

from mqguard.config import parse_config
from mqguard.errors import ConfigError
from mqguard.redact import (
    AMBIGUOUS_USERINFO,
    redact_text,
    redact_url,
    redact_urls_in,
    url_secrets,
    userinfo_is_ambiguous,
)
from mqguard.registry import redact_url as registry_redact_url
from mqguard.stores.redis import mask_url

#: Every URL delimiter (and "%" and a blank), each inside a password.
DELIMITERS = ["#", "/", "?", "@", ":", "%", "[", "]", " "]
#: Two halves that must never be printed, even one without the other: a parser that cuts
#: the password at a delimiter would print the first as a host or port, the second as a path.
HEAD, TAIL = "Lk9q", "Zx7w"


def passwords() -> list[tuple[str, str]]:
    """``(id, password)``: each delimiter raw and percent-encoded, then all of them at once."""
    cases = []
    for d in DELIMITERS:
        cases.append((f"raw{d!r}", f"{HEAD}{d}{TAIL}"))
        cases.append((f"encoded{d!r}", f"{HEAD}{quote(d, safe='')}{TAIL}"))
    cases.append(("all-raw", f"{HEAD}{''.join(DELIMITERS)}{TAIL}"))
    cases.append(("all-encoded", HEAD + quote("".join(DELIMITERS), safe="") + TAIL))
    return cases


PASSWORDS = passwords()
SCHEMES = ["stomp", "stomp+ssl", "mqtt", "redis", "rediss", "redis+cluster"]


def assert_secret_free(text: str) -> None:
    assert HEAD not in text and TAIL not in text, text


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_every_password_is_masked_and_the_host_kept(scheme: str, case: str,
                                                    password: str) -> None:
    url = f"{scheme}://alice:{password}@broker.example:61613/?vhost=/"
    shown = redact_url(url)
    assert_secret_free(shown)
    assert shown == f"{scheme}://alice:***@broker.example:61613/?vhost=/"
    # The project's older entry points are the same function.
    assert registry_redact_url(url) == shown and mask_url(url) == shown


@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_a_password_without_a_user_name_and_a_user_name_alone(case: str, password: str) -> None:
    assert redact_url(f"redis://:{password}@h:1/0") == "redis://:***@h:1/0"
    # redis-py reads a lone user-info as the user name, but people write passwords there
    # (with a raw ":" it reads as a user name and a password, and a plain user name is kept).
    lone = redact_url(f"redis://{password}@h:1/0")
    expected = f"redis://{HEAD}:***@h:1/0" if password == f"{HEAD}:{TAIL}" else "redis://:***@h:1/0"
    assert lone == expected


def test_a_user_name_holding_delimiters_is_masked_too() -> None:
    assert redact_url(f"stomp://{HEAD}/x:{TAIL}@h:1") == "stomp://:***@h:1"


def test_urls_without_credentials_are_unchanged() -> None:
    for url in ("stomp://127.0.0.1:61613", "stomp://[::1]:61613/?vhost=/",
                "redis+cluster://a:1,b:2", "unix:///run/redis.sock?db=1", "mqtt://h"):
        assert redact_url(url) == url


def test_secret_query_parameters_are_masked() -> None:
    assert redact_url(f"unix:///run/redis.sock?db=1&password={HEAD}") == \
        "unix:///run/redis.sock?db=1&password=***"
    assert redact_url(f"redis://h:1/0?token={HEAD}&x=1") == "redis://h:1/0?token=***&x=1"


@pytest.mark.parametrize("url", [f"stomp://h:{HEAD}", f"stomp://[{HEAD}", f"stomp://h{HEAD}]:1",
                                 f"stomp://h:1{HEAD} x", f"redis://{HEAD} {TAIL}:1"])
def test_an_unparsable_url_without_at_is_not_echoed_beyond_its_scheme(url: str) -> None:
    assert redact_url(url) == f"{url.split('://')[0]}://<unparsable URL>"


def test_text_that_is_no_url() -> None:
    assert redact_url("localhost") == "localhost"
    assert redact_url(f"alice:{HEAD}@h") == "***@h"


@pytest.mark.parametrize("delimiter", ["/", "?", "#", "[", "]"])
def test_a_password_a_parser_would_cut_short_is_ambiguous(delimiter: str) -> None:
    assert userinfo_is_ambiguous(f"stomp://u:{HEAD}{delimiter}{TAIL}@h:61613")
    assert not userinfo_is_ambiguous(
        f"stomp://u:{HEAD}{quote(delimiter, safe='')}{TAIL}@h:61613")


@pytest.mark.parametrize("password", [f"{HEAD}@{TAIL}", f"{HEAD}:{TAIL}", f"{HEAD} {TAIL}",
                                      f"{HEAD}%{TAIL}", HEAD])
def test_other_passwords_parse_as_meant(password: str) -> None:
    assert not userinfo_is_ambiguous(f"stomp://u:{password}@h:61613")
    assert redact_url(f"stomp://u:{password}@h:61613") == "stomp://u:***@h:61613"


@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_redact_text_scrubs_a_message_built_from_the_url(case: str, password: str) -> None:
    url = f"redis://alice:{password}@h:1/0"
    # What a library might write: the URL, the password alone, percent-decoded or not.
    message = f"cannot connect to {url}: AUTH {password} / {unquote(password)} failed"
    assert_secret_free(redact_text(message, url))
    assert url_secrets(url)


@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_urls_inside_free_text(case: str, password: str) -> None:
    for text in (f"node 'stomp://u:{password}@h:1' must be", f"at stomp://u:{password}@h:1 now"):
        shown = redact_urls_in(text)
        assert_secret_free(shown)
        assert "stomp://u:***@h:1" in shown


@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_config_errors_never_show_a_node_password(case: str, password: str) -> None:
    node = f"stomp://u:{password}@h"  # no port: always refused
    with pytest.raises(ConfigError) as raised:
        parse_config({"mqguard": {"groups": {"g": {"nodes": [node], "queues": ["q"]}}}})
    assert_secret_free(str(raised.value))
    assert "***" in str(raised.value)


def test_config_refuses_a_node_whose_password_a_parser_cuts_short() -> None:
    with pytest.raises(ConfigError, match="percent-encode"):
        parse_config({"mqguard": {"groups": {"g": {
            "nodes": [f"stomp://u:123/{TAIL}@h:61613"], "queues": ["q"]}}}})
    assert "%2F" in AMBIGUOUS_USERINFO


@pytest.mark.parametrize(("case", "password"), PASSWORDS, ids=[c for c, _ in PASSWORDS])
def test_node_names_in_events_and_metrics_hold_no_password(case: str, password: str) -> None:
    from mqguard.balancing import node_name

    assert node_name(f"stomp://u:{password}@broker-1:61613/?vhost=/") == "broker-1:61613"
