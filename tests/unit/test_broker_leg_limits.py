"""The broker leg's limits admit every MESSAGE of a SEND the client leg admitted, and
:func:`send_refusal` stops at SEND time what the broker would refuse (issue 21, 6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqguard.sidecar.frames import (
    BROKER_ADDED_BYTES,
    BROKER_ADDED_HEADERS,
    BROKER_LINE_BYTES,
    BROKER_STOMP_LIMITS,
    COPY_ADDED_HEADERS,
    HEARTBEAT,
    MQGUARD_ADDED_HEADERS,
    SERVER_COMMANDS,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    Oversized,
    broker_leg_limits,
    encode,
    send_refusal,
    with_plain_header,
)

CLIENT = FrameLimits()  # the sidecar's defaults: 16 MiB, 128 headers, 8192-octet lines


def test_defaults_are_widened_by_what_mqguard_and_the_broker_add() -> None:
    leg = broker_leg_limits(CLIENT)
    assert leg.max_header_count == 128 + MQGUARD_ADDED_HEADERS + BROKER_ADDED_HEADERS
    assert leg.max_header_line_bytes == 2 * 8192
    assert leg.max_frame_bytes >= 16 * 1024 * 1024 + CLIENT.max_head_bytes + BROKER_ADDED_BYTES
    assert leg.max_command_bytes == CLIENT.max_command_bytes


def test_small_client_lines_still_admit_a_brokers_own_line() -> None:
    leg = broker_leg_limits(FrameLimits(max_header_line_bytes=256))
    assert leg.max_header_line_bytes == BROKER_LINE_BYTES


def client_send(count: int, line: int, colons: bool) -> bytes:
    """A SEND as a client may write it: ``count`` headers, one of them ``line`` octets long
    (raw colons when ``colons``: STOMP 1.2 peers send them unescaped, and they are
    escaped, doubling, on every later hop)."""
    headers = [f"x-{i}:v" for i in range(count - 2)]
    filler = ":" if colons else "a"
    headers.append("x-big:" + filler * (line - len("x-big:")))
    return ("SEND\ndestination:/queue/q\n" + "\n".join(headers) + "\n\nbody").encode() + b"\0"


def broker_message(sent: Frame, added: int) -> bytes:
    """The MESSAGE a broker makes of ``sent``: its headers, escaped, plus ``added`` of its own."""
    own = [("message-id", "ID:broker-1:1:1:1:1"), ("subscription", "s1"),
           ("ack", "ID:broker-1:1:1:1:1"), ("timestamp", "1764160000000"),
           ("dlqDeliveryFailureCause", "java.lang.Throwable: " + "x" * 600)]
    extra = [own[i % len(own)] if i < len(own) else (f"x-broker-{i}", "y" * 40)
             for i in range(added)]
    return encode(Frame("MESSAGE", [*sent.headers, *extra], sent.body), "1.2")


@settings(max_examples=60, deadline=None)
@given(count=st.integers(8, 200), line=st.integers(256, 20_000), colons=st.booleans(),
       added=st.integers(0, BROKER_ADDED_HEADERS))
def test_what_the_client_leg_admits_comes_back_through_the_broker_leg(
        count: int, line: int, colons: bool, added: int) -> None:
    client = FrameLimits(max_header_count=count, max_header_line_bytes=line,
                         max_frame_bytes=max(1024, count * 64 + line + 1024))
    data = client_send(count, line, colons)
    [sent] = [f for f in FrameDecoder(limits=client).feed(data) if isinstance(f, Frame)]
    # mqguard's stamps as the sidecar adds them.
    sent.headers += [("mqguard-id", "g" * 24), ("mqguard-producer", "p" * 24),
                     ("mqguard-seq", "1"), ("receipt", "mqguard-r-1")]
    back = broker_message(sent, added)
    leg = broker_leg_limits(client)
    decoded = [f for f in FrameDecoder(limits=leg, commands=SERVER_COMMANDS).feed(back)
               if isinstance(f, Frame)]
    assert [f.get("x-big") for f in decoded] == [sent.get("x-big")]


def test_the_same_message_was_refused_with_the_client_limits() -> None:
    """The bug: the broker leg used the client's limits."""
    data = client_send(128, 5008, colons=True)
    [sent] = [f for f in FrameDecoder(limits=CLIENT).feed(data) if isinstance(f, Frame)]
    back = broker_message(sent, 6)
    with pytest.raises(FrameError):
        FrameDecoder(limits=CLIENT, commands=SERVER_COMMANDS).feed(back)
    assert FrameDecoder(limits=broker_leg_limits(CLIENT), commands=SERVER_COMMANDS).feed(back)


def refusal(frame: Frame, broker: str, client: FrameLimits = CLIENT) -> str | None:
    data = encode(frame, "1.2")
    return send_refusal(data, len(frame.headers), len(frame.body), broker_leg_limits(client),
                        broker)


def test_activemq_header_line_limit() -> None:
    # 5,000 colons: 10,008 octets escaped, within ActiveMQ's 10,240; 6,000 are not.
    assert refusal(Frame("SEND", [("destination", "/queue/q"), ("x", ":" * 5000)]),
                   "activemq") is None
    why = refusal(Frame("SEND", [("destination", "/queue/q"), ("x", ":" * 6000)]), "activemq")
    assert why is not None and "ActiveMQ" in why and "12002" in why and "10240" in why
    # RabbitMQ has no such limit; the broker leg's own (16,384) is the bound there.
    assert refusal(Frame("SEND", [("destination", "/queue/q"), ("x", ":" * 6000)]),
                   "rabbitmq") is None
    why = refusal(Frame("SEND", [("destination", "/queue/q"), ("x", ":" * 9000)]), "rabbitmq")
    assert why is not None and "broker leg" in why


def test_activemq_header_count_limit() -> None:
    """ActiveMQ 5.17 takes 1,001 headers and refuses 1,002 (measured); the sidecar keeps
    to 1,000 with room for the headers a dead-letter or expiry copy adds."""
    wide = FrameLimits(max_header_count=5000)
    fits = 1000 - COPY_ADDED_HEADERS - 1  # - the receipt
    headers = [("destination", "/queue/q"), *((f"h{i}", "v") for i in range(fits - 1))]
    assert refusal(Frame("SEND", headers), "activemq", wide) is None
    why = refusal(Frame("SEND", [*headers, ("one", "more")]), "activemq", wide)
    assert why is not None and f"{fits + 2} with mqguard's" in why and "1000" in why
    assert refusal(Frame("SEND", [*headers, ("one", "more")]), "rabbitmq", wide) is None


def test_broker_body_limits() -> None:
    activemq = BROKER_STOMP_LIMITS["activemq"].max_body_bytes
    rabbitmq = BROKER_STOMP_LIMITS["rabbitmq"].max_body_bytes
    assert (activemq, rabbitmq) == (100 * 1024 * 1024, 128 * 1024 * 1024)
    leg = broker_leg_limits(FrameLimits(max_frame_bytes=1024 ** 3))
    head = b"SEND\ndestination:/queue/q\n\n"
    # The body length decides; a small stand-in frame keeps the test cheap.
    assert send_refusal(head + b"\0", 1, activemq, leg, "activemq") is None
    why = send_refusal(head + b"\0", 1, activemq + 1, leg, "activemq")
    assert why is not None and "ActiveMQ" in why
    assert send_refusal(head + b"\0", 1, activemq + 1, leg, "rabbitmq") is None
    assert send_refusal(head + b"\0", 1, rabbitmq + 1, leg, "rabbitmq") is not None


def test_unknown_brokers_get_the_broker_legs_bound_only() -> None:
    assert refusal(Frame("SEND", [("destination", "/queue/q"), ("x", ":" * 6000)]),
                   "unknown") is None


def test_a_frame_the_broker_leg_could_not_read_back_is_refused() -> None:
    client = FrameLimits(max_frame_bytes=64 * 1024)
    leg = broker_leg_limits(client)
    room = leg.max_frame_bytes - BROKER_ADDED_BYTES - 64  # the receipt line still to come
    head = b"SEND\ndestination:/queue/q\n\n"
    fits = head + b"x" * (room - len(head) - 1) + b"\0"
    assert len(fits) == room
    assert send_refusal(fits, 1, room - len(head) - 1, leg, "rabbitmq") is None
    over = head + b"x" * (room - len(head)) + b"\0"
    assert send_refusal(over, 1, room - len(head), leg, "rabbitmq") is not None


def test_with_plain_header_adds_the_first_header() -> None:
    data = encode(Frame("SEND", [("destination", "/queue/q"), ("a", "b:c")], b"x\0y"), "1.2")
    framed = with_plain_header(data, "receipt", "mqguard-r-7")
    [frame] = [f for f in FrameDecoder().feed(framed) if isinstance(f, Frame)]
    assert frame.headers[0] == ("receipt", "mqguard-r-7")
    assert frame.get("a") == "b:c" and frame.body == b"x\0y"


# -- a decoder that hands frames over the limits on (the broker leg's) ---------------------

SMALL = FrameLimits(max_frame_bytes=200, max_header_count=4, max_header_line_bytes=40)


def items_of(data: bytes, chunk: int | None = None) -> list[object]:
    decoder = FrameDecoder(limits=SMALL, commands=SERVER_COMMANDS, oversized=True)
    if chunk is None:
        return [item for item in decoder.feed(data) if item is not HEARTBEAT]
    out: list[object] = []
    for at in range(0, len(data), chunk):
        out += [item for item in decoder.feed(data[at:at + chunk]) if item is not HEARTBEAT]
    assert decoder.buffered == 0
    return out


def summary(items: list[object]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for item in items:
        if isinstance(item, Oversized):
            out.append(("oversized", item.reason, item.frame.get("ack"), item.body_kept,
                        len(item.frame.body)))
        else:
            assert isinstance(item, Frame)
            out.append((item.command, item.get("ack"), item.body))
    return out


AFTER = b"MESSAGE\nack:after\n\nnext\0\n"


@pytest.mark.parametrize("chunk", [None, 1, 7, 64])
@pytest.mark.parametrize("framing", ["content-length", "nul"])
def test_a_body_over_max_frame_is_skipped_and_decoding_goes_on(chunk: int | None,
                                                               framing: str) -> None:
    body = b"b" * 1000
    length = f"content-length:{len(body)}\n" if framing == "content-length" else ""
    data = f"MESSAGE\nack:big\n{length}\n".encode() + body + b"\0\n" + AFTER
    assert summary(items_of(data, chunk)) == [
        ("oversized", "frame too large", "big", False, 0), ("MESSAGE", "after", b"next")]


@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_too_many_headers_or_a_long_line_keep_the_body(chunk: int | None) -> None:
    many = b"MESSAGE\nack:many\na:1\nb:2\nc:3\nd:4\n\nbody\0"
    wide = b"MESSAGE\nack:wide\nx:" + b"y" * 60 + b"\n\nbody\0"
    assert summary(items_of(many + wide + AFTER, chunk)) == [
        ("oversized", "too many headers", "many", True, 4),
        ("oversized", "header line too long", "wide", True, 4),
        ("MESSAGE", "after", b"next")]


def test_without_oversized_the_same_frames_fail() -> None:
    for data in (b"MESSAGE\nack:many\na:1\nb:2\nc:3\nd:4\n\nbody\0",
                 b"MESSAGE\ncontent-length:1000\n\n" + b"b" * 1000 + b"\0"):
        with pytest.raises(FrameError):
            FrameDecoder(limits=SMALL, commands=SERVER_COMMANDS).feed(data)


def test_a_skipped_body_without_its_nul_is_still_an_error() -> None:
    decoder = FrameDecoder(limits=SMALL, commands=SERVER_COMMANDS, oversized=True)
    decoder.feed(b"MESSAGE\ncontent-length:300\n\n" + b"b" * 100)
    with pytest.raises(FrameError, match="missing NUL"):
        decoder.feed(b"b" * 200 + b"X")


def test_a_header_block_over_max_head_bytes_still_fails() -> None:
    decoder = FrameDecoder(limits=SMALL, commands=SERVER_COMMANDS, oversized=True)
    with pytest.raises(FrameError, match="headers too large"):
        decoder.feed(b"MESSAGE\n" + b"h:v\n" * 100)
