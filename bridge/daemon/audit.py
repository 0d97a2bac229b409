"""The audit log of a shared daemon: one JSON line per event that says who did what — a key added, revoked or
refused; a permission decision (which principal, or which policy, allowed or rejected which action of which agent);
an agent process started, or exited under its sessions. ``audit.log`` beside the token file unless told, 0600,
rotated by size (the standard library's ``RotatingFileHandler``, its files created 0600 as well).

Owns the file and the line format (``{"time", "event", ...fields}``). Secrets are masked by the project's rules
(``wire.observe.redact``), as in every log. Refusals of a bad credential are counted and written once a minute per
reason and peer, so that a flood of them cannot push the rest of the log out of its rotation.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import Any

from wire.observe.redact import redact

from .security import ServeError, check_private

__all__ = ["AuditLog", "audit_path_for"]

MAX_BYTES = 10 * 1024 * 1024  # per file
BACKUPS = 9  # audit.log.1 ... audit.log.9: 100 MB in all


def audit_path_for(token_path: Path) -> Path:
    return token_path.with_name("audit.log")


class _PrivateRotatingHandler(logging.handlers.RotatingFileHandler):
    """A rotating file whose every file is created 0600."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, self.mode.replace("w", "a") if "w" in self.mode else self.mode, encoding=self.encoding)


class _Unwritable(_PrivateRotatingHandler):
    """Says once (on stderr, the daemon's log) that lines are being lost, rather than a traceback a line."""

    lost = 0

    def handleError(self, record: logging.LogRecord) -> None:
        self.lost += 1
        if self.lost == 1:
            sys.stderr.write(f"lmbridge: cannot write the audit log {self.baseFilename}: its events are being lost\n")


class AuditLog:
    """``event(name, **fields)`` writes a line now; ``refused(reason, peer)`` is counted and written by ``flush``."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        self.path = path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.exists():
                check_private(path, path.stat(), "audit log ")
            self._handler = _Unwritable(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        except OSError as exc:
            raise ServeError(
                f"cannot open the audit log {path}: {exc.strerror or exc} (--audit-log names another)"
            ) from None
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._refusals: dict[tuple[str, str], int] = {}

    def event(self, name: str, **fields: Any) -> None:
        line = redact(json.dumps({"time": round(time.time(), 3), "event": name, **fields}, ensure_ascii=False))
        self._handler.emit(logging.LogRecord("lmbridge.audit", logging.INFO, "", 0, line, None, None))

    def refused(self, reason: str, peer: str) -> None:
        key = (reason, peer)
        self._refusals[key] = self._refusals.get(key, 0) + 1

    def flush(self) -> None:
        """Write the refusals counted since the last flush."""
        refusals, self._refusals = self._refusals, {}
        for (reason, peer), count in sorted(refusals.items()):
            self.event("credential_refused", reason=reason, peer=peer, count=count)

    def close(self) -> None:
        self.flush()
        self._handler.close()
