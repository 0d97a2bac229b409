"""The loopback listener's HTTP/1.1 server (``wire.h11_server``) on real sockets: keep-alive, bodies, streams,
disconnects, and every way a request or an application can go wrong."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
import trio.testing
from conftest import HANG

from wire.h11_server import _Connection, serve_h11
from wire.http_server import listening_socket, read_body, send_together

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
GET = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class _Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


@asynccontextmanager
async def _served(app: App, keep_alive: float = 600.0, log: _Log | None = None) -> AsyncIterator[int]:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_h11, app, sock, log=log or _Log(), keep_alive=keep_alive))
        yield port
        nursery.cancel_scope.cancel()


async def _read_until(stream: trio.SocketStream, end: bytes, received: bytes = b"") -> bytes:
    with trio.fail_after(HANG):
        while end not in received:
            chunk = await stream.receive_some()
            assert chunk, f"the server closed first: {received!r}"
            received += chunk
    return received


async def _read_to_eof(stream: trio.SocketStream) -> bytes:
    received = b""
    with trio.fail_after(HANG):
        while chunk := await stream.receive_some():
            received += chunk
    return received


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = f"{scope['method']} {scope['path']} {scope['query_string'].decode()}".encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def test_a_connection_serves_requests_until_its_client_closes_it() -> None:
    async with _served(_ok) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(2):
            await stream.send_all(b"GET /a%20b?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            response = await _read_until(stream, b"GET /a b q=1")
            assert response.startswith(b"HTTP/1.1 200 OK\r\n")
        await stream.send_eof()  # the client is done: the server closes its end at once (not at keep-alive's 600 s)
        assert await _read_to_eof(stream) == b""
        await stream.aclose()


async def test_an_idle_connection_is_closed_after_the_keep_alive_time() -> None:
    async with _served(_ok, keep_alive=0.05) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert await _read_to_eof(stream) == b""
        await stream.aclose()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with _served(_ok) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GET.replace(b"/x", b"/one") + GET.replace(b"/x", b"/two"))
        response = await _read_until(stream, b"GET /two")
        assert response.index(b"GET /one") < response.index(b"GET /two")
        await stream.aclose()


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body, rest = await read_body(receive, 1 << 20)
    assert rest is None
    await send_together(
        send,
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]},
        {"type": "http.response.body", "body": body},
    )
    assert await receive() == {"type": "http.disconnect"}  # after the response: nothing more to hear


async def test_a_body_sent_in_chunks_is_read_whole() -> None:
    async with _served(_echo) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b"6\r\n world\r\n0\r\n\r\n")
        response = await _read_until(stream, b"hello world")
        assert b"content-length: 11" in response.lower()
        await stream.aclose()


async def test_a_client_waiting_for_100_continue_is_told_to_send() -> None:
    async with _served(_echo) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert (await _read_until(stream, b"\r\n\r\n")).startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"ping")
        assert (await _read_until(stream, b"ping")).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()


async def _unread(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers without reading the body (a refusal, say)."""
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def test_a_body_the_application_left_unread_does_not_end_the_connection() -> None:
    async with _served(_unread) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(2):
            await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            assert (await _read_until(stream, b"\r\n\r\n")).startswith(b"HTTP/1.1 401 ")
        await stream.aclose()


async def test_a_head_request_gets_the_head_alone() -> None:
    async with _served(_ok) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
        response = await _read_until(stream, b"GET /x")
        assert response.count(b"HTTP/1.1 200") == 2
        assert b"HEAD /x" not in response
        await stream.aclose()


async def test_a_stream_goes_out_as_it_is_sent_and_its_client_hanging_up_is_heard() -> None:
    heard = trio.Event()
    more = trio.Event()

    async def stream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await more.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        assert (await receive())["type"] == "http.request"
        assert await receive() == {"type": "http.disconnect"}
        heard.set()
        await send({"type": "http.response.body", "body": b"data: 3\n\n", "more_body": True})  # to no one: no error
        await send({"type": "http.response.body", "body": b""})

    async with _served(stream_app) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GET)
        received = await _read_until(stream, b"data: 1")  # before the stream ends
        assert b"transfer-encoding: chunked" in received.lower()
        more.set()
        await _read_until(stream, b"data: 2", received)
        await stream.aclose()
        with trio.fail_after(HANG):
            await heard.wait()


async def test_an_application_failing_before_it_answers_gets_500_and_the_server_goes_on() -> None:
    log = _Log()

    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/fail":
            raise ValueError("broken")
        await _ok(scope, receive, send)

    async with _served(failing, log=log) as port:
        broken = await trio.open_tcp_stream("127.0.0.1", port)
        await broken.send_all(GET.replace(b"/x", b"/fail"))
        assert (await _read_to_eof(broken)).startswith(b"HTTP/1.1 500 ")
        assert "broken" in log.warnings[0][1]["error"]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GET)
        assert (await _read_until(stream, b"GET /x")).startswith(b"HTTP/1.1 200 ")
        await broken.aclose()
        await stream.aclose()


async def test_an_application_that_gives_no_response_gets_500() -> None:
    async def silent(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return

    async with _served(silent) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GET)
        assert (await _read_until(stream, b"no response")).startswith(b"HTTP/1.1 500 ")
        await stream.aclose()


async def test_a_response_cut_short_closes_its_connection() -> None:
    async def cut(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})

    async with _served(cut) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GET)
        response = await _read_to_eof(stream)  # the client sees the stream end without its last chunk
        assert b"part" in response and not response.endswith(b"0\r\n\r\n")
        await stream.aclose()


async def test_a_malformed_request_gets_400_and_headers_too_large_431() -> None:
    async with _served(_ok) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"NOT HTTP\r\n\r\n")
        assert (await _read_to_eof(stream)).startswith(b"HTTP/1.1 400 ")
        await stream.aclose()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024))  # no end in sight
        assert (await _read_to_eof(stream)).startswith(b"HTTP/1.1 431 ")
        await stream.aclose()


class _Recorded:
    """A stream recording each write: what ``send_together`` promises is one write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.socket = self

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    async def send_all(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    async def receive_some(self, size: int) -> bytes:
        await trio.sleep_forever()
        raise AssertionError


async def test_send_together_makes_one_write_and_other_parts_one_each() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await (_echo if scope["method"] == "POST" else _ok)(scope, receive, send)

    stream = _Recorded()
    connection = _Connection(stream, app, ("127.0.0.1", 2), 600.0)  # type: ignore[arg-type]
    connection._h11.receive_data(GET)
    await connection._answer(await connection._next_event())
    assert len(stream.writes) == 2  # the head, then the body with the message's end
    stream.writes.clear()
    assert await connection._drain()  # the GET's end, read as the connection loop reads it
    connection._h11.start_next_cycle()
    connection._h11.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    with trio.fail_after(HANG):  # after its response, _echo hears "disconnected" at once (ASGI)
        await connection._answer(await connection._next_event())
    assert len(stream.writes) == 1 and stream.writes[0].endswith(b"\r\n\r\nhi")
