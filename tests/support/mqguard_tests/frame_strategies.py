"""Hypothesis strategies for STOMP frames, and what decoding an encoded frame gives."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from mqguard.sidecar.frames import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
)

ALL_COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS


UNESCAPED = ("CONNECT", "STOMP", "CONNECTED")


PROPERTY = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


SPECIALS = st.sampled_from([":", "\n", "\r", "\\", "\\c", "\\n", "\\r", " ", "\t", "\u00e9",
                            "\U0001f600", "content-length"])


TEXT = st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
                | SPECIALS, max_size=5).map("".join)


BODY = st.binary(max_size=300) | st.sampled_from([b"", b"\x00", b"a\x00b", b"\n\n\x00\n"])


COMMAND = st.sampled_from(sorted(ALL_COMMANDS))


def representable(command: str, version: str, name: str, value: str) -> tuple[str, str]:
    """Make (name, value) carriable by ``version`` (what encode() requires)."""
    name = name.replace("\x00", "") or "n"
    value = value.replace("\x00", "")
    if name == "content-length":
        name = "content_length"
    if version == "1.0" or command in UNESCAPED:
        name = name.replace(":", "_").replace("\n", "_")
        value = value.replace("\n", "_")
    if value.endswith("\r") and (version != "1.2" or command in UNESCAPED):
        value += "."
    return name, value


@st.composite
def frames(draw, version: str, commands=COMMAND) -> Frame:
    command = draw(commands)
    headers = [representable(command, version, name, value)
               for name, value in draw(st.lists(st.tuples(TEXT, TEXT), max_size=6))]
    return Frame(command, headers, draw(BODY))


def decoded_form(frame: Frame) -> Frame:
    """What decoding encode(frame) gives: content-length added for a body holding a NUL."""
    if b"\x00" in frame.body and frame.get("content-length") is None:
        return Frame(frame.command, [*frame.headers, ("content-length", str(len(frame.body)))],
                     frame.body)
    return frame
