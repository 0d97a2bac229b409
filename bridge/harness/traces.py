"""Wire traces as the harness reads them: the NDJSON files ``lmbridge stdio --trace-dir`` writes, read once or
followed while they grow, and the ACP facts in an agent's wire (requests and their answers, updates, cancels).

Owns the reading (whole lines only; a line being written is left for the next poll) and ``AcpLog``, an incremental
index of one agent connection. Directions are lmbridge's: on ``agent:<id>``, ``out`` is lmbridge (the ACP client)
to the agent and ``in`` the agent to lmbridge; on ``mcp:<session>``, ``in`` is the agent's MCP client to lmbridge.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AcpLog", "Exchange", "TraceFollower", "WireEvent", "read_trace_dir", "update_kind", "update_label"]


@dataclass(slots=True)
class WireEvent:
    ts: float
    conn: str
    dir: str  # "in" | "out", from lmbridge's side
    msg: Any  # the JSON-RPC message, or None when the line was not valid JSON
    raw: str | None = None
    turn: int = 0  # the scenario turn during which it was read (0: before the first turn)

    @property
    def method(self) -> str | None:
        return self.msg.get("method") if isinstance(self.msg, dict) else None

    @property
    def params(self) -> Any:
        return self.msg.get("params") if isinstance(self.msg, dict) else None

    @property
    def is_request(self) -> bool:
        return isinstance(self.msg, dict) and "method" in self.msg and "id" in self.msg

    @property
    def is_notification(self) -> bool:
        return isinstance(self.msg, dict) and "method" in self.msg and "id" not in self.msg

    @property
    def is_response(self) -> bool:
        return isinstance(self.msg, dict) and "method" not in self.msg and ("result" in self.msg or "error" in self.msg)


def _parse_line(line: bytes) -> WireEvent | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or "conn" not in data:
        return None
    return WireEvent(
        ts=float(data.get("ts", 0.0)),
        conn=str(data["conn"]),
        dir=str(data.get("dir", "")),
        msg=data.get("msg"),
        raw=data.get("raw"),
    )


class TraceFollower:
    """Reads the trace files of one directory incrementally: ``poll()`` returns the events added since the last
    call (whole lines only), in file order per connection."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.events: list[WireEvent] = []

    def poll(self) -> list[WireEvent]:
        new: list[WireEvent] = []
        try:
            paths = sorted(self.directory.glob("*.ndjson"))
        except OSError:
            return new
        for path in paths:
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                continue
            if not data:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for line in lines:
                if line.strip():
                    event = _parse_line(line)
                    if event is not None:
                        new.append(event)
        new.sort(key=lambda e: e.ts)
        self.events.extend(new)
        return new


def read_trace_dir(directory: str | os.PathLike[str]) -> list[WireEvent]:
    """Every event of every trace file in ``directory``, in time order."""
    follower = TraceFollower(directory)
    follower.poll()
    return sorted(follower.events, key=lambda e: e.ts)


@dataclass(slots=True)
class Exchange:
    """A request and, once it came, its answer."""

    method: str
    id: Any
    params: Any
    sent: WireEvent
    answer: WireEvent | None = None
    generation: int = 0  # which start of the agent process it was sent to (see AcpLog.restarts)

    @property
    def answered(self) -> bool:
        return self.answer is not None

    @property
    def result(self) -> Any:
        return self.answer.msg.get("result") if self.answer is not None else None

    @property
    def error(self) -> Any:
        return self.answer.msg.get("error") if self.answer is not None else None

    @property
    def session_id(self) -> Any:
        return self.params.get("sessionId") if isinstance(self.params, dict) else None


@dataclass
class AcpLog:
    """An incremental index of one agent connection's events (``feed`` them in order)."""

    conn: str
    events: list[WireEvent] = field(default_factory=list)
    client_requests: list[Exchange] = field(default_factory=list)  # lmbridge → agent
    agent_requests: list[Exchange] = field(default_factory=list)  # agent → lmbridge
    updates: list[WireEvent] = field(default_factory=list)  # session/update notifications
    cancels: list[WireEvent] = field(default_factory=list)  # session/cancel notifications
    invalid: list[WireEvent] = field(default_factory=list)  # lines the agent wrote that were not JSON
    last_agent_message: WireEvent | None = None
    restarts: int = 0  # how often lmbridge started the agent again on this connection name
    _open_client: dict[str, Exchange] = field(default_factory=dict)  # by _id_key
    _open_agent: dict[str, Exchange] = field(default_factory=dict)

    def feed(self, event: WireEvent) -> None:
        if event.conn != self.conn:
            return
        self.events.append(event)
        if event.dir == "in":
            self.last_agent_message = event
        msg = event.msg
        if not isinstance(msg, dict):
            if event.dir == "in":
                self.invalid.append(event)
            return
        if event.is_request:
            exchange = Exchange(msg["method"], msg["id"], msg.get("params"), event)
            if event.dir == "out" and msg["method"] == "initialize" and self.client_requests:
                # lmbridge started the agent again (it exited): a new connection, whose ids start afresh. What the
                # old process left unanswered stays unanswered.
                self.restarts += 1
                self._open_client = {}
                self._open_agent = {}
            exchange.generation = self.restarts
            if event.dir == "out":
                self.client_requests.append(exchange)
                self._open_client[_id_key(msg["id"])] = exchange
            else:
                self.agent_requests.append(exchange)
                self._open_agent[_id_key(msg["id"])] = exchange
        elif event.is_notification:
            if event.dir == "in" and msg["method"] == "session/update":
                self.updates.append(event)
            elif event.dir == "out" and msg["method"] == "session/cancel":
                self.cancels.append(event)
        elif event.is_response:
            table = self._open_client if event.dir == "in" else self._open_agent
            answered = table.pop(_id_key(msg.get("id")), None)
            if answered is not None:
                answered.answer = event

    def requests(self, method: str) -> list[Exchange]:
        return [e for e in self.client_requests if e.method == method]

    @property
    def pending_client_requests(self) -> list[Exchange]:
        return list(self._open_client.values())

    @property
    def pending_agent_requests(self) -> list[Exchange]:
        return list(self._open_agent.values())


def _id_key(value: Any) -> str:
    return json.dumps(value)


def update_kind(params: Any) -> str:
    """The ``sessionUpdate`` of a session/update's params ("?" when missing)."""
    update = params.get("update") if isinstance(params, dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return kind if isinstance(kind, str) else "?"


def update_label(params: Any) -> str:
    """``kind`` or ``kind:status`` for tool calls that carry a status: what expectations on updates name."""
    kind = update_kind(params)
    update = params.get("update") if isinstance(params, dict) else None
    if kind in ("tool_call", "tool_call_update") and isinstance(update, dict):
        status = update.get("status")
        if kind == "tool_call" and status is None:
            status = "pending"  # ACP's default for a new tool call
        if isinstance(status, str):
            return f"{kind}:{status}"
    return kind
