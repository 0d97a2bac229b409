"""The project's HTTP server (``wire.http_server``) on a real socket: a connection its client closes between requests
is closed at once, not held with its socket and tasks until the keep-alive timer runs out."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio
import trio.testing
from conftest import HANG

from wire.http_server import listening_socket, serve_asgi


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _response(stream: trio.SocketStream) -> bytes:
    received = b""
    while not received.endswith(b"\r\n\r\nok"):
        chunk = await stream.receive_some()
        assert chunk, f"the server closed before answering: {received!r}"
        received += chunk
    return received


async def test_a_connection_the_client_closed_between_requests_is_closed_at_once() -> None:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_asgi, _ok, [sock], keep_alive=600))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(2):  # kept alive between requests, as long as the client wants
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await _response(stream)).startswith(b"HTTP/1.1 200")
        await trio.testing.wait_all_tasks_blocked()  # the server is done with the request: the connection idles
        await stream.send_eof()  # the client is done (what closing its pool does, seen from the server)
        with trio.fail_after(HANG):  # far less than the keep-alive timer's 600 s: the server closes its end now
            assert await stream.receive_some() == b""
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_connection_between_requests_stays_open_while_the_client_keeps_it() -> None:
    """What the keep-alive timer is for: the server does not close first (a client could be sending on it)."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_asgi, _ok, [sock], keep_alive=600))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await _response(stream)
        await trio.testing.wait_all_tasks_blocked()  # the server is done with the request: the connection idles
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await _response(stream)).startswith(b"HTTP/1.1 200")
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def _start_cut_short(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The response's start is cancelled inside the server's send, after h11 took it and before it reached the
    socket: Hypercorn then tries a 500 on a response already begun and raises out of the connection."""
    if scope["path"] == "/ok":
        await _ok(scope, receive, send)
        return
    with trio.move_on_after(0):
        await send({"type": "http.response.start", "status": 200, "headers": []})


async def test_one_connections_failure_does_not_end_the_server() -> None:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_asgi, _start_cut_short, [sock])
        broken = await trio.open_tcp_stream("127.0.0.1", port)
        await broken.send_all(b"GET /cut HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with trio.fail_after(HANG):  # that connection is closed (whatever reached it before)
            while await broken.receive_some():
                pass
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with trio.fail_after(HANG):
            assert (await _response(stream)).startswith(b"HTTP/1.1 200")
        await stream.aclose()
        nursery.cancel_scope.cancel()
