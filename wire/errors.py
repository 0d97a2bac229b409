"""Every error lmbridge reports to a peer: the JSON-RPC error codes and the exception types that carry them.

One vocabulary for every front. The editor front sends these as JSON-RPC error objects (``to_dict``); other fronts
map the *types* to their own shapes (an HTTP front: ``InvalidParams`` → 400, ``UnknownModel`` → 404,
``TooManyRequests`` → 429, ``AgentError`` → 502). Code that handles an error catches its type, never its name.

Whose fault, as in h11: ``InvalidParams`` and its subclasses are the client's (fix the request); ``AgentError`` and
its subclasses are the agent's (its process, its answers); ``InternalError`` is lmbridge's own.

This module imports nothing: every layer may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AGENT_ERROR",
    "AGENT_EXITED",
    "AGENT_START_FAILED",
    "DRAINING",
    "EDITOR_MODEL_FAILED",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "SCOPE_MISSING",
    "TOO_MANY_REQUESTS",
    "AgentError",
    "AgentExitedError",
    "AgentReplyError",
    "AgentStartError",
    "Draining",
    "EditorModelError",
    "InternalError",
    "InvalidParams",
    "MessageError",
    "RpcError",
    "ScopeMissing",
    "TooManyRequests",
    "UnknownModel",
]

# -- codes -------------------------------------------------------------------------------------------------------

# JSON-RPC 2.0's own.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# LSP's code for a request the client cancelled; ACP uses the same value.
REQUEST_CANCELLED = -32800
# lmbridge's (docs/protocol.md, "Errors").
AGENT_START_FAILED = -32001  # the agent could not be started or did not complete initialize
AGENT_EXITED = -32002  # the agent process exited during the turn
AGENT_ERROR = -32003  # the agent answered with an error, or with something that is not an answer
TOO_MANY_REQUESTS = -32004  # a limit on requests in flight was reached; retry after an answer came
EDITOR_MODEL_FAILED = -32005  # a model an editor shares failed, refused, timed out, or its editor went away
SCOPE_MISSING = -32006  # the key the connection was opened with lacks the scope this method needs
DRAINING = -32007  # the daemon is stopping: it finishes what runs and opens no new conversation; retry elsewhere


class RpcError(Exception):
    """A JSON-RPC error object: raised by handlers, and by ``request`` when the peer answers with an error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.message!r})"


# -- the client's fault -------------------------------------------------------------------------------------------


class InvalidParams(RpcError):
    """-32602, naming the offending field (a path such as ``messages[3].content[0].callId``) so the caller can fix
    it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(INVALID_PARAMS, f"Invalid params: {field}: {problem}", {"field": field})
        self.field = field
        self.problem = problem


class MessageError(InvalidParams):
    """A malformed message or part in a conversation history (raised by the sans-IO session layer)."""


class UnknownModel(InvalidParams):
    """The request names a model (an agent id, or ``agent/model``) that is not configured."""

    def __init__(self, model: str, known: list[str], *, field: str = "modelId") -> None:
        super().__init__(field, f"unknown model {model!r}; known models: {', '.join(sorted(known))}")
        self.model = model
        self.known = sorted(known)


class TooManyRequests(RpcError):
    """-32004: a limit was reached. ``limit``: its value; ``retry_after``: seconds after which trying again is
    sensible; ``name``: which limit, when it is one of a key's (``requests_per_minute``, ...)."""

    def __init__(self, message: str, *, limit: int, retry_after: float = 1.0, name: str = "") -> None:
        data: dict[str, Any] = {"limit": limit, "retryAfter": retry_after}
        if name:
            data["name"] = name
        super().__init__(TOO_MANY_REQUESTS, message, data)
        self.limit = limit
        self.retry_after = retry_after
        self.name = name


class Draining(RpcError):
    """-32007: the daemon is stopping (draining): the turns it runs finish, a new conversation is not opened here.
    Another node (or this one, restarted) takes it: the request carries its whole history."""

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__(
            DRAINING,
            "lmbridge is stopping and opens no new conversation; send the request again (to another node)",
            {"retryAfter": retry_after},
        )
        self.retry_after = retry_after


class ScopeMissing(RpcError):
    """-32006: the caller's key was not given the scope a request needs (``lmbridge keys add --scope``)."""

    def __init__(self, scope: str, has: list[str]) -> None:
        super().__init__(
            SCOPE_MISSING,
            f"this key lacks the {scope!r} scope (it has: {', '.join(sorted(has)) or 'none'}); ask the operator for "
            "a key with it",
            {"scope": scope},
        )
        self.scope = scope


# -- the agent's fault --------------------------------------------------------------------------------------------


class AgentError(RpcError):
    """Something went wrong on the agent's side. ``retryable``: the same request may succeed if sent again (the agent
    was restarted, or was only slow)."""

    retryable = False

    def __init__(self, code: int, message: str, data: Any = None, *, agent: str | None = None) -> None:
        super().__init__(code, message, data)
        self.agent = agent


class AgentStartError(AgentError):
    """-32001: the agent could not be started or did not complete ``initialize``; ``data`` has its stderr tail."""

    def __init__(self, agent_id: str, problem: str, stderr: str = "", exit_code: int | None = None) -> None:
        message = f"agent {agent_id!r} failed to start: {problem}"
        if stderr:
            message += f" (last stderr line: {stderr.splitlines()[-1][:200]})"
        super().__init__(
            AGENT_START_FAILED, message, {"agent": agent_id, "stderr": stderr, "exitCode": exit_code}, agent=agent_id
        )


class AgentExitedError(AgentError):
    """-32002: the agent process exited while a turn depended on it; ``data`` has its stderr tail."""

    retryable = True

    def __init__(self, agent_id: str, exit_code: int | None, stderr: str) -> None:
        how = (
            f"with code {exit_code}"
            if exit_code is not None and exit_code >= 0
            else (f"on signal {-exit_code}" if exit_code is not None else "(connection lost)")
        )
        message = (
            f"agent {agent_id!r} exited {how} during the turn; lmbridge starts it again: send the request again, "
            "the conversation continues"
        )
        if stderr:
            message += f" (last stderr line: {stderr.splitlines()[-1][:200]})"
        data = {"agent": agent_id, "stderr": stderr, "exitCode": exit_code, "retryable": True}
        super().__init__(AGENT_EXITED, message, data, agent=agent_id)
        self.exit_code = exit_code


class AgentReplyError(AgentError):
    """-32003: the agent answered with an error, or with something that is not a valid answer."""

    def __init__(self, message: str, data: Any = None, *, agent: str | None = None) -> None:
        super().__init__(AGENT_ERROR, message, data, agent=agent)

    @classmethod
    def from_agent_error(
        cls, error: RpcError, *, what: str = "the prompt", agent: str | None = None
    ) -> AgentReplyError:
        """The agent answered a request with a JSON-RPC error: quote it."""
        return cls(
            f"the agent answered {what} with an error: {error.message}", {"agentError": error.to_dict()}, agent=agent
        )


class AgentTimeoutError(AgentError):
    """-32003: the agent did not answer a request within its deadline; lmbridge restarted it."""

    retryable = True

    def __init__(self, agent_id: str, step: str, seconds: float) -> None:
        super().__init__(
            AGENT_ERROR,
            f"agent {agent_id!r} did not answer {step} within {seconds:g} s; lmbridge restarted it. Send the request "
            "again; if this keeps happening, look at the agent's log, or raise [sessions] agent_request_timeout",
            {"agent": agent_id, "step": step, "timeoutSeconds": seconds},
            agent=agent_id,
        )
        self.step = step


# -- the editor's fault (a model it shares) -------------------------------------------------------------------------


class EditorModelError(RpcError):
    """-32005: a call to a model an editor shares failed — the editor answered with an error (no such model, the
    user's consent refused, a quota, the model's own error), took longer than the limit, or went away."""

    def __init__(self, message: str, *, model: str, editor_error: dict[str, Any] | None = None) -> None:
        data: dict[str, Any] = {"model": model}
        if editor_error is not None:
            data["editorError"] = editor_error
        super().__init__(EDITOR_MODEL_FAILED, message, data)
        self.model = model

    @classmethod
    def from_editor(cls, error: RpcError, model: str) -> EditorModelError:
        """The editor's own error answer, quoted."""
        return cls(
            f"the editor's model {model!r} failed: {error.message}",
            model=model,
            editor_error={"code": error.code, "message": error.message},
        )


# -- lmbridge's own fault -----------------------------------------------------------------------------------------


class InternalError(RpcError):
    """-32603: a bug or an impossible situation in lmbridge (the log has the details)."""

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(INTERNAL_ERROR, message, data)
