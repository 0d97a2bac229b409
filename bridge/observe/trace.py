"""Wire traces: every JSON-RPC message of every connection, as NDJSON, one file per connection.

Owns the ``--trace-dir`` files. A line is ``{"ts": <unix seconds>, "conn": <name>, "dir": "in"|"out",
"msg": <the message>}``; input that was not valid JSON is kept as a string under ``"raw"``. Files are created
0600 in a 0700 directory; registered secrets (tokens) are replaced by ``"***"`` before anything is written.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO

__all__ = ["Tracer"]


class Tracer:
    def __init__(self, directory: str | os.PathLike[str], *, prefix: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._prefix = prefix or f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self._files: dict[str, IO[bytes]] = {}
        self._secrets: list[bytes] = []

    def add_secret(self, secret: str) -> None:
        if secret:
            self._secrets.append(json.dumps(secret)[1:-1].encode())

    def path_for(self, conn: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in conn)
        return self.directory / f"{self._prefix}-{safe}.ndjson"

    def _file(self, conn: str) -> IO[bytes]:
        handle = self._files.get(conn)
        if handle is None:
            fd = os.open(self.path_for(conn), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            handle = self._files[conn] = os.fdopen(fd, "ab")
        return handle

    def record(self, conn: str, direction: str, raw: bytes, valid: bool = True) -> None:
        body = raw.rstrip(b"\r\n")
        for secret in self._secrets:
            body = body.replace(secret, b"***")
        head = b'{"ts":%.6f,"conn":%s,"dir":"%s",' % (time.time(), json.dumps(conn).encode(), direction.encode())
        if valid:
            line = head + b'"msg":' + body + b"}\n"
        else:
            line = head + b'"raw":' + json.dumps(body.decode("utf-8", "replace")).encode() + b"}\n"
        handle = self._file(conn)
        handle.write(line)
        handle.flush()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
