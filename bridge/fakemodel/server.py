"""A fake model server for real agents: one HTTP/1.1 server on 127.0.0.1 speaking four streaming APIs, answering
every model request with the next turn of a script, and recording every request it receives.

Owns:
- the script vocabulary (``say``, ``call``, ``parallel``, ``stall``; a ``Turn`` is one model response; a ``Call``
  names its tool, or picks it from the tools the request offers by a glob: ``Call("", {...}, offered="*echo")``);
- the four wire formats: Anthropic Messages SSE (``POST /v1/messages``), OpenAI Responses SSE
  (``POST /v1/responses``), OpenAI Chat Completions SSE (``POST /v1/chat/completions``) and Gemini
  ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``;
- a small HTTP/1.1 server in Trio (keep-alive, Content-Length or chunked request bodies, chunked SSE responses);
- the record: each request's API, path and parsed JSON body, with accessors for what tests assert (the tools the
  agent offered the model, the tool results it sent back).

It runs in the caller's nursery (``async with open_fake_model(...)``) and stops with it: no thread, no task
outlives the block. It never connects anywhere; it only listens on 127.0.0.1.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import math
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trio

__all__ = [
    "Call",
    "FakeModel",
    "ModelRequest",
    "Text",
    "ToolResult",
    "Turn",
    "call",
    "open_fake_model",
    "parallel",
    "say",
    "stall",
]

# -- the script ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    chunks: int = 3  # streamed in this many deltas


@dataclass(frozen=True, slots=True)
class Call:
    """A function call, named as the *model* sees the tool (``mcp__editor__x`` for Claude Code, ``x`` in namespace
    ``mcp__editor`` for Codex, ``mcp_editor_x`` for Gemini CLI, or a built-in tool such as ``Bash``)."""

    name: str
    arguments: dict[str, Any]
    namespace: str | None = None  # OpenAI Responses only: the namespace of an MCP tool
    offered: str | None = None  # globs (``a*|*b``): call the first offered tool whose name matches (name unused)

    def resolve(self, request: ModelRequest) -> Call:
        """This call with ``offered`` resolved against the tools ``request`` offers (unchanged when none match)."""
        if self.offered is None:
            return self
        for listed in request.tool_names:
            if any(fnmatch.fnmatchcase(listed, pattern) for pattern in self.offered.split("|")):
                namespace, _, name = listed.rpartition("/") if request.api == "openai" else ("", "", listed)
                return Call(name, self.arguments, namespace or None)
        return Call(self.offered, self.arguments, self.namespace)


@dataclass(frozen=True, slots=True)
class Turn:
    """One model response: text and/or tool calls, in order. ``stall``: after sending them, keep the response
    open (no stop event) until the client disconnects."""

    items: tuple[Text | Call, ...]
    stall: bool = False

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(item for item in self.items if isinstance(item, Call))

    def resolve(self, request: ModelRequest) -> Turn:
        if not any(isinstance(item, Call) and item.offered for item in self.items):
            return self
        items = tuple(item.resolve(request) if isinstance(item, Call) else item for item in self.items)
        return Turn(items, self.stall)


def say(text: str, chunks: int = 3) -> Turn:
    return Turn((Text(text, chunks),))


def call(tool: Call, text: str = "") -> Turn:
    return Turn(((Text(text, 1),) if text else ()) + (tool,))


def parallel(*tools: Call) -> Turn:
    return Turn(tools)


def stall(text: str = "") -> Turn:
    return Turn((Text(text, 1),) if text else (), stall=True)


FAKE_MODEL_ID = "fake-model"
_EXHAUSTED = say("[fake model: the script has no more turns]", 1)

# -- the record ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str  # the id the model gave the call (Gemini: the function name, it has no ids)
    text: str


@dataclass(eq=False)
class ModelRequest:
    api: str  # "anthropic" | "openai" (Responses) | "openai-chat" (Chat Completions) | "gemini" | "other"
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any  # the parsed JSON body; None if there was none or it was not JSON
    turn: Turn | None = None  # the scripted turn that answered it; None for requests that are not model turns
    disconnected: trio.Event = field(default_factory=trio.Event)  # the connection that carried it has closed

    @property
    def tool_names(self) -> list[str]:
        """The tools offered to the model, as it would call them. OpenAI namespace tools are listed as
        ``<namespace>/<name>``."""
        body = self.body if isinstance(self.body, dict) else {}
        names: list[str] = []
        for tool in body.get("tools") or ():
            if self.api == "gemini":
                names += [f["name"] for f in tool.get("functionDeclarations") or () if "name" in f]
            elif self.api == "openai" and tool.get("type") == "namespace":
                names += [f"{tool['name']}/{t['name']}" for t in tool.get("tools") or () if "name" in t]
            elif self.api == "openai-chat" and isinstance(tool.get("function"), dict):
                names.append(tool["function"].get("name", ""))
            elif "name" in tool:
                names.append(tool["name"])
        return names

    def tool(self, name: str) -> dict[str, Any] | None:
        """The declaration of one offered tool (named as in ``tool_names``)."""
        body = self.body if isinstance(self.body, dict) else {}
        for tool in body.get("tools") or ():
            if self.api == "gemini":
                for declaration in tool.get("functionDeclarations") or ():
                    if declaration.get("name") == name:
                        return dict(declaration)
            elif self.api == "openai" and tool.get("type") == "namespace":
                for inner in tool.get("tools") or ():
                    if f"{tool['name']}/{inner.get('name')}" == name:
                        return dict(inner)
            elif self.api == "openai-chat" and isinstance(tool.get("function"), dict):
                if tool["function"].get("name") == name:
                    return dict(tool["function"])
            elif tool.get("name") == name:
                return dict(tool)
        return None

    @property
    def tool_results(self) -> list[ToolResult]:
        """The tool results the agent sent the model in this request (the whole history's)."""
        body = self.body if isinstance(self.body, dict) else {}
        results: list[ToolResult] = []
        if self.api == "anthropic":
            for message in body.get("messages") or ():
                for block in message.get("content") if isinstance(message.get("content"), list) else ():
                    if block.get("type") == "tool_result":
                        results.append(ToolResult(block.get("tool_use_id", ""), _flatten(block.get("content"))))
        elif self.api == "openai":
            for item in body.get("input") or ():
                if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
                    results.append(ToolResult(item.get("call_id", ""), _flatten(item.get("output"))))
        elif self.api == "openai-chat":
            for message in body.get("messages") or ():
                if isinstance(message, dict) and message.get("role") == "tool":
                    results.append(ToolResult(message.get("tool_call_id", ""), _flatten(message.get("content"))))
        elif self.api == "gemini":
            for content in body.get("contents") or ():
                for part in content.get("parts") or ():
                    response = part.get("functionResponse")
                    if isinstance(response, dict):
                        results.append(
                            ToolResult(
                                response.get("id") or response.get("name", ""), _flatten(response.get("response"))
                            )
                        )
        return results

    @property
    def text(self) -> str:
        """The whole request body as text, for "the prompt reached the model" assertions."""
        return json.dumps(self.body, ensure_ascii=False)


def _flatten(value: Any) -> str:
    """Tool result content as text: strings kept, text blocks joined, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_flatten(item) for item in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"])
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else json.dumps(value)


# -- the server ----------------------------------------------------------------------------------------------------


class FakeModel:
    """The script, the record and the request handlers. Use ``open_fake_model``."""

    def __init__(self, script: Iterable[Turn] = (), default: Turn | None = None) -> None:
        """``default``: the answer once the script is used up (else a marker text, counted in ``errors``)."""
        self.script: list[Turn] = list(script)
        self.default = default
        self.requests: list[ModelRequest] = []
        self.errors: list[str] = []  # requests the script could not answer: a test failure
        self.port = 0
        # Told of each request as it is recorded, before it is answered (``lmbridge fake-model --record``).
        self.on_request: Callable[[ModelRequest], None] | None = None
        self._changed = trio.Event()
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def turns(self) -> list[ModelRequest]:
        """The requests that were model turns (answered from the script), in order."""
        return [r for r in self.requests if r.turn is not None]

    def add(self, *turns: Turn) -> None:
        self.script.extend(turns)

    async def wait_for_turn(self, number: int) -> ModelRequest:
        """The ``number``-th model turn request (1-based), once it has arrived."""
        while len(self.turns) < number:
            await self._changed.wait()
        return self.turns[number - 1]

    async def changed(self) -> None:
        """Return once the next request has been recorded."""
        await self._changed.wait()

    def _record(self, request: ModelRequest) -> None:
        self.requests.append(request)
        if self.on_request is not None:
            self.on_request(request)
        self._changed.set()
        self._changed = trio.Event()

    def _next_turn(self, request: ModelRequest) -> Turn:
        if self.script:
            return self.script.pop(0)
        if self.default is not None:
            return self.default
        self.errors.append(f"unscripted model request #{len(self.turns) + 1}: {request.method} {request.path}")
        return _EXHAUSTED

    # -- HTTP ------------------------------------------------------------------------------------------------

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        reader = _Reader(stream)
        served: list[ModelRequest] = []
        try:
            while True:
                head = await reader.request()
                if head is None:
                    return
                if not await self._respond(stream, reader, served, *head):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, _BadRequest):
            return
        finally:
            for request in served:
                request.disconnected.set()
            await stream.aclose()

    async def _respond(
        self,
        stream: trio.SocketStream,
        reader: _Reader,
        served: list[ModelRequest],
        method: str,
        target: str,
        headers: dict[str, str],
        raw_body: bytes,
    ) -> bool:
        """Answer one request; False when the connection must close afterwards."""
        url = urlsplit(target)
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            body = None
        api, is_turn = _classify(method, url.path)
        request = ModelRequest(api, method, url.path, parse_qs(url.query), headers, body)
        served.append(request)
        keep_alive = headers.get("connection", "").lower() != "close"
        if not is_turn:
            self._record(request)
            status, answer = _side_answer(api, url.path, body)
            await _send_json(stream, status, answer, keep_alive, head_only=method == "HEAD")
            return keep_alive
        chore = _chore(body)
        if chore is None:
            request.turn = turn = self._next_turn(request).resolve(request)
        else:
            turn = chore  # the agent's own housekeeping: answered, not a turn of the script
        self._record(request)
        body = body if isinstance(body, dict) else {}
        whole = api in ("anthropic", "openai-chat") and body.get("stream") is not True
        if whole or url.path.endswith(":generateContent"):
            if turn.stall:
                await reader.wait_closed()
                return False
            await _send_json(stream, 200, _WHOLE[api](turn, body, next(self._ids)), keep_alive)
            return keep_alive
        frames, ending = _FRAMES[api](turn, body, url.path, next(self._ids))
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n" + (b"" if keep_alive else b"connection: close\r\n") + b"\r\n"
        )
        for frame in frames:
            await _send_chunk(stream, frame)
        if turn.stall:
            await reader.wait_closed()
            return False
        for frame in ending:
            await _send_chunk(stream, frame)
        await stream.send_all(b"0\r\n\r\n")
        return keep_alive


@asynccontextmanager
async def open_fake_model(
    script: Iterable[Turn] = (), *, default: Turn | None = None, port: int = 0
) -> AsyncIterator[FakeModel]:
    """Serve a ``FakeModel`` on 127.0.0.1 (``port``, else a free one) for the duration of the block."""
    model = FakeModel(script, default)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, model._serve_connection, port, host="127.0.0.1"))
        model.port = listeners[0].socket.getsockname()[1]
        yield model
        nursery.cancel_scope.cancel()


def _classify(method: str, path: str) -> tuple[str, bool]:
    """Which API a request belongs to, and whether it is a model turn (answered from the script)."""
    if path.startswith("/v1/messages"):
        return "anthropic", method == "POST" and path.rstrip("/") == "/v1/messages"
    if "/models/" in path and path.startswith("/v1"):
        if ":" in path.rsplit("/", 1)[-1]:
            action = path.rsplit(":", 1)[-1]
            return "gemini", method == "POST" and action in ("streamGenerateContent", "generateContent")
        return "gemini", False
    if path.rstrip("/").endswith("/responses"):
        return "openai", method == "POST"
    if path.rstrip("/").endswith("/chat/completions"):
        return "openai-chat", method == "POST"
    return "other", False


# Model requests an agent makes for itself, not for the conversation, recognised by their system prompt: Claude Code
# (adapter 0.5x and later) names each new session with one. They get a fixed answer and are not script turns.
_CHORES = {"You are naming a coding session": "Fake session title"}


def _chore(body: Any) -> Turn | None:
    system = json.dumps(body.get("system")) if isinstance(body, dict) else ""
    for marker, answer in _CHORES.items():
        if marker in system:
            return say(answer, 1)
    return None


def _side_answer(api: str, path: str, body: Any) -> tuple[int, Any]:
    """Requests that are not model turns: token counts get an estimate, everything else a 404."""
    size = len(json.dumps(body)) // 4 if body is not None else 0
    if api == "anthropic" and path.endswith("/count_tokens"):
        return 200, {"input_tokens": size}
    if api == "gemini" and path.endswith(":countTokens"):
        return 200, {"totalTokens": size}
    if path.rstrip("/").endswith("/v1/models"):  # OpenAI-compatible clients list the models first
        return 200, {"object": "list", "data": [{"id": FAKE_MODEL_ID, "object": "model", "owned_by": "lmbridge"}]}
    message = f"fake model server: no such endpoint {path}"
    return 404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}}


# -- the three APIs ------------------------------------------------------------------------------------------------


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _pieces(text: str, chunks: int) -> list[str]:
    if not text:
        return []
    size = max(1, math.ceil(len(text) / max(1, chunks)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _anthropic(turn: Turn, body: dict[str, Any], path: str, serial: int) -> tuple[list[bytes], list[bytes]]:
    model = body.get("model", "claude-fake")
    frames = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_fake_{serial}",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 12,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            },
        )
    ]
    for index, item in enumerate(turn.items):
        if isinstance(item, Text):
            frames.append(
                _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            frames += [
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}},
                )
                for piece in _pieces(item.text, item.chunks)
            ]
        else:
            frames.append(
                _sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {
                            "type": "tool_use",
                            "id": f"toolu_fake_{serial}_{index}",
                            "name": item.name,
                            "input": {},
                        },
                    },
                )
            )
            frames += [
                _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
                for piece in _pieces(json.dumps(item.arguments), 2)
            ]
        frames.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop_reason = "tool_use" if turn.calls else "end_turn"
    ending = [
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "usage": {"output_tokens": 7},
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return frames, ending


def _openai(turn: Turn, body: dict[str, Any], path: str, serial: int) -> tuple[list[bytes], list[bytes]]:
    response_id = f"resp_fake_{serial}"
    frames = [
        _sse(
            "response.created",
            {
                "type": "response.created",
                "response": {
                    "id": response_id,
                    "object": "response",
                    "status": "in_progress",
                    "model": body.get("model", "fake-model"),
                    "output": [],
                },
            },
        )
    ]
    for index, item in enumerate(turn.items):
        if isinstance(item, Text):
            item_id = f"msg_fake_{serial}_{index}"
            frames.append(
                _sse(
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {
                            "type": "message",
                            "id": item_id,
                            "role": "assistant",
                            "status": "in_progress",
                            "content": [],
                        },
                    },
                )
            )
            frames += [
                _sse(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "item_id": item_id,
                        "output_index": index,
                        "content_index": 0,
                        "delta": piece,
                    },
                )
                for piece in _pieces(item.text, item.chunks)
            ]
            frames.append(
                _sse(
                    "response.output_item.done",
                    {
                        "type": "response.output_item.done",
                        "output_index": index,
                        "item": {
                            "type": "message",
                            "id": item_id,
                            "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": item.text, "annotations": []}],
                        },
                    },
                )
            )
        else:
            function_call = {
                "type": "function_call",
                "id": f"fc_fake_{serial}_{index}",
                "call_id": f"call_fake_{serial}_{index}",
                "name": item.name,
                "arguments": json.dumps(item.arguments),
                "status": "completed",
            }
            if item.namespace:
                function_call["namespace"] = item.namespace
            frames.append(
                _sse(
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": index, "item": function_call},
                )
            )
            frames.append(
                _sse(
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": index, "item": function_call},
                )
            )
    ending = [
        _sse(
            "response.completed",
            {
                "type": "response.completed",
                "response": {
                    "id": response_id,
                    "object": "response",
                    "status": "completed",
                    "output": [],
                    "usage": {
                        "input_tokens": 12,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": 7,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": 19,
                    },
                },
            },
        )
    ]
    return frames, ending


def _gemini(turn: Turn, body: dict[str, Any], path: str, serial: int) -> tuple[list[bytes], list[bytes]]:
    model = path.rsplit("/", 1)[-1].split(":", 1)[0]

    def chunk(parts: list[dict[str, Any]], finish: bool) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        data: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": f"fake_{serial}"}
        if finish:
            candidate["finishReason"] = "STOP"
            data["usageMetadata"] = {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19}
        return _sse(None, data)

    frames: list[bytes] = []
    for item in turn.items:
        if isinstance(item, Text):
            frames += [chunk([{"text": piece}], False) for piece in _pieces(item.text, item.chunks)]
        else:
            frames.append(chunk([{"functionCall": {"name": item.name, "args": item.arguments}}], False))
    return frames, [chunk([{"text": ""}], True)]


def _chat_completion(turn: Turn, body: dict[str, Any], path: str, serial: int) -> tuple[list[bytes], list[bytes]]:
    """OpenAI Chat Completions, streamed: text deltas, then each tool call whole in one delta."""
    head = {"id": f"chatcmpl-fake-{serial}", "object": "chat.completion.chunk", "model": body.get("model", "fake")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse(None, {**head, "choices": [choice]})

    frames = [chunk({"role": "assistant", "content": ""})]
    calls = 0
    for index, item in enumerate(turn.items):
        if isinstance(item, Text):
            frames += [chunk({"content": piece}) for piece in _pieces(item.text, item.chunks)]
        else:
            call = {
                "index": calls,
                "id": f"call_fake_{serial}_{index}",
                "type": "function",
                "function": {"name": item.name, "arguments": json.dumps(item.arguments)},
            }
            frames.append(chunk({"tool_calls": [call]}))
            calls += 1
    usage = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    ending = [
        chunk({}, "tool_calls" if calls else "stop"),
        _sse(None, {**head, "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]
    return frames, ending


_FRAMES = {"anthropic": _anthropic, "openai": _openai, "openai-chat": _chat_completion, "gemini": _gemini}


def _anthropic_whole(turn: Turn, body: dict[str, Any], serial: int) -> Any:
    content: list[dict[str, Any]] = []
    for index, item in enumerate(turn.items):
        if isinstance(item, Text):
            content.append({"type": "text", "text": item.text})
        else:
            content.append(
                {"type": "tool_use", "id": f"toolu_fake_{serial}_{index}", "name": item.name, "input": item.arguments}
            )
    return {
        "id": f"msg_fake_{serial}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": content,
        "stop_reason": "tool_use" if turn.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


def _gemini_whole(turn: Turn, body: dict[str, Any], serial: int) -> Any:
    parts = [
        {"text": item.text} if isinstance(item, Text) else {"functionCall": {"name": item.name, "args": item.arguments}}
        for item in turn.items
    ]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19},
    }


def _chat_completion_whole(turn: Turn, body: dict[str, Any], serial: int) -> Any:
    text = "".join(item.text for item in turn.items if isinstance(item, Text))
    calls = [
        {
            "id": f"call_fake_{serial}_{index}",
            "type": "function",
            "function": {"name": item.name, "arguments": json.dumps(item.arguments)},
        }
        for index, item in enumerate(turn.items)
        if isinstance(item, Call)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-fake-{serial}",
        "object": "chat.completion",
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


# Non-streaming answers (Anthropic without ``"stream": true``, Gemini ``:generateContent``): agents use them for side
# requests; none was seen with the set-ups in ``kits``. Codex always streams.
_WHOLE = {"anthropic": _anthropic_whole, "openai-chat": _chat_completion_whole, "gemini": _gemini_whole}


# -- HTTP/1.1 framing ----------------------------------------------------------------------------------------------


class _BadRequest(Exception):
    pass


_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


class _Reader:
    """Reads HTTP/1.1 requests off a stream: the head, then a Content-Length or chunked body."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        data = await self._stream.receive_some(65536)
        self._buffer += data
        return bool(data)

    async def _until(self, marker: bytes, limit: int) -> bytes | None:
        while (end := self._buffer.find(marker)) < 0:
            if len(self._buffer) > limit:
                raise _BadRequest("head too long")
            if not await self._fill():
                if self._buffer:
                    raise _BadRequest("connection closed mid-request")
                return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + len(marker)]
        return line

    async def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not await self._fill():
                raise _BadRequest("connection closed mid-body")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def request(self) -> tuple[str, str, dict[str, str], bytes] | None:
        head = await self._until(b"\r\n\r\n", _MAX_HEAD)
        if head is None:
            return None
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, _version = request_line.split(" ", 2)
        except ValueError:
            raise _BadRequest(f"bad request line {request_line!r}") from None
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            await self._stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await self._until(b"\r\n", _MAX_HEAD)
                if size_line is None:
                    raise _BadRequest("connection closed mid-body")
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    while await self._until(b"\r\n", _MAX_HEAD):  # trailers, up to the empty line
                        pass
                    break
                body += await self._exactly(size)
                await self._exactly(2)
                if len(body) > _MAX_BODY:
                    raise _BadRequest("body too large")
            return method, target, headers, bytes(body)
        length = int(headers.get("content-length") or 0)
        if length > _MAX_BODY:
            raise _BadRequest("body too large")
        return method, target, headers, await self._exactly(length)

    async def wait_closed(self) -> None:
        """Read (and drop) whatever comes until the client closes the connection."""
        try:
            while await self._fill():
                self._buffer.clear()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _send_chunk(stream: trio.SocketStream, data: bytes) -> None:
    await stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))


async def _send_json(
    stream: trio.SocketStream, status: int, value: Any, keep_alive: bool, *, head_only: bool = False
) -> None:
    data = json.dumps(value).encode()
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
    if not keep_alive:
        head += "connection: close\r\n"
    await stream.send_all(head.encode() + b"\r\n" + (b"" if head_only else data))
