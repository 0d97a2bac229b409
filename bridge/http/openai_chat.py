"""OpenAI Chat Completions (``POST /v1/chat/completions``): request model, translation, responses and chunks.

Owns reading ``messages`` (system/developer, user text and images, assistant text and ``tool_calls``, ``tool``
results) into editor-protocol messages, and writing the turn back as one ``chat.completion`` or a stream of
``chat.completion.chunk`` events: text as ``content``, the client's tool calls as ``tool_calls`` (all calls of a
turn in one response), ``finish_reason`` from the stop reason, ``usage`` from what the agent reported (null when
it reported nothing). The agent's activity is text here: the API has no reasoning content.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from session.messages import Message, Part, ToolResultPart

from .api import (
    SSE_PING,
    ApiBody,
    ApiError,
    HttpTurnResult,
    ParsedRequest,
    function_tool,
    image_part,
    max_tokens,
    model_options,
    openai_error_body,
    parsed_arguments,
    reasoning_effort,
    reported_tokens,
    sse,
    text_part,
)

__all__ = ["ChatCompletions"]


class _Function(ApiBody):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(ApiBody):
    type: str = "function"
    function: _Function | None = None


class _CallFunction(ApiBody):
    name: str
    arguments: str = ""


class _ToolCall(ApiBody):
    id: str
    type: str = "function"
    function: _CallFunction


class _Message(ApiBody):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _StreamOptions(ApiBody):
    include_usage: bool = False


class ChatCompletionsBody(ApiBody):
    model: str
    messages: list[_Message]
    tools: list[_Tool] | None = None
    tool_choice: Any = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    metadata: dict[str, Any] | None = None


_FINISH = {"end_turn": "stop", "tool_calls": "tool_calls", "max_tokens": "length", "max_turn_requests": "length"}
_FINISH_OTHER = {"refusal": "content_filter", "cancelled": "stop"}


class ChatCompletions:
    name = "chat.completions"
    body_model = ChatCompletionsBody
    stream_by_accept = True

    @staticmethod
    def parse(request: ChatCompletionsBody, principal: str = "") -> ParsedRequest:
        if not request.messages:
            raise ApiError.bad_request("messages must hold at least one message", "messages")
        messages = [_message(message, f"messages[{index}]") for index, message in enumerate(request.messages)]
        tools = []
        if request.tool_choice != "none":
            for index, tool in enumerate(request.tools or []):
                if tool.type != "function" or tool.function is None:
                    raise ApiError.bad_request("only function tools are supported", f"tools[{index}].type")
                function = tool.function
                tools.append(function_tool(function.name, function.description, function.parameters, f"tools[{index}]"))
        metadata = request.metadata or {}
        return ParsedRequest(
            model=request.model,
            messages=[m for m in messages if m["content"] or m["role"] == "user"],
            tools=tools,
            stream=request.stream,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            conversation=str(metadata.get("lmbridge_conversation") or ""),
            settings=model_options(request.model_extra),
            effort=reasoning_effort(request.model_extra, "reasoning_effort"),
            max_tokens=max_tokens(request.model_extra, "max_completion_tokens", "max_tokens"),
        )

    @staticmethod
    def error_body(error: ApiError) -> dict[str, Any]:
        return openai_error_body(error)

    @staticmethod
    def stream(request: ParsedRequest) -> ChatStream:
        return ChatStream(request)

    @staticmethod
    def body(request: ParsedRequest, result: HttpTurnResult) -> dict[str, Any]:
        text = "".join(part["value"] for part in result.parts if part["type"] == "text")
        calls = [_call(part) for part in _calls(result.parts)]
        message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": _finish(result.stop_reason), "logprobs": None}
            ],
            "usage": _usage(result.usage),
        }


class ChatStream:
    """The ``chat.completion.chunk`` events of one streamed turn."""

    def __init__(self, request: ParsedRequest) -> None:
        self._request = request
        self._id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._request.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
        return sse(chunk)

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def part(self, part: dict[str, Any]) -> list[bytes]:
        if part["type"] == "text":
            return [self._chunk({"content": part["value"]})]
        if part["type"] == "tool_call":
            index = self._calls
            self._calls += 1
            return [self._chunk({"tool_calls": [{"index": index, **_call(part)}]})]
        return []

    def finish(self, result: HttpTurnResult) -> list[bytes]:
        events = [self._chunk({}, _finish(result.stop_reason))]
        if self._request.include_usage:
            usage = {"id": self._id, "object": "chat.completion.chunk", "created": self._created}
            usage |= {"model": self._request.model, "choices": [], "usage": _usage(result.usage)}
            events.append(sse(usage))
        return [*events, sse("[DONE]")]

    def error(self, error: ApiError) -> list[bytes]:
        return [sse(ChatCompletions.error_body(error))]

    @staticmethod
    def ping() -> bytes:
        return SSE_PING


def _message(message: _Message, where: str) -> Message:
    role = message.role
    if role == "function":
        raise ApiError.bad_request("the legacy 'function' role is not supported; use tools and 'tool'", f"{where}.role")
    if role == "tool":
        if not message.tool_call_id:
            raise ApiError.bad_request("a tool message needs tool_call_id", f"{where}.tool_call_id")
        result: ToolResultPart = {
            "type": "tool_result",
            "callId": message.tool_call_id,
            "content": _content(message.content, where),
        }
        return {"role": "user", "content": [result]}
    parts = _content(message.content, where)
    if role == "assistant":
        for index, call in enumerate(message.tool_calls or []):
            parts.append(
                {
                    "type": "tool_call",
                    "callId": call.id or f"{where}.tool_calls[{index}]",
                    "name": call.function.name,
                    "input": parsed_arguments(call.function.arguments),
                }
            )
    return {"role": "system" if role == "developer" else role, "content": parts}


def _content(content: str | list[dict[str, Any]] | None, where: str) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [text_part(content)] if content else []
    parts: list[Part] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(text_part(part["text"]))
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise ApiError.bad_request("image_url needs a url", f"{where}.content[{index}].image_url")
            parts.append(image_part(url, f"{where}.content[{index}].image_url"))
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(text_part(part["refusal"]))
        else:
            raise ApiError.bad_request(f"unsupported content part {kind!r}", f"{where}.content[{index}].type")
    return parts


def _calls(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [part for part in parts if part["type"] == "tool_call"]


def _call(part: dict[str, Any]) -> dict[str, Any]:
    arguments = part["input"] if isinstance(part["input"], str) else json.dumps(part["input"], ensure_ascii=False)
    return {
        "id": part["callId"],
        "type": "function",
        "function": {"name": part["name"], "arguments": arguments},
    }


def _finish(stop_reason: str) -> str:
    return _FINISH.get(stop_reason) or _FINISH_OTHER.get(stop_reason, "stop")


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's usage from the agent's report; null when the agent reported no token counts."""
    tokens = reported_tokens(usage)
    if tokens is None or usage is None:
        return None
    out: dict[str, Any] = {"prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": tokens[2]}
    if "cachedReadTokens" in usage:
        out["prompt_tokens_details"] = {"cached_tokens": usage["cachedReadTokens"]}
    if "thoughtTokens" in usage:
        out["completion_tokens_details"] = {"reasoning_tokens": usage["thoughtTokens"]}
    if usage.get("estimated"):
        out["estimated"] = True  # lmbridge's estimate: the editor's model reported no counts
    return out
