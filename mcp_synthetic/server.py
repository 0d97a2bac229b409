"""The synthetic MCP server: the editor's tools, offered to one ACP session's agent, on the official ``mcp`` SDK's
low-level ``Server`` running under Trio.

Owns the tool list of a session — the client's tools, and the tools lmbridge answers itself for that client
(``LocalTool``: the models an editor shares, ``bridge.service.editor_models``), updated when they change, with
``notifications/tools/list_changed`` to connected clients —, checking each call (unknown or withdrawn tool, invalid
arguments, a tool whose schema is invalid: all answered with ``isError`` and a clear text, so the model can retry —
the editor never sees an invalid call), handing valid calls to the session actor and blocking until the editor's
result comes back (with progress heartbeats where the client gave a progress token), and mapping that result to MCP
content.

Every handler catches everything and answers ``isError``: the SDK would otherwise turn an exception into a
JSON-RPC error the model never sees. The ``mcp`` package takes about a second to import, so nothing here imports it
at module level; ``load_sdk()`` does, and is meant to run in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import functools
import operator
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from wire.cancel import CancelRequest
from wire.observe.logger import Logger

from .names import ToolNames
from .validation import ToolSchema

__all__ = [
    "DISCOVERY_REFUSAL",
    "HEARTBEAT_MESSAGE",
    "INSTRUCTIONS",
    "PROGRESS_INTERVAL",
    "SERVER_NAME",
    "SERVER_VERSION",
    "EditorTool",
    "LocalTool",
    "SessionTools",
    "ToolProgress",
    "agent_annotations",
    "load_sdk",
    "receive_some",
    "to_mcp_content",
]

SERVER_NAME = "editor"
SERVER_VERSION = "1"
INSTRUCTIONS = "Tools of the user's editor. Calls run in the editor."
PROGRESS_INTERVAL = 15.0  # seconds between heartbeats while the editor runs a tool (agents time tools out)
HEARTBEAT_MESSAGE = "waiting for the editor to run the tool"
MAX_LINE_BYTES = 16 * 1024 * 1024

# (editor tool name, arguments) → (the editor's tool_result part, "") or (None, why not); withdrawn by cancelling it
Invoke = Callable[[str, Any], Awaitable[tuple[dict[str, Any] | None, str]]]
# (progress so far, a rising number; what to say) → an MCP notifications/progress to the agent
ToolProgress = Callable[[float, str], Awaitable[None]]


def load_sdk() -> None:
    """Import the parts of the ``mcp`` SDK this module uses (slow: run it in a worker thread)."""
    import mcp_types  # noqa: F401
    from mcp.server.lowlevel import NotificationOptions, Server  # noqa: F401
    from mcp.shared.message import SessionMessage  # noqa: F401


# lmbridge's MCP server speaks the revisions that open a session with ``initialize``, on every transport: served
# without the SDK over HTTP (``mcp_synthetic.early``), and alike where the SDK serves. A client of MCP 2026-07-28 asks
# ``server/discover`` first and takes any error as "open the session with initialize".
DISCOVERY_REFUSAL = (
    "Method not found: server/discover. This server speaks MCP 2025-11-25 and earlier: open the session with "
    "initialize."
)


async def _refuse_discovery(context: Any, params: Any) -> Any:
    from mcp.shared.exceptions import MCPError

    raise MCPError(-32601, DISCOVERY_REFUSAL)


@functools.cache
def _editor_server_class() -> type:
    """The SDK's low-level ``Server``, announcing ``tools.listChanged`` on every transport (the streamable-HTTP
    manager builds its initialization options itself, with the SDK's defaults: no list changes)."""
    from mcp.server.lowlevel import NotificationOptions, Server

    class EditorServer(Server):
        def create_initialization_options(self, notification_options: Any = None, *args: Any, **kwargs: Any) -> Any:
            options = notification_options or NotificationOptions(tools_changed=True)
            return super().create_initialization_options(options, *args, **kwargs)

    return EditorServer


@dataclass(frozen=True, slots=True)
class LocalTool:
    """A tool lmbridge answers itself, not the client: ``run(arguments, progress)`` gives MCP's ``CallToolResult`` as
    JSON (and is cancelled when the agent withdraws the call); ``progress`` is None when the agent asked for none."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    run: Callable[[dict[str, Any], ToolProgress | None], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class EditorTool:
    editor_name: str
    agent_name: str
    description: str
    schema: ToolSchema
    annotations: dict[str, Any]  # MCP tool annotations, as the agent sees them


# MCP's tool annotations and their types: anything else a client sends is dropped (the agent's SDK would refuse the
# whole tool list over one malformed hint).
_ANNOTATION_TYPES: dict[str, type] = {
    "title": str,
    "readOnlyHint": bool,
    "destructiveHint": bool,
    "idempotentHint": bool,
    "openWorldHint": bool,
}


def agent_annotations(client: Any, *, parallel: bool) -> dict[str, Any]:
    """The MCP annotations the agent sees for a client tool: the client's own, and — when ``parallel`` and the
    client does not say the tool is destructive or not read-only — ``readOnlyHint: true``.

    Why that is honest: a synthetic tool does nothing by itself; calling it hands the call to the client, which
    runs it under its own confirmation. For the agent it has no side effect to guard, and ``readOnlyHint`` is what
    Claude Code and Codex need to run two calls of the model's response concurrently (without it they run them one
    after the other, and the client gets one call per response)."""
    known = client if isinstance(client, dict) else {}
    annotations: dict[str, Any] = {
        key: value for key, value in known.items() if isinstance(value, _ANNOTATION_TYPES.get(key, ()))
    }
    if parallel and "readOnlyHint" not in annotations and not annotations.get("destructiveHint"):
        annotations["readOnlyHint"] = True
    return annotations


class SessionTools:
    """The editor's tools for one ACP session, and the MCP server offering them on any number of connections."""

    def __init__(
        self,
        invoke: Invoke,
        *,
        log: Logger,
        tracer: Any = None,
        name: str = "mcp",
        parallel: bool = True,
        prompt_cancelled: Callable[[], CancelRequest | None] | None = None,
    ) -> None:
        """``parallel``: mark tools ``readOnlyHint`` unless the client says otherwise (see ``agent_annotations``).
        ``prompt_cancelled()``: set when the session's prompt is cancelled (or it closes); a call of lmbridge's own
        tools is withdrawn then (the editor's are withdrawn by the session itself)."""
        self._invoke = invoke
        self._prompt_cancelled = prompt_cancelled
        self._parallel = parallel
        self._log = log
        self._tracer = tracer
        self._name = name
        self._names = ToolNames()
        self._tools: dict[str, EditorTool] = {}  # by agent-facing name
        self._local: dict[str, tuple[LocalTool, ToolSchema]] = {}  # lmbridge's own, by name
        self._signature: tuple[Any, ...] = ()
        self._taken: list[dict[str, Any]] = []  # the tool objects ``update`` took last
        self._connections: list[Any] = []  # the SDK's per-connection sessions, for list_changed
        self._watchers: set[Callable[[], None]] = set()  # event streams served without the SDK, for list_changed
        self._server: Any = None

    # -- the tool list ----------------------------------------------------------------------------------------

    def update(self, tools: list[dict[str, Any]]) -> bool:
        """Take the editor's current tools; True when the set changed (connected clients are then told). Their
        schemas are compiled later (``compile_schemas``, or on first use)."""
        if len(tools) == len(self._taken) and all(map(operator.is_, tools, self._taken)):
            return False  # the very tool objects of last time (the editor repeated its list): ~0.5 ms for 80 tools
        self._taken = list(tools)
        signature = tuple(
            (t["name"], t.get("description", ""), repr(t.get("inputSchema")), repr(t.get("annotations"))) for t in tools
        )
        if signature == self._signature:
            return False
        self._signature = signature
        current: dict[str, EditorTool] = {}
        for tool in tools:
            name = self._names.agent(tool["name"])
            previous = self._tools.get(name)
            schema = (
                previous.schema
                if previous is not None and previous.schema.schema == tool.get("inputSchema")
                else (ToolSchema(tool["name"], tool.get("inputSchema", {"type": "object"})))
            )
            annotations = agent_annotations(tool.get("annotations"), parallel=self._parallel)
            current[name] = EditorTool(tool["name"], name, tool.get("description", ""), schema, annotations)
        self._tools = current
        return True

    def set_local(self, tools: list[LocalTool]) -> bool:
        """Take the tools lmbridge answers itself for this session's client now; True when the set changed (connected
        clients are then told, as for ``update``). A client tool of the same name wins (the client named it)."""
        signature = tuple((t.name, t.description, repr(t.input_schema)) for t in tools)
        current = tuple((t.name, t.description, repr(s.schema)) for t, s in self._local.values())
        self._local = {t.name: (t, self._local_schema(t)) for t in tools}
        return signature != current

    def _local_schema(self, tool: LocalTool) -> ToolSchema:
        known = self._local.get(tool.name)
        if known is not None and known[1].schema == tool.input_schema:
            return known[1]
        return ToolSchema(tool.name, tool.input_schema)

    async def compile_schemas(self) -> None:
        """Compile the schemas of the current tools that are not yet, one at a time (each a fraction of a
        millisecond to a few: other work runs in between): run off the turn's path when the tools arrive, so that
        neither ``session/new`` nor the agent's tool list waits for it."""
        for tool in list(self._tools.values()):
            if not tool.schema.compiled:
                self._schema_error(tool)
                await trio.lowlevel.checkpoint()

    def _schema_error(self, tool: EditorTool) -> str | None:
        """Why the editor's schema for ``tool`` is invalid (compiling it if need be; said in the log when compiled,
        once per distinct schema in the process), or None."""
        reported = tool.schema.compiled
        error = tool.schema.error
        if error and not reported:
            self._log.warning(
                "the editor gave a tool an invalid input schema; the agent will be told",
                tool=tool.editor_name,
                problem=error,
            )
        return error

    @property
    def tracer(self) -> Any:
        return self._tracer

    def trace(self, direction: str, raw: bytes) -> None:
        """Record one MCP message (by any transport) under this session's ``mcp:`` connection name."""
        if self._tracer is not None:
            self._tracer.record(self._name, direction, raw, _is_json(raw))

    @property
    def agent_names(self) -> set[str]:
        return set(self._tools) | set(self._local)

    @property
    def editor_names(self) -> set[str]:
        return {tool.editor_name for tool in self._tools.values()}

    def watch_changes(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Have ``watcher`` called when the tool list changes (``notify_changed``); returns what stops that."""
        self._watchers.add(watcher)
        return lambda: self._watchers.discard(watcher)

    async def notify_changed(self) -> None:
        for watcher in list(self._watchers):
            watcher()
        for connection in list(self._connections):
            try:
                await connection.send_tool_list_changed()
            except Exception as exc:
                self._log.debug("list_changed not delivered", error=str(exc))

    # -- serving ----------------------------------------------------------------------------------------------

    @property
    def server(self) -> Any:
        """The SDK's low-level ``Server`` for these tools (made on first use)."""
        if self._server is None:
            import mcp_types as types

            self._server = _editor_server_class()(
                SERVER_NAME,
                version=SERVER_VERSION,
                instructions=INSTRUCTIONS,
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
            )
            self._server.add_notification_handler(
                "notifications/initialized", types.NotificationParams, self._initialized
            )
            self._server.add_request_handler("server/discover", types.RequestParams, _refuse_discovery)
            # The SDK wraps every request in an OpenTelemetry span by default: about a sixth of a tool round trip's
            # cost here, for traces nobody collects (lmbridge has its own wire traces).
            self._server.middleware.clear()
        return self._server

    async def serve(self, lines: AsyncIterator[bytes], send: Callable[[bytes], Awaitable[None]]) -> None:
        """Run the SDK's server on one connection's messages (``lines``: newline-delimited JSON-RPC, framed and
        traced by the caller; ``send(line)`` writes one of the server's) until ``lines`` ends."""
        import anyio
        import mcp_types as types
        from mcp.shared.message import SessionMessage

        server = self.server
        to_server_send, to_server = anyio.create_memory_object_stream[Any](64)
        from_server, from_server_receive = anyio.create_memory_object_stream[Any](64)

        async def read_lines() -> None:
            async with to_server_send:
                async for line in lines:
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except Exception as exc:
                        await to_server_send.send(exc)
                        continue
                    if isinstance(message, types.JSONRPCRequest) and message.method == "server/discover":
                        # Refused before the SDK sees it: it would hold the connection to MCP 2026-07-28 and
                        # refuse the initialize that follows.
                        error = types.ErrorData(code=-32601, message=DISCOVERY_REFUSAL)
                        refusal = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                        await from_server.send(SessionMessage(refusal))
                        continue
                    await to_server_send.send(SessionMessage(message))

        async def write_lines() -> None:
            async with from_server_receive:
                async for item in from_server_receive:
                    await send(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_lines)
            nursery.start_soon(write_lines)
            await server.run(
                to_server,
                from_server,
                server.create_initialization_options(),
                raise_exceptions=False,
            )
            nursery.cancel_scope.cancel()

    # -- handlers ---------------------------------------------------------------------------------------------

    async def _initialized(self, ctx: Any, params: Any) -> None:
        self._connections.append(ctx.session)

    def listing(self) -> list[dict[str, Any]]:
        """The tools as ``tools/list`` gives them (MCP's JSON): the SDK's handler and the early handshake
        (``mcp_synthetic.early``) both answer with it."""
        tools: list[dict[str, Any]] = []
        for tool in self._tools.values():
            error = self._schema_error(tool)
            if error:
                description = f"(Unavailable: the editor gave this tool an {error}.) {tool.description}"
                schema: Any = {"type": "object"}
            else:
                description = tool.description
                schema = tool.schema.schema if isinstance(tool.schema.schema, dict) else {"type": "object"}
            listed = {"name": tool.agent_name, "description": description, "inputSchema": schema}
            if tool.annotations:
                listed["annotations"] = tool.annotations
            tools.append(listed)
        for name, (local, _schema) in self._local.items():
            if name not in self._tools:
                entry = {"name": name, "description": local.description, "inputSchema": local.input_schema}
                tools.append({**entry, "annotations": local.annotations} if local.annotations else entry)
        return tools

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        import mcp_types as types

        return types.ListToolsResult.model_validate({"tools": self.listing()})

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        """The SDK's ``tools/call`` handler: ``call``, with heartbeats as the SDK's progress notifications."""
        import mcp_types as types

        token = (getattr(ctx, "meta", None) or {}).get("progress_token")
        progress: ToolProgress | None = None
        if token is not None:

            async def progress(value: float, message: str) -> None:
                await ctx.session.send_progress_notification(
                    token, value, None, message, related_request_id=ctx.request_id
                )

        return types.CallToolResult.model_validate(await self.call(params.name, params.arguments, progress))

    async def call(self, name: str, arguments: Any, progress: ToolProgress | None = None) -> dict[str, Any]:
        """Run one of the agent's ``tools/call``: MCP's ``CallToolResult`` as JSON. Never raises (but
        ``trio.Cancelled``, when the agent withdraws the call): the model must see what happened, as an ``isError``
        result. ``progress(value, message)``, if given, is awaited every ``PROGRESS_INTERVAL`` seconds while the
        editor runs the tool (agents time tools out), and as a tool of lmbridge's own makes progress."""
        try:
            return await self._call(name, arguments, progress)
        except Exception as exc:
            self._log.exception("tool call failed inside lmbridge", tool=name)
            return _error_result(f"lmbridge could not run this tool call: {type(exc).__name__}: {exc}")

    async def _call(self, name: str, arguments: Any, progress: ToolProgress | None) -> dict[str, Any]:
        tool = self._tools.get(name)
        if tool is None and name in self._local:
            return await self._call_local(*self._local[name], arguments, progress)
        if tool is None:
            available = ", ".join(sorted(self.agent_names)) or "none"
            return _error_result(
                f"Unknown tool {name!r}: the editor does not offer it (any more). Available tools: {available}."
            )
        error = self._schema_error(tool)
        if error:
            return _error_result(
                f"the tool {tool.agent_name!r} cannot be called: the editor gave it an "
                f"{error}. Do not call it again; use another tool or ask the user."
            )
        check = tool.schema.check(arguments)
        if not check.ok:
            return _error_result(
                f"Invalid arguments for {tool.agent_name}:\n- "
                + "\n- ".join(check.problems)
                + "\nFix the arguments and call the tool again."
            )
        answered = False
        try:
            if progress is None:  # no nursery to leave: the answer goes back without another scheduler pass
                result, reason = await self._invoke(tool.editor_name, check.arguments)
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_heartbeat, progress)
                    result, reason = await self._invoke(tool.editor_name, check.arguments)
                    nursery.cancel_scope.cancel()
            answered = True
        finally:
            if not answered:  # notifications/cancelled from the agent, or the connection closing
                self._log.info("the agent withdrew a tool call", tool=tool.editor_name)
        if result is None:
            return _error_result(reason or "The tool call was withdrawn.")
        return {"content": to_mcp_content(result.get("content", [])), "isError": bool(result.get("isError"))}

    async def _call_local(
        self, tool: LocalTool, schema: ToolSchema, arguments: Any, progress: ToolProgress | None
    ) -> dict[str, Any]:
        check = schema.check(arguments)
        if not check.ok:
            return _error_result(
                f"Invalid arguments for {tool.name}:\n- " + "\n- ".join(check.problems) + "\nFix them and call again."
            )
        cancelled = self._prompt_cancelled() if self._prompt_cancelled is not None else None
        answered = False
        with trio.CancelScope() as withdrawn:
            unwatch = cancelled.on_set(withdrawn.cancel) if cancelled is not None else None
            try:
                result = await tool.run(check.arguments, progress)
                answered = True
            finally:
                if unwatch is not None:
                    unwatch()
                if not answered and not withdrawn.cancel_called:
                    self._log.info("the agent withdrew a tool call", tool=tool.name)
        if withdrawn.cancelled_caught:
            self._log.info("the request was cancelled; tool call withdrawn", tool=tool.name)
            return _error_result("The user cancelled the request; the tool call was withdrawn.")
        return result


def _is_json(line: bytes) -> bool:
    import json

    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


async def receive_some(stream: trio.abc.Stream, max_bytes: int = 65536) -> bytes | bytearray:
    """The next bytes, or b"" when the peer closed or the connection broke."""
    try:
        return await stream.receive_some(max_bytes)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


async def _heartbeat(progress: ToolProgress) -> None:
    beats = 0
    while True:
        await trio.sleep(PROGRESS_INTERVAL)
        beats += 1
        try:
            await progress(beats, HEARTBEAT_MESSAGE)
        except Exception:
            return


def _error_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


def to_mcp_content(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Editor result parts → MCP content (JSON): text as text, images as images, textual data decoded, other data
    described (agents cannot take arbitrary blobs)."""
    content: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind == "text":
            content.append({"type": "text", "text": part["value"]})
        elif kind == "data":
            mime = part.get("mimeType", "")
            if mime.startswith("image/"):
                content.append({"type": "image", "data": part["data"], "mimeType": mime})
                continue
            try:
                raw = base64.b64decode(part["data"], validate=True)
            except (binascii.Error, ValueError):
                raw = None
            if raw is not None and (mime.startswith("text/") or mime.endswith(("json", "xml"))):
                try:
                    content.append({"type": "text", "text": raw.decode("utf-8")})
                    continue
                except UnicodeDecodeError:
                    pass
            size = len(raw) if raw is not None else len(part.get("data", ""))
            content.append({"type": "text", "text": f"[{mime or 'binary'} data, {size} bytes]"})
    return content
