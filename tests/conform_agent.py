"""A small ACP agent for testing ``lmbridge conform``: conformant as written, broken on purpose with ``--defect
NAME`` (repeatable). Standard library only, one thread per prompt (and one for a terminal a defect leaves running),
so that each defect is exactly the one line that differs from the conformant behaviour.

Its "model" is the demo agent's directives (``--model directives``): ``/say TEXT`` streams TEXT, ``/sleep MS``
waits (a cancel ends the wait), ``/tool NAME {json}`` calls a tool of the session's first stdio MCP server (a client
of a few lines, a process per call), ``/shell COMMAND`` asks permission, then runs the command in a client terminal
when the client has one (with ``--pwd-first``, after ``pwd`` in a terminal of its own), else only ``touch PATH``,
itself (with ``--own-shell``, any command in a process of its own, killed by a cancel; with ``--relative-paths`` as
well, run in the session's cwd with the paths under it made relative), ``/read PATH`` reads a file (through the
client when it offers ``fs/read_text_file``). With ``--prompt-in-argv`` each prompt's text is handed to a helper
process on its command line, as an adapter hands a turn to a CLI of its own; the helpers live as long as the agent.
Sessions are kept as JSON in ``$CONFORM_AGENT_STATE`` (required for load/resume). It reports each change of a
session's mode with a ``current_mode_update`` (with ``--reports-first-mode-change``, only a session's first).

``DEFECTS`` maps each defect to the requirements the kit must find failing because of it, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

DEFECTS: dict[str, set[str]] = {
    "version-string": {"LMB-INIT-001", "LMB-INIT-002", "LMB-INIT-003"},  # protocolVersion "1", always
    "echo-version": {"LMB-INIT-003"},  # answers whatever version it is asked for
    "no-agent-info": {"LMB-INIT-004"},
    "same-session-id": {"LMB-SESS-002"},
    "rejects-meta": {"LMB-EXT-004"},
    "result-for-unknown-method": {"LMB-RPC-002"},  # answered, but with a result
    "ext-wrong-code": {"LMB-EXT-002"},
    "answers-notifications": {"LMB-EXT-003", "LMB-RPC-003"},  # an error without an id
    "stdout-noise": {"LMB-STDIO-001"},
    "dies-on-garbage": {"LMB-STDIO-002"},
    "dies-on-deep-json": {"LMB-STDIO-004"},  # exits on a valid request nested deeper than its parser goes
    "bad-stop-reason": {"LMB-PROMPT-001", "LMB-PROMPT-003", "LMB-CANCEL-003"},
    "bad-update": {"LMB-PROMPT-002"},
    "reads-without-capability": {"LMB-CAP-001"},
    "ignores-cancel": {"LMB-CANCEL-001", "LMB-CANCEL-004"},
    "updates-after-cancel": {"LMB-CANCEL-002"},
    "list-invalid": {"LMB-SESS-003"},
    "load-without-replay": {"LMB-SESS-006"},
    "resume-replays": {"LMB-SESS-007"},
    "stays-after-eof": {"LMB-SHUT-001"},
    "skips-mcp": {"LMB-MCP-001", "LMB-MCP-002", "LMB-MCP-004"},  # never connects to the MCP servers it is given
    "wrong-mcp-arguments": {"LMB-MCP-002", "LMB-MCP-004"},
    "unreported-tool-call": {"LMB-MCP-003"},  # calls the MCP tool without a tool_call update
    "orphan-tool-call": {"LMB-TOOL-001"},  # its tool call stays in_progress after the turn
    "bad-permission-request": {"LMB-PERM-001"},  # options without a kind
    "runs-rejected": {"LMB-PERM-002"},
    "cancelled-permission-ends-turn": {"LMB-PERM-003"},  # a cancel during a permission request ends end_turn
    "refuses-its-mode": {"LMB-MODE-001"},  # session/set_mode to the mode it is in: an error
    "refuses-other-modes": {"LMB-MODE-002"},  # session/set_mode to any mode but the one it is in: an error
    "stale-mode-update": {"LMB-MODE-002"},  # reports each change with a current_mode_update naming the old mode
    "hangs-on-mode-change": {"LMB-MODE-002"},  # session/set_mode to any mode but the one it is in: never answered
    "hangs-on-set-mode": {"LMB-MODE-001", "LMB-MODE-002"},  # set_mode never answered: the switch is not tried
    "hangs-on-set-config": {"LMB-CONFIG-001", "LMB-CONFIG-002"},  # set_config_option never answered: nor the switch
    "partial-config-answer": {"LMB-CONFIG-001"},  # set_config_option answered with the changed option only
    "config-keeps-value": {"LMB-CONFIG-002"},  # set_config_option answered with the option's value unchanged
    "relative-read-path": {"LMB-FS-001"},  # fs/read_text_file with a path relative to the cwd
    "relative-terminal-cwd": {"LMB-TERM-001"},  # terminal/create with cwd "." (refused: it runs nothing)
    "unreleased-terminal": {"LMB-TERM-002"},  # never calls terminal/release
    "keeps-terminal-on-cancel": {"LMB-TERM-004"},  # a cancel ends the turn, the command runs on (released at exit)
    "forgets-allow-always": {"LMB-PERM-004"},  # asks again after an allow_always answer
    "orphans-own-command": {"LMB-CANCEL-005"},  # runs commands itself (as --own-shell); a cancel leaves them running
    "detaches-own-command": {"LMB-CANCEL-005"},  # the same, each command in a session of its own (as --own-shell's)
    "refuses-resource-link": {"LMB-CONTENT-001"},  # a prompt with a resource_link block: -32602
    "refuses-image": {"LMB-CONTENT-002"},  # advertises images, then refuses a prompt with one
    "drops-mcp-headers": {"LMB-MCP-004"},  # calls an HTTP MCP server without the headers session/new gave
    "delete-answers-null": {"LMB-SESS-009"},  # session/delete answered with a null result, not an object
    "delete-keeps-listing": {"LMB-SESS-010"},  # session/delete answers, and session/list still has the session
    "delete-unknown-errors": {"LMB-SESS-011"},  # session/delete of an unknown session: -32002
    "fork-same-id": {"LMB-SESS-012"},  # session/fork answered with the forked session's own id
    "logout-answers-null": {"LMB-AUTH-001"},  # logout answered with a null result, not an object
    "logout-breaks-sessions": {"LMB-AUTH-002"},  # after logout, session/new fails with -32603, not auth_required
}

_MODES = {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]}
_OPTIONS = [
    {"id": "model", "name": "Model", "type": "select", "currentValue": "small",
     "options": [{"value": "small", "name": "Small"}, {"value": "large", "name": "Large"}]},
    {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
     "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]},
]  # fmt: skip

_defects: set[str] = set()
_flags: dict[
    str, bool
] = {}  # --own-shell, --pwd-first, --relative-paths, --prompt-in-argv, --reports-first-mode-change
_helpers: list[subprocess.Popen[bytes]] = []  # --prompt-in-argv's, each until its stdin (ours) closes
_client: dict[str, Any] = {}  # the client's capabilities, from initialize
_auth = {"required": False, "done": False, "logged_out": False}  # --require-auth: session/new answers -32000 until
# authenticate (and again after logout)
_write_lock = threading.Lock()
_sessions: dict[str, dict[str, Any]] = {}
_cancelled: dict[str, threading.Event] = {}
_state_dir = os.environ.get("CONFORM_AGENT_STATE")
_waiting: dict[str, tuple[threading.Event, list[Any]]] = {}  # our requests to the client, by id


def _ask_client(request_id: str, method: str, params: dict[str, Any], cancelled: threading.Event | None = None) -> Any:
    """Send a request to the client and wait for its answer (the reader thread hands it over); None when
    ``cancelled`` is set first."""
    done, answer = threading.Event(), []
    _waiting[request_id] = (done, answer)
    _send({"id": request_id, "method": method, "params": params})
    for _ in range(1200):  # 120 s
        if done.wait(0.1) or (cancelled is not None and cancelled.is_set()):
            break
    return answer[0] if answer else None


def _mcp_call(server: dict[str, Any], name: str, arguments: Any) -> str:
    """One tool call on a stdio MCP server: initialize, initialized, tools/list, tools/call; the result's text."""
    env = {**os.environ, **{pair["name"]: pair["value"] for pair in server.get("env") or ()}}
    command = [server["command"], *server.get("args", [])]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as process:
        assert process.stdin is not None and process.stdout is not None

        def ask(number: int, method: str, params: dict[str, Any]) -> Any:
            process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params}) + "\n")
            process.stdin.flush()
            return json.loads(process.stdout.readline()).get("result")

        info = {"name": "conform-test-agent", "version": "1"}
        ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info})
        process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        ask(2, "tools/list", {})
        result = ask(3, "tools/call", {"name": name, "arguments": arguments})
        process.stdin.close()
    return "".join(block.get("text", "") for block in (result or {}).get("content", []))


def _mcp_call_http(server: dict[str, Any], name: str, arguments: Any) -> str:
    """The same over streamable HTTP (JSON answers), with the headers ``session/new`` gave."""
    import urllib.request

    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if "drops-mcp-headers" not in _defects:
        headers.update({pair["name"]: pair["value"] for pair in server.get("headers") or ()})

    def post(message: dict[str, Any]) -> Any:
        request = urllib.request.Request(server["url"], json.dumps(message).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
        except OSError:
            return None
        return json.loads(body).get("result") if body else None

    info = {"name": "conform-test-agent", "version": "1"}
    post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
          "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info}})  # fmt: skip
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    post({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
    result = post({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
    return "".join(block.get("text", "") for block in (result or {}).get("content", []))


def _tool(session_id: str, line: str) -> str:
    name, _, raw = line[len("/tool ") :].partition(" ")
    arguments = json.loads(raw or "{}")
    if "wrong-mcp-arguments" in _defects:
        arguments = {"text": "not what the model asked"}
    servers = [s for s in _sessions[session_id].get("mcpServers", []) if s.get("command") or s.get("type") == "http"]
    call_id = f"tool-{uuid.uuid4().hex[:8]}"
    if "unreported-tool-call" not in _defects:
        _update(
            session_id, {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": name, "status": "in_progress"}
        )
    call = _mcp_call_http if servers and servers[0].get("type") == "http" else _mcp_call
    text = "no MCP server" if not servers or "skips-mcp" in _defects else call(servers[0], name, arguments)
    if "unreported-tool-call" not in _defects and "orphan-tool-call" not in _defects:
        _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "completed"})
    return f"tool {name} returned: {text}\n"


def _shell(session_id: str, line: str) -> str:
    """``/shell COMMAND``: a tool call behind a permission request (none once the same command was allowed
    always in the session); the stop reason when cancelled."""
    command = line[len("/shell ") :]
    path = line.split()[-1]
    call_id = f"shell-{uuid.uuid4().hex[:8]}"
    _update(session_id, {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": line, "kind": "execute"})
    options = [
        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
        {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
    ]
    if "bad-permission-request" in _defects:
        options = [{"optionId": "allow", "name": "Allow"}]
    allowed_always = _sessions[session_id].setdefault("allowed", [])
    if command in allowed_always and "forgets-allow-always" not in _defects:
        outcome = {"outcome": "selected", "optionId": "always"}
    else:
        params = {"sessionId": session_id, "toolCall": {"toolCallId": call_id}, "options": options}
        answer = _ask_client(f"perm-{call_id}", "session/request_permission", params) or {}
        outcome = (answer.get("result") or {}).get("outcome") or {}
    if outcome.get("outcome") == "cancelled":
        _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"})
        return "end_turn" if "cancelled-permission-ends-turn" in _defects else "cancelled"
    if outcome.get("optionId") == "always":
        allowed_always.append(command)
    allowed = outcome.get("optionId") in ("allow", "always") or "runs-rejected" in _defects
    if allowed and _own_shell():
        if not _run_itself(session_id, command):
            _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"})
            return "cancelled"
    elif allowed and _client.get("terminal"):
        output = _terminal(session_id, command)
        if output is None:
            _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed"})
            return "cancelled"
        _update(session_id, _text("agent_message_chunk", output))
    elif allowed:
        Path(path).touch()
    status = "completed" if allowed else "failed"
    _update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status})
    return ""


def _own_shell() -> bool:
    return _flags.get("own_shell", False) or bool({"orphans-own-command", "detaches-own-command"} & _defects)


def _run_itself(session_id: str, command: str) -> bool:
    """Run ``command`` in a shell of its own, in a session of its own; False when a cancel came first (the command
    then killed, its whole process group, unless a defect leaves it: orphans-own-command's stays in the agent's
    group, for whoever stops that; detaches-own-command's in its own session)."""
    orphans = "orphans-own-command" in _defects
    leaves = orphans or "detaches-own-command" in _defects
    quiet = subprocess.DEVNULL  # (its stdout is not the protocol's)
    cwd = _sessions[session_id]["cwd"] if _flags.get("relative_paths") else None
    if cwd is not None:
        command = command.replace(os.path.join(cwd, ""), "")
    process = subprocess.Popen(
        ["sh", "-c", command], stdin=quiet, stdout=quiet, stderr=quiet, cwd=cwd, start_new_session=not orphans
    )
    cancelled = _cancelled[session_id]
    while process.poll() is None:
        if cancelled.wait(0.05):
            if not leaves:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return False
    return True


def _create_terminal(session_id: str, command: str) -> dict[str, Any] | None:
    """A client terminal running ``command`` (its ids for the terminal/* requests); None when it was refused."""
    cwd = "." if "relative-terminal-cwd" in _defects else _sessions[session_id]["cwd"]
    params = {"sessionId": session_id, "command": "sh", "args": ["-c", command], "cwd": cwd}
    created = (_ask_client(f"term-{uuid.uuid4().hex[:8]}", "terminal/create", params) or {}).get("result") or {}
    return {"sessionId": session_id, "terminalId": created["terminalId"]} if "terminalId" in created else None


def _terminal(session_id: str, command: str) -> str | None:
    """Run ``command`` in a client terminal (with ``--pwd-first``, after ``pwd`` in another, released once the
    command is done)."""
    first = _create_terminal(session_id, "pwd") if _flags.get("pwd_first") else None
    if first is not None:
        _ask_client(f"wait-{uuid.uuid4().hex[:8]}", "terminal/wait_for_exit", first)
    try:
        return _run_in_terminal(session_id, command)
    finally:
        if first is not None:
            _ask_client(f"release-{uuid.uuid4().hex[:8]}", "terminal/release", first)


def _run_in_terminal(session_id: str, command: str) -> str | None:
    """Run ``command`` in a client terminal: create, wait for its exit, read its output, release it. A cancel
    while it runs kills it and releases the terminal (None: the turn was cancelled)."""
    terminal = _create_terminal(session_id, command)
    if terminal is None:
        return "the terminal could not be created\n"

    def release() -> None:
        if "unreleased-terminal" not in _defects:
            _ask_client(f"release-{uuid.uuid4().hex[:8]}", "terminal/release", terminal)

    cancelled = _cancelled[session_id]
    if _ask_client(f"wait-{uuid.uuid4().hex[:8]}", "terminal/wait_for_exit", terminal, cancelled) is None:
        if "keeps-terminal-on-cancel" in _defects:  # left running; released once it exits by itself

            def release_at_exit() -> None:
                _ask_client(f"wait-{uuid.uuid4().hex[:8]}", "terminal/wait_for_exit", terminal)
                release()

            threading.Thread(target=release_at_exit, daemon=True).start()
        else:
            _ask_client(f"kill-{uuid.uuid4().hex[:8]}", "terminal/kill", terminal)
            release()
        return None
    output = (_ask_client(f"out-{uuid.uuid4().hex[:8]}", "terminal/output", terminal) or {}).get("result") or {}
    release()
    return str(output.get("output", ""))


def _read(session_id: str, path: str) -> str:
    """``/read PATH``: through the client when it offers it, else from the disk."""
    if not (_client.get("fs") or {}).get("readTextFile"):
        return Path(path).read_text()
    asked = os.path.relpath(path, _sessions[session_id]["cwd"]) if "relative-read-path" in _defects else path
    answer = _ask_client(f"read-{uuid.uuid4().hex[:8]}", "fs/read_text_file", {"sessionId": session_id, "path": asked})
    return str(((answer or {}).get("result") or {}).get("content", "the client could not read it\n"))


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
    _client.update(params.get("clientCapabilities") or {})
    asked = params.get("protocolVersion")
    version: Any = 1
    if "echo-version" in _defects:
        version = asked
    if "version-string" in _defects:
        version = "1"
    capabilities = {
        "promptCapabilities": {"image": True, "audio": True, "embeddedContext": True},
        "mcpCapabilities": {"http": True},
        "loadSession": bool(_state_dir),
        "sessionCapabilities": {
            "list": {},
            "close": {},
            "delete": {},
            "fork": {},
            **({"resume": {}} if _state_dir else {}),
        },
        "auth": {"logout": {}},
    }
    methods = [{"id": "token", "name": "Token"}] if _auth["required"] else []
    result: dict[str, Any] = {"protocolVersion": version, "agentCapabilities": capabilities, "authMethods": methods}
    if "no-agent-info" not in _defects:
        result["agentInfo"] = {"name": "conform-test-agent", "version": "1.0"}
    return result


def _prompt(request_id: Any, params: dict[str, Any]) -> None:
    session_id = params["sessionId"]
    kinds = {block.get("type") for block in params.get("prompt", [])}
    refused = {"refuses-resource-link": "resource_link", "refuses-image": "image"}
    if any(defect in _defects and kind in kinds for defect, kind in refused.items()):
        _send({"id": request_id, "error": {"code": -32602, "message": f"unsupported content: {sorted(kinds)}"}})
        return
    session = _sessions[session_id]
    cancelled = _cancelled[session_id]  # reset when the prompt arrived, so a cancel right behind it is kept
    text = "".join(block.get("text", "") for block in params.get("prompt", []) if block.get("type") == "text")
    if _flags.get("prompt_in_argv"):
        helper = [sys.executable, "-c", "import sys; sys.stdin.read()", text]
        _helpers.append(subprocess.Popen(helper, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL))
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
        elif line.startswith("/tool "):
            said.append(_tool(session_id, line))
            _update(session_id, _text("agent_message_chunk", said[-1]))
        elif line.startswith("/read "):
            said.append(_read(session_id, line[len("/read ") :].strip()))
            _update(session_id, _text("agent_message_chunk", said[-1]))
        elif line.startswith("/shell "):
            ended = _shell(session_id, line)
            if ended:
                stop = ended
                break
    session["history"].append([text, "".join(said)])
    _save(session_id)
    if "bad-stop-reason" in _defects and stop == "end_turn":
        stop = "done"
    _send({"id": request_id, "result": {"stopReason": stop}})
    if stop == "cancelled" and "updates-after-cancel" in _defects:
        _update(session_id, _text("agent_message_chunk", "one more thing\n"))


def _set_mode(request_id: Any, params: dict[str, Any]) -> None:
    session = _sessions.get(params.get("sessionId")) or {}
    current, mode = session.get("mode", _MODES["currentModeId"]), params.get("modeId")
    if "hangs-on-set-mode" in _defects or (mode != current and "hangs-on-mode-change" in _defects):
        return
    refused = "refuses-its-mode" if mode == current else "refuses-other-modes"
    if refused in _defects or mode not in {m["id"] for m in _MODES["availableModes"]}:
        _send({"id": request_id, "error": {"code": -32602, "message": f"cannot set mode {mode!r}"}})
        return
    session["mode"] = mode
    reports = not (_flags.get("reports_first_mode_change") and session.get("reported"))
    if mode != current and reports:  # said, as an agent that reports every change would
        said = current if "stale-mode-update" in _defects else mode
        _update(params["sessionId"], {"sessionUpdate": "current_mode_update", "currentModeId": said})
        session["reported"] = True
    _send({"id": request_id, "result": {}})


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
    if method is None:  # an answer to one of our requests
        waiting = _waiting.pop(str(request_id), None)
        if waiting is not None:
            waiting[1].append(message)
            waiting[0].set()
        return
    if _flags.get("freezes_on_set_mode") and (_flags.get("frozen") or method == "session/set_mode"):
        _flags["frozen"] = True  # from its first session/set_mode on, it answers no request
        return
    if method == "initialize":
        _send({"id": request_id, "result": _initialize(params)})
    elif method == "logout":  # the login ends: with --require-auth, sessions need authenticate again
        _auth["done"] = False
        _auth["logged_out"] = True
        _send({"id": request_id, "result": None if "logout-answers-null" in _defects else {}})
    elif method == "session/new" and _auth.get("logged_out") and "logout-breaks-sessions" in _defects:
        _send({"id": request_id, "error": {"code": -32603, "message": "internal error: no credentials"}})
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
        _sessions[session_id] = {"cwd": params.get("cwd"), "history": [], "mcpServers": params.get("mcpServers", [])}
        _save(session_id)
        _send({"id": request_id, "result": {"sessionId": session_id, "modes": _MODES, "configOptions": _OPTIONS}})
    elif method == "session/fork":
        forked = _load(params.get("sessionId", ""))
        if forked is None:
            _send({"id": request_id, "error": {"code": -32002, "message": "Resource not found"}})
            return
        session_id = params["sessionId"] if "fork-same-id" in _defects else f"s-{uuid.uuid4().hex[:12]}"
        _sessions[session_id] = json.loads(json.dumps({**forked, "cwd": params.get("cwd")}))
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
            saved = sorted(p.stem for p in Path(_state_dir).glob("*.json")) if _state_dir else []
            known = [key for key in saved if _load(key) is not None] + [key for key in _sessions if key not in saved]
            listed = [{"sessionId": key, "cwd": _sessions[key]["cwd"]} for key in known]
            _send({"id": request_id, "result": {"sessions": listed}})
    elif method == "session/set_mode":
        _set_mode(request_id, params)
    elif method == "session/set_config_option":
        if "hangs-on-set-config" in _defects:
            return
        session = _sessions.get(params.get("sessionId")) or {}
        values = session.setdefault("options", {o["id"]: o["currentValue"] for o in _OPTIONS})
        if params.get("configId") in values and "config-keeps-value" not in _defects:
            values[params["configId"]] = params.get("value")
        changed = [o for o in _OPTIONS if o["id"] == params.get("configId") or "partial-config-answer" not in _defects]
        answered = [dict(o, currentValue=values.get(o["id"], o["currentValue"])) for o in changed]
        _send({"id": request_id, "result": {"configOptions": answered}})
    elif method == "session/close":
        _sessions.pop(params.get("sessionId"), None)
        _send({"id": request_id, "result": {}})
    elif method == "session/delete":
        session_id = params.get("sessionId")
        known = _load(session_id) is not None if isinstance(session_id, str) else False
        if not known and "delete-unknown-errors" in _defects:
            _send({"id": request_id, "error": {"code": -32002, "message": "Resource not found"}})
            return
        if known and "delete-keeps-listing" not in _defects:
            _sessions.pop(session_id, None)
            if _state_dir:
                Path(_state_dir, f"{session_id}.json").unlink(missing_ok=True)
        _send({"id": request_id, "result": None if "delete-answers-null" in _defects else {}})
    elif method == "session/prompt":
        if params.get("sessionId") not in _sessions:
            _send({"id": request_id, "error": {"code": -32602, "message": "unknown session"}})
            return
        _cancelled[params["sessionId"]] = threading.Event()
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
    _flags["own_shell"] = "--own-shell" in argv
    _flags["pwd_first"] = "--pwd-first" in argv
    _flags["relative_paths"] = "--relative-paths" in argv
    _flags["prompt_in_argv"] = "--prompt-in-argv" in argv
    _flags["reports_first_mode_change"] = "--reports-first-mode-change" in argv
    _flags["freezes_on_set_mode"] = "--freezes-on-set-mode" in argv
    if "stdout-noise" in _defects:
        print("conform-test-agent starting")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:  # (RecursionError: nested deeper than the parser goes)
            if f"dies-on-{'deep-json' if isinstance(exc, RecursionError) else 'garbage'}" in _defects:
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
