"""Anthropic Messages (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): request model, translation, the
message object and its event stream.

Owns reading ``system`` and ``messages`` (text, base64 images, ``tool_use``, ``tool_result`` with a string or a list
of blocks, ``thinking`` sent back) into editor-protocol messages; writing the turn back as content blocks —
``thinking`` (the agent's thoughts and activity), ``text``, ``tool_use`` (every call of the turn in one message) —
in one message or as the event sequence the SDKs expect (``message_start``, ``ping``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``; ``error`` after the stream began); and the token
estimate. ``usage`` holds what the agent reported; zeros when it reported nothing (the API requires numbers).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from session.messages import Message, Part, ToolResultPart
from session.tokens import estimate_message_tokens, estimate_tokens

from .api import (
    ApiBody,
    ApiError,
    HttpTurnResult,
    ParsedRequest,
    function_tool,
    model_options,
    reasoning_effort,
    reported_tokens,
    sse,
    text_part,
)

__all__ = ["Messages"]


class _Tool(ApiBody):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _Message(ApiBody):
    # "system": instructions between the turns (Claude Code sends them for newer models, e.g. its environment)
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensBody(ApiBody):
    model: str
    messages: list[_Message]
    system: str | list[dict[str, Any]] | None = None
    tools: list[_Tool] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesBody(CountTokensBody):
    max_tokens: int
    stream: bool = False
    metadata: dict[str, Any] | None = None


_STOP = {"tool_calls": "tool_use", "max_tokens": "max_tokens", "max_turn_requests": "max_tokens", "refusal": "refusal"}
_ERROR_TYPES = {413: "request_too_large", 401: "authentication_error", 403: "permission_error"}


class Messages:
    name = "messages"
    body_model = MessagesBody
    stream_by_accept = False  # its clients always say, with ``stream``

    @staticmethod
    def parse(request: CountTokensBody, principal: str = "") -> ParsedRequest:
        if not request.messages:
            raise ApiError.bad_request("messages must hold at least one message", "messages")
        system = _system(request.system)
        messages = [_message(m, f"messages[{index}]") for index, m in enumerate(request.messages)]
        tools = []
        if not (request.tool_choice and request.tool_choice.get("type") == "none"):
            for index, tool in enumerate(request.tools or []):
                if tool.type not in (None, "custom"):
                    raise ApiError.bad_request(
                        f"server tools ({tool.type}) are not supported; give client tools", f"tools[{index}].type"
                    )
                tools.append(function_tool(tool.name, tool.description, tool.input_schema, f"tools[{index}]"))
        metadata = getattr(request, "metadata", None) or {}
        stream = bool(getattr(request, "stream", False))
        return ParsedRequest(
            model=request.model,
            messages=system + messages,
            tools=tools,
            stream=stream,
            conversation=str(metadata.get("lmbridge_conversation") or ""),
            native_reasoning=True,
            settings=model_options(request.model_extra),
            effort=reasoning_effort(request.model_extra, "output_config", "effort"),
            max_tokens=getattr(request, "max_tokens", None),
        )

    @staticmethod
    def error_body(error: ApiError) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(error.status, error.kind)
        message = error.message
        if error.param and not message.startswith(error.param):  # the API has no field for it: say it in words
            message = f"{error.param}: {message}"
        return {"type": "error", "error": {"type": kind, "message": message}}

    @staticmethod
    def count_tokens(request: ParsedRequest) -> dict[str, Any]:
        count = sum(estimate_message_tokens(m, f"messages[{i}]") for i, m in enumerate(request.messages))
        count += sum(estimate_tokens(json.dumps(tool, ensure_ascii=False)) for tool in request.tools)
        return {"input_tokens": count}

    @staticmethod
    def stream(request: ParsedRequest) -> MessagesStream:
        return MessagesStream(request)

    @staticmethod
    def body(request: ParsedRequest, result: HttpTurnResult) -> dict[str, Any]:
        blocks: list[dict[str, Any]] = []
        for part in result.parts:
            block = _block(part)
            if block is None:
                continue
            if blocks and block["type"] in ("text", "thinking") and blocks[-1]["type"] == block["type"]:
                key = block["type"]
                blocks[-1][key] += block[key]
            else:
                blocks.append(block)
        return _message_object(request, f"msg_{uuid.uuid4().hex}", blocks, result)


class MessagesStream:
    def __init__(self, request: ParsedRequest) -> None:
        self._request = request
        self._id = f"msg_{uuid.uuid4().hex}"
        self._index = -1
        self._open: str | None = None  # the type of the content block being streamed

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, kind)

    def start(self) -> list[bytes]:
        message = _message_object(self._request, self._id, [], None)
        return [self._event("message_start", message=message), self.ping()]

    def part(self, part: dict[str, Any]) -> list[bytes]:
        block = _block(part)
        if block is None:
            return []
        events: list[bytes] = []
        kind = block["type"]
        if kind != self._open or kind == "tool_use":
            events += self._close()
            self._index += 1
            self._open = kind
            if kind == "tool_use":
                start = {**block, "input": {}}
            else:
                start = {**block, kind: ""}
            events.append(self._event("content_block_start", index=self._index, content_block=start))
        if kind == "text":
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        events.append(self._event("content_block_delta", index=self._index, delta=delta))
        if kind == "tool_use":
            events += self._close()
        return events

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        events = []
        if self._open == "thinking":
            delta = {"type": "signature_delta", "signature": ""}
            events.append(self._event("content_block_delta", index=self._index, delta=delta))
        self._open = None
        return [*events, self._event("content_block_stop", index=self._index)]

    def finish(self, result: HttpTurnResult) -> list[bytes]:
        usage = _usage(result.usage)
        delta = {"stop_reason": _STOP.get(result.stop_reason, "end_turn"), "stop_sequence": None}
        return [
            *self._close(),
            self._event("message_delta", delta=delta, usage=usage),
            self._event("message_stop"),
        ]

    def error(self, error: ApiError) -> list[bytes]:
        body = Messages.error_body(error)
        return [*self._close(), sse(body, "error")]

    @classmethod
    def ping(cls) -> bytes:
        return cls._event("ping")


def _message_object(
    request: ParsedRequest, message_id: str, content: list[dict[str, Any]], result: HttpTurnResult | None
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": _STOP.get(result.stop_reason, "end_turn") if result is not None else None,
        "stop_sequence": None,
        "usage": _usage(result.usage if result is not None else None),
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    tokens = reported_tokens(usage)
    out: dict[str, Any] = {"input_tokens": tokens[0] if tokens else 0, "output_tokens": tokens[1] if tokens else 0}
    if usage and "cachedReadTokens" in usage:
        out["cache_read_input_tokens"] = usage["cachedReadTokens"]
    if usage and "cachedWriteTokens" in usage:
        out["cache_creation_input_tokens"] = usage["cachedWriteTokens"]
    if usage and usage.get("estimated"):
        out["estimated"] = True  # lmbridge's estimate: the editor's model reported no counts
    return out


def _block(part: dict[str, Any]) -> dict[str, Any] | None:
    kind = part["type"]
    if kind == "text":
        return {"type": "text", "text": part["value"]}
    if kind == "thinking":
        return {"type": "thinking", "thinking": part["value"], "signature": ""}
    if kind == "tool_call":
        arguments = part["input"]
        if not isinstance(arguments, dict):
            arguments = {"input": arguments}
        return {"type": "tool_use", "id": part["callId"], "name": part["name"], "input": arguments}
    return None


def _system(system: str | list[dict[str, Any]] | None) -> list[Message]:
    if not system:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": [text_part(system)]}]
    text = "\n".join(block.get("text", "") for block in system if block.get("type") == "text")
    return [{"role": "system", "content": [text_part(text)]}] if text else []


def _message(message: _Message, where: str) -> Message:
    content = message.content
    if isinstance(content, str):
        return {"role": message.role, "content": [text_part(content)] if content else []}
    parts = []
    for index, block in enumerate(content):
        if message.role == "system" and block.get("type") != "text":
            raise ApiError.bad_request("a system message holds text blocks", f"{where}.content[{index}].type")
        parts += _parts(block, f"{where}.content[{index}]")
    return {"role": message.role, "content": parts}


def _parts(block: dict[str, Any], where: str) -> list[Part]:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return [text_part(block["text"])]
    if kind == "image":
        source = block.get("source")
        if not isinstance(source, dict) or source.get("type") != "base64":
            raise ApiError.bad_request("only base64 image sources are supported", f"{where}.source")
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise ApiError.bad_request("a base64 image source needs media_type and data", f"{where}.source")
        return [{"type": "data", "mimeType": media_type, "data": data}]
    if kind == "tool_use":
        call_id, name = block.get("id"), block.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise ApiError.bad_request("a tool_use block needs id and name", where)
        return [{"type": "tool_call", "callId": call_id, "name": name, "input": block.get("input", {})}]
    if kind == "tool_result":
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError.bad_request("a tool_result block needs tool_use_id", f"{where}.tool_use_id")
        raw = block.get("content", "")
        inner: list[Part] = []
        if isinstance(raw, str):
            inner = [text_part(raw)] if raw else []
        elif isinstance(raw, list):
            for index, item in enumerate(raw):
                if not isinstance(item, dict) or item.get("type") not in ("text", "image"):
                    raise ApiError.bad_request("a tool result holds text and image blocks", f"{where}.content[{index}]")
                inner += _parts(item, f"{where}.content[{index}]")
        else:
            raise ApiError.bad_request("content must be a string or a list of blocks", f"{where}.content")
        result: ToolResultPart = {"type": "tool_result", "callId": call_id, "content": inner}
        if block.get("is_error"):
            result["isError"] = True
        return [result]
    if kind in ("thinking", "redacted_thinking"):
        thinking = block.get("thinking")
        return [{"type": "thinking", "value": thinking if isinstance(thinking, str) else ""}]
    raise ApiError.bad_request(f"unsupported content block {kind!r}", f"{where}.type")
