"""The stdio MCP server an agent starts for the editor's tools: a tiny relay between its stdin/stdout and the
bridge's per-session unix socket.

Standard library only, run as ``python -I -S shim.py`` so it starts in milliseconds. It reads the socket path and
the session token from ``LMBRIDGE_MCP_SOCKET`` and ``LMBRIDGE_MCP_TOKEN``, presents the token first (the bridge
relays nothing before checking it), then copies bytes both ways until either side closes. It never parses MCP:
the bridge does.
"""

import os
import socket
import sys
import threading

HANDSHAKE = b"LMBRIDGE-MCP-1 "


def _relay_stdin(sock: socket.socket) -> None:
    try:
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def main() -> int:
    path = os.environ.get("LMBRIDGE_MCP_SOCKET")
    token = os.environ.get("LMBRIDGE_MCP_TOKEN")
    if not path or not token:
        sys.stderr.write("lmbridge MCP shim: LMBRIDGE_MCP_SOCKET and LMBRIDGE_MCP_TOKEN must be set\n")
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(HANDSHAKE + token.encode() + b"\n")
    except OSError as exc:
        sys.stderr.write(f"lmbridge MCP shim: cannot reach the bridge at {path}: {exc.strerror or exc}\n")
        return 1
    threading.Thread(target=_relay_stdin, args=(sock,), daemon=True).start()
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            _write_all(1, data)
    except OSError as exc:
        sys.stderr.write(f"lmbridge MCP shim: connection to the bridge lost: {exc.strerror or exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
