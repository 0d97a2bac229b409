"""The synthetic MCP server over streamable HTTP on 127.0.0.1, for agents that advertise ``mcpCapabilities.http``
(the default with ``[agents.<id>] mcp_transport = "auto"``): no relay process, the agent connects directly.

Owns one listener for every session of an lmbridge process (``HttpEndpoints``): each session gets its own path
(``/mcp/<route>``), its own bearer token (401 without it) and its own official-SDK streamable-HTTP session manager,
all served by the project's HTTP server (``bridge.rpc.asgi``: Hypercorn's Trio worker). The SDK's DNS-rebinding
protection stays on (the Host header must be this listener's address). A closed session's path answers 404.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from bridge.rpc.asgi import listening_socket, serve_asgi

from .server import SessionTools

__all__ = ["MAX_BODY", "HttpEndpoints", "load_http"]

MAX_BODY = 16 * 1024 * 1024
_PREFIX = "/mcp/"
_START_TIMEOUT = 30.0  # seconds a request may wait for its route's session manager to start


@dataclass(slots=True, frozen=True)
class _Route:
    tools: SessionTools
    manager: Any  # mcp.server.streamable_http_manager.StreamableHTTPSessionManager
    authorization: bytes  # b"Bearer <token>"


def load_http() -> None:
    """Import what serving over HTTP needs besides the SDK's core (slow: run it in a worker thread)."""
    import mcp.server.streamable_http_manager
    import mcp.server.transport_security  # noqa: F401

    from bridge.rpc.asgi import load_server

    load_server()


class HttpEndpoints:
    """The shared streamable-HTTP listener: ``run`` it in a nursery, then ``add`` a session's tools.

    The socket is bound, and URLs handed out, before the MCP SDK is imported (``ready`` waits for that import,
    which a worker thread does): an agent's first connection waits in the socket's backlog for the few hundred
    milliseconds the import may still take, while the agent starts its session, instead of lmbridge holding back
    ``session/new`` for it."""

    def __init__(self, log: Any, ready: Callable[[], Awaitable[None]]) -> None:
        self._log = log
        self._ready = ready
        self._routes: dict[str, _Route] = {}
        self._starting: dict[str, trio.Event] = {}  # routes handed out whose SDK session manager is not running yet
        self._port = 0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on a free port of 127.0.0.1 until cancelled; ``OSError`` when no socket can be opened."""
        sock = listening_socket("127.0.0.1", 0)
        self._port = sock.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await self._ready()
                except Exception as exc:  # the SDK cannot be imported: refuse connections rather than hold them
                    self._log.error("cannot serve MCP over HTTP", error=str(exc))
                    nursery.cancel_scope.cancel()
                    return
                await nursery.start(serve_asgi, self._app, [sock])
                self._log.debug("MCP endpoints listening", port=self._port)
                await trio.sleep_forever()
        finally:
            self._nursery = None
            sock.close()

    def add(self, tools: SessionTools, token: str) -> tuple[str, trio.CancelScope]:
        """Serve ``tools`` at a new path; returns its URL at once and the scope that stops serving it.
        ``RuntimeError`` when the listener is not running (not started, or it gave up)."""
        if self._nursery is None:
            raise RuntimeError("the MCP endpoints are not running")
        route = secrets.token_hex(8)
        scope = trio.CancelScope()
        self._starting[route] = trio.Event()
        self._nursery.start_soon(self._serve_route, route, tools, f"Bearer {token}".encode(), scope)
        return f"http://127.0.0.1:{self._port}{_PREFIX}{route}", scope

    async def _serve_route(
        self, route: str, tools: SessionTools, authorization: bytes, scope: trio.CancelScope
    ) -> None:
        with scope:
            try:
                try:
                    await self._ready()
                except Exception:  # the SDK cannot be imported: run() says so and stops listening
                    return
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
                from mcp.server.transport_security import TransportSecuritySettings

                manager = StreamableHTTPSessionManager(
                    app=tools.server,
                    max_request_body_size=MAX_BODY,
                    # The MCP session lives as long as lmbridge's session (its route): the SDK's 30-minute idle
                    # reaping would make an agent's next tool call after a long pause a 404.
                    session_idle_timeout=None,
                    security_settings=TransportSecuritySettings(
                        allowed_hosts=[f"127.0.0.1:{self._port}"], allowed_origins=[]
                    ),
                )
                async with manager.run():  # the SDK's task group for this session's MCP connections
                    self._routes[route] = _Route(tools, manager, authorization)
                    self._starting.pop(route).set()
                    await trio.sleep_forever()
            finally:
                self._routes.pop(route, None)
                started = self._starting.pop(route, None)
                if started is not None:
                    started.set()

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope.get("path", "")
        route = path[len(_PREFIX) :] if path.startswith(_PREFIX) else ""
        starting = self._starting.get(route)
        if starting is not None:  # handed out a moment ago: its session manager is starting
            with trio.move_on_after(_START_TIMEOUT):
                await starting.wait()
        entry = self._routes.get(route)
        if entry is None:
            await _plain(send, 404, b"no such MCP endpoint: the session it served has closed")
            return
        authorization = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(authorization, entry.authorization):
            self._log.warning("refused an HTTP MCP request: wrong or missing token")
            await _plain(send, 401, b"missing or wrong token", [(b"www-authenticate", b"Bearer")])
            return
        tools = entry.tools
        if tools.tracer is None:
            await entry.manager.handle_request(scope, receive, send)
        else:
            await entry.manager.handle_request(scope, _traced_receive(receive, tools), _traced_send(send, tools))


async def _plain(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


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
