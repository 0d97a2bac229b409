"""The synthetic MCP server on a stdio relay's connection (``shim.py`` → the session's unix socket), answered without
the MCP SDK for the revisions that open a session with ``initialize``, as ``mcp_synthetic.early`` answers HTTP.

The relay is started by the agent for each of its sessions; were the SDK imported for the relay's first connection
(about half a second of CPU), every agent given the relay would wait that long for its tools at its first session.
What an agent asks of lmbridge's server depends on nothing but the session's tools, so the messages answered here —
``initialize``, ``notifications/initialized``, ``tools/list``, ``ping``, ``tools/call`` (heartbeats included),
``notifications/cancelled``, any other notification (the SDK ignores them too), and ``server/discover`` refused as
the SDK's path refuses it — get the SDK's answers, message by message (the tests compare both). Anything else (a
request of another method, a line that is not one JSON-RPC message, a second ``initialize``) hands the connection
to the SDK: its ``initialize`` (and ``notifications/initialized``) are replayed to the SDK's server, whose answer to
the replayed opening is dropped, and every message from then on is the SDK's, but the answers of the tool calls
already running here.

``decide`` owns the decisions (sans-IO); ``serve_stdio`` is the Trio shell for one connection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from wire.observe.logger import Logger
from wire.rpc.protocol import LineFramer

from .early import (
    EARLY_PROTOCOL_VERSIONS,
    LIST_CHANGED_MESSAGE,
    EarlyCall,
    cancelled_request,
    compact_json,
    discovery_refusal,
    initialize_result,
    progress_message,
    request_id_of,
    result_message,
    tool_call,
)
from .server import MAX_LINE_BYTES, SessionTools, receive_some

__all__ = ["Ignore", "Initialized", "Reply", "Withdraw", "decide", "serve_stdio"]

_WRITE_QUEUE = 64  # lines waiting for the connection (the writer is the only task that sends)


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``message`` (a JSON-RPC response); ``opens``: the revision an ``initialize`` answered at."""

    message: dict[str, Any]
    opens: str | None = None


@dataclass(frozen=True, slots=True)
class Initialized:
    """``notifications/initialized``: the agent is told of tool list changes from now on."""


@dataclass(frozen=True, slots=True)
class Withdraw:
    """``notifications/cancelled`` of ``request_id``: withdraw that call if it runs (no answer is sent)."""

    request_id: str | int


@dataclass(frozen=True, slots=True)
class Ignore:
    """A notification nothing here (nor the SDK) acts on."""


def decide(
    line: bytes, *, opened: str | None, listing: Callable[[], list[dict[str, Any]]]
) -> Reply | Initialized | Withdraw | Ignore | EarlyCall | None:
    """What to do with one line of the connection, or ``None`` to hand the connection to the SDK.

    ``opened``: the revision this connection's ``initialize`` was answered at, ``None`` before it; ``listing``: the
    session's tools as ``tools/list`` gives them."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    valid, request_id = request_id_of(message)
    if not valid:
        return None
    method = message["method"]
    params = message.get("params")
    if opened is None:
        if request_id is None:
            return None
        if method == "server/discover":
            return Reply(discovery_refusal(request_id))
        version = params.get("protocolVersion") if method == "initialize" and isinstance(params, dict) else None
        if version not in EARLY_PROTOCOL_VERSIONS:
            return None
        return Reply(result_message(request_id, initialize_result(version)), opens=version)
    if request_id is None:
        if method == "notifications/initialized":
            return Initialized()
        if method == "notifications/cancelled":
            cancelled = cancelled_request(params)
            return Withdraw(cancelled) if cancelled is not None else None
        return Ignore() if method.startswith("notifications/") else None
    if method == "tools/list":
        return Reply(result_message(request_id, {"tools": listing()}))
    if method == "ping":
        return Reply(result_message(request_id, {}))
    if method == "tools/call":
        return tool_call("", request_id, params)
    return None


def _line(message: dict[str, Any]) -> bytes:
    return compact_json(message) + b"\n"


_LIST_CHANGED = _line(LIST_CHANGED_MESSAGE)


async def serve_stdio(
    tools: SessionTools, stream: trio.abc.Stream, *, sdk_ready: Callable[[], Awaitable[None]], log: Logger
) -> None:
    """Serve ``tools`` on one relay connection until either side closes it (the calls still running are then
    withdrawn), and close it. ``sdk_ready()`` imports the SDK, for a connection that needs it (``RuntimeError`` when
    it cannot)."""
    async with stream:
        await _Connection(tools, stream, log).run(sdk_ready)


class _Connection:
    def __init__(self, tools: SessionTools, stream: trio.abc.Stream, log: Logger) -> None:
        self._tools = tools
        self._stream = stream
        self._log = log
        self._framer = LineFramer(MAX_LINE_BYTES)  # joins a long line once, however many reads it took
        self._pending: list[bytes] = []  # lines read but not yet taken
        self._opening: list[bytes] = []  # initialize and notifications/initialized, replayed to the SDK
        self._opened: str | None = None
        self._calls: dict[str | int, trio.CancelScope] = {}  # tool calls running here, by request id
        self._send, self._outbox = trio.open_memory_channel[bytes](_WRITE_QUEUE)
        self._unwatch: Callable[[], None] | None = None

    async def run(self, sdk_ready: Callable[[], Awaitable[None]]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, nursery.cancel_scope)
                line = await self._serve_here(nursery)
                if line is not None:
                    await self._hand_over(line, sdk_ready)
                nursery.cancel_scope.cancel()  # the agent hung up: withdraw the calls still running
        finally:
            if self._unwatch is not None:
                self._unwatch()

    async def _next_line(self) -> bytes | None:
        """The next line from the agent (traced), or ``None`` when the connection ends: the agent closed it, or sent
        a line over ``MAX_LINE_BYTES`` (closed then)."""
        while not self._pending:
            data = await receive_some(self._stream)
            if not data:
                return None
            lines = self._framer.feed(data)
            if self._framer.buffered > MAX_LINE_BYTES or any(isinstance(x, LineFramer.LineTooLong) for x in lines):
                self._log.warning("MCP message over the size limit; closing the connection")
                return None
            self._pending.extend(line for line in lines if isinstance(line, bytes))
        line = self._pending.pop(0)
        self._tools.trace("in", line)
        return line

    async def _serve_here(self, nursery: trio.Nursery) -> bytes | None:
        """Answer what ``decide`` answers; the first line it does not (``None``: the agent hung up)."""
        while (line := await self._next_line()) is not None:
            action = decide(line, opened=self._opened, listing=self._tools.listing)
            if action is None:
                return line
            if isinstance(action, Reply):
                if action.opens is not None:
                    self._opened = action.opens
                    self._opening.append(line)
                await self._send.send(_line(action.message))
            elif isinstance(action, Initialized):
                self._opening.append(line)
                if self._unwatch is None:
                    self._unwatch = self._tools.watch_changes(self._list_changed)
            elif isinstance(action, Withdraw):
                self._withdraw(action.request_id)
            elif isinstance(action, EarlyCall):
                nursery.start_soon(self._call, action)
        return None

    def _list_changed(self) -> None:
        try:
            self._send.send_nowait(_LIST_CHANGED)
        except trio.WouldBlock:  # the agent reads nothing: a notification more would not help
            pass

    def _withdraw(self, request_id: str | int) -> None:
        running = self._calls.get(request_id)
        if running is not None:
            running.cancel()

    def _withdraw_if_cancelled(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        if isinstance(message, dict) and message.get("method") == "notifications/cancelled":
            cancelled = cancelled_request(message.get("params"))
            if cancelled is not None:
                self._withdraw(cancelled)

    async def _call(self, call: EarlyCall) -> None:
        progress = None
        if call.progress_token is not None:
            token = call.progress_token

            async def progress(value: float, message: str) -> None:
                await self._send.send(_line(progress_message(token, value, message)))

        result: dict[str, Any] | None = None
        with trio.CancelScope() as withdrawn:
            self._calls[call.request_id] = withdrawn
            try:
                result = await self._tools.call(call.name, call.arguments, progress)
            finally:
                self._calls.pop(call.request_id, None)
        if result is not None:  # a withdrawn call gets no answer (MCP)
            await self._send.send(_line(result_message(call.request_id, result)))

    async def _write(self, connection: trio.CancelScope) -> None:
        async with self._outbox:
            async for data in self._outbox:
                self._tools.trace("out", data)
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    connection.cancel()  # the agent's end is gone: so is everything running for it
                    return

    async def _hand_over(self, line: bytes, sdk_ready: Callable[[], Awaitable[None]]) -> None:
        """The SDK's server takes the connection over from ``line`` on."""
        if self._unwatch is not None:  # the SDK tells the agent of changes from now on (its initialized handler)
            self._unwatch()
            self._unwatch = None
        self._log.debug("an MCP message needs the SDK", line=line[:200].decode("utf-8", "replace"))
        try:
            await sdk_ready()
        except RuntimeError as exc:
            self._log.error("cannot serve an MCP connection", error=str(exc))
            return
        replayed = [json.loads(opening).get("id") for opening in self._opening]
        dropped = {request_id for request_id in replayed if request_id is not None}

        async def lines() -> AsyncIterator[bytes]:
            for opening in self._opening:
                yield opening
            yield line
            while (more := await self._next_line()) is not None:
                if self._calls:
                    self._withdraw_if_cancelled(more)  # a call running here (the SDK does not know it)
                yield more

        async def send(data: bytes) -> None:
            if dropped:  # the SDK's answer to the replayed initialize: the agent had it already
                request_id = json.loads(data).get("id")
                if request_id in dropped:
                    dropped.discard(request_id)
                    return
            await self._send.send(data)

        await self._tools.serve(lines(), send)
