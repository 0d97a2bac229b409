"""The synthetic MCP server over streamable HTTP on 127.0.0.1, for agents that advertise ``mcpCapabilities.http``
(the default with ``[agents.<id>] mcp_transport = "auto"``): no relay process, the agent connects directly.

Owns one listener for every session of an lmbridge process (``HttpEndpoints``): each session gets its own path
(``/mcp/<route>``), its own bearer token (401 without it) and its own official-SDK streamable-HTTP session manager,
all served by the project's HTTP server (``bridge.rpc.asgi``: Hypercorn's Trio worker). The SDK's DNS-rebinding
protection stays on (the Host header must be this listener's address). A closed session's path answers 404.

While the SDK is still importing, ``mcp_synthetic.early`` decides what can be answered without it (the opening of a
session, its tool list, its tool calls), and this module answers; once imported, the SDK takes such a session over
(the agent's ``initialize`` replayed to it) and requests of the agent's session id are served under the SDK's.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from bridge.rpc.asgi import listening_socket, read_body, serve_asgi

from .early import (
    SESSION_HEADER,
    EarlyCall,
    EarlyCancel,
    answer_early,
    progress_event,
    result_event,
    sse_headers,
)
from .server import SessionTools

__all__ = ["MAX_BODY", "HttpEndpoints", "load_http"]

MAX_BODY = 16 * 1024 * 1024
_PREFIX = "/mcp/"
_START_TIMEOUT = 30.0  # seconds a request may wait for its route's session manager to start


@dataclass(slots=True)
class _EarlySession:
    """An MCP session opened by ``mcp_synthetic.early`` while the SDK was importing, until the SDK takes it over."""

    scope: dict[str, Any]  # the agent's initialize request, replayed to the SDK
    body: bytes
    version: str
    initialized: bool = False  # the agent sent notifications/initialized (replayed too)
    calls: dict[str | int, trio.CancelScope] = field(default_factory=dict)  # tool calls run early, by request id
    sdk_id: bytes | None = None  # the SDK's id for it, once taken over (None after a failed take-over)
    adopted: trio.Event = field(default_factory=trio.Event)


@dataclass(slots=True)
class _Route:
    tools: SessionTools
    authorization: bytes  # b"Bearer <token>"
    manager: Any = None  # mcp.server.streamable_http_manager.StreamableHTTPSessionManager, once the SDK runs it
    served: trio.Event = field(default_factory=trio.Event)  # the manager runs (or the route closed)
    early: dict[str, _EarlySession] = field(default_factory=dict)  # by the session id the agent was given


def load_http() -> None:
    """Import what serving over HTTP needs besides the SDK's core (slow: run it in a worker thread)."""
    import mcp.server.streamable_http_manager
    import mcp.server.transport_security  # noqa: F401

    from bridge.rpc.asgi import load_server

    load_server()


class HttpEndpoints:
    """The shared streamable-HTTP listener: ``run`` it in a nursery, then ``add`` a session's tools.

    The socket is bound, and URLs handed out, before anything is imported. It serves as soon as the HTTP server is
    imported (``serving``, ~40 ms); until the SDK is imported too (``ready``, ~0.5 s, in a worker thread), the
    opening of an MCP session is answered by ``mcp_synthetic.early`` and every other request waits for the SDK."""

    def __init__(
        self, log: Any, ready: Callable[[], Awaitable[None]], serving: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._log = log
        self._ready = ready
        self._serving = serving or ready
        self._routes: dict[str, _Route] = {}
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
                    await self._serving()
                    await nursery.start(serve_asgi, self._app, [sock])
                    self._log.debug("MCP endpoints listening", port=self._port)
                    await self._ready()
                except Exception as exc:  # the SDK cannot be imported: refuse connections rather than hold them
                    self._log.error("cannot serve MCP over HTTP", error=str(exc))
                    nursery.cancel_scope.cancel()
                    return
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
        entry = self._routes[route] = _Route(tools, f"Bearer {token}".encode())
        self._nursery.start_soon(self._serve_route, route, entry, scope)
        return f"http://127.0.0.1:{self._port}{_PREFIX}{route}", scope

    async def _serve_route(self, route: str, entry: _Route, scope: trio.CancelScope) -> None:
        with scope:
            try:
                try:
                    await self._ready()
                except Exception:  # the SDK cannot be imported: run() says so and stops listening
                    return
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
                from mcp.server.transport_security import TransportSecuritySettings

                manager = StreamableHTTPSessionManager(
                    app=entry.tools.server,
                    max_request_body_size=MAX_BODY,
                    # The MCP session lives as long as lmbridge's session (its route): the SDK's 30-minute idle
                    # reaping would make an agent's next tool call after a long pause a 404.
                    session_idle_timeout=None,
                    security_settings=TransportSecuritySettings(allowed_hosts=[self._host], allowed_origins=[]),
                )
                async with manager.run():  # the SDK's task group for this session's MCP connections
                    entry.manager = manager  # from here on no session opens early: the ones that did are handed over
                    for early in list(entry.early.values()):
                        await self._hand_over(manager, early)
                    entry.served.set()
                    await trio.sleep_forever()
            finally:
                self._routes.pop(route, None)
                entry.manager = None
                entry.served.set()
                for early in entry.early.values():
                    early.adopted.set()
                    for call in early.calls.values():
                        call.cancel()

    @property
    def _host(self) -> str:
        return f"127.0.0.1:{self._port}"

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope.get("path", "")
        route = path[len(_PREFIX) :] if path.startswith(_PREFIX) else ""
        entry = self._routes.get(route)
        if entry is None:
            await _plain(send, 404, b"no such MCP endpoint: the session it served has closed")
            return
        headers = dict(scope["headers"])
        if not hmac.compare_digest(headers.get(b"authorization", b""), entry.authorization):
            self._log.warning("refused an HTTP MCP request: wrong or missing token")
            await _plain(send, 401, b"missing or wrong token", [(b"www-authenticate", b"Bearer")])
            return
        tools = entry.tools
        if tools.tracer is not None:
            receive, send = _traced_receive(receive, tools), _traced_send(send, tools)
        if entry.manager is None:  # the SDK is still importing
            receive = await self._open_early(entry, scope, headers, receive, send)
            if receive is None:
                return
            with trio.move_on_after(_START_TIMEOUT):
                await entry.served.wait()
            if entry.manager is None:
                await _plain(send, 404, b"no such MCP endpoint: the session it served has closed")
                return
        early = entry.early.get(headers.get(SESSION_HEADER, b"").decode("latin-1"))
        if early is not None:  # a session opened early: the SDK knows it under its own id
            await early.adopted.wait()
            if early.sdk_id is None or entry.manager is None:  # MCP's "no such session": the agent opens another
                await _plain(send, 404, b"the MCP session has ended; open a new one")
                return
            scope, send = _with_session_id(scope, send, early.sdk_id, headers[SESSION_HEADER])
        await entry.manager.handle_request(scope, receive, send)

    async def _open_early(
        self, entry: _Route, scope: dict[str, Any], headers: dict[bytes, bytes], receive: Any, send: Any
    ) -> Any:
        """Answer a request of an MCP session's opening while the SDK imports (``None``: answered); else the
        ``receive`` that gives the SDK the request again, body included."""
        if scope.get("method") != "POST":
            return receive
        body, more = await read_body(receive, _EARLY_BODY)
        if more is not None or entry.manager is not None:
            return _replay(body, more, receive)
        sessions = {session_id: early.version for session_id, early in entry.early.items()}
        answer = answer_early("POST", headers, body, host=self._host, sessions=sessions, listing=entry.tools.listing)
        if answer is None:
            return _replay(body, None, receive)
        if isinstance(answer, EarlyCall):
            await self._call_early(entry.tools, entry.early[answer.session_id], answer, receive, send)
            return None
        if isinstance(answer, EarlyCancel):
            running = entry.early[answer.session_id].calls.get(answer.request_id)
            if running is not None:
                running.cancel()
            await _accepted(send, answer.session_id)
            return None
        if answer.opens_session:
            entry.early[answer.session_id] = _EarlySession(dict(scope), body, answer.protocol_version)
        if answer.status == 202:  # notifications/initialized
            entry.early[answer.session_id].initialized = True
            await _accepted(send, answer.session_id)
            return None
        await send({"type": "http.response.start", "status": 200, "headers": sse_headers(answer.session_id)})
        await send({"type": "http.response.body", "body": answer.body})
        return None

    async def _call_early(
        self, tools: SessionTools, early: _EarlySession, call: EarlyCall, receive: Any, send: Any
    ) -> None:
        """Run a tool call made before the SDK is imported, streaming its heartbeats and answer as the SDK would.
        The agent withdraws it with ``notifications/cancelled`` (while the SDK is importing: after that the SDK,
        which does not know the call, ignores it, and the call ends with the turn) or by hanging up."""
        await send({"type": "http.response.start", "status": 200, "headers": sse_headers(call.session_id)})
        progress = None
        if call.progress_token is not None:
            token = call.progress_token

            async def progress(beat: int) -> None:
                await send({"type": "http.response.body", "body": progress_event(token, beat), "more_body": True})

        result: dict[str, Any] | None = None
        with trio.CancelScope() as withdrawn:
            early.calls[call.request_id] = withdrawn
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_on_disconnect, receive, withdrawn)
                    result = await tools.call(call.name, call.arguments, progress)
                    nursery.cancel_scope.cancel()
            finally:
                early.calls.pop(call.request_id, None)
        # A withdrawn call gets no answer (MCP): its stream just ends.
        body = result_event(call.request_id, result) if result is not None else b""
        await send({"type": "http.response.body", "body": body})

    async def _hand_over(self, manager: Any, early: _EarlySession) -> None:
        """Replay an early session's ``initialize`` (and ``notifications/initialized``) to the SDK, which opens the
        session under its own id; requests of the agent's id are then served under it."""
        try:
            with trio.fail_after(_START_TIMEOUT):  # the agent's requests of this session wait for it
                await _replay_opening(manager, early)
            self._log.debug("an MCP session opened before the SDK was imported is served by it now")
        except Exception as exc:  # the agent's next request of it gets 404, and MCP clients then open a new session
            self._log.warning("the MCP SDK did not take over a session opened early", error=str(exc))
        finally:
            early.adopted.set()


async def _replay_opening(manager: Any, early: _EarlySession) -> None:
    """The agent's ``initialize`` (and ``notifications/initialized``) once more, to the SDK's manager; the
    session id it gives goes to ``early.sdk_id``."""
    status, response = await _call(manager, early.scope, early.body)
    sdk_id = dict(response).get(SESSION_HEADER)
    if status != 200 or sdk_id is None:
        raise RuntimeError(f"the SDK answered the replayed initialize with HTTP {status}")
    if early.initialized:
        notified = {k: v for k, v in early.scope["headers"] if k != b"content-length"}
        notified |= {SESSION_HEADER: sdk_id, b"mcp-protocol-version": early.version.encode()}
        scope = dict(early.scope, headers=list(notified.items()))
        await _call(manager, scope, b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    early.sdk_id = sdk_id


_EARLY_BODY = 1024 * 1024  # bytes: a session's opening is far smaller; a larger request is left to the SDK


async def _accepted(send: Any, session_id: str) -> None:
    """202, as the SDK answers a notification."""
    headers = [(b"content-type", b"application/json"), (SESSION_HEADER, session_id.encode())]
    await send({"type": "http.response.start", "status": 202, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _on_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _replay(body: bytes, last: dict[str, Any] | None, receive: Any) -> Any:
    """A ``receive`` giving the body read so far again, then what the original gives."""
    pending: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": last is not None}]
    if last is not None and last["type"] != "http.request":
        pending.append(last)

    async def replayed() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()

    return replayed


async def _call(app: Any, scope: dict[str, Any], body: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    """One request to the SDK's manager from inside lmbridge: its status and headers (the body is not needed)."""
    answered = trio.Event()
    start: dict[str, Any] = {}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # the SDK listens for a disconnect while it streams: there is none until the end
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.set()

    await app.handle_request(dict(scope), receive, send)
    answered.set()
    return int(start.get("status", 0)), list(start.get("headers", []))


def _with_session_id(scope: dict[str, Any], send: Any, sdk_id: bytes, agent_id: bytes) -> tuple[dict[str, Any], Any]:
    """The request under the SDK's session id, and a ``send`` that gives the agent its own id back."""
    headers = [(k, sdk_id if k == SESSION_HEADER else v) for k, v in scope["headers"]]

    async def renamed(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = dict(
                message, headers=[(k, agent_id if k == SESSION_HEADER else v) for k, v in message.get("headers", [])]
            )
        await send(message)

    return dict(scope, headers=headers), renamed


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
