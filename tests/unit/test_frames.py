"""STOMP frame codec of the sidecar (mqguard.sidecar.frames)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from mqguard_tests.frame_strategies import (
    ALL_COMMANDS,
    BODY,
    COMMAND,
    PROPERTY,
    TEXT,
    UNESCAPED,
    decoded_form,
    frames,
)

from mqguard.errors import MqguardError
from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    STOMP_VERSIONS,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    encode,
    encode_heartbeat,
)

QUICK_PROPERTY = settings(PROPERTY, max_examples=40)


def decode(data: bytes, version: str = "1.2", **kwargs) -> list[Frame | object]:
    return FrameDecoder(version=version, **kwargs).feed(data)


def one(data: bytes, version: str = "1.2", **kwargs) -> Frame:
    out = decode(data, version, **kwargs)
    assert len(out) == 1, out
    frame = out[0]
    assert isinstance(frame, Frame)
    return frame


def error(data: bytes, version: str = "1.2", **kwargs) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode(data, version, **kwargs)
    return info.value


def feed_in_chunks(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[Frame | object]:
    out: list[Frame | object] = []
    last = 0
    for cut in [*sorted(cuts), len(data)]:
        out.extend(decoder.feed(data[last:cut]))
        last = max(last, cut)
    return out


# -- constants, limits, errors, the Frame type ------------------------------------------------


def test_constants():
    assert STOMP_VERSIONS == ("1.0", "1.1", "1.2")
    assert sorted(CLIENT_COMMANDS) == sorted(["CONNECT", "STOMP", "SEND", "SUBSCRIBE",
                                              "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT",
                                              "ABORT", "DISCONNECT"])
    assert sorted(SERVER_COMMANDS) == ["CONNECTED", "ERROR", "MESSAGE", "RECEIPT"]
    assert encode_heartbeat() == b"\n"
    assert repr(HEARTBEAT) == "HEARTBEAT"


def test_limits_defaults():
    limits = FrameLimits()
    assert limits.max_frame_bytes == 16 * 1024 * 1024
    assert limits.max_header_count == 128
    assert limits.max_header_line_bytes == 8192
    assert limits.max_command_bytes == 32


def test_limits_head_bound_and_decoder_property():
    limits = FrameLimits(max_frame_bytes=10**9, max_header_count=2, max_header_line_bytes=10,
                         max_command_bytes=5)
    assert limits.max_head_bytes == (5 + 2) + 2 * (10 + 2) + 2
    assert FrameLimits(max_frame_bytes=50).max_head_bytes == 50
    assert FrameDecoder(limits=limits).limits is limits


@pytest.mark.parametrize("name", ["max_frame_bytes", "max_header_count",
                                  "max_header_line_bytes", "max_command_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10", None])
def test_limits_must_be_positive_ints(name, value):
    with pytest.raises(ValueError, match=name):
        FrameLimits(**{name: value})


def test_frame_error():
    exc = FrameError("bad command", detail="'GET / HTTP/1.1'")
    assert isinstance(exc, MqguardError)
    assert exc.reason == "bad command"
    assert exc.detail == "'GET / HTTP/1.1'"
    assert str(exc) == "bad command: 'GET / HTTP/1.1'"
    assert str(FrameError("x")) == "x"
    assert FrameError("x").frames == []


def test_frame_header_access():
    frame = Frame("SEND", [("a", "1"), ("b", "2"), ("a", "3")])
    assert frame.get("a") == "1"  # the first occurrence wins
    assert frame.get("zz") is None
    assert frame.get("zz", "d") == "d"
    assert frame.header_dict() == {"a": "1", "b": "2"}
    assert list(frame.header_dict()) == ["a", "b"]
    headers = frame.headers
    frame.set("a", "9")
    assert frame.headers == [("a", "9"), ("b", "2")]
    assert frame.headers is headers  # changed in place
    frame.set("c", "4")
    assert frame.headers == [("a", "9"), ("b", "2"), ("c", "4")]
    frame.set("b", "5")
    assert frame.headers == [("a", "9"), ("b", "5"), ("c", "4")]
    frame.headers.append(("b", "6"))
    frame.remove("b")
    assert frame.headers == [("a", "9"), ("c", "4")]
    frame.remove("nothing")
    assert frame.headers == [("a", "9"), ("c", "4")]
    assert Frame("ACK") == Frame("ACK", [], b"")


# -- framing, EOLs, heart-beats ------------------------------------------------------------------


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_simple_frame(version):
    frame = one(b"SEND\ndestination:/queue/a\nreceipt:77\n\nhello\x00", version)
    assert frame == Frame("SEND", [("destination", "/queue/a"), ("receipt", "77")], b"hello")


def test_frame_without_headers_or_body():
    assert one(b"DISCONNECT\n\n\x00") == Frame("DISCONNECT")


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_crlf_accepted_in_every_version(version):
    data = b"SEND\r\ndestination:/q\r\nx:y\r\n\r\nbody\r\n\x00"
    frame = one(data, version)
    assert frame == Frame("SEND", [("destination", "/q"), ("x", "y")], b"body\r\n")


def test_mixed_eols():
    frame = one(b"SEND\r\na:1\nb:2\r\n\nbody\x00")
    assert frame == Frame("SEND", [("a", "1"), ("b", "2")], b"body")


def test_heartbeats_between_frames():
    data = b"\n\r\n\nSEND\n\n1\x00\n\r\nACK\nid:1\n\n\x00\n"
    out = decode(data)
    assert out == [HEARTBEAT, HEARTBEAT, HEARTBEAT, Frame("SEND", [], b"1"), HEARTBEAT,
                   HEARTBEAT, Frame("ACK", [("id", "1")]), HEARTBEAT]


def test_crlf_heartbeat_split_across_feeds_counts_once():
    decoder = FrameDecoder()
    assert decoder.feed(b"\r") == []
    assert decoder.buffered == 1
    assert decoder.feed(b"\n") == [HEARTBEAT]
    assert decoder.buffered == 0


def test_lone_cr_is_not_a_heartbeat():
    decoder = FrameDecoder()
    decoder.feed(b"\r")
    with pytest.raises(FrameError, match="bad command"):
        decoder.feed(b"SEND\n\n\x00")


def test_partial_frames_are_buffered():
    decoder = FrameDecoder()
    assert decoder.feed(b"SEN") == []
    assert decoder.buffered == 3
    assert decoder.feed(b"D\ndestination:/q\n") == []
    assert decoder.feed(b"\nab") == []
    assert decoder.buffered == len(b"SEND\ndestination:/q\n\nab")
    assert decoder.feed(b"c\x00\nSEND\n\n") == [Frame("SEND", [("destination", "/q")], b"abc"),
                                               HEARTBEAT]
    assert decoder.buffered == len(b"SEND\n\n")
    assert decoder.feed(b"\x00") == [Frame("SEND")]
    assert decoder.buffered == 0
    assert decoder.feed(b"") == []


def test_feed_accepts_bytearray_and_memoryview():
    assert FrameDecoder().feed(bytearray(b"ACK\n\n\x00")) == [Frame("ACK")]
    assert FrameDecoder().feed(memoryview(b"ACK\n\n\x00")) == [Frame("ACK")]


# -- body and content-length ----------------------------------------------------------------


def test_body_runs_to_first_nul_without_content_length():
    assert decode(b"SEND\n\nab\x00SEND\n\ncd\x00") == [Frame("SEND", [], b"ab"),
                                                      Frame("SEND", [], b"cd")]
    exc = error(b"SEND\n\nab\x00cd\n\n\x00")
    assert exc.frames == [Frame("SEND", [], b"ab")]
    assert exc.reason == "bad command"  # "cd", the rest of the intended body


def test_content_length_reads_exactly_and_allows_nul_in_body():
    frame = one(b"SEND\ncontent-length:5\n\na\x00b\x00c\x00")
    assert frame.body == b"a\x00b\x00c"
    assert frame.get("content-length") == "5"


def test_content_length_zero():
    assert one(b"SEND\ncontent-length:0\n\n\x00").body == b""


def test_content_length_leading_zeros():
    assert one(b"SEND\ncontent-length:007\n\n1234567\x00").body == b"1234567"


def test_content_length_first_occurrence_wins():
    frame = one(b"SEND\ncontent-length:2\ncontent-length:5\n\nab\x00")
    assert frame.body == b"ab"
    assert frame.headers == [("content-length", "2"), ("content-length", "5")]


@pytest.mark.parametrize("data", [b"SEND\ncontent-length:2\n\nabc\x00",
                                  b"SEND\ncontent-length:1\n\nab\x00"])
def test_missing_nul_after_body(data):
    assert error(data).reason == "missing NUL after body"


def test_missing_nul_detected_when_the_byte_arrives():
    decoder = FrameDecoder()
    assert decoder.feed(b"SEND\ncontent-length:2\n\nab") == []
    with pytest.raises(FrameError, match="missing NUL after body"):
        decoder.feed(b"X")


@pytest.mark.parametrize("value", ["", "abc", "-1", "+1", " 1", "1 ", "1.0", "0x10", "1e3",
                                   "\u0661", "\u00b2", "1\\c2"])
def test_invalid_content_length(value):
    data = f"SEND\ncontent-length:{value}\n\n\x00".encode()
    assert error(data).reason == "invalid content-length"


@pytest.mark.parametrize("value", ["9" * 19, "9" * 5000, "1" + "0" * 30])
def test_huge_content_length(value):
    assert error(f"SEND\ncontent-length:{value}\n\n".encode()).reason in (
        "content-length too large", "frame too large")


def test_content_length_beyond_max_frame_fails_before_the_body_arrives():
    decoder = FrameDecoder(limits=FrameLimits(max_frame_bytes=100))
    with pytest.raises(FrameError, match="frame too large"):
        decoder.feed(b"SEND\ncontent-length:100\n\n")


# -- headers --------------------------------------------------------------------------------


def test_repeated_headers_kept_in_order():
    frame = one(b"MESSAGE\nfoo:1\nbar:2\nfoo:3\n\n\x00")
    assert frame.headers == [("foo", "1"), ("bar", "2"), ("foo", "3")]
    assert frame.get("foo") == "1"


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_value_splits_at_first_colon(version):
    frame = one(b"MESSAGE\nmessage-id:ID:host-1:2:3\nempty:\n\n\x00", version)
    assert frame.headers == [("message-id", "ID:host-1:2:3"), ("empty", "")]


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_no_trimming_in_any_version(version):
    frame = one(b"SEND\n key : value \n\n\x00", version)
    assert frame.headers == [(" key ", " value ")]


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_trailing_cr_is_part_of_eol(version):
    assert one(b"SEND\nk:v\r\n\n\x00", version).headers == [("k", "v")]
    # only one CR belongs to the EOL; an inner CR stays
    assert one(b"SEND\nk:v\r\r\n\n\x00", version).headers == [("k", "v\r")]
    assert one(b"SEND\nk:a\rb\n\n\x00", version).headers == [("k", "a\rb")]


def test_header_line_without_colon():
    assert error(b"SEND\nnocolon\n\n\x00").reason == "header line without ':'"


def test_empty_header_name():
    assert error(b"SEND\n:value\n\n\x00").reason == "empty header name"


def test_utf8_headers():
    frame = one("SEND\nd\u00e9st:\u65e5\u672c\U0001f600\n\n\x00".encode())
    assert frame.headers == [("d\u00e9st", "\u65e5\u672c\U0001f600")]


@pytest.mark.parametrize("data", [b"SEND\nk:\xff\n\n\x00", b"SEND\n\xc3:v\n\n\x00",
                                  b"SEND\nk:\xed\xa0\x80\n\n\x00"])  # the last: a surrogate
def test_invalid_utf8(data):
    assert error(data).reason == "invalid UTF-8 in headers"


def test_body_need_not_be_utf8():
    assert one(b"SEND\n\n\xff\xfe\x00").body == b"\xff\xfe"


@pytest.mark.parametrize("data", [b"SEND\nk:a\x00b\n\n\x00", b"SEND\x00", b"SEND\nk:v\x00",
                                  b"SEND\nk:a\x00b\ncontent-length:0\n\n\x00"])
def test_nul_in_headers(data):
    assert error(data).reason == "NUL in headers"


def test_nul_in_partial_headers_fails_at_once():
    decoder = FrameDecoder()
    decoder.feed(b"SEND\nk:v")
    with pytest.raises(FrameError, match="NUL in headers"):
        decoder.feed(b"\x00")


# -- escaping -------------------------------------------------------------------------------


def test_unescape_12():
    frame = one(b"SEND\na\\cb:1\\r2\\n3\\c4\\\\5\\\\n\n\n\x00", "1.2")
    assert frame.headers == [("a:b", "1\r2\n3:4\\5\\n")]


def test_unescape_11():
    frame = one(b"SEND\na\\cb:2\\n3\\c4\\\\5\n\n\x00", "1.1")
    assert frame.headers == [("a:b", "2\n3:4\\5")]


@pytest.mark.parametrize(("version", "value"), [
    ("1.2", b"\\t"), ("1.2", b"x\\"), ("1.2", b"\\"), ("1.2", b"a\\\\\\"), ("1.2", b"\\C"),
    ("1.2", b"\\\\\\x"), ("1.1", b"\\r"), ("1.1", b"\\t"), ("1.1", b"a\\"),
])
def test_undefined_escape_is_fatal(version, value):
    assert error(b"SEND\nk:" + value + b"\n\n\x00", version).reason == "bad header escape"
    assert error(b"SEND\nk" + value + b":v\n\n\x00", version).reason == "bad header escape"


def test_no_escaping_in_10():
    frame = one(b"SEND\nk\\c:a\\tb\\nc\\\n\n\x00", "1.0")
    assert frame.headers == [("k\\c", "a\\tb\\nc\\")]


@pytest.mark.parametrize("command", UNESCAPED)
@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_connect_frames_are_never_unescaped(command, version):
    frame = one(command.encode() + b"\nlogin:a\\tb\npasscode:x\\c\\\n\n\x00", version)
    assert frame.headers == [("login", "a\\tb"), ("passcode", "x\\c\\")]


def test_version_is_settable_between_frames():
    decoder = FrameDecoder(version="1.0")
    assert decoder.version == "1.0"
    assert decoder.feed(b"SEND\nk:a\\tb\n\n\x00") == [Frame("SEND", [("k", "a\\tb")])]
    decoder.version = "1.2"
    with pytest.raises(FrameError, match="bad header escape"):
        decoder.feed(b"SEND\nk:a\\tb\n\n\x00")


def test_version_applies_to_a_frame_completed_after_the_change():
    decoder = FrameDecoder(version="1.0")
    assert decoder.feed(b"SEND\nk:a\\cb\n") == []
    decoder.version = "1.1"
    assert decoder.feed(b"\n\x00") == [Frame("SEND", [("k", "a:b")])]


@pytest.mark.parametrize("version", ["1.3", "", "1", "2.0"])
def test_unknown_version(version):
    with pytest.raises(ValueError, match="STOMP version"):
        FrameDecoder(version=version)
    decoder = FrameDecoder()
    with pytest.raises(ValueError, match="STOMP version"):
        decoder.version = version
    with pytest.raises(ValueError, match="STOMP version"):
        encode(Frame("SEND"), version)


# -- commands -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(ALL_COMMANDS))
def test_every_command_decodes(command):
    assert one(command.encode() + b"\n\n\x00").command == command


def test_unknown_command():
    exc = error(b"FOO\n\n\x00")
    assert exc.reason == "unknown command"
    assert "FOO" in exc.detail


@pytest.mark.parametrize("data", [b"send\n\n\x00", b"SEND \n\n\x00", b" SEND\n\n\x00",
                                  b"S1\n\n\x00", b"\xc3\x89\n\n\x00", b"GET / HTTP/1.1\r\n",
                                  b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"])
def test_bad_command(data):
    assert error(data).reason == "bad command"


def test_bad_command_detected_before_the_line_ends():
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="bad command"):
        decoder.feed(b"GET ")


def test_command_set_restricts():
    decoder = FrameDecoder(commands=CLIENT_COMMANDS)
    assert decoder.feed(b"SEND\n\n\x00") == [Frame("SEND")]
    with pytest.raises(FrameError, match="unknown command"):
        decoder.feed(b"MESSAGE\n\n\x00")
    with pytest.raises(FrameError, match="unknown command"):
        FrameDecoder(commands=SERVER_COMMANDS).feed(b"SEND\n\n\x00")


def test_custom_commands():
    assert one(b"PING\n\n\x00", commands=frozenset({"PING"})).command == "PING"


@pytest.mark.parametrize("commands", [frozenset({"send"}), frozenset({""}),
                                      frozenset({"SE ND"}), frozenset({"\u00c9"})])
def test_commands_must_be_uppercase_words(commands):
    with pytest.raises(ValueError, match="commands"):
        FrameDecoder(commands=commands)


# -- limits ---------------------------------------------------------------------------------


def test_max_command_bytes():
    limits = FrameLimits(max_command_bytes=4)
    assert one(b"SEND\n\n\x00", limits=limits).command == "SEND"
    assert one(b"SEND\r\n\r\n\x00", limits=limits).command == "SEND"  # CR is part of the EOL
    assert error(b"COMMIT\n\n\x00", limits=limits).reason == "command too long"
    decoder = FrameDecoder(limits=limits)
    assert decoder.feed(b"SEND") == []
    with pytest.raises(FrameError, match="command too long"):
        decoder.feed(b"X")  # no need to wait for the EOL


def test_endless_command_line_is_stopped():
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="command too long"):
        for _ in range(100):
            decoder.feed(b"A")
    assert decoder.buffered == 0


def test_max_header_count():
    limits = FrameLimits(max_header_count=3)
    ok = b"SEND\na:1\nb:2\nc:3\n\n\x00"
    assert len(one(ok, limits=limits).headers) == 3
    assert error(b"SEND\na:1\nb:2\nc:3\nd:4\n\n\x00", limits=limits).reason == "too many headers"
    decoder = FrameDecoder(limits=limits)
    decoder.feed(b"SEND\na:1\nb:2\nc:3\n")
    with pytest.raises(FrameError, match="too many headers"):
        decoder.feed(b"d:4\n")  # before the blank line arrives


def test_max_header_line_bytes():
    limits = FrameLimits(max_header_line_bytes=8)
    assert one(b"SEND\nabc:1234\n\n\x00", limits=limits).headers == [("abc", "1234")]
    assert one(b"SEND\nabc:1234\r\n\r\n\x00", limits=limits).headers == [("abc", "1234")]
    exc = error(b"SEND\nabc:12345\n\n\x00", limits=limits)
    assert exc.reason == "header line too long"
    # measured encoded: 2 characters, 8 octets
    assert error("SEND\n\U0001f600:\u00e9\u00e9\n\n\x00".encode(), limits=limits).reason == (
        "header line too long")
    assert one("SEND\n\U0001f600:\u00e9\n\n\x00".encode(), limits=limits)


def test_endless_header_line_is_stopped():
    limits = FrameLimits(max_header_line_bytes=100)
    decoder = FrameDecoder(limits=limits)
    decoder.feed(b"SEND\nk:")
    with pytest.raises(FrameError, match="header line too long"):
        for _ in range(200):
            decoder.feed(b"v")
    assert decoder.buffered == 0


def test_endless_headers_are_stopped_by_max_frame_bytes():
    limits = FrameLimits(max_frame_bytes=1000, max_header_count=1000)
    decoder = FrameDecoder(limits=limits)
    decoder.feed(b"SEND\n")
    with pytest.raises(FrameError, match="headers too large"):
        for _ in range(1000):
            decoder.feed(b"k:v\n")
            assert decoder.buffered < 1000


def test_max_frame_bytes_exact():
    frame = b"SEND\n\n" + b"x" * 10 + b"\x00"
    assert one(frame, limits=FrameLimits(max_frame_bytes=len(frame))).body == b"x" * 10
    assert error(frame, limits=FrameLimits(max_frame_bytes=len(frame) - 1)).reason == (
        "frame too large")
    framed = b"SEND\ncontent-length:10\n\n" + b"x" * 10 + b"\x00"
    assert one(framed, limits=FrameLimits(max_frame_bytes=len(framed))).body == b"x" * 10
    assert error(framed, limits=FrameLimits(max_frame_bytes=len(framed) - 1)).reason == (
        "frame too large")


def test_max_frame_bytes_excludes_heartbeats():
    frame = b"SEND\n\n\x00"
    assert decode(b"\n" * 50 + frame + b"\n" * 50, limits=FrameLimits(max_frame_bytes=7))


def test_endless_body_is_stopped():
    decoder = FrameDecoder(limits=FrameLimits(max_frame_bytes=1000))
    decoder.feed(b"SEND\n\n")
    with pytest.raises(FrameError, match="frame too large"):
        for _ in range(100):
            decoder.feed(b"x" * 100)
            assert decoder.buffered < 1000


def test_large_frame_in_small_chunks():
    body = bytes(range(256)) * 4096  # 1 MiB, NULs included
    data = encode(Frame("SEND", [("destination", "/q")], body))
    decoder = FrameDecoder()
    out = feed_in_chunks(decoder, data, list(range(0, len(data), 1000)))
    assert out == [Frame("SEND", [("destination", "/q"), ("content-length", str(len(body)))],
                         body)]
    big = b"SEND\n\n" + b"x" * 1_000_000 + b"\x00"
    assert feed_in_chunks(FrameDecoder(), big, list(range(0, len(big), 999)))[0].body == (
        b"x" * 1_000_000)


# -- poisoning ------------------------------------------------------------------------------


def test_decoder_is_poisoned_after_an_error():
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(b"SEND\n\nok\x00\nBAD\n\n\x00SEND\n\n\x00")
    assert info.value.reason == "unknown command"
    assert info.value.frames == [Frame("SEND", [], b"ok"), HEARTBEAT]
    assert decoder.buffered == 0
    for data in (b"", b"SEND\n\n\x00", b"\n"):
        with pytest.raises(FrameError) as again:
            decoder.feed(data)
        assert again.value.reason == "unknown command"


# -- encoding -------------------------------------------------------------------------------


def test_encode_simple():
    frame = Frame("SEND", [("destination", "/q"), ("x", "y")], b"hi")
    assert encode(frame) == b"SEND\ndestination:/q\nx:y\n\nhi\x00"
    assert encode(Frame("DISCONNECT")) == b"DISCONNECT\n\n\x00"


def test_encode_escapes_12():
    frame = Frame("SEND", [("a:b\n", "1\r2\n3:4\\5")])
    assert encode(frame, "1.2") == b"SEND\na\\cb\\n:1\\r2\\n3\\c4\\\\5\n\n\x00"


def test_encode_escapes_11():
    frame = Frame("SEND", [("a:b\n", "1\r2\n3:4\\5")])
    assert encode(frame, "1.1") == b"SEND\na\\cb\\n:1\r2\\n3\\c4\\\\5\n\n\x00"


def test_encode_10_is_verbatim():
    frame = Frame("SEND", [("k\\", "a:b\\n\r\\")])
    assert encode(frame, "1.0") == b"SEND\nk\\:a:b\\n\r\\\n\n\x00"


@pytest.mark.parametrize("command", UNESCAPED)
@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_encode_never_escapes_connect_frames(command, version):
    frame = Frame(command, [("passcode", "a:b\\c")])
    assert encode(frame, version) == command.encode() + b"\npasscode:a:b\\c\n\n\x00"


def test_encode_adds_content_length_only_for_nul_bodies():
    assert b"content-length" not in encode(Frame("SEND", [], b"abc"))
    assert encode(Frame("SEND", [("a", "1")], b"a\x00c")) == (
        b"SEND\na:1\ncontent-length:3\n\na\x00c\x00")


def test_encode_keeps_a_correct_content_length():
    frame = Frame("SEND", [("content-length", "3"), ("a", "1")], b"abc")
    assert encode(frame) == b"SEND\ncontent-length:3\na:1\n\nabc\x00"
    frame = Frame("SEND", [("content-length", "3"), ("a", "1")], b"a\x00c")
    assert encode(frame) == b"SEND\ncontent-length:3\na:1\n\na\x00c\x00"


def test_encode_corrects_a_wrong_content_length_and_drops_repeats():
    frame = Frame("SEND", [("a", "1"), ("content-length", "99"), ("content-length", "3")],
                  b"ab\x00")
    assert encode(frame) == b"SEND\na:1\ncontent-length:3\n\nab\x00\x00"
    assert frame.headers[1] == ("content-length", "99")  # the frame itself is not modified
    assert encode(Frame("SEND", [("content-length", "x")])) == b"SEND\ncontent-length:0\n\n\x00"


def test_encode_accepts_bytes_like_body():
    assert encode(Frame("SEND", [], bytearray(b"ab"))) == b"SEND\n\nab\x00"  # type: ignore[arg-type]


@pytest.mark.parametrize(("version", "command", "name", "value"), [
    ("1.0", "SEND", "k", "a\nb"),
    ("1.0", "SEND", "k:x", "v"),
    ("1.0", "SEND", "k\nx", "v"),
    ("1.0", "SEND", "k", "v\r"),
    ("1.1", "SEND", "k", "v\r"),
    ("1.2", "CONNECT", "k", "a\nb"),
    ("1.2", "CONNECT", "k:x", "v"),
    ("1.1", "CONNECTED", "k", "v\r"),
    ("1.2", "STOMP", "k\n", "v"),
])
def test_encode_refuses_unrepresentable_headers(version, command, name, value):
    with pytest.raises(FrameError, match="not representable"):
        encode(Frame(command, [(name, value)]), version)


@pytest.mark.parametrize("version", STOMP_VERSIONS)
def test_encode_refuses_nul_and_empty_names(version):
    with pytest.raises(FrameError, match="NUL"):
        encode(Frame("SEND", [("k", "a\x00")]), version)
    with pytest.raises(FrameError, match="NUL"):
        encode(Frame("SEND", [("\x00", "a")]), version)
    with pytest.raises(FrameError, match="empty header name"):
        encode(Frame("SEND", [("", "a")]), version)


def test_encode_refuses_surrogates():
    with pytest.raises(FrameError, match="not representable"):
        encode(Frame("SEND", [("k", "\ud800")]))


def test_encode_12_represents_trailing_cr():
    data = encode(Frame("SEND", [("k", "v\r")]), "1.2")
    assert data == b"SEND\nk:v\\r\n\n\x00"
    assert one(data).headers == [("k", "v\r")]


@pytest.mark.parametrize("command", ["send", "", "SE ND", "SEND\n", "S1", "\u00c9"])
def test_encode_refuses_bad_commands(command):
    with pytest.raises(FrameError, match="bad command"):
        encode(Frame(command))


# -- properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", STOMP_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_property_round_trip(version, data):
    frame = data.draw(frames(version))
    assert FrameDecoder(version=version).feed(encode(frame, version)) == [decoded_form(frame)]


@pytest.mark.parametrize("version", STOMP_VERSIONS)
@PROPERTY
@given(command=COMMAND, headers=st.lists(st.tuples(TEXT, TEXT), max_size=4), body=BODY)
def test_property_encode_refuses_or_round_trips(version, command, headers, body):
    headers = [(name, value) for name, value in headers if name != "content-length"]
    frame = Frame(command, headers, body)
    try:
        data = encode(frame, version)
    except FrameError:
        return
    assert FrameDecoder(version=version).feed(data) == [decoded_form(frame)]


@pytest.mark.parametrize("version", STOMP_VERSIONS)
@QUICK_PROPERTY
@given(data=st.data())
def test_property_split_points_do_not_matter(version, data):
    items = data.draw(st.lists(frames(version) | st.sampled_from([b"\n", b"\r\n"]), max_size=6))
    stream = b"".join(encode(item, version) if isinstance(item, Frame) else item
                      for item in items)
    expected = [decoded_form(item) if isinstance(item, Frame) else HEARTBEAT for item in items]
    assert FrameDecoder(version=version).feed(stream) == expected
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    decoder = FrameDecoder(version=version)
    assert feed_in_chunks(decoder, stream, cuts) == expected
    assert decoder.buffered == 0
    if len(stream) <= 300:  # byte by byte, too
        decoder = FrameDecoder(version=version)
        assert feed_in_chunks(decoder, stream, list(range(len(stream)))) == expected


def outcome(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> tuple[list, bool]:
    """Everything decoded before the first error, and whether one happened."""
    out: list = []
    last = 0
    for cut in [*sorted(cuts), len(data)]:
        try:
            out.extend(decoder.feed(data[last:cut]))
        except FrameError as exc:
            out.extend(exc.frames)
            with pytest.raises(FrameError):
                decoder.feed(b"SEND\n\n\x00")  # poisoned
            with pytest.raises(FrameError):
                decoder.feed(b"")
            return out, True
        last = max(last, cut)
    return out, False


STOMPISH = st.lists(st.sampled_from([b"SEND", b"MESSAGE", b"CONNECT", b"\n", b"\r\n", b"\r",
                                     b":", b"\\", b"\\c", b"\\t", b"\x00", b"a", b"\xff", b"\xc3",
                                     b"content-length:", b"3", b"-", b" ", b"send"]),
                    max_size=40).map(b"".join)


@PROPERTY
@given(data=st.data(), version=st.sampled_from(STOMP_VERSIONS))
def test_property_garbage_only_raises_frame_error(data, version):
    raw = data.draw(st.binary(max_size=200) | STOMPISH)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=8))
    limits = FrameLimits(max_frame_bytes=120, max_header_count=4, max_header_line_bytes=20,
                         max_command_bytes=8)
    # only FrameError escapes, and the result does not depend on how the input is split
    whole = outcome(FrameDecoder(version=version, limits=limits), raw, [])
    split = outcome(FrameDecoder(version=version, limits=limits), raw, cuts)
    assert whole == split


def mutate(data: bytes, draw) -> bytes:
    kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "duplicate"]))
    if not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if kind == "insert":
        return data[:at] + draw(st.sampled_from([b"\x00", b"\n", b"\r", b":", b"\\", b"\xff",
                                                 b"9"])) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    end = draw(st.integers(at, len(data)))
    return data[:end] + data[at:end] + data[end:]


@PROPERTY
@given(data=st.data(), version=st.sampled_from(STOMP_VERSIONS))
def test_property_mutated_frames_only_raise_frame_error(data, version):
    items = data.draw(st.lists(frames(version), min_size=1, max_size=3))
    stream = b"\n".join(encode(item, version) for item in items)
    for _ in range(data.draw(st.integers(1, 3))):
        stream = mutate(stream, data.draw)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    assert outcome(FrameDecoder(version=version), stream, []) == outcome(
        FrameDecoder(version=version), stream, cuts)


def encoded_metrics(frame: Frame) -> tuple[int, int, int, int]:
    """(frame bytes, header count, longest header line, command bytes) of encode(frame)."""
    data = encode(frame)
    head = data[:data.index(b"\n\n")].split(b"\n")
    return len(data), len(head) - 1, max(map(len, head[1:]), default=0), len(head[0])


@PROPERTY
@given(data=st.data())
def test_property_limits_are_exact(data):
    frame = data.draw(frames("1.2"))
    size, count, line, command = encoded_metrics(frame)
    limits = FrameLimits(
        max_frame_bytes=data.draw(st.integers(max(1, size - 3), size + 3)),
        max_header_count=data.draw(st.integers(max(1, count - 1), count + 1)),
        max_header_line_bytes=data.draw(st.integers(max(1, line - 2), line + 2)),
        max_command_bytes=data.draw(st.integers(max(1, command - 1), command + 1)),
    )
    fits = (size <= limits.max_frame_bytes and count <= limits.max_header_count
            and line <= limits.max_header_line_bytes and command <= limits.max_command_bytes)
    stream = encode(frame)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    decoder = FrameDecoder(limits=limits)
    if fits:
        assert feed_in_chunks(decoder, stream, cuts) == [decoded_form(frame)]
    else:
        with pytest.raises(FrameError):
            feed_in_chunks(decoder, stream, cuts)


@PROPERTY
@given(
    prefix=st.sampled_from([b"SEND", b"SEND\nk:", b"SEND\n\n", b"SEND\n", b""]),
    filler=st.sampled_from([b"A", b"v", b"k:v\n", b"x" * 7, b"\r\n"]),
    chunk=st.integers(1, 64),
    max_frame=st.integers(64, 400),
    max_line=st.integers(8, 64),
    max_command=st.integers(4, 16),
)
def test_property_oversized_streams_are_stopped(prefix, filler, chunk, max_frame, max_line,
                                               max_command):
    assume(prefix or filler != b"\r\n")
    limits = FrameLimits(max_frame_bytes=max_frame, max_header_count=1000,
                         max_header_line_bytes=max_line, max_command_bytes=max_command)
    decoder = FrameDecoder(limits=limits)
    stream = prefix + filler * (2 * max_frame // len(filler) + 2)
    fed = 0
    with pytest.raises(FrameError):
        while fed < len(stream):
            decoder.feed(stream[fed:fed + chunk])
            fed += chunk
            assert decoder.buffered < max_frame
    # stopped no later than the chunk that made the frame too large to be valid
    assert fed <= max_frame + chunk
