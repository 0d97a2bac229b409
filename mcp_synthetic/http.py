"""The synthetic MCP server over streamable HTTP on 127.0.0.1, for agents that advertise ``mcpCapabilities.http``
(the default with ``[agents.<id>] mcp_transport = "auto"``): no relay process, the agent connects directly.

Owns one listener for every session of an lmbridge process (``HttpEndpoints``): each session gets its own path
(``/mcp/<route>``), its own bearer token (401 without it) and its own official-SDK streamable-HTTP session manager,
all served by the loopback listener's HTTP/1.1 server (``wire.h11_server``). The SDK's DNS-rebinding
protection stays on (the Host header must be this listener's address). A closed session's path answers 404.

The SDK is imported, and a route's session manager started, only when a request needs it: ``mcp_synthetic.early``
decides what can be answered without it (for the revisions that open a session with ``initialize``: the opening,
the tool list, the tool calls, the event stream, the end), and this module answers. A request that needs the SDK
(a batch, another method, a resumed stream: anything unusual) starts it; the SDK then takes the route's sessions
over (each agent's ``initialize`` replayed to it) and requests of an agent's session id are served under the SDK's.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from wire.h11_server import serve_h11
from wire.http_server import listening_socket, read_body, send_together
from wire.observe.logger import Logger

from .early import (
    SESSION_HEADER,
    EarlyCall,
    EarlyCancel,
    EarlyEnd,
    EarlyRefusal,
    EarlyStream,
    answer_early,
    list_changed_event,
    progress_event,
    result_event,
    sse_headers,
    stream_conflict,
)
from .server import SessionTools

__all__ = ["MAX_BODY", "HttpEndpoints", "load_http"]

MAX_BODY = 16 * 1024 * 1024
_PREFIX = "/mcp/"
_PING_INTERVAL = 15.0  # seconds between keep-alive comments on an idle event stream, as the SDK sends them
_HEAD_DELAY = 1.0  # seconds a tool call's response head may wait for the answer, to go out with it
_START_TIMEOUT = 30.0  # seconds a request may wait for its route's session manager to start (the SDK's import too)


@dataclass(slots=True)
class _EarlySession:
    """An MCP session opened by ``mcp_synthetic.early``, until it ends or the SDK takes it over."""

    scope: dict[str, Any]  # the agent's initialize request, replayed to the SDK
    body: bytes
    version: str
    initialized: bool = False  # the agent sent notifications/initialized (replayed too)
    calls: dict[str | int, trio.CancelScope] = field(default_factory=dict)  # tool calls run here, by request id
    stream: trio.CancelScope | None = None  # its event stream (GET), while open
    sdk_id: bytes | None = None  # the SDK's id for it, once taken over (None after a failed take-over)
    adopted: trio.Event = field(default_factory=trio.Event)

    def close(self) -> None:
        """The session ended (or its route closed): withdraw its tool calls, end its event stream."""
        for call in self.calls.values():
            call.cancel()
        if self.stream is not None:
            self.stream.cancel()


@dataclass(slots=True)
class _Route:
    tools: SessionTools
    authorization: bytes  # b"Bearer <token>"
    manager: Any = None  # mcp.server.streamable_http_manager.StreamableHTTPSessionManager, once the SDK runs it
    needs_sdk: trio.Event = field(default_factory=trio.Event)  # a request needs the SDK: start the manager
    served: trio.Event = field(default_factory=trio.Event)  # the manager runs (or cannot: the route closed, no SDK)
    sdk_failed: bool = False  # the SDK could not be imported: what needs it gets 500, the rest is answered still
    early: dict[str, _EarlySession] = field(default_factory=dict)  # by the session id the agent was given


def load_http() -> None:
    """Import what the SDK's streamable-HTTP transport needs besides the SDK's core (slow: run it in a worker
    thread)."""
    import mcp.server.streamable_http_manager
    import mcp.server.transport_security  # noqa: F401


class HttpEndpoints:
    """The shared streamable-HTTP listener: ``run`` it in a nursery, then ``add`` a session's tools.

    The socket is bound, and URLs handed out, before anything is imported. It serves once ``serving`` is done (the
    schema checker's import). ``ready`` imports the SDK (~0.5 s of CPU, in a worker thread): it is awaited only
    when a request needs the SDK (``own_answers=False``: for every route, at once — the tests compare both)."""

    def __init__(
        self,
        log: Logger,
        ready: Callable[[], Awaitable[None]],
        serving: Callable[[], Awaitable[None]] | None = None,
        *,
        own_answers: bool = True,
    ) -> None:
        self._log = log
        self._ready = ready
        self._serving = serving or ready
        self._own_answers = own_answers
        self._routes: dict[str, _Route] = {}
        self._mounts: dict[str, Callable[..., Awaitable[None]]] = {}  # path prefix → an ASGI application of its own
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
                    await nursery.start(partial(serve_h11, self._app, sock, log=self._log))
                    self._log.debug("MCP endpoints listening", port=self._port)
                except Exception as exc:  # what serving needs cannot be imported: refuse connections, not hold them
                    self._log.error("cannot serve MCP over HTTP", error=str(exc))
                    nursery.cancel_scope.cancel()
                    return
                await trio.sleep_forever()
        finally:
            self._nursery = None
            sock.close()

    def mount(self, prefix: str, app: Callable[..., Awaitable[None]]) -> str:
        """Serve another ASGI application on this listener under ``prefix`` (``/name/``), which checks its own
        requests' tokens; returns its base URL. ``RuntimeError`` when the listener is not running."""
        if self._nursery is None:
            raise RuntimeError("the loopback listener is not running")
        if not (prefix.startswith("/") and prefix.endswith("/")) or prefix == _PREFIX:
            raise ValueError(f"a mount's prefix is /name/, not {_PREFIX}: {prefix!r}")
        self._mounts[prefix] = app
        return f"http://127.0.0.1:{self._port}{prefix.rstrip('/')}"

    def add(self, tools: SessionTools, token: str) -> tuple[str, trio.CancelScope]:
        """Serve ``tools`` at a new path; returns its URL at once and the scope that stops serving it.
        ``RuntimeError`` when the listener is not running (not started, or it gave up)."""
        if self._nursery is None:
            raise RuntimeError("the MCP endpoints are not running")
        route = secrets.token_hex(8)
        scope = trio.CancelScope()
        entry = self._routes[route] = _Route(tools, f"Bearer {token}".encode())
        if not self._own_answers:
            entry.needs_sdk.set()
        self._nursery.start_soon(self._serve_route, route, entry, scope)
        return f"http://127.0.0.1:{self._port}{_PREFIX}{route}", scope

    async def _serve_route(self, route: str, entry: _Route, scope: trio.CancelScope) -> None:
        with scope:
            try:
                await entry.needs_sdk.wait()
                try:
                    await self._ready()
                except Exception:  # the SDK cannot be imported (the import logged why): answer what needs no SDK
                    entry.sdk_failed = True
                    entry.served.set()
                    await trio.sleep_forever()  # until the route closes
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
                    entry.manager = manager  # from here on the SDK opens sessions: those opened here are handed over
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
                    early.close()

    @property
    def _host(self) -> str:
        return f"127.0.0.1:{self._port}"

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope.get("path", "")
        if not path.startswith(_PREFIX):
            mounted = next((app for prefix, app in self._mounts.items() if path.startswith(prefix)), None)
            if mounted is not None:
                await mounted(scope, receive, send)
                return
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
        if entry.manager is None:  # the SDK does not serve this route (yet)
            receive = await self._answer_here(entry, scope, headers, receive, send)
            if receive is None:
                return
            if not entry.needs_sdk.is_set():
                self._log.debug("an MCP request needs the SDK", method=scope.get("method"))
                entry.needs_sdk.set()
            with trio.move_on_after(_START_TIMEOUT):
                await entry.served.wait()
            if entry.manager is None:
                if entry.sdk_failed:
                    await _plain(send, 500, b"the MCP SDK could not be imported: see lmbridge's log")
                else:
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

    async def _answer_here(
        self, entry: _Route, scope: dict[str, Any], headers: dict[bytes, bytes], receive: Any, send: Any
    ) -> Any:
        """Answer a request ``mcp_synthetic.early`` can answer (``None``: answered); else the ``receive`` that gives
        the SDK the request again, body included."""
        method = scope.get("method")
        if method not in ("POST", "GET", "DELETE"):
            return receive
        body, more = await read_body(receive, _EARLY_BODY)
        if more is not None or entry.manager is not None:
            return _replay(body, more, receive)
        sessions = {session_id: early.version for session_id, early in entry.early.items()}
        answer = answer_early(method, headers, body, host=self._host, sessions=sessions, listing=entry.tools.listing)
        if answer is None:
            return _replay(body, None, receive)
        if isinstance(answer, EarlyRefusal):
            await _refuse(send, answer)
            return None
        if isinstance(answer, EarlyEnd):
            ended = entry.early.pop(answer.session_id)
            ended.close()
            ended.adopted.set()  # a request of it still waiting for a take-over gets 404 (no SDK id)
            await _answer_empty(send, 200, answer.session_id)
            return None
        if isinstance(answer, EarlyStream):
            await self._stream(entry.tools, entry.early[answer.session_id], answer.session_id, receive, send)
            return None
        if isinstance(answer, EarlyCall):
            await self._call_early(entry.tools, entry.early[answer.session_id], answer, receive, send)
            return None
        if isinstance(answer, EarlyCancel):
            running = entry.early[answer.session_id].calls.get(answer.request_id)
            if running is not None:
                running.cancel()
            await _answer_empty(send, 202, answer.session_id)
            return None
        if answer.opens_session:
            entry.early[answer.session_id] = _EarlySession(dict(scope), body, answer.protocol_version)
        if answer.status == 202:  # notifications/initialized
            entry.early[answer.session_id].initialized = True
            await _answer_empty(send, 202, answer.session_id)
            return None
        start = {"type": "http.response.start", "status": 200, "headers": sse_headers(answer.session_id)}
        await send_together(send, start, {"type": "http.response.body", "body": answer.body})
        return None

    async def _call_early(
        self, tools: SessionTools, early: _EarlySession, call: EarlyCall, receive: Any, send: Any
    ) -> None:
        """Run a tool call, streaming its heartbeats and answer as the SDK would. The agent withdraws it with
        ``notifications/cancelled`` (once the SDK has taken the session over, the SDK, which does not know the
        call, ignores that: the call ends with the turn), by ending the session or by hanging up.

        The response's head waits for the first thing to follow it, up to ``_HEAD_DELAY``: an editor's tool mostly
        answers within milliseconds, and the head, the answer and the stream's end then go out in one write (three
        wake-ups of the agent otherwise, on the turn's path). A slower call gets its head at ``_HEAD_DELAY`` (HTTP
        clients time out on a head that never comes: Node's after 300 s)."""
        head: dict[str, Any] | None = {
            "type": "http.response.start",
            "status": 200,
            "headers": sse_headers(call.session_id),
        }
        sending = trio.Lock()  # the head, heartbeats and the answer, each whole and in that order

        async def send_with_head(message: dict[str, Any] | None) -> None:
            nonlocal head
            async with sending:
                started, head = head, None
                with trio.CancelScope(shield=True):  # once begun, a response's part is written whole
                    await send_together(send, *(m for m in (started, message) if m is not None))

        async def watch() -> None:
            """The head at ``_HEAD_DELAY``; the call withdrawn when the agent hangs up (one task for both)."""
            with trio.move_on_after(_HEAD_DELAY):
                await _on_disconnect(receive, withdrawn)
                return
            if head is not None:
                await send_with_head(None)
            await _on_disconnect(receive, withdrawn)

        progress = None
        if call.progress_token is not None:
            token = call.progress_token

            async def progress(value: float, message: str) -> None:
                body = progress_event(token, value, message)
                await send_with_head({"type": "http.response.body", "body": body, "more_body": True})

        result: dict[str, Any] | None = None
        with trio.CancelScope() as withdrawn:
            early.calls[call.request_id] = withdrawn
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch)
                    result = await tools.call(call.name, call.arguments, progress)
                    nursery.cancel_scope.cancel()
            finally:
                early.calls.pop(call.request_id, None)
        # A withdrawn call gets no answer (MCP): its stream just ends.
        body = result_event(call.request_id, result) if result is not None else b""
        await send_with_head({"type": "http.response.body", "body": body})

    async def _stream(
        self, tools: SessionTools, early: _EarlySession, session_id: str, receive: Any, send: Any
    ) -> None:
        """The session's event stream: ``notifications/tools/list_changed`` when the editor's tools change, a
        keep-alive comment every 15 s otherwise, until the agent hangs up, the session ends or the SDK takes it
        over (MCP clients then open the stream again, from the SDK)."""
        if early.stream is not None:  # MCP: one stream per session
            await _refuse(send, stream_conflict(session_id))
            return
        changed = trio.Event()

        def on_change() -> None:
            changed.set()

        headers = [*sse_headers(session_id), (b"connection", b"keep-alive")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        unwatch = tools.watch_changes(on_change)
        try:
            with trio.CancelScope() as early.stream:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_on_disconnect, receive, nursery.cancel_scope)
                    while True:
                        with trio.move_on_after(_PING_INTERVAL):
                            await changed.wait()
                        event = list_changed_event() if changed.is_set() else b": ping\r\n\r\n"
                        changed = trio.Event()
                        await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            unwatch()
            early.stream = None
        await send({"type": "http.response.body", "body": b""})

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
            if early.stream is not None:  # the agent opens it again, from the SDK
                early.stream.cancel()


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


_EARLY_BODY = 1024 * 1024  # bytes: the requests answered here are far smaller; a larger one is left to the SDK
_JSON = [(b"content-type", b"application/json")]


async def _refuse(send: Any, refusal: EarlyRefusal) -> None:
    headers = [*_JSON, (SESSION_HEADER, refusal.session_id.encode())] if refusal.session_id else _JSON
    start = {"type": "http.response.start", "status": refusal.status, "headers": headers}
    await send_together(send, start, {"type": "http.response.body", "body": refusal.body})


async def _answer_empty(send: Any, status: int, session_id: str) -> None:
    """No body, as the SDK answers a notification (202) and a session's end (200)."""
    headers = [*_JSON, (SESSION_HEADER, session_id.encode())]
    start = {"type": "http.response.start", "status": status, "headers": headers}
    await send_together(send, start, {"type": "http.response.body", "body": b""})


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
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"text/plain"), *(headers or [])],
    }
    await send_together(send, start, {"type": "http.response.body", "body": body})


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
