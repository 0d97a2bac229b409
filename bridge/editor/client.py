"""An editor-side client of protocol v1, in Trio: what ``lmbridge demo``, ``lmbridge chat``, the test harness and
the tests use to talk to a bridge the way an editor extension does.

Owns spawning ``lmbridge stdio`` as a subprocess (and stopping it), and the client half of the protocol: requests,
``lm/part`` notifications routed to the turn they belong to, ``lm/modelsChanged`` counted, and cancelling a turn
while still receiving its answer. And the editor's own models, as an editor shares them: ``serve_models`` answers
``editor/chat`` with a function of the caller's (its parts sent as ``editor/part``), ``share_models`` says which.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from wire.cancel import CancelRequest
from wire.errors import RpcError
from wire.rpc.connection import (
    EDITOR_CANCEL,
    JsonRpcConnection,
    MethodTable,
    OutgoingRequest,
    RequestContext,
    StreamWire,
)

__all__ = [
    "ChatResult",
    "ChatTurn",
    "EditorClient",
    "assistant_message",
    "connect_daemon",
    "lmbridge_command",
    "spawn_stdio",
    "stop_lmbridge",
]

PartCallback = Callable[[dict[str, Any]], None]
# How a test editor answers ``editor/chat``: (its params, a function sending one part, the call's cancel) → the answer
# ({stopReason, usage?}); an ``RpcError`` raised is the editor's error answer.
ModelAnswer = Callable[
    [dict[str, Any], Callable[[dict[str, Any]], Awaitable[None]], CancelRequest], Awaitable[dict[str, Any]]
]


@dataclass
class ChatResult:
    parts: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: RpcError | None = None

    @property
    def text(self) -> str:
        return "".join(part["value"] for part in self.parts if part.get("type") == "text")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [part for part in self.parts if part.get("type") == "tool_call"]

    def assistant_message(self) -> dict[str, Any]:
        return assistant_message(self.parts)


def assistant_message(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A response's parts as the assistant message an editor puts in its history (text merged, tool calls kept,
    thinking and data dropped — what VS Code re-sends)."""
    content: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind == "text":
            if content and content[-1]["type"] == "text":
                content[-1] = {"type": "text", "value": content[-1]["value"] + part["value"]}
            else:
                content.append(dict(part))
        elif kind == "tool_call":
            content.append(dict(part))
    return {"role": "assistant", "content": content}


class ChatTurn:
    """An ``lm/chat`` in flight: its parts so far, ``cancel()``, and ``result()``."""

    def __init__(self, request: OutgoingRequest, on_part: PartCallback | None) -> None:
        self.request = request
        self.parts: list[dict[str, Any]] = []
        self.first_part = trio.Event()
        self._on_part = on_part

    def _part(self, part: dict[str, Any]) -> None:
        self.parts.append(part)
        self.first_part.set()
        if self._on_part is not None:
            self._on_part(part)

    def cancel(self) -> None:
        self.request.cancel()

    async def result(self) -> ChatResult:
        try:
            result = await self.request.result()
        except RpcError as exc:
            return ChatResult(self.parts, None, None, exc)
        return ChatResult(self.parts, result.get("stopReason"), result.get("usage"))


class EditorClient:
    def __init__(self) -> None:
        self.methods = MethodTable()
        self.methods.notification("lm/part", self._on_part)
        self.methods.notification("lm/modelsChanged", self._on_models_changed)
        self.connection: JsonRpcConnection | None = None
        self.models_changes = 0  # lm/modelsChanged notifications received
        self._models_changed = trio.Event()
        self._turns: dict[Any, ChatTurn] = {}
        self._early: dict[Any, list[dict[str, Any]]] = {}
        self.stray_parts: list[dict[str, Any]] = []  # parts for no turn of ours (a bug if ever non-empty)

    def attach(self, connection: JsonRpcConnection) -> None:
        self.connection = connection

    async def request(self, method: str, params: Any = None) -> Any:
        assert self.connection is not None
        return await self.connection.request(method, params)

    async def initialize(self, **params: Any) -> dict[str, Any]:
        params.setdefault("protocolVersion", 1)
        params.setdefault("clientInfo", {"name": "lmbridge-client", "version": "1"})
        result: dict[str, Any] = await self.request("initialize", params)
        return result

    async def wait_models_changed(self, seen: int = 0) -> None:
        """Until more than ``seen`` ``lm/modelsChanged`` notifications have arrived."""
        while self.models_changes <= seen:
            await self._models_changed.wait()

    async def _on_models_changed(self, params: Any) -> None:
        self.models_changes += 1
        self._models_changed.set()
        self._models_changed = trio.Event()

    async def models(self) -> list[dict[str, Any]]:
        models: list[dict[str, Any]] = (await self.request("lm/models", {}))["models"]
        return models

    async def start_chat(
        self,
        model_id: str,
        messages: list[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] = (),
        on_part: PartCallback | None = None,
        **options: Any,
    ) -> ChatTurn:
        assert self.connection is not None
        params: dict[str, Any] = {"modelId": model_id, "messages": messages}
        if tools or options:
            params["options"] = {**options, **({"tools": list(tools)} if tools else {})}
        request = await self.connection.start_request("lm/chat", params)
        turn = self._turns[request.id] = ChatTurn(request, on_part)
        # Sending may have waited (backpressure), letting parts for this id arrive before it was registered.
        for part in self._early.pop(request.id, ()):
            turn._part(part)
        return turn

    async def chat(self, model_id: str, messages: list[dict[str, Any]], **kwargs: Any) -> ChatResult:
        turn = await self.start_chat(model_id, messages, **kwargs)
        try:
            return await turn.result()
        finally:
            self._turns.pop(turn.request.id, None)

    async def count_tokens(self, model_id: str, **what: Any) -> int:
        count: int = (await self.request("lm/countTokens", {"modelId": model_id, **what}))["count"]
        return count

    async def shutdown(self) -> None:
        await self.request("shutdown", None)

    def serve_models(self, answer: ModelAnswer) -> None:
        """Answer ``editor/chat`` with ``answer`` (before ``initialize``: the models are shared from then on)."""

        async def editor_chat(params: Any, context: RequestContext) -> Any:
            async def send_part(part: dict[str, Any]) -> None:
                await context.connection.notify("editor/part", {"requestId": context.id, "part": part})

            return await answer(params, send_part, context.cancel_requested)

        self.methods.request("editor/chat", editor_chat, handles_cancel=True)

    async def share_models(self, models: list[dict[str, Any]]) -> None:
        """``editor/modelsChanged``: the models this editor shares from now on (``[]``: none)."""
        assert self.connection is not None
        await self.connection.notify("editor/modelsChanged", {"models": models})

    async def _on_part(self, params: Any) -> None:
        if not isinstance(params, dict) or not isinstance(params.get("part"), dict):
            self.stray_parts.append(params)
            return
        request_id = params.get("requestId")
        turn = self._turns.get(request_id)
        if turn is not None:
            turn._part(params["part"])
        elif self.connection is not None and request_id in self.connection.pending_ids:
            self._early.setdefault(request_id, []).append(params["part"])
        else:
            self.stray_parts.append(params)


def lmbridge_command(*args: str) -> list[str]:
    """The command line of this lmbridge, runnable from any directory."""
    return [sys.executable, "-m", "bridge", *args]


@asynccontextmanager
async def spawn_stdio(
    args: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stderr: Any = None,
    stop_timeout: float = 15.0,
    command: Sequence[str] | None = None,
) -> AsyncIterator[tuple[EditorClient, trio.Process]]:
    """Run ``lmbridge stdio ARGS`` as a subprocess and yield a connected (not yet initialized) client and the
    process. On exit: stdin is closed (which stops the bridge) and the process awaited; killed if it hangs.
    ``command``: another program speaking the editor protocol on stdio to run instead (a benchmark's floor)."""
    process = await trio.lowlevel.open_process(
        [*command, *args] if command is not None else lmbridge_command("stdio", *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr if stderr is not None else None,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    client = EditorClient()
    assert process.stdin is not None and process.stdout is not None
    connection = JsonRpcConnection(
        StreamWire(process.stdout, process.stdin), client.methods, name="bridge", cancel_style=EDITOR_CANCEL
    )
    client.attach(connection)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.serve)
            try:
                yield client, process
            finally:
                await stop_lmbridge(process, stop_timeout)
                nursery.cancel_scope.cancel()
    finally:
        await stop_lmbridge(process, 0)


async def stop_lmbridge(process: trio.Process, timeout: float) -> None:
    """Stop an ``lmbridge stdio`` subprocess: close its stdin (its orderly stop: sessions closed, agents stopped)
    and wait for it, killing it if it has not exited within ``timeout`` seconds. Shielded; idempotent."""
    with trio.CancelScope(shield=True):
        if process.stdin is not None:
            await process.stdin.aclose()
        with trio.move_on_after(timeout):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def connect_daemon(url: str, token: str) -> AsyncIterator[EditorClient]:
    """A connected (not yet initialized) client of ``lmbridge serve`` at ``url``."""
    from wire.rpc.websocket import WebSocketWire, open_websocket

    async with open_websocket(url, token) as ws:
        client = EditorClient()
        connection = JsonRpcConnection(WebSocketWire(ws), client.methods, name="bridge", cancel_style=EDITOR_CANCEL)
        client.attach(connection)
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.serve)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await connection.aclose(timeout=1)
                nursery.cancel_scope.cancel()
