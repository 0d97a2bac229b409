"""The HTTP APIs' common ground, declared: what each API is (``HttpApi``: reading its request body, its error shape,
its response as one body or as a stream) and what one streamed response is (``ApiStream``); a request once read
(``ParsedRequest``) and a turn once run (``HttpTurnResult``); API errors; server-sent event framing; and the pieces the
translations share (parts, tools, images, usage).

May import: ``session`` (message checks, option choices), ``bridge.service`` (a resolved model), ``wire``. Knows no
connection: ``app`` serves, the API modules translate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from bridge.service.editor_models import EditorLink
from bridge.service.models import ModelEntry
from bridge.service.principals import Principal
from bridge.service.shared_models import SharedModel
from session.messages import DataPart, Message, TextPart, check_image_size
from session.options import read_choices
from wire.cancel import CancelRequest
from wire.errors import (
    AgentError,
    Draining,
    EditorModelError,
    InvalidParams,
    MessageError,
    RpcError,
    TooManyRequests,
    UnknownModel,
)

__all__ = [
    "SSE_PING",
    "ApiBody",
    "ApiError",
    "ApiStream",
    "EditorTarget",
    "HttpApi",
    "HttpTurnResult",
    "ParsedRequest",
    "sse",
]


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
        """The HTTP form of an error of the session path (``wire.errors``)."""
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
        if isinstance(error, Draining):
            return cls(503, "overloaded_error", str(error), retry_after=error.retry_after)
        if isinstance(error, EditorModelError):
            return cls(502, "api_error", str(error))
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
    messages: list[Message]
    tools: list[dict[str, Any]]  # {name, description, inputSchema}
    stream: bool = False
    include_usage: bool = False
    conversation: str = ""  # the client's name for the conversation (header or metadata), "" when none
    native_reasoning: bool = False  # the API has reasoning/thinking content for the agent's activity
    extra: dict[str, Any] = field(default_factory=dict)  # what only one API uses
    settings: tuple[tuple[str, Any], ...] = ()  # the agent's session options the client chose (``model_options``)
    effort: str | None = None  # the API's own reasoning effort, for the agent's thought-level option
    entry: ModelEntry | None = None  # ``model`` resolved (``TurnRunner.resolve``), once, when the request is read...
    editor_model: EditorTarget | None = None  # ...or, for ``editor/<id>``, the editor's model it names
    max_tokens: int | None = None  # the client's limit on the answer's length (an editor's model takes it)
    principal: Principal | None = None  # whose request it is (None: a process with one user)
    history_stored: bool = False  # part of the prompt is lmbridge's stored history (previous_response_id)
    body_bytes: int = 0  # the request body's length, when the body holds the whole prompt (0: unknown)


@dataclass
class HttpTurnResult:
    stop_reason: str  # an ACP stop reason, or "tool_calls" when the client was given calls to run
    usage: dict[str, Any] | None
    error: Exception | None = None
    parts: list[dict[str, Any]] = field(default_factory=list)  # what the client was sent, in order


@dataclass(frozen=True, slots=True)
class EditorTarget:
    """A model an editor shares, as a request named it: the model and the editor that answers for it."""

    name: str  # ``editor/<id>``, as the client wrote it
    model: SharedModel
    link: EditorLink
    # An agent's own model request: the prompt it serves, whose cancel ends the request too (an agent may leave its
    # model request open after its turn was cancelled).
    cancelled_with: CancelRequest | None = None


class ApiBody(BaseModel):
    """A request body of an API: its known fields checked, the rest kept (``model_extra``), never refused."""

    model_config = ConfigDict(extra="allow")


class ApiStream(Protocol):
    """One streamed response: each method returns the server-sent events to write, already framed (``sse``)."""

    def start(self) -> list[bytes]:
        """The events before the first part (written with the status line, at the first output)."""

    def part(self, part: dict[str, Any]) -> list[bytes]:
        """Events for a part the session sent the client (text, thinking, a call of one of its tools)."""

    def finish(self, result: HttpTurnResult) -> list[bytes]: ...

    def error(self, error: ApiError) -> list[bytes]:
        """An error after the stream began (before, the client gets an HTTP error status instead)."""

    def ping(self) -> bytes:
        """A keep-alive for a silent stream."""


class HttpApi(Protocol):
    """One HTTP API of the front (``openai_chat``, ``openai_responses``, ``anthropic_messages``)."""

    @property
    def name(self) -> str: ...

    @property
    def body_model(self) -> type[ApiBody]: ...

    @property
    def stream_by_accept(self) -> bool:
        """Whether ``Accept: text/event-stream`` asks for a stream when the body does not say."""

    def parse(self, body: Any, principal: str = "") -> ParsedRequest:
        """The validated ``body_model`` in the session path's terms; ``ApiError`` (400) naming the field at fault.
        ``principal``: whose request it is (what it refers to of earlier requests must be its own)."""

    def error_body(self, error: ApiError) -> dict[str, Any]: ...

    def stream(self, request: ParsedRequest) -> ApiStream: ...

    def body(self, request: ParsedRequest, result: HttpTurnResult) -> dict[str, Any]:
        """The whole response as one JSON body (a request that did not ask for a stream)."""


# -- server-sent events ------------------------------------------------------------------------------------------

SSE_PING = b": ping\n\n"  # a keep-alive any event-stream parser skips


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data`` (an object as JSON, or a string as it is), under ``event`` when given."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\ndata: {text}\n\n" if event else f"data: {text}\n\n").encode()


# -- pieces the API translations share ------------------------------------------------------------------------------


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


def max_tokens(extra: dict[str, Any] | None, *names: str) -> int | None:
    """The first of the body's ``names`` that holds a positive integer: the client's limit on the answer's length."""
    for name in names:
        value = (extra or {}).get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def reasoning_effort(extra: dict[str, Any] | None, *path: str) -> str | None:
    """An API's reasoning effort ("low", "high", …) at ``path`` in the body's fields, when the client gave one."""
    value: Any = extra or {}
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def text_part(value: str) -> TextPart:
    return {"type": "text", "value": value}


def image_part(url: str, where: str) -> DataPart:
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
