"""Serving an ASGI application over plain HTTP/1.1 with h11 on Trio: the loopback listener's server (the synthetic
MCP server's streamable-HTTP transport, and what is mounted beside it).

Hypercorn (``wire.http_server``) serves the HTTP API front: TLS, HTTP/2, a graceful stop. The loopback listener
needs none of that, and it is on the path of every agent's tool call: this server is one Trio task per connection
and one write per response part (or per ``send_together``), where Hypercorn spent ~40 % of lmbridge's CPU
on an MCP call in its own tasks and events, and ~70 ms of CPU to import beside a starting agent.

Owns the connection loop: requests one at a time per connection (keep-alive; pipelined requests wait their turn), the
ASGI ``http`` scope, ``receive`` (the body, then ``http.disconnect`` when the client hangs up), ``send`` (each part
written as it comes, or held by ``wire.http_server.send_together`` for one write), the limits (header size, the idle
time between requests), and the errors: a malformed request gets 400 (431 for oversized headers), an application
that fails before answering gets 500, and one connection's failure never ends the server. A client that closes its
end between requests has its connection closed at once. Imports ``wire.http_server`` alone of lmbridge.
"""

from __future__ import annotations

import http
import socket
from typing import Any, Protocol
from urllib.parse import unquote

import h11
import trio

from wire.http_server import HEADER_BYTES, claim_held_writes

__all__ = ["serve_h11"]

_RECEIVE_BYTES = 64 * 1024
_DRAIN_BYTES = 1024 * 1024  # of a request body the application left unread, read to keep the connection
_LINGER = 1.0  # seconds a closing connection reads what its client still sends
_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


class Warns(Protocol):
    """Where a connection's failure is told (``wire.observe``'s ``Logger`` is one)."""

    def warning(self, event: str, **fields: Any) -> None: ...


async def serve_h11(
    app: Any,
    sock: socket.socket,
    *,
    log: Warns,
    keep_alive: float = 75.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``sock`` (bound and listening) until cancelled. ``keep_alive``: seconds a connection may
    idle before (and while sending) a request's head; clients close theirs sooner, so the server never closes a
    connection a client is about to send on."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    server = sock.getsockname()[:2]

    async def handle(stream: trio.SocketStream) -> None:
        connection = _Connection(stream, app, server, keep_alive)
        try:
            await connection.run()
        except Exception as exc:  # this connection alone ends
            log.warning("an HTTP connection failed and was closed", error=repr(exc))
        finally:
            await connection.close()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, [listener])
        task_status.started()


class _Connection:
    """One client connection: its h11 state machine, and the request being answered."""

    def __init__(self, stream: trio.SocketStream, app: Any, server: tuple[str, int], keep_alive: float) -> None:
        self._stream = stream
        self._app = app
        self._server = server
        self._keep_alive = keep_alive
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=HEADER_BYTES)
        self._writing = trio.Lock()
        self._eof = False  # the client closed its end (or the connection broke)
        self._broken = False  # a write failed or was cut short: nothing more can be sent
        # The request being answered:
        self._head_request = False
        self._pending: Any = None  # an event read ahead of its turn (the body's end after its last data)
        self._body_done = False
        self._started = False
        self._finished = False

    async def run(self) -> None:
        while True:
            event = None
            with trio.move_on_after(self._keep_alive):
                try:
                    event = await self._next_event()
                except h11.RemoteProtocolError as exc:
                    await self._refuse(exc.error_status_hint, str(exc))
                    return
            if not isinstance(event, h11.Request):  # idle too long, the client left, or it broke the protocol
                return
            await self._answer(event)
            if self._broken or self._h11.our_state is not h11.DONE:  # a cut-short response, or one that closes
                return
            if self._h11.their_state is not h11.DONE and not await self._drain():
                return
            if self._eof:
                return
            self._h11.start_next_cycle()

    async def close(self) -> None:
        """Say the end (what was written reaches the client before the close), read what the client still sends
        for a moment (closing on unread data would reset the connection, and the client could lose the answer it
        has not read yet), then close."""
        try:
            if not (self._broken or self._eof):
                with trio.move_on_after(_LINGER):
                    await self._stream.send_eof()
                    while await self._stream.receive_some(_RECEIVE_BYTES):
                        pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self._stream.aclose()

    # -- reading --------------------------------------------------------------------------------------------

    async def _next_event(self) -> Any:
        if self._pending is not None:
            event, self._pending = self._pending, None
            return event
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self._receive_some()
            if not data:
                self._eof = True
            self._h11.receive_data(data)

    async def _receive_some(self) -> bytes:
        try:
            return await self._stream.receive_some(_RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _drain(self) -> bool:
        """Read the rest of a request body the application did not read; False: the connection cannot be kept."""
        left = _DRAIN_BYTES
        with trio.move_on_after(self._keep_alive):
            while left > 0:
                try:
                    event = await self._next_event()
                except h11.RemoteProtocolError:
                    return False
                if isinstance(event, h11.EndOfMessage):
                    return True
                if not isinstance(event, h11.Data):
                    return False
                left -= len(event.data)
        return False

    # -- one request ----------------------------------------------------------------------------------------

    async def _answer(self, request: h11.Request) -> None:
        self._head_request = request.method == b"HEAD"
        self._pending = None
        self._body_done = self._started = self._finished = False
        raw_path, _, query = bytes(request.target).partition(b"?")
        try:
            client: tuple[str, int] | None = tuple(self._stream.socket.getpeername()[:2])
        except OSError:  # already gone
            client = None
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(raw_path.decode("ascii", "replace")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(request.headers),
            "client": client,
            "server": self._server,
        }
        try:
            await self._app(scope, self._receive, self._send)
        except Exception:
            if self._started:
                raise  # the response is cut short: the connection closes (and the failure is logged)
            await self._plain(500, b"Internal Server Error")
            raise
        if not self._started:
            await self._plain(500, b"Internal Server Error: the application gave no response")
        elif not self._finished:
            self._broken = True  # a response begun and never ended: only closing tells the client

    async def _receive(self) -> dict[str, Any]:
        if not self._body_done:
            if self._h11.they_are_waiting_for_100_continue:
                await self._write(h11.InformationalResponse(status_code=100, headers=[]))
            try:
                event = await self._next_event()
                # The body's end often came in the same read: it is said with the data.
                ahead = self._h11.next_event() if isinstance(event, h11.Data) else None
            except h11.RemoteProtocolError:
                self._eof = self._body_done = True
                return _DISCONNECT
            if isinstance(event, h11.Data):
                if isinstance(ahead, h11.EndOfMessage):
                    self._body_done = True
                elif ahead is not h11.NEED_DATA:
                    self._pending = ahead
                return {"type": "http.request", "body": bytes(event.data), "more_body": not self._body_done}
            if isinstance(event, h11.EndOfMessage):
                self._body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            self._eof = self._body_done = True  # the client left mid-body
            return _DISCONNECT
        # The whole request was read: what is left to hear is the client hanging up (or, once the response is
        # done, nothing: ASGI then says disconnected).
        while not (self._eof or self._broken or self._finished):
            data = await self._receive_some()
            if not data:
                self._eof = True
                break
            self._h11.receive_data(data)  # a pipelined next request: read when its turn comes
        return _DISCONNECT

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._started:
                raise RuntimeError("the response has already started")
            self._started = True
            status = int(message["status"])
            headers = list(message.get("headers", []))
            await self._write(h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b"")))
        elif kind == "http.response.body":
            if not self._started or self._finished:
                raise RuntimeError("a response body outside a response")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            self._finished = not more
            events: list[Any] = [h11.Data(data=body)] if body and not self._head_request else []
            if not more:
                events.append(h11.EndOfMessage())
            if events:
                await self._write(*events)
        else:
            raise RuntimeError(f"unknown ASGI message for an HTTP response: {kind!r}")

    async def _plain(self, status: int, text: bytes, *headers: tuple[bytes, bytes]) -> None:
        self._started = self._finished = True
        head = [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode()), *headers]
        response = h11.Response(status_code=status, headers=head, reason=_REASONS.get(status, b""))
        await self._write(response, h11.Data(data=text), h11.EndOfMessage())

    async def _refuse(self, status: int, problem: str) -> None:
        """A request h11 could not read: its status (the connection then closes)."""
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            text = f"{_REASONS.get(status, b'').decode()}: {problem}".encode()
            try:
                await self._plain(status, text, (b"connection", b"close"))
            except h11.LocalProtocolError:
                pass

    # -- writing --------------------------------------------------------------------------------------------

    async def _write(self, *events: Any) -> None:
        """Turn ``events`` into bytes and write them (or hold them for ``send_together``'s one write). After the
        client left, or a write was cut short, nothing is written: the application goes on as if it was, and
        hears the disconnect from ``receive``."""
        if self._broken:
            return
        data = b"".join(self._h11.send(event) for event in events)
        held = claim_held_writes(self)
        if held is not None:
            held.chunks.append(data)
            return
        await self._write_bytes(data)

    async def write_held(self, held: Any) -> None:
        """``send_together``'s end: what it held, in one write."""
        if held.chunks:
            data, held.chunks = b"".join(held.chunks), []
            await self._write_bytes(data)

    async def _write_bytes(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._writing.acquire_nowait()
        except trio.WouldBlock:
            await self._writing.acquire()
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = self._eof = True
        except BaseException:
            self._broken = True  # cancelled mid-write: what reached the client is not a whole response
            raise
        finally:
            self._writing.release()
