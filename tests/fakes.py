"""The tests' toolkit, the way trio ships ``trio.testing``: what more than one test module needs, written once.

- messages: ``user``, ``assistant``, ``tool_result``
- the agent as the session actor sees it (``session.actor.AgentLink``): ``FakeAgentLink``, whose requests the test
  answers (``FakeReply``)
- the agent as the router sees it (``session.router.AgentHandle``): ``FakeAgent`` with ``FakeInfo`` behind a
  ``FakeAgentProvider``; ``answer_next_prompt``; ``RouterEditor`` runs turns against a router and keeps their parts
- an editor's own model (``ScriptedEditorModel``): what a test editor shares and answers ``editor/chat`` with
- MCP: the editor's tools a session offers (``MCP_TOOLS``: a valid one, a destructive one, one with an invalid
  schema), an agent's ``mcp_initialize`` and what it asks after it (``MCP_DIALOGUE``)

Everything here is in-process: no subprocess, no socket (those are ``conftest``'s fixtures: a live ``lmbridge stdio``,
a test agents file). Time: pytest-trio's ``autojump_clock`` fixture. Logs: the project's own logger
(``wire.observe.logs.get_logger``), which pytest shows for a failing test.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from session.router import RouterSettings, SessionRouter, TurnRequest
from wire.cancel import CancelRequest
from wire.errors import RpcError
from wire.observe.logs import get_logger

__all__ = [
    "MCP_DIALOGUE",
    "MCP_TOOLS",
    "FakeAgent",
    "FakeAgentLink",
    "FakeAgentProvider",
    "FakeInfo",
    "FakeReply",
    "RouterEditor",
    "ScriptedEditorModel",
    "answer_next_prompt",
    "assistant",
    "mcp_initialize",
    "start_router",
    "tool_result",
    "user",
]


# -- messages -------------------------------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "value": text}]}


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    """A user message carrying one tool result."""
    result = {"type": "tool_result", "callId": call_id, "content": [{"type": "text", "value": text}]}
    return {"role": "user", "content": [result]}


# -- the agent as the session actor sees it --------------------------------------------------------------------------


class FakeReply:
    """The answer to one request, given by the test: ``answer(value)`` (a result, or an exception for an error) or
    ``lose()`` (the agent went away without answering). ``result()`` waits for it; ``on_answer`` — how the actor takes
    a prompt's answer — is told as the wire would tell it."""

    def __init__(self, *, lost: BaseException | None = None) -> None:
        self.answered = trio.Event()
        self.value: Any = {}
        self._lost = lost  # set: the agent is gone already, result() raises it
        self._callback: Callable[[Any, BaseException | None], object] | None = None
        self._on_lost: Callable[[], object] | None = None

    def on_answer(self, callback: Callable[[Any, BaseException | None], object], on_lost: Any = None) -> None:
        self._callback, self._on_lost = callback, on_lost
        if self._lost is not None and on_lost is not None:
            on_lost()

    def answer(self, value: Any = None) -> None:
        self.value = {} if value is None else value
        self.answered.set()
        if self._callback is not None:
            if isinstance(self.value, BaseException):
                self._callback(None, self.value)
            else:
                self._callback(self.value, None)

    def lose(self, error: BaseException) -> None:
        self._lost = error
        if self._on_lost is not None:
            self._on_lost()

    async def result(self) -> Any:
        if self._lost is not None:
            raise self._lost
        await self.answered.wait()
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class FakeAgentLink:
    """Records what the actor sends (``sent``); each request's ``FakeReply`` is in ``replies``, answered when the test
    says. ``gone``: the agent is gone already — every reply is lost with that error."""

    id = "fake"

    def __init__(self, *, gone: BaseException | None = None) -> None:
        self.gone = gone
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.replies: list[FakeReply] = []
        self.request_came = trio.Event()  # set by each request; a test waiting for the next one replaces it

    def send_request(self, method: str, params: dict[str, Any]) -> FakeReply:
        self.sent.append((method, params))
        self.replies.append(FakeReply(lost=self.gone))
        self.request_came.set()
        return self.replies[-1]

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return await self.send_request(method, params).result()

    def detach(self, session_id: str) -> None:
        pass


# -- the agent as the router sees it --------------------------------------------------------------------------------


@dataclass
class FakeInfo:
    can_close: bool = True
    can_resume: bool = False
    can_load: bool = False

    def prompt(self, kind: str) -> bool:
        return False


class _Answered:
    """A fake prompt's answer came: ``set`` by the test; ``on_set`` tells the actor at once."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self.on_set: Callable[[], object] = lambda: None

    def set(self) -> None:
        self._event.set()
        self.on_set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


class FakeAgent:
    """An in-memory agent process: sessions open at once (or when ``session_new_gate`` is set); prompts run until the
    test finishes them (``finish``), or until ``session/cancel`` if ``honours_cancel``."""

    def __init__(self, *, honours_cancel: bool = True) -> None:
        self.id = "fake"
        self.alive = True
        self.info = FakeInfo()
        self.honours_cancel = honours_cancel
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        self.endpoints: dict[str, Any] = {}
        self.running: dict[str, tuple[_Answered, dict[str, Any]]] = {}
        self.prompt_started = trio.Event()
        self.session_new_gate: trio.Event | None = None
        self._ids = itertools.count(1)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return await self.send_request(method, params).result()

    def send_request(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        agent = self

        class Reply:
            def on_answer(self, callback: Any, on_lost: Any = None) -> None:
                if method == "session/prompt":  # told at once when the test answers it, as from the wire
                    done.on_set = lambda: (
                        callback(None, result["error"])
                        if "error" in result
                        else callback({"stopReason": result["stopReason"]}, None)
                    )

            async def result(self) -> Any:
                return await self._result()

            async def _result(self) -> Any:
                if method == "session/new":
                    if agent.session_new_gate is not None:
                        await agent.session_new_gate.wait()
                    return {"sessionId": f"s{next(agent._ids)}"}
                if method == "session/prompt":
                    await done.wait()
                    if "error" in result:
                        raise result["error"]
                    return {"stopReason": result["stopReason"]}
                return {}

        if method == "session/prompt":  # running from the moment it is sent, like on the wire
            done, result = _Answered(), {}
            self.running[params["sessionId"]] = (done, result)
            self.prompt_started.set()
        return Reply()

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.notifications.append((method, params))
        if method == "session/cancel" and self.honours_cancel and params["sessionId"] in self.running:
            self.finish(params["sessionId"], "cancelled")

    def attach(self, session_id: str, endpoint: Any) -> list[dict[str, Any]]:
        self.endpoints[session_id] = endpoint
        return []

    def detach(self, session_id: str) -> None:
        self.endpoints.pop(session_id, None)

    async def stop(self) -> None:
        self.alive = False

    def finish(self, session_id: str, stop_reason: str) -> None:
        done, result = self.running.pop(session_id)
        result["stopReason"] = stop_reason
        done.set()

    def method_count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


class FakeAgentProvider:
    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent

    async def acquire(self, agent_id: str, owner: object = None) -> FakeAgent:
        return self.agent

    def release(self, agent: FakeAgent) -> None:
        pass


async def answer_next_prompt(
    agent: FakeAgent, stop_reason: str = "end_turn", text: str | Callable[[str], str] | None = None
) -> str:
    """Wait for a prompt to run, say ``text`` (if any; a function: of the session id) and end it with
    ``stop_reason``; its session id."""
    while not agent.running:
        agent.prompt_started = trio.Event()
        await agent.prompt_started.wait()
    (session_id,) = list(agent.running)
    if callable(text):
        text = text(session_id)
    if text is not None:
        await agent.endpoints[session_id].on_agent_update(
            {
                "sessionId": session_id,
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
            }
        )
    agent.finish(session_id, stop_reason)
    return session_id


class RouterEditor:
    """Runs turns against a router, as a front would, and returns each turn's outcome with its parts."""

    def __init__(self, router: SessionRouter) -> None:
        self.router = router

    async def chat(self, messages: list[dict[str, Any]], cancel: CancelRequest | None = None) -> Any:
        parts: list[dict[str, Any]] = []

        async def sink(part: dict[str, Any]) -> None:
            parts.append(part)

        outcome = await self.router.chat(
            TurnRequest("fake", messages, "/tmp"), sink, cancel if cancel is not None else CancelRequest()
        )
        return outcome, parts


async def start_router(nursery: trio.Nursery, agent: FakeAgent, **settings: Any) -> tuple[SessionRouter, RouterEditor]:
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(**settings), log=get_logger())
    await nursery.start(router.run)
    return router, RouterEditor(router)


# -- an editor's own model ------------------------------------------------------------------------------------------


class ScriptedEditorModel:
    """A model a test editor shares (``EditorClient.serve_models(model.answer)``), scripted by the last user text of
    each ``editor/chat``:

    - ``/fail TEXT``: the editor answers with a JSON-RPC error (-32000, TEXT), as for a refused consent or a quota;
    - ``/wait``: says "waiting", then nothing until the call is cancelled (``cancelled`` counts it);
    - ``/call NAME {json}``: a call of the client's tool NAME (stop reason ``tool_calls``);
    - anything else: ``<model id> heard: <text>``, streamed word by word, with usage.

    ``calls`` keeps every ``editor/chat``'s params; ``models`` is what the editor shares (``initialize.editorModels``).
    """

    def __init__(self, *ids: str, tool_calling: bool = True) -> None:
        self.models = [
            {
                "id": model_id,
                "name": f"Scripted {model_id}",
                "vendor": "test-vendor",
                "family": "scripted",
                "maxInputTokens": 8192,
                "maxOutputTokens": 1024,
                "capabilities": {"toolCalling": tool_calling, "imageInput": False},
            }
            for model_id in ids or ("scripted-1",)
        ]
        self.calls: list[dict[str, Any]] = []
        self.cancelled = 0
        self.waiting = trio.Event()  # set when a /wait call is waiting

    async def answer(self, params: dict[str, Any], send_part: Any, cancel: Any) -> dict[str, Any]:
        self.calls.append(params)
        text = _last_user_text(params.get("messages") or [])
        if text.startswith("/fail"):
            raise RpcError(-32000, text.removeprefix("/fail").strip() or "the model failed")
        if text.startswith("/wait"):
            await send_part({"type": "text", "value": "waiting"})
            self.waiting.set()
            await cancel.wait()
            self.cancelled += 1
            return {"stopReason": "cancelled"}
        if text.startswith("/call "):
            name, _, arguments = text.removeprefix("/call ").partition(" ")
            call = {
                "type": "tool_call",
                "callId": f"call_{len(self.calls)}",
                "name": name,
                "input": json.loads(arguments),
            }
            await send_part(call)
            return {"stopReason": "tool_calls"}
        words = f"{params['modelId']} heard: {text}".split(" ")
        for index, word in enumerate(words):
            await send_part({"type": "text", "value": word if index == 0 else " " + word})
        return {"stopReason": "end_turn", "usage": {"inputTokens": 11, "outputTokens": len(words)}}


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            texts = [p.get("value", "") for p in message.get("content") or () if p.get("type") == "text"]
            if texts:
                return "".join(texts)
    return ""


# -- MCP ------------------------------------------------------------------------------------------------------------

MCP_TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather — in a city.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"name": "erase", "description": "", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": True}},
    {"name": "broken", "description": "b", "inputSchema": {"type": "object", "properties": {"n": {"type": 5}}}},
]


def mcp_initialize(version: str, request_id: int | str = 0) -> dict[str, Any]:
    """An MCP client's ``initialize`` at ``version``."""
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}


# What an agent asks once its MCP session is open: the tool list, a ping, a call, a call with invalid arguments, one
# of a tool not offered, one of a tool whose schema is invalid.
MCP_DIALOGUE = [
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": "two", "method": "ping"},
    {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "get_weather", "arguments": {"city": "Oslo"}},
    },
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "get_weather", "arguments": {}}},
    {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "nowhere"}},
    {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "broken", "arguments": {}}},
]
