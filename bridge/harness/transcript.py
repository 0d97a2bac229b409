"""Transcripts: every wire of a run (editor, ``agent:<id>``, ``mcp:<n>``) merged into one NDJSON file, normalised
so that two runs of the same scenario differ only where the agent did, and with secrets redacted.

Owns the format. The first line is a header::

    {"lmbridgeTranscript": 1, "scenario": "...", "agent": "agent:demo",
     "mcp": {"mcp:1": {"session": "session-1", "server": "editor"}}, "redacted": [...]}

then one line per message, in the order lmbridge saw them::

    {"seq": 12, "t": 0.481, "conn": "agent:demo", "dir": "in", "msg": {...}}

``dir`` is lmbridge's: on the agent's connection ``out`` goes to the agent, ``in`` comes from it; on an MCP
connection ``in`` comes from the agent's MCP client. Normalised: timestamps become seconds since the first message
(``t``); ACP session ids become ``session-1``…, tool-call ids ``tool-1``…, the editor's call ids ``lmb_1``…, MCP
connections ``mcp:1``…, the run's private directories ``<work>``/``<workspace>``. Redacted: MCP server ``env``
values and ``headers`` values (the socket path and token of lmbridge's own server among them), values under keys
such as ``authorization``, ``token``, ``api_key``, ``password``, ``cookie``, ``{name, value}`` pairs whose name
looks secret, and the values of the tested agent's configured ``env`` whose names look secret (``*KEY*``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*AUTH*``, ...) or that look like tokens (20 characters or more, no
spaces or slashes), wherever they occur.

Which session an MCP connection belongs to is not on the wire: it is taken to be the most recent session whose
opening request named MCP servers before the connection's first message (exact unless two sessions open and use
tools at once).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .traces import WireEvent

__all__ = ["TRANSCRIPT_VERSION", "build_transcript", "load_transcript", "write_transcript"]

TRANSCRIPT_VERSION = 1
_LMB_ID = re.compile(r"lmb_[0-9a-f]{32}")
_SECRET_KEYS = {
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api_key",
    "apikey",
    "api-key",
    "token",
    "access_token",
    "refresh_token",
    "password",
    "secret",
    "client_secret",
    "cookie",
    "set-cookie",
}
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|COOKIE|SOCKET)", re.IGNORECASE)
REDACTED = "<redacted>"
_LMBRIDGE_MCP_URL = re.compile(r"^http://127\.0\.0\.1:\d+/mcp/[0-9a-f]+$")  # lmbridge's HTTP MCP endpoint


def build_transcript(
    events: Iterable[WireEvent],
    *,
    scenario: str = "",
    agent_conn: str | None = None,
    secrets: dict[str, str] | None = None,
    paths: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The header and message lines of a transcript of ``events`` (trace events of one run)."""
    ordered = sorted(events, key=lambda e: e.ts)
    conns: dict[str, str] = {}
    mcp_count = 0
    for event in ordered:
        if event.conn not in conns:
            if event.conn.startswith("mcp:"):
                mcp_count += 1
                conns[event.conn] = f"mcp:{mcp_count}"
            else:
                conns[event.conn] = event.conn
    agents = [c for c in conns if c.startswith("agent:")]
    if agent_conn is None:
        agent_conn = agents[0] if agents else None
    replacer = _Normaliser(secrets or {}, paths or {})
    # Session ids first (from the agent's answers to session/new, and the ids it was asked to load or resume).
    methods: dict[tuple[str, str], str] = {}
    for event in ordered:
        msg = event.msg if isinstance(event.msg, dict) else None
        if msg is None or not event.conn.startswith("agent:"):
            continue
        if "method" in msg and "id" in msg and event.dir == "out":
            methods[(event.conn, json.dumps(msg["id"]))] = msg["method"]
            params = msg.get("params")
            if msg["method"] in ("session/load", "session/resume") and isinstance(params, dict):
                replacer.session(params.get("sessionId"))
        elif (
            "method" not in msg
            and event.dir == "in"
            and methods.get((event.conn, json.dumps(msg.get("id")))) == "session/new"
            and isinstance(msg.get("result"), dict)
        ):
            replacer.session(msg["result"].get("sessionId"))
    t0 = ordered[0].ts if ordered else 0.0
    lines: list[dict[str, Any]] = []
    for seq, event in enumerate(ordered, start=1):
        line: dict[str, Any] = {"seq": seq, "t": round(event.ts - t0, 3), "conn": conns[event.conn], "dir": event.dir}
        if event.msg is not None or event.raw is None:
            line["msg"] = replacer.value(event.msg)
        else:
            line["raw"] = replacer.value(event.raw)
        lines.append(line)
    header = {
        "lmbridgeTranscript": TRANSCRIPT_VERSION,
        "scenario": scenario,
        "agent": agent_conn,
        "agents": agents,
        "mcp": _mcp_sessions(lines),
        "redacted": sorted(replacer.redacted),
    }
    return [header, *lines]


def _mcp_sessions(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """mcp:<n> → the session (and server name) it most likely belongs to: the most recent session whose opening
    request named MCP servers before the connection's first message (agents connect while opening the session —
    Gemini CLI, before answering session/new — or at their first tool call)."""
    opened: list[dict[str, Any]] = []  # {seq, agent, session, server}, in the order the requests were sent
    pending: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        msg = line.get("msg")
        if not isinstance(msg, dict) or not line["conn"].startswith("agent:"):
            continue
        if line["dir"] == "out" and msg.get("method") in ("session/new", "session/load", "session/resume"):
            params = msg.get("params") or {}
            if params.get("mcpServers"):
                entry = {
                    "seq": line["seq"],
                    "agent": line["conn"],
                    "session": params.get("sessionId"),
                    "server": _server_name(params),
                }
                opened.append(entry)
                if msg["method"] == "session/new":
                    pending[(line["conn"], json.dumps(msg.get("id")))] = entry
        elif line["dir"] == "in" and "method" not in msg:
            answered = pending.pop((str(line["conn"]), json.dumps(msg.get("id"))), None)
            if answered is not None and isinstance(msg.get("result"), dict):
                answered["session"] = msg["result"].get("sessionId")
    mapping: dict[str, dict[str, Any]] = {}
    taken: set[int] = set()
    first_seen: dict[str, int] = {}
    for line in lines:
        if line["conn"].startswith("mcp:"):
            first_seen.setdefault(line["conn"], line["seq"])
    for conn, seq in sorted(first_seen.items(), key=lambda item: item[1]):
        candidates = [o for o in opened if o["seq"] < seq and o["session"]]
        if not candidates:
            continue
        free = [o for o in candidates if o["seq"] not in taken]
        chosen = (free or candidates)[-1]
        taken.add(chosen["seq"])
        mapping[conn] = {"agent": chosen["agent"], "session": chosen["session"], "server": chosen["server"]}
    return mapping


def _server_name(params: dict[str, Any]) -> str:
    servers = params.get("mcpServers") or []
    return next((str(s["name"]) for s in servers if isinstance(s, dict) and s.get("name")), "editor")


def _is_secret(name: str, value: Any) -> bool:
    """An agent env value worth redacting: under a secret-looking name, or shaped like a token."""
    if not isinstance(value, str) or len(value) < 4:
        return False
    return bool(_SECRET_NAME.search(name)) or (len(value) >= 20 and not re.search(r"[\s/]", value))


class _Normaliser:
    def __init__(self, secrets: dict[str, str], paths: dict[str, str]) -> None:
        self.redacted: set[str] = set()
        self._secrets = sorted(((v, k) for k, v in secrets.items() if _is_secret(k, v)), key=lambda item: -len(item[0]))
        self._paths = sorted(((p, name) for p, name in paths.items() if p), key=lambda item: -len(item[0]))
        self._sessions: dict[str, str] = {}
        self._tool_calls: dict[str, str] = {}
        self._lmb: dict[str, str] = {}

    def session(self, value: Any) -> None:
        if isinstance(value, str) and value and value not in self._sessions:
            self._sessions[value] = f"session-{len(self._sessions) + 1}"

    def value(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                if k in ("env", "headers") and isinstance(v, list):  # MCP server definitions
                    out[k] = [self._redact_pair(item, force=True) for item in v]
                elif isinstance(v, str) and k.lower() in _SECRET_KEYS:
                    self.redacted.add(k)
                    out[k] = REDACTED
                elif k == "url" and isinstance(v, str) and _LMBRIDGE_MCP_URL.match(v):  # this run's port and path
                    out[k] = "<lmbridge-mcp-url>"
                elif k == "toolCallId" and isinstance(v, str):
                    out[k] = self._tool_calls.setdefault(v, f"tool-{len(self._tool_calls) + 1}")
                else:
                    out[k] = self.value(v, k)
            if (
                isinstance(out.get("name"), str)
                and "value" in out
                and _SECRET_NAME.search(out["name"])
                and isinstance(out["value"], str)
                and out["value"] != REDACTED
            ):
                self.redacted.add(out["name"])
                out["value"] = REDACTED
            return out
        if isinstance(value, list):
            return [self.value(item, key) for item in value]
        if isinstance(value, str):
            return self._text(value)
        return value

    def _redact_pair(self, item: Any, force: bool) -> Any:
        if isinstance(item, dict) and "value" in item:
            self.redacted.add(str(item.get("name", "?")))
            return {**{k: self.value(v) for k, v in item.items() if k != "value"}, "value": REDACTED}
        return self.value(item)

    def _text(self, text: str) -> str:
        if text in self._sessions:
            return self._sessions[text]
        if text in self._tool_calls:
            return self._tool_calls[text]
        for secret, name in self._secrets:
            if secret in text:
                self.redacted.add(name)
                text = text.replace(secret, f"<redacted:{name}>")
        for path, name in self._paths:
            if path in text:
                text = text.replace(path, name)
        for session, short in self._sessions.items():
            if len(session) >= 8 and session in text:
                text = text.replace(session, short)
        if "lmb_" in text:
            text = _LMB_ID.sub(lambda m: self._lmb.setdefault(m.group(0), f"lmb_{len(self._lmb) + 1}"), text)
        return text


def write_transcript(lines: list[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")


def load_transcript(paths: Iterable[str | os.PathLike[str]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A transcript file, or the raw ``--trace-dir`` files of one run (normalised on the way in): the header and
    the message lines."""
    header: dict[str, Any] | None = None
    lines: list[dict[str, Any]] = []
    raw_events: list[WireEvent] = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if not text.strip():
                    continue
                try:
                    data = json.loads(text)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
                if not isinstance(data, dict):
                    raise ValueError(f"{path}:{number}: expected a JSON object")
                if "lmbridgeTranscript" in data:
                    if data["lmbridgeTranscript"] != TRANSCRIPT_VERSION:
                        raise ValueError(
                            f"{path}: transcript version {data['lmbridgeTranscript']} (this lmbridge "
                            f"reads version {TRANSCRIPT_VERSION})"
                        )
                    header = data
                elif "seq" in data:
                    lines.append(data)
                elif "ts" in data and "conn" in data:
                    raw_events.append(
                        WireEvent(
                            float(data["ts"]),
                            str(data["conn"]),
                            str(data.get("dir", "")),
                            data.get("msg"),
                            data.get("raw"),
                        )
                    )
                else:
                    raise ValueError(f"{path}:{number}: neither a transcript nor a trace line")
    if raw_events:
        header, *lines = build_transcript(raw_events)
    if header is None:
        raise ValueError("no transcript header (is this a file written by lmbridge test --record?)")
    lines.sort(key=lambda line: line["seq"])
    return header, lines
