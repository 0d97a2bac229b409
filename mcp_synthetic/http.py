"""The synthetic MCP server over streamable HTTP on 127.0.0.1, for agents that advertise ``mcpCapabilities.http``
(chosen with ``[agents.<id>] mcp_transport = "http"``): no shim process, the agent connects directly.

Owns a small HTTP/1.1 server on Trio (``h11``) that runs the official SDK's streamable-HTTP session manager (an
ASGI application) for one session's tools, and the checks in front of it: the per-session bearer token (401
without it) and the SDK's DNS-rebinding protection (the Host header must be this listener's address).
"""

from __future__ import annotations

import hmac
from functools import partial
from typing import Any

import h11
import trio

from .server import SessionTools, receive_some

__all__ = ["MAX_BODY", "serve_http"]

MAX_BODY = 16 * 1024 * 1024
_HEADER_TIMEOUT = 10.0


async def serve_http(
    tools: SessionTools,
    token: str,
    log: Any,
    *,
    task_status: trio.TaskStatus[tuple[str, trio.CancelScope]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on 127.0.0.1 (a free port); ``task_status`` gets the endpoint URL and the scope that stops it."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    manager = StreamableHTTPSessionManager(
        app=tools.server,
        max_request_body_size=MAX_BODY,
        security_settings=TransportSecuritySettings(allowed_hosts=[f"127.0.0.1:{port}"], allowed_origins=[]),
    )
    expected = f"Bearer {token}".encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        authorization = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(authorization, expected):
            log.warning("refused an HTTP MCP request: wrong or missing token")
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": b"missing or wrong token"})
            return
        if tools.tracer is None:
            await manager.handle_request(scope, receive, send)
            return
        await manager.handle_request(scope, _traced_receive(receive, tools), _traced_send(send, tools))

    with trio.CancelScope() as scope:
        async with manager.run():
            task_status.started((f"http://127.0.0.1:{port}/mcp", scope))
            await trio.serve_listeners(partial(_connection, app=app, port=port, log=log), listeners)


def _traced_receive(receive: Any, tools: SessionTools) -> Any:
    async def traced() -> dict[str, Any]:
        message: dict[str, Any] = await receive()
        if message.get("type") == "http.request" and message.get("body"):
            tools.trace("in", message["body"])
        return message

    return traced


def _traced_send(send: Any, tools: SessionTools) -> Any:
    """Record the JSON-RPC messages of a response: a JSON body, or the ``data:`` lines of an event stream."""

    async def traced(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.body" and message.get("body"):
            body = message["body"]
            for line in body.split(b"\n") if body.startswith((b"data:", b"event:", b"id:", b":")) else [body]:
                line = line.strip()
                if line.startswith(b"data:"):
                    line = line[5:].strip()
                if line.startswith((b"{", b"[")):
                    tools.trace("out", line)
        await send(message)

    return traced


async def _connection(stream: trio.SocketStream, *, app: Any, port: int, log: Any) -> None:
    """One HTTP/1.1 connection: requests one after another (keep-alive), each handed to the ASGI ``app``."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    async with stream:
        while True:
            request = await _next_event(connection, stream, _HEADER_TIMEOUT)
            if not isinstance(request, h11.Request):
                return
            body = bytearray()
            while True:
                event = await _next_event(connection, stream, _HEADER_TIMEOUT)
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY:
                        await _send(
                            stream, connection, h11.Response(status_code=413, headers=[("content-length", "0")])
                        )
                        await _send(stream, connection, h11.EndOfMessage())
                        return
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
            if not await _exchange(stream, connection, request, bytes(body), app, port, log):
                return
            if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
                return
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:
                return


async def _exchange(
    stream: trio.SocketStream,
    connection: h11.Connection,
    request: h11.Request,
    body: bytes,
    app: Any,
    port: int,
    log: Any,
) -> bool:
    path, _, query = request.target.partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method.decode(),
        "scheme": "http",
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.headers],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", port),
    }
    delivered = False
    disconnected = trio.Event()
    finished = {"ok": True}

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        try:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", [])]
                await _send(stream, connection, h11.Response(status_code=message["status"], headers=headers))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    await _send(stream, connection, h11.Data(data=message["body"]))
                if not message.get("more_body", False):
                    await _send(stream, connection, h11.EndOfMessage())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            finished["ok"] = False
            disconnected.set()
            raise

    async def watch_disconnect() -> None:
        # A streaming (SSE) answer ends when the client goes away. Bytes that do arrive meanwhile belong to the
        # client's next request: h11 keeps them for the next cycle.
        while data := await receive_some(stream, 4096):
            connection.receive_data(bytes(data))
        disconnected.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_disconnect)
        try:
            await app(scope, receive, send)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("HTTP MCP request failed inside lmbridge")
            finished["ok"] = False
        nursery.cancel_scope.cancel()
    return finished["ok"] and not disconnected.is_set()


async def _next_event(connection: h11.Connection, stream: trio.SocketStream, timeout: float) -> Any:
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is not h11.NEED_DATA:
            return event
        with trio.move_on_after(timeout) as scope:
            data = await receive_some(stream)
        if scope.cancelled_caught:
            return None
        connection.receive_data(bytes(data))
        if not data:
            return None


async def _send(stream: trio.SocketStream, connection: h11.Connection, event: Any) -> None:
    data = connection.send(event)
    if data:
        await stream.send_all(data)
