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

from .redact import add_secret

__all__ = ["TraceDirError", "Tracer"]


class TraceDirError(OSError):
    """The trace directory is open to others and cannot be made private: traces would leak conversations."""


def _make_private(directory: Path) -> None:
    """A directory that existed before may be readable by others (0755): traces hold whole conversations, so it
    becomes 0700 — or, if it is not ours to change, lmbridge refuses to write there."""
    mode = directory.stat().st_mode & 0o777
    if not mode & 0o077:
        return
    try:
        os.chmod(directory, 0o700)
    except OSError as exc:
        raise TraceDirError(
            f"the trace directory {directory} is open to others (mode {mode:o}) and cannot be made private "
            f"({exc.strerror}): choose another --trace-dir, or run chmod 700 on it"
        ) from None


class Tracer:
    def __init__(self, directory: str | os.PathLike[str], *, prefix: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(self.directory)
        self._prefix = prefix or f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        self._files: dict[str, IO[bytes]] = {}
        self._secrets: list[bytes] = []

    def add_secret(self, secret: str) -> None:
        if secret:
            self._secrets.append(json.dumps(secret)[1:-1].encode())
            add_secret(secret)  # the same secret is masked in logs and agent stderr too

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
