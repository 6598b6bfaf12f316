"""A scripted STOMP broker on loopback, for what a real broker cannot be made to do (send
its heart-beat EOLs in a given pattern, a malformed frame, close at a given frame).

Each connection gets a thread that reads whole frames (up to their NUL; bodies without
NUL only) and hands each to :meth:`ScriptedBroker.answer` with the socket: a subclass
writes what its script says, and returns False to close the connection.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["LoopbackServer", "ScriptedBroker"]


class LoopbackServer:
    """Accepts connections on a free loopback port until :meth:`close`, each served by
    :meth:`serve` on a thread of its own."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def serve(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(sock,), daemon=True).start()


class ScriptedBroker(LoopbackServer):
    """A STOMP broker answering each frame per :meth:`answer`."""

    def answer(self, sock: socket.socket, command: str, headers: dict[str, str]) -> bool:
        """CONNECTED to CONNECT, a RECEIPT when one is asked for; False after DISCONNECT."""
        if command in ("CONNECT", "STOMP"):
            sock.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\nserver:scripted/1\n\n\0")
        if "receipt" in headers:
            sock.sendall(f"RECEIPT\nreceipt-id:{headers['receipt']}\n\n\0".encode())
        return command != "DISCONNECT"

    def serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        with sock:
            while True:
                while b"\0" not in buffer:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                raw, _, buffer = buffer.partition(b"\0")
                lines = raw.lstrip(b"\r\n").decode().split("\n")
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                if not self.answer(sock, lines[0], headers):
                    return
