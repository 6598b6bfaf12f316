"""The admin port's broker probe reads the broker's answer with the project's codec: a
CONNECTED or an ERROR (the broker answers, it refused the probe's login) is an answer, and
anything else is not; its CONNECT carries the URL's credentials unless one would break
the frame."""

from __future__ import annotations

import asyncio

import pytest

from mqguard.sidecar.admin import UpstreamProbe
from mqguard.sidecar.frames import CLIENT_COMMANDS, Frame, FrameDecoder
from mqguard.sidecar.server import parse_upstream


async def _probe_against(answer: bytes, url: str = "stomp://u:p%40ss@127.0.0.1:{port}"
                         ) -> tuple[bool, str, list[Frame]]:
    received: list[Frame] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(commands=CLIENT_COMMANDS, version="1.0", keep_wire=False)
        while not any(isinstance(item, Frame) for item in received):
            data = await reader.read(4096)
            if not data:
                break
            received.extend(item for item in decoder.feed(data) if isinstance(item, Frame))
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        result = await UpstreamProbe(parse_upstream(url.format(port=port)),
                                     timeout=2.0).check()
    return result.ok, result.detail, received


@pytest.mark.parametrize(("answer", "ok", "detail"), [
    (b"CONNECTED\nversion:1.2\n\n\x00", True, "CONNECTED"),
    (b"\n\nERROR\nmessage:Access refused for user 'u'\n\nbad login\x00", True,
     "ERROR: Access refused for user 'u'"),
    (b"MESSAGE\ndestination:/queue/a\n\nhi\x00", False,
     "broker answered CONNECT with a malformed frame"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n\x00", False,
     "broker answered CONNECT with a malformed frame"),
])
def test_the_answer_is_read_by_the_codec(answer: bytes, ok: bool, detail: str) -> None:
    got_ok, got_detail, received = asyncio.run(_probe_against(answer))
    assert (got_ok, got_detail) == (ok, detail)
    [connect] = received
    assert connect.command == "CONNECT"
    assert connect.get("login") == "u" and connect.get("passcode") == "p@ss"
    assert connect.get("accept-version") == "1.0,1.1,1.2"


def test_a_credential_with_a_line_break_is_left_out() -> None:
    _, _, received = asyncio.run(_probe_against(
        b"CONNECTED\n\n\x00", "stomp://u:p%0Ass@127.0.0.1:{port}"))
    [connect] = received
    assert connect.get("login") == "u" and connect.get("passcode") is None
