"""MCP over streamable HTTP answered without the MCP SDK, for the revisions that open a session with ``initialize``.

Importing the SDK costs about half a second of CPU per lmbridge process. On a small machine that CPU is taken from
the agent, which is starting at the same moment: every agent's cold first chat paid for it (Claude Code's own start
is CPU-bound, and ~0.6 s of CPU beside it delays it by ~0.15 s), and Codex, which connects ~0.2 s after it was
spawned, waited for it. Yet what an agent asks of lmbridge's MCP server depends on nothing but the session's tools:
``mcp_synthetic.http`` answers it itself, in the SDK's words (the tests compare both, message by message, for every
revision answered here), and imports the SDK only when a request needs it.

Answered here: ``initialize`` (2024-11-05 … 2025-11-25), ``notifications/initialized``, ``tools/list``, ``ping``,
``tools/call`` (``EarlyCall``: the session's own ``SessionTools.call``, heartbeats included), ``notifications/
cancelled`` (``EarlyCancel``), the server's event stream (``GET``: ``EarlyStream``), the session's end (``DELETE``:
``EarlyEnd``), a session id not known (404), and MCP 2026-07-28's ``server/discover``, refused as a server of the
earlier revisions refuses it (``EarlyRefusal``), upon which clients open the session with ``initialize`` (the SDK's
client and Claude Code do). Everything else — a batch, another method, a resumed stream, a header or a message the
SDK would refuse — returns ``None``: the SDK takes the session over (``mcp_synthetic.http`` replays its
``initialize`` to it) and answers.

Owns the decisions only (sans-IO): given one HTTP request, what to do.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .server import DISCOVERY_REFUSAL, HEARTBEAT_MESSAGE, INSTRUCTIONS, SERVER_NAME, SERVER_VERSION

__all__ = [
    "EARLY_PROTOCOL_VERSIONS",
    "SESSION_HEADER",
    "EarlyAnswer",
    "EarlyCall",
    "EarlyCancel",
    "EarlyEnd",
    "EarlyRefusal",
    "EarlyStream",
    "answer_early",
    "list_changed_event",
    "progress_event",
    "result_event",
    "sse_headers",
    "stream_conflict",
]

# The revisions answered here: those of the SDK's that begin with ``initialize`` (it answers an unknown revision with
# its newest, which is left to it).
EARLY_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"


@dataclass(frozen=True, slots=True)
class EarlyAnswer:
    status: int  # 200 with one server-sent event, or 202 for a notification
    body: bytes
    session_id: str  # the MCP session the request opened or belongs to
    protocol_version: str
    opens_session: bool = False


@dataclass(frozen=True, slots=True)
class EarlyCall:
    """A ``tools/call`` to run now; its answer (``result_event``), and its heartbeats before that
    (``progress_event``, when the agent gave a progress token), go out as one event stream."""

    session_id: str
    request_id: str | int
    name: str
    arguments: dict[str, Any]
    progress_token: str | int | None


@dataclass(frozen=True, slots=True)
class EarlyCancel:
    """``notifications/cancelled`` for a request of an early session: withdraw that call if it runs; answer 202."""

    session_id: str
    request_id: str | int


@dataclass(frozen=True, slots=True)
class EarlyEnd:
    """``DELETE`` of an early session: the agent ends it; withdraw its calls and answer 200 (as the SDK does)."""

    session_id: str


@dataclass(frozen=True, slots=True)
class EarlyStream:
    """``GET`` of an early session: its event stream, held open for the server's notifications (the tool list
    changed) and pinged as the SDK pings it, until the agent hangs up or the session ends."""

    session_id: str


@dataclass(frozen=True, slots=True)
class EarlyRefusal:
    """A JSON-RPC error sent as JSON at an HTTP error status: ``server/discover``, which servers of the revisions
    answered here do not know (MCP 2026-07-28 clients take any error to it as "open the session with initialize"),
    an unknown session (404), a second event stream (409)."""

    status: int
    body: bytes
    session_id: str = ""  # sent back as the session's header (the SDK does for an existing session)


# What the SDK answers for a session id it does not know (MCP: the client then opens a new session).
_SESSION_NOT_FOUND = EarlyRefusal(
    404, b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'
)


def stream_conflict(session_id: str) -> EarlyRefusal:
    """The SDK's answer to a second event stream (GET) of a session: MCP allows one."""
    message = "Conflict: Only one SSE stream is allowed per session"
    body = compact_json({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}})
    return EarlyRefusal(409, body, session_id)


def sse_headers(session_id: str) -> list[tuple[bytes, bytes]]:
    """The SDK's headers for a response sent as a server-sent event stream."""
    return [
        (b"cache-control", b"no-cache, no-transform"),
        (b"content-type", b"text/event-stream"),
        (SESSION_HEADER, session_id.encode()),
        (b"x-accel-buffering", b"no"),
    ]


def answer_early(
    method: str,
    headers: Mapping[bytes, bytes],
    body: bytes,
    *,
    host: str,
    sessions: Mapping[str, str],
    listing: Callable[[], list[dict[str, Any]]],
) -> EarlyAnswer | EarlyCall | EarlyCancel | EarlyEnd | EarlyRefusal | EarlyStream | None:
    """What to do with one HTTP request of a route the SDK does not serve, or ``None`` to leave it to the SDK.

    ``headers``: lower-case names; ``host``: the listener's ``127.0.0.1:<port>`` (the SDK's DNS-rebinding check, kept
    here); ``sessions``: the route's MCP sessions, all opened here (id → negotiated protocol version); ``listing``:
    the session's tools as ``tools/list`` gives them."""
    if headers.get(b"host", b"").decode("latin-1") != host or b"origin" in headers:
        return None
    session_id = headers.get(SESSION_HEADER, b"").decode("latin-1")
    if session_id and session_id not in sessions:  # the route's sessions are all here: an ended one, or a stranger
        return _SESSION_NOT_FOUND
    accept = headers.get(b"accept", b"").decode("latin-1")
    if method in ("DELETE", "GET"):
        if not _in_session(headers, session_id, sessions):
            return None
        if method == "DELETE":
            return EarlyEnd(session_id)
        # The server's stream (MCP: for its own requests and notifications); resuming one is left to the SDK.
        return EarlyStream(session_id) if "text/event-stream" in accept and b"last-event-id" not in headers else None
    if method != "POST":
        return None
    content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if content_type != "application/json" or "application/json" not in accept or "text/event-stream" not in accept:
        return None
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    valid, request_id = request_id_of(message)
    if not valid:
        return None
    rpc_method = message["method"]
    if not session_id:
        if rpc_method == "server/discover" and request_id is not None:
            return EarlyRefusal(400, compact_json(discovery_refusal(request_id)))
        return _initialize(message, request_id) if rpc_method == "initialize" else None
    if not _in_session(headers, session_id, sessions):
        return None
    version = sessions[session_id]
    params = message.get("params")
    if request_id is None:
        if rpc_method == "notifications/initialized":
            return EarlyAnswer(202, b"", session_id, version)
        if rpc_method == "notifications/cancelled":
            cancelled = cancelled_request(params)
            if cancelled is not None:
                return EarlyCancel(session_id, cancelled)
        return None
    if rpc_method == "tools/list":
        return EarlyAnswer(200, result_event(request_id, {"tools": listing()}), session_id, version)
    if rpc_method == "ping":
        return EarlyAnswer(200, result_event(request_id, {}), session_id, version)
    if rpc_method == "tools/call":
        return tool_call(session_id, request_id, params)
    return None


def request_id_of(message: Any) -> tuple[bool, str | int | None]:
    """Whether ``message`` is a JSON-RPC 2.0 request or notification the SDK would take as one (a dict, a method
    name, an id that is a string or an integer), and its id (``None``: a notification)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return False, None
    request_id = message.get("id")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
        return False, None
    return True, request_id


def tool_call(session_id: str, request_id: str | int, params: Any) -> EarlyCall | None:
    """A ``tools/call`` to run, or ``None`` when its parameters are not what the SDK takes (its JSON-RPC error then
    says what is wrong)."""
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return None
    arguments = params.get("arguments") or {}
    meta = params.get("_meta") or {}
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    if not isinstance(arguments, dict) or isinstance(token, bool) or not isinstance(token, (str, int, type(None))):
        return None
    return EarlyCall(session_id, request_id, params["name"], arguments, token)


def cancelled_request(params: Any) -> str | int | None:
    """The request a ``notifications/cancelled`` withdraws, or ``None`` when it names none the SDK would take."""
    cancelled = params.get("requestId") if isinstance(params, dict) else None
    return cancelled if isinstance(cancelled, (str, int)) and not isinstance(cancelled, bool) else None


def _in_session(headers: Mapping[bytes, bytes], session_id: str, sessions: Mapping[str, str]) -> bool:
    """The request belongs to a session opened here, under its revision (a request without the version header is
    taken as of it, as the SDK takes it)."""
    version = sessions.get(session_id)
    return version is not None and headers.get(_VERSION_HEADER, version.encode()).decode("latin-1") == version


def _initialize(message: dict[str, Any], request_id: Any) -> EarlyAnswer | None:
    params = message.get("params")
    if request_id is None or not isinstance(params, dict):
        return None
    version = params.get("protocolVersion")
    if version not in EARLY_PROTOCOL_VERSIONS:
        return None
    body = result_event(request_id, initialize_result(version))
    return EarlyAnswer(200, body, secrets.token_hex(16), version, opens_session=True)


def initialize_result(version: str) -> dict[str, Any]:
    """The SDK's answer to ``initialize`` at a revision it speaks (one of ``EARLY_PROTOCOL_VERSIONS``)."""
    return {
        "capabilities": {"tools": {"listChanged": True}},
        "instructions": INSTRUCTIONS,
        "protocolVersion": version,
        "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
    }


def result_message(request_id: str | int, result: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC result."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


LIST_CHANGED_MESSAGE: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def progress_message(token: str | int, progress: float, message: str = HEARTBEAT_MESSAGE) -> dict[str, Any]:
    """A tool call's progress (``notifications/progress``: a heartbeat, or what it has so far)."""
    params = {"progressToken": token, "progress": progress, "message": message}
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}


def result_event(request_id: str | int, result: dict[str, Any]) -> bytes:
    """A JSON-RPC result as the SDK sends it: one server-sent event."""
    return _event(result_message(request_id, result))


def list_changed_event() -> bytes:
    """``notifications/tools/list_changed``, on a session's event stream."""
    return _event(LIST_CHANGED_MESSAGE)


def progress_event(token: str | int, progress: float, message: str = HEARTBEAT_MESSAGE) -> bytes:
    """A tool call's progress, on its event stream."""
    return _event(progress_message(token, progress, message))


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + compact_json(message) + b"\r\n\r\n"


def discovery_refusal(request_id: str | int) -> dict[str, Any]:
    """The JSON-RPC error to ``server/discover`` of a server of the revisions answered here."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": DISCOVERY_REFUSAL}}


def compact_json(message: dict[str, Any]) -> bytes:
    """One message as the SDK encodes it: no spaces, UTF-8 kept."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
