"""Editor protocol v1: the methods an editor extension calls, over any JSON-RPC connection (stdio or WebSocket).

Owns checking every editor request (a bad field gets -32602 naming it), the per-connection state (initialized,
workspace folders, capabilities), turning ``lm/chat`` into a routed turn whose parts stream back as ``lm/part``
notifications, and mapping outcomes to results and errors. The other direction too: the models the editor shares
(``initialize.editorModels``, ``editor/modelsChanged``) go to ``bridge.service.editor_models``, and a call to one of
them is an ``editor/chat`` request to the editor whose ``editor/part`` notifications stream its answer back
(``editor_chat``: this connection is the ``EditorLink``). The contract itself is documented in docs/protocol.md;
keep the two in step.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from bridge.service.composition import BridgeService
from bridge.service.principals import LOCAL, Principal
from bridge.service.shared_models import parse_shared_models
from bridge.service.view import ClientView
from session.options import read_choices
from session.tokens import estimate_message_tokens, estimate_tokens
from wire.cancel import CancelRequest
from wire.errors import INVALID_REQUEST, InternalError, InvalidParams, RpcError
from wire.rpc.connection import ConnectionClosed, JsonRpcConnection, MethodTable, RequestContext

if TYPE_CHECKING:
    from session.actor import TurnOutcome

from .history_parse import HistoryReusingParser
from .initialize import PROTOCOL_VERSION, EditorHello, initialize_result, parse_initialize

__all__ = ["PROTOCOL_VERSION", "EditorConnection"]

_SERIALS = itertools.count(1)


class EditorConnection:
    """One editor's connection. ``methods`` is registered on its ``JsonRpcConnection`` by the caller."""

    def __init__(
        self,
        service: BridgeService,
        *,
        name: str = "editor",
        default_cwd: str | None = None,
        shutdown_stops_daemon: bool = True,
        principal: Principal = LOCAL,
        authorized: Callable[[], bool] = lambda: True,
    ) -> None:
        """``shutdown_stops_daemon``: with stdio, ``shutdown`` stops the whole bridge; on a shared daemon it only
        ends this editor's turns (the daemon serves others). ``principal``: whose key opened the connection (its
        conversations, its models and what it may do); ``authorized``: whether that key still holds."""
        self.service = service
        self.name = name
        self.principal = principal
        self.connected = True  # until the connection ends (``close``): a draining daemon waits for it, not after
        self.serial = next(_SERIALS)  # which connection, never reused (an agent process may be this editor's)
        self._authorized = authorized
        self.methods = MethodTable()
        self.methods.request("initialize", self._initialize, inline=True)
        # Checked in arrival order, not when the handler gets to run: initialized, and the key's scope.
        chat, models = self._needs("chat"), self._needs("models")
        self.methods.request("lm/models", self._models, precondition=models)
        self.methods.request("lm/chat", self._chat, handles_cancel=True, precondition=chat)
        self.methods.request("lm/countTokens", self._count_tokens, precondition=chat)
        self.methods.request("shutdown", self._shutdown)
        self.methods.request("daemon/status", self._status, precondition=self._require_initialized)
        self.methods.notification("editor/modelsChanged", self._editor_models_changed)
        self.methods.notification("editor/part", self._editor_parts, batch=True)
        self.connection: JsonRpcConnection | None = None
        # The editor re-sends every history in full: its connection parses with this (see bridge.history_parse).
        self.parse = HistoryReusingParser()
        self.initialized = False
        self.client_info: dict[str, Any] = {}
        self.workspace_folders: list[str] = []
        self.view = ClientView()  # how the editor shows the agent's activity (its initialize capabilities)
        self.shutdown_requested = trio.Event()
        self._default_cwd = default_cwd or os.getcwd()
        self._log = service.log.bind(conn=name)
        self._turn_events: set[CancelRequest] = set()  # the cancel signals of the turns running now
        self._no_turns = trio.Event()
        self._no_turns.set()
        self._shutdown_stops_daemon = shutdown_stops_daemon
        self._unwatch_models: Callable[[], None] | None = None  # set once initialized: stops lm/modelsChanged
        # The last tool list checked, and what it was checked from: the parser hands back the very list object when
        # the editor repeats its tools, which it does with every request (~0.2 ms to check 80 tools again).
        self._checked_tools: tuple[Any, list[dict[str, Any]]] = (None, [])
        # The editor/chat calls lmbridge made to this editor and that are running: their parts, by request id.
        self._model_calls: dict[Any, trio.MemorySendChannel[list[Any]]] = {}

    @property
    def cwd(self) -> str:
        return self.workspace_folders[0] if self.workspace_folders else self._default_cwd

    @property
    def scope(self) -> str:
        """Who asks, for history matching: the client's name and its workspace folders. Not the connection, so that
        an editor that reconnects (or restarts lmbridge) still continues its conversations; but two clients, or two
        workspaces, whose conversations open alike never share a session."""
        folders = "\0".join(sorted(self.workspace_folders)) or self._default_cwd
        return f"editor\0{self.client_info.get('name') or ''}\0{folders}"

    @property
    def principal_id(self) -> str:
        return self.principal.id

    @property
    def label(self) -> str:
        """Which editor, for logs and model lists: its name and first workspace folder."""
        name = self.client_info.get("name") or self.name
        return f"{name} ({self.workspace_folders[0]})" if self.workspace_folders else str(name)

    def close(self) -> None:
        """The connection ended: no more notifications for it, and the models it shared are gone."""
        self.connected = False
        if self._unwatch_models is not None:
            self._unwatch_models()
            self._unwatch_models = None
        self.service.editor_models.withdraw(self)

    def cancel_turns(self) -> None:
        """Ask every running turn of this connection to end (they answer ``cancelled``)."""
        for event in list(self._turn_events):
            event.set()

    # -- methods --------------------------------------------------------------------------------------------

    async def _initialize(self, params: Any, context: RequestContext) -> dict[str, Any]:
        self.apply(parse_initialize(params))
        return initialize_result(self.service.permission_tool)

    def apply(self, hello: EditorHello) -> None:
        """Take what the editor said in ``initialize`` (also when ``lmbridge stdio`` answered it early). Agents it
        defines are every client's (on a daemon: only a key with the ``admin`` scope may), and sharing its models
        is a ``chat`` matter."""
        if hello.agents:
            self.principal.require("admin")
        if hello.editor_models:
            self.principal.require("chat")
        self.client_info = hello.client_info
        self.workspace_folders = list(hello.workspace_folders)
        self.view = ClientView(thinking=hello.thinking, acp_updates=hello.acp_updates)
        if hello.agents:
            self.service.add_agents(hello.agents)
        self.service.prestart_agents(self, self.principal)
        if self._unwatch_models is None:
            self._unwatch_models = self.service.watch_models(self._models_changed)
        self.initialized = True
        if hello.editor_models:
            self.service.editor_models.share(self, hello.editor_models)
        self._log.info("editor initialized", client=self.client_info.get("name"), folders=len(self.workspace_folders))

    def _require_initialized(self) -> None:
        if not self.initialized:
            raise RpcError(INVALID_REQUEST, "Invalid Request: call initialize first")

    def _needs(self, scope: str) -> Callable[[], None]:
        def precondition() -> None:
            self._require_initialized()
            if not self._authorized():
                raise RpcError(INVALID_REQUEST, "Invalid Request: this connection's key was revoked or has expired")
            self.principal.require(scope)

        return precondition

    def _models_changed(self) -> None:
        connection = self.connection
        if connection is not None and not connection.closed:
            connection.notify_nowait("lm/modelsChanged", {})

    def _tools(self, raw: Any) -> list[dict[str, Any]]:
        checked_from, checked = self._checked_tools
        if raw is None or raw is not checked_from:
            checked = _tools(raw)
            if raw is not None:
                self._checked_tools = (raw, checked)
        return checked

    async def _models(self, params: Any, context: RequestContext) -> dict[str, Any]:
        # An agent on the editor's models is offered on this editor's own models only (another editor's would not
        # answer this editor's conversations).
        own = {model.id for model in self.service.editor_models.shared_by(self)}
        listed = self.service.models(self.principal)
        entries = [e for e in listed if not e.thinks_with or e.thinks_with.partition(":")[2] in own]
        return {"models": [entry.describe() for entry in entries]}

    async def _chat(self, params: Any, context: RequestContext) -> dict[str, Any]:
        params = _object(params, "params")
        model_id = params.get("modelId")
        if not isinstance(model_id, str):
            raise InvalidParams("modelId", "is required and must be a string")
        entry = self.service.resolve_model(model_id, self.principal)  # unknown model → -32602
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidParams("messages", "must be a non-empty list of messages")
        options = params.get("options")
        options = _object(options, "options") if options is not None else {}
        tools = self._tools(options.get("tools"))
        tool_mode = options.get("toolMode")
        if tool_mode not in (None, "auto", "required"):
            raise InvalidParams("options.toolMode", 'must be "auto" or "required"')
        settings = read_choices(options.get("modelOptions"), "options.modelOptions")
        conversation = options.get("conversationId")
        if conversation is not None and (not isinstance(conversation, str) or not 0 < len(conversation) <= 256):
            raise InvalidParams("options.conversationId", "must be a string of 1 to 256 characters")
        scope = self.scope if conversation is None else f"{self.scope}\0{conversation}"
        request = self.service.turn_request(
            entry,
            messages,
            tools,
            cwd=self.cwd,
            view=self.view,
            scope=scope,
            choices=settings,
            client=self,
            principal=self.principal,
        )
        connection = context.connection
        request_id = context.id

        async def sink(part: dict[str, Any]) -> None:
            await connection.notify("lm/part", {"requestId": request_id, "part": part})

        def answer(outcome: TurnOutcome) -> None:
            # The answer follows the turn's last part in the same step (a tool call's part, then the answer the
            # editor waits for to run it): no scheduler round between them.
            if outcome.error is None:
                context.reply_now(_chat_result(outcome))

        cancel = context.cancel_requested
        self._turn_events.add(cancel)
        if self._no_turns.is_set():
            self._no_turns = trio.Event()
        started = trio.current_time()
        try:
            outcome = await self.service.chat(
                request, sink, cancel, on_outcome=answer, principal=self.principal, front="editor", model=model_id
            )
        finally:
            self._turn_events.discard(cancel)
            if not self._turn_events:
                self._no_turns.set()
        seconds = round(trio.current_time() - started, 3)
        if outcome.error is not None:
            self._log.info("turn failed", model=model_id, seconds=seconds, error=str(outcome.error))
            raise _as_rpc_error(outcome.error)
        # Logged once the answer is out (a log line costs ~60 µs: a tool round trip waits for this answer).
        stop, parts = outcome.stop_reason, len(outcome.emitted)
        context.after_reply(
            lambda: self._log.info("turn done", model=model_id, seconds=seconds, stop_reason=stop, parts=parts)
        )
        return _chat_result(outcome)

    async def _count_tokens(self, params: Any, context: RequestContext) -> dict[str, Any]:
        params = _object(params, "params")
        model_id = params.get("modelId")
        if not isinstance(model_id, str):
            raise InvalidParams("modelId", "is required and must be a string")
        self.service.resolve_model(model_id, self.principal)
        if "text" in params:
            if not isinstance(params["text"], str):
                raise InvalidParams("text", "must be a string")
            return {"count": estimate_tokens(params["text"])}
        if "message" in params:
            return {"count": estimate_message_tokens(params["message"])}
        raise InvalidParams("text", "give either text or message")

    async def _status(self, params: Any, context: RequestContext) -> dict[str, Any]:
        return self.service.status(self.principal)

    # -- the editor's own models ------------------------------------------------------------------------------

    async def _editor_models_changed(self, params: Any) -> None:
        if not self.initialized:
            raise InvalidParams("editor/modelsChanged", "call initialize first")
        models = parse_shared_models(_object(params, "params").get("models"), "models")
        self.principal.require("chat")
        self.service.editor_models.share(self, models)

    async def _editor_parts(self, batch: list[Any]) -> None:
        # The parts read in one go (a model streams many small ones) reach each call as one list.
        by_call: dict[Any, list[Any]] = {}
        malformed = 0
        for params in batch:
            request_id = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
                by_call.setdefault(request_id, []).append(params.get("part"))
            else:
                malformed += 1
        for request_id, parts in by_call.items():
            channel = self._model_calls.get(request_id)
            if channel is not None:
                try:
                    channel.send_nowait(parts)  # unbounded: the parts of one answer, forwarded by its call
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    pass  # parts after the call's answer: the call has ended, as the answer said
        if malformed:
            raise InvalidParams(
                "params", f"must be an object with a requestId ({malformed} editor/part notifications ignored)"
            )

    async def editor_chat(self, params: dict[str, Any], on_part: Callable[[Any], Any], cancel: CancelRequest) -> Any:
        """``EditorLink.editor_chat``: one ``editor/chat`` to this editor; its parts to ``on_part``, in order, all of
        them before this returns. A cancel (``cancel``, or the caller's) sends ``$/cancelRequest`` at once and stops
        waiting: the answer is then ``{"stopReason": "cancelled"}``."""
        from bridge.service.editor_models import EditorGone

        connection = self.connection
        if connection is None or connection.closed or connection.peer_closed.is_set():
            raise EditorGone  # (an editor whose input has ended cannot answer, though its connection is still open)
        send, receive = trio.open_memory_channel[list[Any]](math.inf)
        try:
            call = connection.start_request_nowait("editor/chat", params)
        except ConnectionClosed:
            raise EditorGone from None
        self._model_calls[call.id] = send
        answer: Any = {"stopReason": "cancelled"}
        failure: BaseException | None = None

        def answered(result: Any, error: BaseException | None) -> None:
            # Told by the connection's reader, in wire order: the answer follows the last part, nothing more comes.
            nonlocal answer, failure
            answer, failure = result, error
            send.close()

        call.on_answer(answered)
        try:
            with trio.CancelScope() as cancelled:
                unwatch = cancel.on_set(cancelled.cancel)
                try:
                    async for parts in receive:
                        # What else has come meanwhile goes out with them, adjacent text as one part: a model streams
                        # small pieces, and each write to the caller (an event stream) costs far more.
                        for ready in _ready(receive):
                            parts += ready
                        for part in _merged_text(parts):
                            await on_part(part)
                finally:
                    unwatch()
        finally:
            self._model_calls.pop(call.id, None)
            if not call.answered:
                call.abandon()  # $/cancelRequest; a late answer is ignored
        if isinstance(failure, ConnectionClosed):
            raise EditorGone
        if failure is not None:
            raise failure
        return answer

    async def _shutdown(self, params: Any, context: RequestContext) -> None:
        self.shutdown_requested.set()
        if self._shutdown_stops_daemon:
            await self.service.stopped.wait()
        else:
            self.cancel_turns()
            await self._no_turns.wait()
        return


def _ready(receive: trio.MemoryReceiveChannel[list[Any]]) -> list[list[Any]]:
    """Whatever the channel holds now, without waiting."""
    ready: list[list[Any]] = []
    while True:
        try:
            ready.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return ready


def _merged_text(parts: list[Any]) -> list[Any]:
    """Adjacent text parts (as the editor sent them) as one; everything else as it is, in order."""
    out: list[Any] = []
    texts: list[str] = []  # the run of text parts being merged, joined once when it ends

    def end_of_text() -> None:
        if texts:
            out.append({"type": "text", "value": "".join(texts)})
            texts.clear()

    for part in parts:
        value = part.get("value") if isinstance(part, dict) and part.get("type") == "text" else None
        if isinstance(value, str):
            texts.append(value)
        else:
            end_of_text()
            out.append(part)
    end_of_text()
    return out


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParams(field, "must be an object")
    return value


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidParams("options.tools", "must be a list of tools")
    tools = []
    for index, tool in enumerate(raw):
        where = f"options.tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidParams(where, "must be an object with name, description and inputSchema")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidParams(f"{where}.name", "is required and must be a non-empty string")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise InvalidParams(f"{where}.description", "must be a string")
        schema = tool.get("inputSchema", {"type": "object"})
        if not isinstance(schema, (dict, bool)):
            raise InvalidParams(f"{where}.inputSchema", "must be a JSON Schema object")
        annotations = tool.get("annotations")
        if annotations is not None and not isinstance(annotations, dict):
            raise InvalidParams(f"{where}.annotations", "must be an object of MCP tool annotations")
        checked = {"name": name, "description": description, "inputSchema": schema}
        if annotations:
            checked["annotations"] = annotations
        tools.append(checked)
    return tools


def _as_rpc_error(error: Exception) -> RpcError:
    if isinstance(error, RpcError):
        return error
    return InternalError(f"Internal error: {type(error).__name__}: {error}")


def _chat_result(outcome: TurnOutcome) -> dict[str, Any]:
    result: dict[str, Any] = {"stopReason": outcome.stop_reason}
    if outcome.usage:
        result["usage"] = outcome.usage
    return result
