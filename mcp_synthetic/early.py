"""The opening of an MCP session over streamable HTTP, answered before the MCP SDK is imported.

A cold lmbridge imports the SDK (about half a second of CPU) in a worker thread while the agent starts. An agent that
connects to its MCP servers before its first model call — Codex does, about 0.2 s after it was spawned — would wait
that long for ``initialize`` and ``tools/list``, whose answers depend on nothing but the session's tools. So
``mcp_synthetic.http`` gives them itself, in the SDK's words (the tests compare both, for every protocol version
answered here), and hands the session to the SDK once it is imported, by replaying the agent's ``initialize`` to it.

Tool calls made before the SDK is imported are run here too (``EarlyCall``: the session's own ``SessionTools.call``,
its answer and heartbeats sent as the SDK sends them), and the agent may cancel them (``EarlyCancel``): at machine
speed (a local model) the first call can come while the import still runs.

Owns the decisions only (sans-IO): given one HTTP request, what to do, or ``None`` — "wait for the SDK", which is what
happens to anything unusual: another protocol revision, a batch, a GET stream, a header or a message the SDK would
refuse.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .server import HEARTBEAT_MESSAGE, INSTRUCTIONS, SERVER_NAME, SERVER_VERSION

__all__ = [
    "EARLY_PROTOCOL_VERSIONS",
    "SESSION_HEADER",
    "EarlyAnswer",
    "EarlyCall",
    "EarlyCancel",
    "answer_early",
    "progress_event",
    "result_event",
    "sse_headers",
]

# The revisions whose session opening is answered here: those of the SDK's that begin with ``initialize`` (it
# answers an unknown revision with its newest, which is left to it).
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
) -> EarlyAnswer | EarlyCall | EarlyCancel | None:
    """What to do with one HTTP request made before the SDK is imported, or ``None`` to leave it to the SDK.

    ``headers``: lower-case names; ``host``: the listener's ``127.0.0.1:<port>`` (the SDK's DNS-rebinding check, kept
    here); ``sessions``: the MCP sessions opened early so far (id → negotiated protocol version); ``listing``: the
    session's tools as ``tools/list`` gives them."""
    if method != "POST" or headers.get(b"host", b"").decode("latin-1") != host or b"origin" in headers:
        return None
    accept = headers.get(b"accept", b"").decode("latin-1")
    content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if content_type != "application/json" or "application/json" not in accept or "text/event-stream" not in accept:
        return None
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return None
    request_id = message.get("id")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
        return None
    session_id = headers.get(SESSION_HEADER, b"").decode("latin-1")
    rpc_method = message["method"]
    if not session_id:
        return _initialize(message, request_id) if rpc_method == "initialize" else None
    version = sessions.get(session_id)
    if version is None or headers.get(_VERSION_HEADER, version.encode()).decode("latin-1") != version:
        return None
    params = message.get("params")
    if request_id is None:
        if rpc_method == "notifications/initialized":
            return EarlyAnswer(202, b"", session_id, version)
        if rpc_method == "notifications/cancelled" and isinstance(params, dict):
            cancelled = params.get("requestId")
            if isinstance(cancelled, (str, int)) and not isinstance(cancelled, bool):
                return EarlyCancel(session_id, cancelled)
        return None
    if rpc_method == "tools/list":
        return EarlyAnswer(200, result_event(request_id, {"tools": listing()}), session_id, version)
    if rpc_method == "ping":
        return EarlyAnswer(200, result_event(request_id, {}), session_id, version)
    if rpc_method == "tools/call" and isinstance(params, dict) and isinstance(params.get("name"), str):
        arguments = params.get("arguments") or {}
        meta = params.get("_meta") or {}
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if not isinstance(arguments, dict) or isinstance(token, bool) or not isinstance(token, (str, int, type(None))):
            return None  # the SDK's JSON-RPC error says what is wrong
        return EarlyCall(session_id, request_id, params["name"], arguments, token)
    return None


def _initialize(message: dict[str, Any], request_id: Any) -> EarlyAnswer | None:
    params = message.get("params")
    if request_id is None or not isinstance(params, dict):
        return None
    version = params.get("protocolVersion")
    if version not in EARLY_PROTOCOL_VERSIONS:
        return None
    result = {
        "capabilities": {"tools": {"listChanged": True}},
        "instructions": INSTRUCTIONS,
        "protocolVersion": version,
        "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
    }
    return EarlyAnswer(200, result_event(request_id, result), secrets.token_hex(16), version, opens_session=True)


def result_event(request_id: str | int, result: dict[str, Any]) -> bytes:
    """A JSON-RPC result as the SDK sends it: one server-sent event."""
    return _event({"jsonrpc": "2.0", "id": request_id, "result": result})


def progress_event(token: str | int, beat: int) -> bytes:
    """A tool call's heartbeat (``notifications/progress``), on that call's event stream."""
    params = {"progressToken": token, "progress": beat, "message": HEARTBEAT_MESSAGE}
    return _event({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


def _event(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    return b"event: message\r\ndata: " + data.encode() + b"\r\n\r\n"
