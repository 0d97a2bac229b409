"""The stdio MCP server an agent starts for ``bench/bare_floor.py``: its stdin and stdout joined to the floor's socket.

Standard library only and single-threaded (one ``selectors`` loop), run as ``python -I -S bare_shim.py``. It reads the
socket path and the token from ``BARE_FLOOR_SOCKET`` and ``BARE_FLOOR_TOKEN``, sends the token as its first line and
then copies bytes both ways until the floor closes the socket; the floor parses MCP. It stands where any bridge's
relay must stand when an agent takes its tools from a stdio MCP server it starts itself.
"""

import os
import selectors
import socket
import sys


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> int:
    path, token = os.environ.get("BARE_FLOOR_SOCKET"), os.environ.get("BARE_FLOOR_TOKEN")
    if not path or not token:
        sys.stderr.write("bare floor shim: BARE_FLOOR_SOCKET and BARE_FLOOR_TOKEN must be set\n")
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(token.encode() + b"\n")
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(sock, selectors.EVENT_READ)
    while True:
        for key, _events in selector.select():
            if key.fileobj == 0:
                data = os.read(0, 1 << 16)
                if data:
                    sock.sendall(data)
                else:  # the agent closed our stdin: the floor sees the end, and closes in turn
                    selector.unregister(0)
                    sock.shutdown(socket.SHUT_WR)
            else:
                data = sock.recv(1 << 16)
                if not data:
                    return 0
                _write_all(1, data)


if __name__ == "__main__":
    sys.exit(main())
