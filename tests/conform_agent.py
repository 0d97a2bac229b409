"""A small ACP agent for testing ``lmbridge conform``: conformant as written, broken on purpose with ``--defect
NAME`` (repeatable). Standard library only, one thread per prompt, so that each defect is exactly the one line
that differs from the conformant behaviour.

Its "model" is the demo agent's directives (``--model directives``): ``/say TEXT`` streams TEXT, ``/sleep MS``
waits (a cancel ends the wait). Sessions are kept as JSON in ``$CONFORM_AGENT_STATE`` (required for load/resume).

``DEFECTS`` maps each defect to the requirements the kit must find failing because of it, and nothing else.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from typing import Any

DEFECTS: dict[str, set[str]] = {
    "version-string": {"LMB-INIT-001", "LMB-INIT-002", "LMB-INIT-003"},  # protocolVersion "1", always
    "echo-version": {"LMB-INIT-003"},  # answers whatever version it is asked for
    "no-agent-info": {"LMB-INIT-004"},
    "same-session-id": {"LMB-SESS-002"},
    "rejects-meta": {"LMB-EXT-004"},
    "result-for-unknown-method": {"LMB-RPC-001", "LMB-RPC-002"},
    "ext-wrong-code": {"LMB-EXT-002"},
    "answers-notifications": {"LMB-EXT-003", "LMB-RPC-003"},  # an error without an id
    "stdout-noise": {"LMB-STDIO-001"},
    "dies-on-garbage": {"LMB-STDIO-002"},
    "bad-stop-reason": {"LMB-PROMPT-001", "LMB-PROMPT-003", "LMB-CANCEL-003"},
    "bad-update": {"LMB-PROMPT-002"},
    "reads-without-capability": {"LMB-CAP-001"},
    "ignores-cancel": {"LMB-CANCEL-001"},
    "updates-after-cancel": {"LMB-CANCEL-002"},
    "list-invalid": {"LMB-SESS-003"},
    "load-without-replay": {"LMB-SESS-006"},
    "resume-replays": {"LMB-SESS-007"},
    "stays-after-eof": {"LMB-SHUT-001"},
}

_defects: set[str] = set()
_auth = {"required": False, "done": False}  # --require-auth: session/new answers -32000 until authenticate
_write_lock = threading.Lock()
_sessions: dict[str, dict[str, Any]] = {}
_cancelled: dict[str, threading.Event] = {}
_state_dir = os.environ.get("CONFORM_AGENT_STATE")


def _send(message: dict[str, Any]) -> None:
    with _write_lock:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()


def _update(session: str, update: dict[str, Any]) -> None:
    _send({"method": "session/update", "params": {"sessionId": session, "update": update}})


def _text(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _save(session_id: str) -> None:
    if _state_dir:
        with open(os.path.join(_state_dir, f"{session_id}.json"), "w") as handle:
            json.dump(_sessions[session_id], handle)


def _load(session_id: str) -> dict[str, Any] | None:
    if session_id in _sessions:
        return _sessions[session_id]
    path = os.path.join(_state_dir or "/nonexistent", f"{session_id}.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        _sessions[session_id] = json.load(handle)
    return _sessions[session_id]


def _initialize(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    version: Any = 1
    if "echo-version" in _defects:
        version = asked
    if "version-string" in _defects:
        version = "1"
    capabilities = {
        "loadSession": bool(_state_dir),
        "sessionCapabilities": {"list": {}, "close": {}, **({"resume": {}} if _state_dir else {})},
    }
    methods = [{"id": "token", "name": "Token"}] if _auth["required"] else []
    result: dict[str, Any] = {"protocolVersion": version, "agentCapabilities": capabilities, "authMethods": methods}
    if "no-agent-info" not in _defects:
        result["agentInfo"] = {"name": "conform-test-agent", "version": "1.0"}
    return result


def _prompt(request_id: Any, params: dict[str, Any]) -> None:
    session_id = params["sessionId"]
    session = _sessions[session_id]
    cancelled = _cancelled.setdefault(session_id, threading.Event())
    cancelled.clear()
    text = "".join(block.get("text", "") for block in params.get("prompt", []) if block.get("type") == "text")
    said = []
    stop = "end_turn"
    if "reads-without-capability" in _defects:
        _send(
            {
                "id": "agent-read-1",
                "method": "fs/read_text_file",
                "params": {"sessionId": session_id, "path": "/etc/hostname"},
            }
        )
    if "bad-update" in _defects:
        _update(session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text"}})
    for line in text.splitlines():
        if line.startswith("/say "):
            said.append(line[5:] + "\n")
            _update(session_id, _text("agent_message_chunk", line[5:] + "\n"))
        elif line.startswith("/sleep ") and cancelled.wait(int(line[7:]) / 1000) and "ignores-cancel" not in _defects:
            stop = "cancelled"
            break
    session["history"].append([text, "".join(said)])
    _save(session_id)
    if "bad-stop-reason" in _defects and stop == "end_turn":
        stop = "done"
    _send({"id": request_id, "result": {"stopReason": stop}})
    if stop == "cancelled" and "updates-after-cancel" in _defects:
        _update(session_id, _text("agent_message_chunk", "one more thing\n"))


def _replay(session_id: str, session: dict[str, Any]) -> None:
    for user, agent in session["history"]:
        _update(session_id, _text("user_message_chunk", user))
        if agent:
            _update(session_id, _text("agent_message_chunk", agent))


def _handle(message: dict[str, Any]) -> None:
    method = message.get("method")
    params = message.get("params") or {}
    request_id = message.get("id")
    if "id" not in message:  # a notification
        if method == "session/cancel":
            _cancelled.setdefault(params.get("sessionId"), threading.Event()).set()
        elif "answers-notifications" in _defects:
            _send({"error": {"code": -32601, "message": "Method not found", "data": method}})
        return
    if method is None:
        return  # an answer to our own request
    if method == "initialize":
        _send({"id": request_id, "result": _initialize(params)})
    elif method == "authenticate":
        _auth["done"] = params.get("methodId") == "token"
        if _auth["done"]:
            _send({"id": request_id, "result": {}})
        else:
            _send({"id": request_id, "error": {"code": -32602, "message": "unknown auth method"}})
    elif method in ("session/new", "session/load", "session/resume") and _auth["required"] and not _auth["done"]:
        _send({"id": request_id, "error": {"code": -32000, "message": "Authentication required"}})
    elif method == "session/new":
        if "_meta" in params and "rejects-meta" in _defects:
            _send({"id": request_id, "error": {"code": -32602, "message": "unexpected _meta"}})
            return
        session_id = "same-session" if "same-session-id" in _defects else f"s-{uuid.uuid4().hex[:12]}"
        _sessions[session_id] = {"cwd": params.get("cwd"), "history": []}
        _save(session_id)
        _send({"id": request_id, "result": {"sessionId": session_id}})
    elif method in ("session/load", "session/resume"):
        session = _load(params.get("sessionId", ""))
        if session is None:
            _send({"id": request_id, "error": {"code": -32002, "message": "Resource not found"}})
            return
        if method == "session/load":
            replay = "load-without-replay" not in _defects
        else:
            replay = "resume-replays" in _defects
        if replay:
            _replay(params["sessionId"], session)
        _send({"id": request_id, "result": {}})
    elif method == "session/list":
        if "list-invalid" in _defects:
            _send({"id": request_id, "result": {"items": []}})
        else:
            listed = [{"sessionId": key, "cwd": value["cwd"]} for key, value in _sessions.items()]
            _send({"id": request_id, "result": {"sessions": listed}})
    elif method == "session/close":
        _sessions.pop(params.get("sessionId"), None)
        _send({"id": request_id, "result": {}})
    elif method == "session/prompt":
        if params.get("sessionId") not in _sessions:
            _send({"id": request_id, "error": {"code": -32602, "message": "unknown session"}})
            return
        threading.Thread(target=_prompt, args=(request_id, params), daemon=True).start()
    elif isinstance(method, str) and method.startswith("_") and "ext-wrong-code" in _defects:
        _send({"id": request_id, "error": {"code": -32603, "message": "Internal error"}})
    elif "result-for-unknown-method" in _defects and not str(method).startswith("_"):
        _send({"id": request_id, "result": None})
    else:
        _send({"id": request_id, "error": {"code": -32601, "message": "Method not found"}})


def main(argv: list[str]) -> int:
    for index, word in enumerate(argv):
        if word == "--defect":
            if argv[index + 1] not in DEFECTS:
                print(f"unknown defect {argv[index + 1]!r}", file=sys.stderr)
                return 2
            _defects.add(argv[index + 1])
    _auth["required"] = "--require-auth" in argv
    if "stdout-noise" in _defects:
        print("conform-test-agent starting")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            if "dies-on-garbage" in _defects:
                return 1
            _send({"id": None, "error": {"code": -32700, "message": "Parse error"}})
            continue
        if isinstance(message, dict):
            _handle(message)
    if "stays-after-eof" in _defects:
        threading.Event().wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
