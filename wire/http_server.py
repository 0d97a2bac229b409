"""Serving an ASGI application on sockets lmbridge opened, with Hypercorn's Trio worker: the HTTP API front's
server (TLS, HTTP/2, a graceful stop). The loopback listener (the synthetic MCP server's streamable-HTTP transport)
runs on ``wire.h11_server`` instead.

Owns turning listening sockets into a running Hypercorn server inside the caller's nursery, with its logs kept off
stdout and its limits set: header size, keep-alive, a graceful timeout on stop; ``send_together``, which puts what
several ASGI messages make on the wire in one write (under either server); and the small helpers both fronts share
(the listening socket, the body read, the bearer token). The application decides everything else (bodies, auth,
routes).
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import socket
import ssl
from collections.abc import Sequence
from typing import Any

import trio

__all__ = [
    "HEADER_BYTES",
    "MORE_TO_COME",
    "bearer",
    "claim_held_writes",
    "is_loopback",
    "listening_socket",
    "presented_token",
    "read_body",
    "send_together",
    "serve_asgi",
]

HEADER_BYTES = 64 * 1024  # of a request's head, at most
MORE_TO_COME: dict[str, Any] = {"type": "http.request", "body": b"", "more_body": True}


def is_loopback(host: str) -> bool:
    """A host name or address that stays on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def read_body(receive: Any, limit: int) -> tuple[bytes, dict[str, Any] | None]:
    """An ASGI request's body, read whole: ``(body, None)``. When the client leaves first, what was read and the
    ``http.disconnect``; past ``limit`` bytes, what was read (the last chunk included) and ``MORE_TO_COME``: the rest
    is still for whoever calls ``receive`` next."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            return b"".join(chunks), None
        if size > limit:
            return b"".join(chunks), MORE_TO_COME


class _HeldWrites:
    """The bytes a connection was given while ``send_together`` ran, written when it ends."""

    __slots__ = ("chunks", "connection")

    def __init__(self) -> None:
        self.connection: Any = None  # the connection (Hypercorn's, replaced below) that holds them
        self.chunks: list[bytes] = []


_held_writes: contextvars.ContextVar[_HeldWrites | None] = contextvars.ContextVar("_held_writes", default=None)


async def send_together(send: Any, *messages: dict[str, Any]) -> None:
    """Send ASGI ``messages`` (a response's start and its body, say) so that their bytes reach the socket in one
    write. Servers write each part of a response as it is given — the head, each body chunk, the chunked
    encoding's end: three writes for a short event-stream answer, and as many wake-ups of a client that may read
    between them (on a busy machine the client, woken by the first, can take the CPU before the rest is written).
    Hypercorn and ``wire.h11_server`` hold them instead (``claim_held_writes``); under another server the messages
    are sent one by one, as ``send`` would."""
    held = _HeldWrites()
    token = _held_writes.set(held)
    try:
        for message in messages:
            await send(message)
    finally:
        _held_writes.reset(token)
        if held.connection is not None:
            with trio.CancelScope(shield=True):  # the connection counts these bytes as sent: they must be
                await held.connection.write_held(held)


def claim_held_writes(connection: Any) -> _HeldWrites | None:
    """For a server's connection about to write: the writes ``send_together`` holds in this task, now
    ``connection``'s (it adds its bytes to ``chunks``, and its ``write_held(held)`` is awaited at the end); ``None``
    when nothing is held, or it is held for another connection."""
    held = _held_writes.get()
    if held is None or held.connection not in (None, connection):
        return None
    held.connection = connection
    return held


async def serve_asgi(
    app: Any,
    sockets: Sequence[socket.socket],
    *,
    ssl_context: ssl.SSLContext | None = None,
    keep_alive: float = 75.0,
    graceful_timeout: float = 3.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``sockets`` (bound and listening) until cancelled. With ``ssl_context``, TLS on all of them."""
    from hypercorn.config import Config, Sockets
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    _close_idle_connections_on_client_eof()
    config = Config()
    config.accesslog = None
    # Hypercorn's error log is the standard library's; lmbridge's stderr logging shows what propagates to it.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.h11_max_incomplete_size = HEADER_BYTES
    config.keep_alive_timeout = keep_alive
    config.graceful_timeout = graceful_timeout
    config.include_server_header = False
    if ssl_context is not None:
        config.create_ssl_context = lambda: ssl_context  # type: ignore[method-assign]  # our context, not its files
        bound = Sockets(secure_sockets=list(sockets), insecure_sockets=[], quic_sockets=[])
    else:
        bound = Sockets(secure_sockets=[], insecure_sockets=list(sockets), quic_sockets=[])

    async def application(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # lmbridge's applications start and stop with their owners, not here
            while True:
                message = await receive()
                kind = message["type"].rpartition(".")[2]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await app(scope, receive, send)

    await worker_serve(
        wrap_app(application, config.wsgi_max_body_size, "asgi"),
        config,
        sockets=bound,
        task_status=_started_without_binds(task_status),
    )


def _close_idle_connections_on_client_eof() -> None:
    """Hypercorn 0.18's Trio worker keeps a connection its client closed between requests — the socket in
    CLOSE-WAIT, the connection's tasks and buffers — until the keep-alive timer runs out (``keep_alive``: 75 s, so
    that clients, whose idle timeouts are shorter, close first and never send on a connection being closed). Every
    MCP session of an agent leaves two or three such connections when it ends: a daemon serving conversations with
    tools one after another would hold thousands. Its connection class, with the timer stopped
    once the client's end of stream has been read: the connection then closes as soon as nothing is in flight.
    Idempotent.

    The same class keeps one connection's failure from ending the server: Hypercorn 0.18 can raise out of a
    connection (h11's ``LocalProtocolError`` when a client vanishes as a response starts: it then tries to send a
    500 on a response already begun), which would end every connection of the listener and lmbridge with them.

    And it holds what a connection is given to write while ``send_together`` runs in the task that gives it, for
    one write at the end."""
    import hypercorn.trio.run
    from hypercorn.trio.tcp_server import TCPServer

    if issubclass(hypercorn.trio.run.TCPServer, _ClosingTCPServerMarker):  # type: ignore[attr-defined]
        return

    from hypercorn.events import RawData

    class _ClosingTCPServer(TCPServer, _ClosingTCPServerMarker):
        async def _read_data(self) -> None:
            await super()._read_data()
            await self.idle_task.stop()

        async def protocol_send(self, event: Any) -> None:
            held = _held_writes.get()
            if held is not None and held.connection in (None, self):
                if isinstance(event, RawData):  # one of send_together's: kept for its one write
                    held.connection = self
                    held.chunks.append(event.data)
                    return
                await self.write_held(held)  # what came before it goes first (a close, say)
            await super().protocol_send(event)

        async def write_held(self, held: _HeldWrites) -> None:
            if held.chunks:
                data, held.chunks = b"".join(held.chunks), []
                await super().protocol_send(RawData(data=data))

        async def run(self) -> None:
            await _isolated(super().run)

    hypercorn.trio.run.TCPServer = _ClosingTCPServer  # type: ignore[attr-defined]  # what worker_serve instantiates


async def _isolated(run_connection: Any) -> None:
    """Run one connection; an error of its own is logged and ends it alone (it has been closed by then)."""
    try:
        await run_connection()
    except Exception as exc:  # a BaseExceptionGroup with Cancelled in it still propagates
        logging.getLogger("hypercorn.error").warning("an HTTP connection failed and was closed: %r", exc)


class _ClosingTCPServerMarker:
    """Marks Hypercorn's connection class as replaced (``_close_idle_connections_on_client_eof``)."""


def _started_without_binds(task_status: trio.TaskStatus[None]) -> Any:
    class _Status:
        def started(self, value: Any = None) -> None:
            task_status.started()

    return _Status()


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 picks a free port) and listening; ``OSError`` when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bearer(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    scheme, _, presented = (authorization or b"").partition(b" ")
    return presented.strip() or None if scheme.lower() == b"bearer" else None


def presented_token(headers: dict[bytes, bytes]) -> bytes | None:
    """The credential of an HTTP API request (lower-cased header names): ``Authorization: Bearer`` or, as
    Anthropic's clients send it, ``x-api-key``."""
    return bearer(headers.get(b"authorization")) or headers.get(b"x-api-key")
