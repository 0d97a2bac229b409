"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``): request model, translation, the response
object and its event stream, and the store that makes ``previous_response_id`` work.

Owns reading ``input`` (a string, or message / ``function_call`` / ``function_call_output`` / ``reasoning`` items)
and ``instructions`` into editor-protocol messages, and ``tools`` (function tools, and namespace tools as
``<namespace>__<name>``, whose calls go back out in their namespace); writing the turn back as output items —
``reasoning`` (the agent's thoughts and activity), ``message`` (its text) and ``function_call`` (the client's tools;
every call of the turn in one response) — in one object or as the event sequence ``response.created`` …
``response.completed`` (``response.incomplete`` for a length stop, ``response.failed`` for an error after the
stream began); and the bounded in-memory store of responses (``store``, default true) that
``previous_response_id`` continues from.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from session.messages import Message, Part, ToolCallPart

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

__all__ = ["ResponseStore", "Responses"]


class _Tool(ApiBody):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # a namespace's function tools


# A namespace's tool as the agent or model sees it: "<namespace>__<name>" (Codex gives MCP servers' tools as
# namespace tools; providers and agents take only plain names, letters, digits, '_' and '-').
NAMESPACE_JOIN = "__"


class ResponsesBody(ApiBody):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: Any = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass
class _Stored:
    parent: str | None
    messages: list[dict[str, Any]]  # this request's new input and the response, as editor messages
    response: dict[str, Any]
    conversation: str
    principal: str  # whose it is: another principal's request finds nothing under its id


class ResponseStore:
    """The ``limit`` newest stored responses; a chain whose start was evicted can no longer be continued (the
    client gets a 400 naming ``previous_response_id`` and can send the whole input instead)."""

    def __init__(self, limit: int = 2048) -> None:
        self._responses: OrderedDict[str, _Stored] = OrderedDict()
        self._limit = limit

    def get(self, response_id: str, principal: str = "") -> dict[str, Any] | None:
        stored = self._responses.get(response_id)
        return stored.response if stored is not None and stored.principal == principal else None

    def history(self, response_id: str, principal: str = "") -> tuple[list[dict[str, Any]], str]:
        """The conversation up to and including ``response_id``, and its conversation scope: ``principal``'s own
        (another's is answered as if it were not stored, the same words)."""
        chain: list[_Stored] = []
        current: str | None = response_id
        while current is not None:
            stored = self._responses.get(current)
            if stored is None or stored.principal != principal:
                raise ApiError.bad_request(
                    f"previous response {current!r} is not stored here (lmbridge keeps the newest {self._limit}, "
                    "in memory); send the whole conversation as input instead",
                    "previous_response_id",
                )
            self._responses.move_to_end(current)
            chain.append(stored)
            current = stored.parent
        messages = [message for stored in reversed(chain) for message in stored.messages]
        return messages, chain[0].conversation

    def put(
        self,
        response: dict[str, Any],
        parent: str | None,
        messages: list[dict[str, Any]],
        conversation: str,
        principal: str = "",
    ) -> None:
        self._responses[response["id"]] = _Stored(parent, messages, response, conversation, principal)
        while len(self._responses) > self._limit:
            self._responses.popitem(last=False)


class Responses:
    name = "responses"
    body_model = ResponsesBody
    stream_by_accept = True

    def __init__(self, store: ResponseStore, *, echo: bool = True) -> None:
        """``echo``: response objects repeat the request's instructions and tools, as OpenAI's do (else they are
        left out: for agents, which never read them back)."""
        self.store = store
        self.echo = echo

    def parse(self, request: ResponsesBody, principal: str = "") -> ParsedRequest:
        new = _input_messages(request.input)
        if not new:
            raise ApiError.bad_request("input must hold at least one item", "input")
        earlier: list[dict[str, Any]] = []
        conversation = str((request.metadata or {}).get("lmbridge_conversation") or "")
        if request.previous_response_id:
            earlier, stored_conversation = self.store.history(request.previous_response_id, principal)
            conversation = conversation or stored_conversation
        system = [{"role": "system", "content": [text_part(request.instructions)]}] if request.instructions else []
        tools = []
        namespaced: dict[str, tuple[str, str]] = {}  # a namespace tool's joined name → (namespace, name)
        if request.tool_choice != "none":
            for index, tool in enumerate(request.tools or []):
                where = f"tools[{index}]"
                if tool.type == "function":
                    tools.append(function_tool(tool.name or "", tool.description, tool.parameters, where))
                elif tool.type == "namespace" and tool.name and isinstance(tool.tools, list):
                    for inner_index, inner in enumerate(tool.tools):
                        inner_where = f"{where}.tools[{inner_index}]"
                        name = inner.get("name") if isinstance(inner, dict) else None
                        if not isinstance(name, str) or inner.get("type", "function") != "function":
                            raise ApiError.bad_request("a namespace holds function tools with names", inner_where)
                        joined = f"{tool.name}{NAMESPACE_JOIN}{name}"
                        namespaced[joined] = (tool.name, name)
                        schema = inner.get("parameters")
                        tools.append(function_tool(joined, inner.get("description"), schema, inner_where))
                else:
                    raise ApiError.bad_request(
                        f"only function and namespace tools are supported, not {tool.type!r}", f"{where}.type"
                    )
        return ParsedRequest(
            model=request.model,
            messages=system + earlier + new,
            tools=tools,
            stream=request.stream,
            conversation=conversation,
            native_reasoning=True,
            settings=model_options(request.model_extra),
            effort=reasoning_effort(request.model_extra, "reasoning", "effort"),
            max_tokens=max_tokens(request.model_extra, "max_output_tokens"),
            history_stored=bool(earlier),
            extra={
                "new": new,
                "previous_response_id": request.previous_response_id,
                "store": request.store,
                "instructions": request.instructions,
                "metadata": request.metadata or {},
                "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
                "tool_choice": request.tool_choice or "auto",
                "namespaced": namespaced,
            },
        )

    @staticmethod
    def error_body(error: ApiError) -> dict[str, Any]:
        return openai_error_body(error)

    def stream(self, request: ParsedRequest) -> ResponsesStream:
        return ResponsesStream(self, request)

    def body(self, request: ParsedRequest, result: HttpTurnResult) -> dict[str, Any]:
        builder = _Output(request.extra["namespaced"])
        for part in result.parts:
            builder.add(part)
        response = _response(request, f"resp_{uuid.uuid4().hex}", int(time.time()), builder.items, result)
        self.remember(request, response, result)
        return response if self.echo else _without_echo(response)

    def remember(self, request: ParsedRequest, response: dict[str, Any], result: HttpTurnResult) -> None:
        if not request.extra["store"]:
            return
        messages = [*request.extra["new"], {"role": "assistant", "content": list(result.parts)}]
        principal = request.principal.id if request.principal is not None else ""
        self.store.put(response, request.extra["previous_response_id"], messages, request.conversation, principal)


class ResponsesStream:
    """The events of one streamed response, each with its ``sequence_number``."""

    def __init__(self, api: Responses, request: ParsedRequest) -> None:
        self._api = api
        self._request = request
        self._id = f"resp_{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._sequence = 0
        self._output = _Output(request.extra["namespaced"])
        self._echoed: str | None = None  # the response object's fields copied from the request, as JSON members

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(event, kind)

    def _response_event(self, kind: str, response: dict[str, Any]) -> bytes:
        """An event carrying the response object. Its copies of the request's instructions and tools (tens of KB
        for an agent) are encoded once a stream rather than in each of its three such events: the object is encoded
        without them and they are appended as its last members."""
        if self._echoed is None:
            echoed = _ECHOED if self._api.echo else ()
            self._echoed = "".join(f', "{key}": {json.dumps(response[key], ensure_ascii=False)}' for key in echoed)
        rest = _without_echo(response)
        text = json.dumps({"type": kind, "sequence_number": self._sequence, "response": rest}, ensure_ascii=False)
        self._sequence += 1
        return sse(text[:-2] + self._echoed + "}}", kind)  # the event's last member is the response object

    def start(self) -> list[bytes]:
        response = _response(self._request, self._id, self._created, [], None)
        return [
            self._response_event("response.created", response),
            self._response_event("response.in_progress", response),
        ]

    def part(self, part: dict[str, Any]) -> list[bytes]:
        output = self._output
        added = output.add(part)
        if added is None:
            return []
        closed, opened = added
        events = self._done(closed) if closed is not None else []
        item = output.current
        assert item is not None
        index = len(output.items) - 1
        ids = {"item_id": item["id"], "output_index": index}
        if opened is not None:
            events.append(self._event("response.output_item.added", output_index=index, item=_in_progress(item)))
            if item["type"] == "message":
                blank = {"type": "output_text", "text": "", "annotations": []}
                events.append(self._event("response.content_part.added", **ids, content_index=0, part=blank))
            elif item["type"] == "reasoning":
                blank = {"type": "summary_text", "text": ""}
                events.append(self._event("response.reasoning_summary_part.added", **ids, summary_index=0, part=blank))
        if item["type"] == "message":
            events.append(
                self._event("response.output_text.delta", **ids, content_index=0, delta=part["value"], logprobs=[])
            )
        elif item["type"] == "reasoning":
            events.append(
                self._event("response.reasoning_summary_text.delta", **ids, summary_index=0, delta=part["value"])
            )
        else:  # a function call is whole at once: its arguments in one delta, then done
            events.append(self._event("response.function_call_arguments.delta", **ids, delta=item["arguments"]))
            events += self._done(output.close())
        return events

    def _done(self, item: dict[str, Any] | None) -> list[bytes]:
        """The events that end an output item."""
        if item is None:
            return []
        ids = {"item_id": item["id"], "output_index": self._output.items.index(item)}
        events = []
        if item["type"] == "message":
            content = item["content"][0]
            events.append(
                self._event("response.output_text.done", **ids, content_index=0, text=content["text"], logprobs=[])
            )
            events.append(self._event("response.content_part.done", **ids, content_index=0, part=content))
        elif item["type"] == "reasoning":
            summary = item["summary"][0]
            events.append(
                self._event("response.reasoning_summary_text.done", **ids, summary_index=0, text=summary["text"])
            )
            events.append(self._event("response.reasoning_summary_part.done", **ids, summary_index=0, part=summary))
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"]
                )
            )
        events.append(self._event("response.output_item.done", output_index=ids["output_index"], item=item))
        return events

    def finish(self, result: HttpTurnResult) -> list[bytes]:
        events = self._done(self._output.close())
        response = _response(self._request, self._id, self._created, self._output.items, result)
        self._api.remember(self._request, response, result)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [*events, self._response_event(kind, response)]

    def error(self, error: ApiError) -> list[bytes]:
        response = _response(self._request, self._id, self._created, self._output.items, None)
        response["status"] = "failed"
        response["error"] = {"code": "server_error" if error.status >= 500 else error.kind, "message": error.message}
        return [*self._done(self._output.close()), self._response_event("response.failed", response)]

    @staticmethod
    def ping() -> bytes:
        return SSE_PING


_ECHOED = ("instructions", "tools")  # the response object's copies of the request's largest fields


def _without_echo(response: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in response.items() if key not in _ECHOED}


_ITEM_KINDS = {"thinking": "reasoning", "text": "message", "tool_call": "function_call"}  # part type → item type


class _Output:
    """The output items of a response, built from the turn's parts."""

    def __init__(self, namespaced: dict[str, tuple[str, str]]) -> None:
        self.items: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self._namespaced = namespaced  # a call of "<namespace>__<name>" goes out as <name> in its namespace

    def add(self, part: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
        """Add a part: adjacent text (or thinking) parts share an item, each tool call is an item of its own.
        Returns the item this closed and the item it opened (either may be None), or None for a part that has no
        place in the output."""
        kind = _ITEM_KINDS.get(part["type"])
        if kind is None:
            return None
        closed = opened = None
        if self.current is None or self.current["type"] != kind or kind == "function_call":
            closed = self.close()
            opened = self._open(kind, part)
        if kind != "function_call":
            assert self.current is not None
            holder = self.current["content" if kind == "message" else "summary"][0]
            holder["text"] += part["value"]
        return closed, opened

    def close(self) -> dict[str, Any] | None:
        """End the current item; returns it."""
        item, self.current = self.current, None
        return item

    def _open(self, kind: str, part: dict[str, Any]) -> dict[str, Any]:
        item: dict[str, Any]
        if kind == "message":
            item = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        elif kind == "reasoning":
            item = {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": ""}],
            }
        else:
            arguments = part["input"] if isinstance(part["input"], str) else json.dumps(part["input"])
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "completed",
                "call_id": part["callId"],
                "name": part["name"],
                "arguments": arguments,
            }
            if part["name"] in self._namespaced:
                item["namespace"], item["name"] = self._namespaced[part["name"]]
        self.items.append(item)
        self.current = item
        return item


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "reasoning":
        return {**item, "summary": []}
    return {**item, "status": "in_progress", "arguments": ""}


def _response(
    request: ParsedRequest, response_id: str, created: int, output: list[dict[str, Any]], result: HttpTurnResult | None
) -> dict[str, Any]:
    status, incomplete = "in_progress", None
    if result is not None:
        status = "completed"
        if result.stop_reason in ("max_tokens", "max_turn_requests"):
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        elif result.stop_reason == "refusal":
            status, incomplete = "incomplete", {"reason": "content_filter"}
    extra = request.extra
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": extra["instructions"],
        "max_output_tokens": None,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": extra["previous_response_id"],
        "reasoning": {"effort": None, "summary": None},
        "store": extra["store"],
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": extra["tool_choice"],
        "tools": extra["tools"],
        "top_p": None,
        "truncation": "disabled",
        "usage": _usage(result.usage) if result is not None else None,
        "metadata": extra["metadata"],
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Responses usage object from the agent's report; null when it reported no token counts."""
    tokens = reported_tokens(usage)
    if tokens is None or usage is None:
        return None
    out = {
        "input_tokens": tokens[0],
        "input_tokens_details": {"cached_tokens": usage.get("cachedReadTokens", 0)},
        "output_tokens": tokens[1],
        "output_tokens_details": {"reasoning_tokens": usage.get("thoughtTokens", 0)},
        "total_tokens": tokens[2],
    }
    if usage.get("estimated"):
        out["estimated"] = True  # lmbridge's estimate: the editor's model reported no counts
    return out


def _input_messages(raw: str | list[dict[str, Any]]) -> list[Message]:
    if isinstance(raw, str):
        return [{"role": "user", "content": [text_part(raw)]}] if raw else []
    messages: list[Message] = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError.bad_request("role must be user, assistant, system or developer", f"{where}.role")
            parts = _content(item.get("content"), where)
            messages.append({"role": "system" if role == "developer" else role, "content": parts})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise ApiError.bad_request("a function_call item needs call_id and name", where)
            arguments = item.get("arguments", "")
            namespace = item.get("namespace")
            call: ToolCallPart = {
                "type": "tool_call",
                "callId": call_id,
                "name": f"{namespace}{NAMESPACE_JOIN}{name}" if isinstance(namespace, str) and namespace else name,
                "input": parsed_arguments(arguments) if isinstance(arguments, str) else arguments,
            }
            messages.append({"role": "assistant", "content": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError.bad_request("a function_call_output item needs call_id", f"{where}.call_id")
            output = item.get("output", "")
            content = _content(output, f"{where}.output")
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "callId": call_id, "content": content}]}
            )
        elif kind == "reasoning":
            summary = item.get("summary") or []
            text = "".join(s.get("text", "") for s in summary if isinstance(s, dict))
            messages.append({"role": "assistant", "content": [{"type": "thinking", "value": text}]})
        else:
            raise ApiError.bad_request(f"unsupported input item type {kind!r}", f"{where}.type")
    return messages


def _content(content: Any, where: str) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [text_part(content)] if content else []
    if not isinstance(content, list):
        raise ApiError.bad_request("content must be a string or a list of content parts", where)
    parts: list[Part] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(text_part(part["text"]))
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(text_part(part["refusal"]))
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise ApiError.bad_request("input_image needs an image_url (file_id is not supported)", where)
            parts.append(image_part(url, f"{where}[{index}].image_url"))
        else:
            raise ApiError.bad_request(f"unsupported content part {kind!r}", f"{where}[{index}].type")
    return parts
