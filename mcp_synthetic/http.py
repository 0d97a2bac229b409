"""The synthetic MCP server over streamable HTTP on 127.0.0.1, for agents that advertise ``mcpCapabilities.http``
(chosen with ``[agents.<id>] mcp_transport = "http"``): no shim process, the agent connects directly.

Owns running the official SDK's streamable-HTTP session manager (an ASGI application) for one session's tools on
the project's HTTP server (``bridge.rpc.asgi``: Hypercorn's Trio worker), and the checks in front of it: the
per-session bearer token (401 without it) and the SDK's DNS-rebinding protection (the Host header must be this
listener's address).
"""

from __future__ import annotations

import hmac
from typing import Any

import trio

from bridge.rpc.asgi import listening_socket, serve_asgi

from .server import SessionTools

__all__ = ["MAX_BODY", "serve_http"]

MAX_BODY = 16 * 1024 * 1024


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

    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
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

    try:
        with trio.CancelScope() as scope:
            async with manager.run(), trio.open_nursery() as nursery:
                await nursery.start(serve_asgi, app, [sock])
                task_status.started((f"http://127.0.0.1:{port}/mcp", scope))
                await trio.sleep_forever()
    finally:
        sock.close()


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
