"""Pure logic of ``mqguard.dlq``: durations, body previews, selection, the retried copy."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mqguard.adapter import Delivery
from mqguard.cli.dlq import dlq
from mqguard.config import parse_config
from mqguard.dlq import (
    DeadLetter,
    Selection,
    body_preview,
    is_dead_letter_address,
    parse_duration,
    retry_copy,
)
from mqguard.message import (
    ACTUAL_EXPIRY_HEADER,
    BRIDGE_DUPLICATE_ID_HEADER,
    MESSAGE_ID_HEADER,
    MOVE_REASON_HEADER,
    MOVED_AT_HEADER,
    ORIG_ADDRESS_HEADER,
    ORIG_DELIVERY_COUNT_HEADER,
    ORIG_MESSAGE_ID_HEADER,
    ORIG_QUEUE_HEADER,
    SENT_AT_HEADER,
    Message,
)
from mqguard.servers.ports import free_ports


@pytest.mark.parametrize(("text", "ms"), [("10m", 600_000), ("2h", 7_200_000),
                                          ("7d", 604_800_000), ("0s", 0), ("250ms", 250),
                                          (" 1w ", 604_800_000)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["10", "", "m", "-1h", "1.5h", "10 parsecs", "1y"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ValueError, match=r"--older-than .*7d"):
        parse_duration(text, name="--older-than")


def test_previews_are_bounded_and_binary_safe() -> None:
    assert body_preview(b"hello\nworld", 256) == {"size": 11, "truncated": False,
                                                 "text": "hello\nworld"}
    binary = bytes(range(256))
    out = body_preview(binary, 16)
    assert out["truncated"] and base64.b64decode(out["base64"]) == binary[:16]
    # A character cut in half by the limit is still text.
    assert body_preview(("é" * 10).encode(), 5)["text"] == "éé"


def _letter(**headers: str) -> DeadLetter:
    message = Message(address="orders.DLA", body=b"x", message_id="D" * 20,
                      producer_id="P" * 20, sequence=7, duplicate_id="dup-1",
                      headers={ORIG_ADDRESS_HEADER: "orders", ORIG_QUEUE_HEADER: "orders",
                               ORIG_MESSAGE_ID_HEADER: "P" * 20 + ".7",
                               MOVE_REASON_HEADER: "max-delivery-attempts (1) reached",
                               MOVED_AT_HEADER: "1000", ORIG_DELIVERY_COUNT_HEADER: "1",
                               "app": "kept", **headers})
    return DeadLetter.from_delivery(Delivery(message, "s", None), "orders.DLA")


def test_a_dead_letter_is_read_from_its_headers() -> None:
    letter = _letter()
    assert (letter.original_address, letter.original_queue, letter.delivery_count,
            letter.moved_at, letter.kind) == ("orders", "orders", 1, 1000, "dead-letter")
    assert _letter(**{ACTUAL_EXPIRY_HEADER: "2000"}).kind == "expired"


def test_a_copy_carries_the_original_send_time() -> None:
    # mqguard-sent-at: the guard's stamp of the original's send, kept by its copy.
    message = Message.from_wire("orders.DLA", b"x", {
        MESSAGE_ID_HEADER: "D" * 20, SENT_AT_HEADER: "900", MOVED_AT_HEADER: "1000",
        ORIG_ADDRESS_HEADER: "orders"})
    letter = DeadLetter.from_delivery(Delivery(message, "s", None), "orders.DLA")
    assert (letter.sent_at, letter.moved_at, letter.age_ms(1500)) == (900, 1000, 500)
    row = letter.to_json()
    assert (row["sent_at"], row["moved_at"]) == (900, 1000)
    assert SENT_AT_HEADER not in row["headers"]  # a field, not an application header
    # Without the stamp (sent past mqguard, or to an address with no move target): None.
    assert _letter().sent_at is None and _letter().to_json()["sent_at"] is None
    # A malformed one is the application's header, not a time.
    odd = Message.from_wire("orders.DLA", b"x", {SENT_AT_HEADER: "soon"})
    letter = DeadLetter.from_delivery(Delivery(odd, "s", None), "orders.DLA")
    assert letter.sent_at is None and letter.headers[SENT_AT_HEADER] == "soon"
    # Its retried copy keeps it (Artemis's copy keeps the timestamp).
    message.sent_at = 900
    assert retry_copy(DeadLetter.from_delivery(Delivery(message, "s", None), "orders.DLA"),
                      "orders", None).wire_headers()[SENT_AT_HEADER] == "900"


def test_selection() -> None:
    letter = _letter()
    assert Selection().accepts(letter, 0)
    assert Selection.of(ids=["D" * 20]).accepts(letter, 0)
    assert Selection.of(ids=["P" * 20 + ".7"]).accepts(letter, 0)
    assert not Selection.of(ids=["other"]).accepts(letter, 0)
    assert Selection.of(original="orders").accepts(letter, 0)
    assert Selection.of(original="#").accepts(letter, 0)
    assert not Selection.of(original="payments").accepts(letter, 0)
    assert Selection.of(older_than_ms=500).accepts(letter, 1500)
    assert not Selection.of(older_than_ms=501).accepts(letter, 1500)


def test_the_retried_copy_follows_artemis_retry_messages() -> None:
    letter = _letter(**{ACTUAL_EXPIRY_HEADER: "2000"})
    letter.message.expiration = 5
    copy = retry_copy(letter, "orders", "dlq:" + "D" * 20)
    assert copy.address == "orders" and copy.body == b"x"
    assert copy.message_id == "D" * 20 + "~r"  # the same for every attempt
    assert (copy.producer_id, copy.sequence, copy.duplicate_id) == ("P" * 20, 7, "dup-1")
    assert copy.expiration == 0 and copy.delivery_count == 0
    assert copy.headers == {ORIG_ADDRESS_HEADER: "orders.DLA", ORIG_QUEUE_HEADER: "orders.DLA",
                            ORIG_MESSAGE_ID_HEADER: "D" * 20, "app": "kept",
                            BRIDGE_DUPLICATE_ID_HEADER: "dlq:" + "D" * 20}


def test_activemq_own_dead_letters_name_their_queue() -> None:
    message = Message(address="ActiveMQ.DLQ", body=b"x", broker_message_id="ID:1")
    delivery = Delivery(message, "s", None, raw_headers={
        "original-destination": "/queue/orders", "timestamp": "1234"})
    letter = DeadLetter.from_delivery(delivery, "ActiveMQ.DLQ")
    assert (letter.original_address, letter.reason, letter.message_id) == (
        "orders", "dead-lettered by ActiveMQ", "ID:1")
    # ActiveMQ keeps the original's timestamp: a send time, which ages it (the move came
    # after it, at an unknown time).
    assert (letter.moved_at, letter.sent_at, letter.age_ms(1734)) == (None, 1234, 500)
    assert Selection.of(older_than_ms=500).accepts(letter, 1734)
    # One sent through a guard carries the guard's stamp too, which is taken first.
    stamped = Message(address="ActiveMQ.DLQ", body=b"x", broker_message_id="ID:2",
                      sent_at=1200)
    assert DeadLetter.from_delivery(Delivery(stamped, "s", None, raw_headers={
        "original-destination": "/queue/orders", "timestamp": "1234"}),
        "ActiveMQ.DLQ").sent_at == 1200
    # Retried to that queue under a new random id (no mqguard id to derive one from).
    copy = retry_copy(letter, "orders", None)
    assert copy.address == "orders" and copy.message_id and BRIDGE_DUPLICATE_ID_HEADER \
        not in copy.headers


def test_dead_letter_addresses_are_those_the_configuration_sends_to() -> None:
    config = parse_config({"address-settings": {
        "orders": {"dead-letter-address": "orders.DLA", "expiry-address": "orders.EXP"},
        "payments.#": {"auto-create-dead-letter-resources": True,
                       "dead-letter-address": "DLA"}}})
    for address in ("orders.DLA", "orders.EXP", "DLQ.payments.eu"):
        assert is_dead_letter_address(config, address), address
    for address in ("orders", "order.DLA", "DLQ.orders", "DLQ.", "EXP.payments.eu"):
        assert not is_dead_letter_address(config, address), address


def _toml(tmp_path: Path) -> str:
    path = tmp_path / "mqguard.toml"
    path.write_text('[address-settings.orders]\ndead-letter-address = "orders.DLA"\n')
    return str(path)


@pytest.mark.parametrize("command", ["show", "retry", "purge", "attach"])
def test_an_unknown_address_is_refused_before_connecting(command: str, tmp_path: Path) -> None:
    (port,) = free_ports(1)
    result = CliRunner().invoke(dlq, [command, "order.DLA", "--url",
                                      f"stomp://u:pw-x9@127.0.0.1:{port}", "-c",
                                      _toml(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "unknown dead-letter address 'order.DLA'" in result.output
    assert "names orders.DLA" in result.output and "--any-address" in result.output
    assert "cannot connect" not in result.output and "pw-x9" not in result.output
    # --any-address takes it: then the (unreachable) broker is what fails.
    result = CliRunner().invoke(dlq, [command, "order.DLA", "--any-address", "--yes",
                                      "--url", f"stomp://127.0.0.1:{port}", "-c",
                                      _toml(tmp_path)] if command == "purge" else
                                [command, "order.DLA", "--any-address", "--url",
                                 f"stomp://127.0.0.1:{port}", "-c", _toml(tmp_path)])
    assert result.exit_code == 1 and "cannot connect" in result.output, result.output


def test_a_pattern_matching_no_address_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(dlq, ["list", "payments.#", "--url", "stomp://127.0.0.1:9",
                                      "-c", _toml(tmp_path)])
    assert result.exit_code == 1
    assert "no dead-letter or expiry address matches 'payments.#'" in result.output
    assert "orders.DLA" in result.output


_SYNOPSIS_OPTION = re.compile(r"\[(-[-\w]+)( [A-Za-z.]+)?(?: \.\.\.)?\]")


def test_each_command_s_options_are_its_synopsis_in_docs() -> None:
    """docs/dlq.md's synopsis and --help name the same options, values named alike."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "dlq.md").read_text()
    synopsis = page.split("```", 2)[1]
    usages = re.split(r"^mqguard dlq ", synopsis, flags=re.M)[1:]
    assert sorted(u.split()[0] for u in usages) == sorted(dlq.commands)
    for usage in usages:
        name = usage.split()[0]
        documented = {m.group(1): (m.group(2) or "").strip() for m in
                      _SYNOPSIS_OPTION.finditer(usage)}
        if "--url URL" in usage:
            documented["--url"] = "URL"
        actual: dict[str, str] = {}
        for param in dlq.commands[name].params:
            if not isinstance(param, click.Option) or param.opts[0] == "--help":
                continue
            value = "" if getattr(param, "is_flag", False) else str(param.metavar)
            shown = next((opt for opt in param.opts if opt in documented), param.opts[0])
            actual[shown] = value
        assert documented == actual, name
