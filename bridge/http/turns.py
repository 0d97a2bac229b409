"""What every HTTP API shares: the request once parsed, the turn it runs on the session path, and API errors.

Owns the translation-independent half of a request: the client's tools (the permission tool passed through when the
client offers it, else asked about in words through ``session.permissions.PermissionQuestions``), the turn run
with ``BridgeService.chat`` (the same call the editor front makes), and what the client is owed at the end: the
parts it saw, whether it was given tool calls, the stop reason and the usage the agent reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.acp.vocabulary import TOOL_CALLS
from bridge.core.service import BridgeService
from bridge.errors import AgentError, InvalidParams, MessageError, RpcError, TooManyRequests, UnknownModel
from bridge.rpc.cancel import CancelRequest
from session.messages import check_image_size
from session.options import read_choices
from session.permissions import PermissionQuestions

__all__ = ["ApiError", "ParsedRequest", "TurnResult", "TurnRunner"]

PartCallback = Callable[[dict[str, Any]], Awaitable[None]]


class ApiError(Exception):
    """An error answered in the API's own shape: HTTP ``status``, an error ``kind`` (``invalid_request_error``,
    ``authentication_error``, ``not_found_error``, ``rate_limit_error``, ``api_error``, ...), a message saying what
    to do, and the request field at fault when there is one."""

    def __init__(
        self, status: int, kind: str, message: str, *, param: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @classmethod
    def bad_request(cls, message: str, param: str | None = None) -> ApiError:
        return cls(400, "invalid_request_error", message, param=param)

    @classmethod
    def from_error(cls, error: Exception) -> ApiError:
        """The HTTP form of an error of the session path (``bridge.errors``)."""
        if isinstance(error, ApiError):
            return error
        if isinstance(error, UnknownModel):
            known = ", ".join(error.known)
            return cls(
                404, "not_found_error", f"The model {error.model!r} does not exist; models: {known}", param="model"
            )
        if isinstance(error, InvalidParams):
            field_name = error.data.get("field") if isinstance(error.data, dict) else None
            return cls(400, "invalid_request_error", str(error), param=field_name)
        if isinstance(error, TooManyRequests):
            return cls(429, "rate_limit_error", str(error), retry_after=error.retry_after or 1.0)
        if isinstance(error, AgentError) and error.retryable:
            # The agent was restarted (or was only slow): the same request is expected to work, soon.
            return cls(503, "overloaded_error", f"the agent failed, retry: {error}", retry_after=1.0)
        if isinstance(error, AgentError):
            return cls(502, "api_error", f"the agent failed: {error}")
        if isinstance(error, RpcError):
            return cls(500, "api_error", str(error))
        return cls(500, "api_error", f"lmbridge failed: {type(error).__name__}: {error}")


@dataclass
class ParsedRequest:
    """A request of any of the APIs, in the session path's terms: editor-protocol messages and tools."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]  # {name, description, inputSchema}
    stream: bool = False
    include_usage: bool = False
    conversation: str = ""  # the client's name for the conversation (header or metadata), "" when none
    native_reasoning: bool = False  # the API has reasoning/thinking content for the agent's activity
    extra: dict[str, Any] = field(default_factory=dict)  # what only one API uses
    settings: tuple[tuple[str, Any], ...] = ()  # the agent's session options the client chose (``model_options``)
    effort: str | None = None  # the API's own reasoning effort, for the agent's thought-level option


@dataclass
class TurnResult:
    stop_reason: str  # an ACP stop reason, or "tool_calls" when the client was given calls to run
    usage: dict[str, Any] | None
    error: Exception | None = None
    parts: list[dict[str, Any]] = field(default_factory=list)  # what the client was sent, in order


class TurnRunner:
    """Runs the turns of every HTTP API on the bridge service; one per HTTP front."""

    def __init__(self, service: BridgeService, *, activity: str = "native", default_cwd: str | None = None) -> None:
        self.service = service
        self.questions = PermissionQuestions()
        self._activity = activity
        self._default_cwd = default_cwd or os.getcwd()

    def check_model(self, model: str) -> None:
        """``ApiError`` 404 for a model (an agent id, or ``agent/model``) lmbridge does not offer."""
        try:
            self.service.resolve_model(model)
        except UnknownModel as error:
            raise ApiError.from_error(error) from None

    async def run(
        self, request: ParsedRequest, on_part: PartCallback, cancel: CancelRequest, *, cwd: str | None = None
    ) -> TurnResult:
        """Run the turn; ``on_part`` gets each part meant for the client (text, thinking, tool calls of its tools).
        A permission request becomes a question in words when the client did not offer the permission tool."""
        permission = self.service.permission_tool
        offered = any(tool["name"] == permission["name"] for tool in request.tools)
        tools = request.tools if offered else [*request.tools, permission]
        messages = request.messages if offered else self.questions.restore(request.messages)
        sent: list[dict[str, Any]] = []
        calls = 0
        said = False  # text went out: a question starts on a paragraph of its own

        async def sink(part: dict[str, Any]) -> None:
            nonlocal calls, said
            if part["type"] == "tool_call" and part["name"] == permission["name"] and not offered:
                part = {"type": "text", "value": ("\n\n" if said else "") + self.questions.ask(part)}
            elif part["type"] == "tool_call":
                calls += 1
            said = said or part["type"] == "text"
            sent.append(part)
            await on_part(part)

        native = request.native_reasoning and self._activity == "native"
        outcome = await self.service.chat(
            request.model,
            messages,
            tools,
            sink,
            cancel,
            cwd=cwd or self._default_cwd,
            thinking=native,
            activity_as_thinking=native,
            scope=request.conversation,
            share_running=False,
            settings=self._settings(request),
        )
        stop_reason = outcome.stop_reason or "end_turn"
        if stop_reason == TOOL_CALLS and not calls:
            stop_reason = "end_turn"  # only a question was asked: the client's turn to speak
        return TurnResult(stop_reason, outcome.usage, outcome.error, sent)

    def _settings(self, request: ParsedRequest) -> tuple[tuple[str, Any], ...]:
        """The client's ``model_options``, and its reasoning effort as the agent's thought-level option when the
        agent offers that value (clients send an effort by habit: one the agent cannot take is not an error)."""
        if request.effort is None:
            return request.settings
        entry = self.service.resolve_model(request.model)
        level = next((o for o in entry.options if o.category == "thought_level" and o.kind == "select"), None)
        chosen = dict(request.settings)
        if level is not None and request.effort in level.values and level.id not in chosen:
            chosen[level.id] = request.effort
        return tuple(chosen.items())


# -- pieces the API translations share ------------------------------------------------------------------------------

SSE_COMMENT_PING = b": ping\n\n"  # a keep-alive any event-stream parser skips


def openai_error_body(error: ApiError) -> dict[str, Any]:
    """The error object of both OpenAI APIs."""
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": None}}


def model_options(extra: dict[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """The body's ``model_options`` (an lmbridge extension, e.g. the OpenAI SDK's ``extra_body``): the agent's
    session options, as ``options.modelOptions`` of the editor protocol."""
    try:
        return read_choices((extra or {}).get("model_options"), "model_options")
    except InvalidParams as error:
        raise ApiError.from_error(error) from None


def reasoning_effort(extra: dict[str, Any] | None, *path: str) -> str | None:
    """An API's reasoning effort ("low", "high", …) at ``path`` in the body's fields, when the client gave one."""
    value: Any = extra or {}
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def text_part(value: str) -> dict[str, Any]:
    return {"type": "text", "value": value}


def image_part(url: str, where: str) -> dict[str, Any]:
    """A ``data:`` URL (the only images a local agent can be given) as a data part; other URLs are refused."""
    if not url.startswith("data:"):
        raise ApiError.bad_request("only data: URLs (base64) are supported for images; fetch the image first", where)
    header, _, data = url[5:].partition(",")
    mime_type, _, encoding = header.partition(";")
    if encoding != "base64" or not mime_type:
        raise ApiError.bad_request("an image data: URL must be base64, e.g. data:image/png;base64,...", where)
    try:
        check_image_size(data, where)
    except MessageError as exc:
        raise ApiError.bad_request(exc.problem, where) from None
    return {"type": "data", "mimeType": mime_type, "data": data}


def parsed_arguments(arguments: str) -> Any:
    """A tool call's arguments as the session compares them: parsed JSON, or the string when it is not JSON."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def function_tool(name: str, description: str | None, parameters: Any, where: str) -> dict[str, Any]:
    if not name:
        raise ApiError.bad_request("a tool needs a name", where)
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ApiError.bad_request("a tool's parameters must be a JSON Schema object", where)
    return {"name": name, "description": description or "", "inputSchema": parameters}


def reported_tokens(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """``(input, output, total)`` tokens from the agent's report, or None when it reported no token counts: the
    APIs then say so (null usage, or zeros where the API requires numbers) rather than invent them."""
    if not usage or ("inputTokens" not in usage and "outputTokens" not in usage):
        return None
    prompt, completion = int(usage.get("inputTokens", 0)), int(usage.get("outputTokens", 0))
    return prompt, completion, int(usage.get("totalTokens", prompt + completion))
