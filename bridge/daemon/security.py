"""What stands between a socket and the agents: the token file, the loopback rule, the Origin rule and TLS.

Owns the rules every listener of ``lmbridge serve`` applies before anything else runs (the WebSocket editor
protocol and the HTTP API): which addresses may be listened on, how the token is stored, which browser origins may
connect, and the TLS context. Who a credential belongs to is ``bridge.daemon.keys``. Pure functions and small values;
no sockets.
"""

from __future__ import annotations

import os
import secrets
import ssl
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from wire.http_server import is_loopback

__all__ = [
    "Refusal",
    "ServeError",
    "beside_token",
    "check_listen_address",
    "check_origin",
    "default_token_path",
    "load_token",
    "ssl_context",
]


class ServeError(Exception):
    """A problem with how the daemon was asked to serve: the message says what to change."""


class Refusal(Exception):
    """A request refused before it reached lmbridge: an HTTP status and the reason, in words for the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def default_token_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lmbridge" / "token"


def beside_token(explicit: str | None, token_file: str | None, default: Callable[[Path], Path]) -> Path:
    """A state file's path: ``explicit`` (its option), else ``default`` of the token file's (``token_file``, else the
    default token file) — the keys file, the usage ledger, the audit log live beside the token."""
    if explicit:
        return Path(explicit).expanduser()
    return default(Path(token_file).expanduser() if token_file else default_token_path())


def load_token(path: Path) -> str:
    """The token in ``path``; a new random one (file created 0600) if it does not exist. A file that other users
    can read is refused: the token is the only thing between them and the agents."""
    try:
        info = path.stat()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        return token
    check_private(path, info, "token file ")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ServeError(
            f"token file {path} holds no usable token (at least 16 characters); delete it to get a new one"
        )
    return token


def check_private(path: Path, info: os.stat_result, what: str = "") -> None:
    """``ServeError`` unless ``path`` (``info``: its ``stat``) is a regular file only its owner can read."""
    if not stat.S_ISREG(info.st_mode):
        raise ServeError(f"{what}{path} is not a regular file")
    if info.st_mode & 0o077:
        raise ServeError(
            f"{what}{path} is accessible by other users (mode {stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}"
        )


def check_listen_address(host: str, *, allow_remote: bool, tls: bool) -> None:
    """Loopback by default; anything else only when asked for, and only with TLS."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ServeError(
            f"refusing to listen on {host}: not a loopback address. To accept remote clients, add "
            "--allow-remote and TLS (--tls-cert/--tls-key)"
        )
    if not tls:
        raise ServeError("--allow-remote needs TLS: give --tls-cert and --tls-key")


def ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not (cert or key):
        return None
    if not (cert and key):
        raise ServeError("give both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ServeError(f"cannot load the TLS certificate/key: {exc}") from None
    return context


def origins_in(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """Every ``Origin`` header of a request (a mapping would keep only the last of two)."""
    return [value for name, value in headers if name.lower() == b"origin"]


def check_origin(origins: Iterable[bytes], allowed: Iterable[str]) -> None:
    """Browsers send ``Origin``; other clients do not. A browser page may talk to lmbridge only from an origin the
    daemon was started with (``--allow-origin``)."""
    origins = list(origins)
    if not origins:
        return
    if len(origins) > 1:
        raise Refusal(400, "more than one Origin header")
    origin = origins[0].decode("latin-1")
    if origin not in set(allowed):
        raise Refusal(
            403,
            f"origin {origin!r} is not allowed (browsers may not talk to lmbridge unless started with --allow-origin)",
        )
