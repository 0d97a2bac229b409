"""The tool round trip's hops with nothing but the standard library: a floor that shares no code with lmbridge.

``bench/tool_floor.py`` measures the hops lmbridge adds with lmbridge's own transports (Trio, its JSON-RPC engine,
its MCP endpoint under Hypercorn). This is the same conversation with blocking threads and ``http.server``: the
least a Python process can do to relay an agent's MCP call to an editor and the editor's result back. It imports
nothing of lmbridge. Three modes:

    python bench/bare_floor.py --serve          an MCP server on streamable HTTP (JSON responses) that answers
                                                ``echo`` at once; prints ``{"url": ...}``: the baseline;
                                                it serves until its stdin ends
    python bench/bare_floor.py AGENT_ARGV...    in lmbridge's place: the editor on stdin/stdout (editor protocol
                                                v1, ``initialize`` and ``lm/chat``), AGENT_ARGV (the bench agent)
                                                as the agent, its MCP calls served over HTTP and relayed to the
                                                editor; the conversations of ``make bench``'s tool benchmark
    python bench/bare_floor.py --launch FILE    the same for a real agent, as ``make bench-agents`` drives one
                                                (``python -m bench.agents --floor bare``): FILE (JSON) says how
                                                lmbridge would start and set it up — ``argv``, ``env`` and
                                                ``unset_env`` over this process's environment, ``cwd``,
                                                ``authenticate`` (a method id), ``options`` (``[id, value]`` pairs
                                                set with ``session/set_config_option`` where they differ),
                                                ``prestart``, ``transport`` (``http``, ``stdio`` or ``auto``: HTTP
                                                when the agent advertises it)

With ``BARE_FLOOR_TRACE_DIR`` set, every message on the three links is written to ``<dir>/<pid>-<link>.ndjson`` as
lmbridge's ``--trace-dir`` writes its own (``ts``, ``conn``, ``dir``, ``msg``; links ``editor``, ``agent``, ``mcp``),
so that a floor's turn and lmbridge's can be laid side by side.

With ``--launch`` the agent starts with the first chat (or with the editor's ``initialize`` when ``prestart``; then
"agent ready" goes to stderr), in a process group of its own, offered the client capabilities lmbridge offers; each
conversation gets a session whose MCP server lists the editor's tools of its chat (minus the permission tool this
program offers the editor, as lmbridge offers one), over HTTP or through ``bench/bare_shim.py``, a stdio server the
agent starts that joins it to this program's unix socket; every permission request is allowed once; the agent's
text goes to the editor as it comes.

The difference between the floor and the direct runs, the agent timing the same calls, is what relaying itself
costs: two pipe hops, the editor's own work, and the wake-ups in between. It serves only those conversations (one
prompt, then one tool result per request) and nothing else.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings, standard library only as well
from agent import Lines, write_all
from mcp_server import ECHO_TOOL

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bare_shim.py")
# What lmbridge offers an agent (bridge.acp.handshake), written out here: the agent is set up alike on both sides.
CLIENT_CAPABILITIES = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
    "elicitation": {"form": {}, "url": {}},
}
PERMISSION_TOOL = {
    "name": "bare_floor_permission",
    "description": "Asks the user to approve an action of the agent (never called: the floor allows every action).",
    "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}},
}


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class _Trace:
    """The optional wire trace (``BARE_FLOOR_TRACE_DIR``): one file per link, a record per message, 0600."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, conn: str, direction: str, message: dict[str, Any]) -> None:
        if not self._directory:
            return
        record = {"ts": round(time.time(), 6), "conn": conn, "dir": direction, "msg": message}
        with self._lock:
            handle = self._files.get(conn)
            if handle is None:
                path = os.path.join(self._directory, f"{os.getpid()}-{conn}.ndjson")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                handle = self._files[conn] = os.fdopen(fd, "w")
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            handle.flush()


TRACE = _Trace(os.environ.get("BARE_FLOOR_TRACE_DIR", ""))


def mcp_answer(message: dict[str, Any], tools: list[dict[str, Any]], call: Any) -> dict[str, Any] | None:
    """The answer to one MCP message (``None`` for a notification): ``initialize``, ``ping``, ``tools/list`` with
    ``tools``, ``tools/call`` by ``call(params)``; any other request is not found."""
    if "id" not in message:
        return None
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bare-floor", "version": "1"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call":
        result = call(params)
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


class _McpHandler(BaseHTTPRequestHandler):
    """MCP over streamable HTTP, JSON responses only; no stream to GET (405), a DELETE ends nothing to end."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's client expects
    wbufsize = 1 << 16  # the head and the body in one write (flushed after each request)
    disable_nagle_algorithm = True
    server: _McpServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _empty(self, status: int) -> None:
        self.send_response(status)
        if status == 405:
            self.send_header("allow", "POST, DELETE")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._empty(405)

    def do_DELETE(self) -> None:
        self._empty(200)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.server.token and self.headers.get("authorization") != f"Bearer {self.server.token}":
            self._empty(401)
            return
        message = json.loads(body)
        TRACE("mcp", "in", message)
        answer = self.server.answer(message)
        if answer is not None:
            TRACE("mcp", "out", answer)
        if answer is None:  # a notification
            self._empty(202)
            return
        data = _line(answer)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _McpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer: Any, token: str = "") -> None:
        super().__init__(("127.0.0.1", 0), _McpHandler)
        self.answer = answer
        self.token = token

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


class _Handover:
    """One value handed from one thread to another that waits for it."""

    __slots__ = ("ready", "value")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: Any = None

    def put(self, value: Any) -> None:
        self.value = value
        self.ready.set()

    def get(self) -> Any:
        self.ready.wait()
        return self.value


def _echo(params: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": (params.get("arguments") or {}).get("text", "")}]}


class AgentFailed(Exception):
    """The agent did not start, or answered a request of the floor's with an error."""


class Floor:
    """The editor link (main thread), the agent link (a reader thread) and the MCP server (a thread per connection),
    wired to each other directly. ``launch``: how to start and set up the agent (the module's ``--launch`` file);
    ``bench_agent``: ``make bench``'s agent, started at once and offered ``echo``."""

    def __init__(self, launch: dict[str, Any], *, bench_agent: bool = False) -> None:
        self.launch = launch
        self.bench_agent = bench_agent
        self.agent: subprocess.Popen[bytes] | None = None
        self._to_agent = -1
        self._ids = itertools.count(1)
        self._answers: dict[int, _Handover] = {}
        self._started: threading.Event | None = None  # set once the agent's start ended, however it ended
        self._failure = ""  # why the agent's start failed
        self._capabilities: dict[str, Any] = {}
        self._turn: Any = None  # the id of the editor's open lm/chat
        self._prompt_id: int | None = None
        self._waiting: _Handover | None = None  # the MCP call waiting for the editor's result
        self._calls = 0
        self._session_id: str | None = None
        self._tools: list[dict[str, Any]] = [ECHO_TOOL] if bench_agent else []
        self._stopping = False  # the editor closed: the agent is being stopped on purpose
        self._token = "" if bench_agent else secrets.token_urlsafe(16)
        self.mcp = _McpServer(self._mcp_answer, self._token)
        self._socket_dir = ""  # the stdio relay's unix socket lives here (0700), made when first needed
        self._relay: socket.socket | None = None

    # -- the agent -------------------------------------------------------------------------------------------------

    def _start(self) -> None:
        """Start the agent and set it up (``initialize``, ``authenticate``); any failure is kept for the chats."""
        assert self._started is not None
        try:
            launch = self.launch
            env = None
            if not self.bench_agent:
                unset = launch.get("unset_env") or ()
                env = {k: v for k, v in os.environ.items() if not any(fnmatch.fnmatchcase(k, p) for p in unset)}
                env.update(launch.get("env") or {})
            self.agent = subprocess.Popen(
                launch["argv"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None if self.bench_agent else subprocess.DEVNULL,
                bufsize=0,
                env=env,
                cwd=launch.get("cwd"),
                start_new_session=not self.bench_agent,
            )
            assert self.agent.stdin is not None
            self._to_agent = self.agent.stdin.fileno()
            threading.Thread(target=self._read_agent, daemon=True).start()
            capabilities = {} if self.bench_agent else CLIENT_CAPABILITIES
            initialize = {"protocolVersion": 1, "clientCapabilities": capabilities}
            if not self.bench_agent:
                initialize["clientInfo"] = {"name": "bare-floor", "version": "1"}
            self._capabilities = self._ask("initialize", initialize).get("agentCapabilities") or {}
            if launch.get("authenticate"):
                self._ask("authenticate", {"methodId": launch["authenticate"]})
        except (OSError, ValueError, AgentFailed) as exc:
            self._failure = str(exc) or type(exc).__name__
        finally:
            self._started.set()

    def _start_once(self, *, report: bool = False) -> None:
        """The agent's start, begun by the first caller (in a thread of its own); ``report``: "agent ready" to
        stderr once it has started, what ``make bench-agents`` waits for after a prestart."""
        if self._started is None:
            self._started = threading.Event()
            threading.Thread(target=self._start, daemon=True).start()
        if report:

            def ready() -> None:
                assert self._started is not None
                self._started.wait()
                print("agent ready" if not self._failure else f"agent failed: {self._failure}", file=sys.stderr)
                sys.stderr.flush()

            threading.Thread(target=ready, daemon=True).start()

    def _send(self, message: dict[str, Any]) -> None:
        TRACE("agent", "out", message)
        write_all(self._to_agent, _line(message))

    def _ask(self, method: str, params: dict[str, Any]) -> Any:
        # The id is made known to the agent reader before the request is written: the answer may come at once.
        request_id, answer = next(self._ids), _Handover()
        self._answers[request_id] = answer
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        message = answer.get()
        if "error" in message:
            raise AgentFailed(f"{method}: {message['error']}")
        return message.get("result")

    def _read_agent(self) -> None:
        assert self.agent is not None and self.agent.stdout is not None
        try:
            self._relay_agent(Lines(self.agent.stdout.fileno()))
        finally:
            # The agent is gone (or its output unreadable): nothing would answer what waits on it. Exit at once, so
            # that the editor's side sees this program's output end instead of waiting for ever.
            if not self._stopping:
                sys.stderr.write(f"bare floor: the agent's output ended (exit code {self.agent.poll()})\n")
                sys.stderr.flush()
                self._stop_agent()
                os._exit(1)

    def _relay_agent(self, lines: Lines) -> None:
        while (line := lines.next()) is not None:
            message = json.loads(line)
            TRACE("agent", "in", message)
            method = message.get("method")
            if method is None:
                if message.get("id") == self._prompt_id:
                    turn, self._turn = self._turn, None
                    stop = (message.get("result") or {}).get("stopReason", "end_turn")
                    self._to_editor({"jsonrpc": "2.0", "id": turn, "result": {"stopReason": stop}})
                elif (answer := self._answers.pop(message.get("id"), None)) is not None:
                    answer.put(message)
            elif method == "session/update":
                update = (message.get("params") or {}).get("update") or {}
                content = update.get("content") or {}
                text = update.get("sessionUpdate") == "agent_message_chunk" and content.get("type") == "text"
                if text and self._turn is not None:
                    part = {"type": "text", "value": content["text"]}
                    params = {"requestId": self._turn, "part": part}
                    self._to_editor({"jsonrpc": "2.0", "method": "lm/part", "params": params})
            elif "id" in message:
                self._send({"jsonrpc": "2.0", "id": message["id"], **self._agent_request(method, message)})

    @staticmethod
    def _agent_request(method: str, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to a request of the agent's: a permission is allowed once; nothing else is offered."""
        if method == "session/request_permission":
            options = (message.get("params") or {}).get("options") or [{}]
            chosen = next((o for o in options if o.get("kind") == "allow_once"), options[0])
            return {"result": {"outcome": {"outcome": "selected", "optionId": chosen.get("optionId")}}}
        return {"error": {"code": -32601, "message": f"method not found: {method}"}}

    def _stop_agent(self) -> None:
        if self.agent is None:
            return
        try:
            if self.bench_agent:
                self.agent.kill()
            else:  # its whole process group, as lmbridge stops an agent (with its MCP servers and helpers)
                os.killpg(self.agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.agent.wait()

    # -- the MCP server and its relay ------------------------------------------------------------------------------

    def _mcp_answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        return mcp_answer(message, self._tools, self._call)

    def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        self._calls += 1
        part = {"type": "tool_call", "callId": f"call_{self._calls}", "name": params["name"]}
        part["input"] = params.get("arguments") or {}
        result = self._waiting = _Handover()
        turn, self._turn = self._turn, None
        self._to_editor(
            {"jsonrpc": "2.0", "method": "lm/part", "params": {"requestId": turn, "part": part}},
            {"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "tool_calls"}},
        )
        content = result.get().get("content") or []
        return {"content": [{"type": "text", "text": c.get("value", "")} for c in content if c.get("type") == "text"]}

    def _stdio_server(self) -> dict[str, Any]:
        """The MCP server entry of a session over the stdio relay (its listener made at the first)."""
        if self._relay is None:
            self._socket_dir = tempfile.mkdtemp(prefix="bare-floor-")  # 0700
            self._relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._relay.bind(os.path.join(self._socket_dir, "mcp.sock"))
            self._relay.listen(8)
            threading.Thread(target=self._accept, args=(self._relay,), daemon=True).start()
        env = {"BARE_FLOOR_SOCKET": os.path.join(self._socket_dir, "mcp.sock"), "BARE_FLOOR_TOKEN": self._token}
        return {
            "name": "editor",
            "command": sys.executable,
            "args": ["-I", "-S", SHIM],
            "env": [{"name": name, "value": value} for name, value in env.items()],
        }

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the floor stops
                return
            threading.Thread(target=self._serve_stdio, args=(connection,), daemon=True).start()

    def _serve_stdio(self, connection: socket.socket) -> None:
        """One shim's MCP session: its token first, then a JSON-RPC message per line, answered in turn."""
        with connection:
            lines = Lines(connection.fileno())
            if lines.next() != self._token.encode():
                return
            while (line := lines.next()) is not None:
                message = json.loads(line)
                TRACE("mcp", "in", message)
                answer = self._mcp_answer(message)
                if answer is not None:
                    TRACE("mcp", "out", answer)
                    connection.sendall(_line(answer))

    def _http_server(self) -> dict[str, Any]:
        headers = [{"name": "Authorization", "value": f"Bearer {self._token}"}] if self._token else []
        return {"type": "http", "name": "editor", "url": self.mcp.url, "headers": headers}

    # -- the editor ------------------------------------------------------------------------------------------------

    def _to_editor(self, *messages: dict[str, Any]) -> None:
        for message in messages:
            TRACE("editor", "out", message)
        write_all(1, b"".join(_line(message) for message in messages))

    def run(self) -> None:
        threading.Thread(target=self.mcp.serve_forever, daemon=True).start()
        if self.bench_agent:
            self._start_once()
            assert self._started is not None
            self._started.wait()
        editor = Lines(0)
        try:
            while (line := editor.next()) is not None:
                message = json.loads(line)
                TRACE("editor", "in", message)
                method = message.get("method")
                if method == "initialize":
                    info = {"protocolVersion": 1, "serverInfo": {"name": "bare-floor", "version": "1"}, "models": []}
                    if not self.bench_agent:
                        info["permissionTool"] = PERMISSION_TOOL
                        if self.launch.get("prestart"):
                            self._start_once(report=True)
                    self._to_editor({"jsonrpc": "2.0", "id": message["id"], "result": info})
                elif method == "lm/chat":
                    self._chat(message["id"], message["params"])
                elif method is not None and "id" in message:
                    error = {"code": -32601, "message": f"method not found: {method}"}
                    self._to_editor({"jsonrpc": "2.0", "id": message["id"], "error": error})
        finally:
            self._stopping = True
            self._stop_agent()
            self.mcp.server_close()
            if self._relay is not None:
                self._relay.close()
                shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _chat(self, request_id: Any, params: dict[str, Any]) -> None:
        self._turn = request_id
        messages = params["messages"]
        last = messages[-1]["content"]
        results = [part for part in last if part.get("type") == "tool_result"]
        if results and self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            waiting.put(results[0])
            return
        try:
            self._prompt(messages, [part for part in last if part.get("type") == "text"], params)
        except AgentFailed as exc:
            self._turn = None
            error = {"code": -32603, "message": f"bare floor: {exc}"}
            self._to_editor({"jsonrpc": "2.0", "id": request_id, "error": error})

    def _prompt(self, messages: list[Any], texts: list[dict[str, Any]], params: dict[str, Any]) -> None:
        """The chat's text as a prompt: in a new session for a new conversation (answered by the agent reader)."""
        self._start_once()
        assert self._started is not None
        self._started.wait()
        if self._failure:
            raise AgentFailed(f"the agent did not start: {self._failure}")
        if not self.bench_agent:  # the editor's tools, minus the permission tool, as lmbridge offers them
            offered = (params.get("options") or {}).get("tools") or ()
            self._tools = [tool for tool in offered if tool.get("name") != PERMISSION_TOOL["name"]]
        if len(messages) == 1 or self._session_id is None:
            self._new_session()
        text = "".join(part.get("value", "") for part in texts)
        prompt = {"sessionId": self._session_id, "prompt": [{"type": "text", "text": text}]}
        self._prompt_id = next(self._ids)
        self._send({"jsonrpc": "2.0", "id": self._prompt_id, "method": "session/prompt", "params": prompt})

    def _new_session(self) -> None:
        transport = self.launch.get("transport", "http")
        if transport == "auto":
            transport = "http" if (self._capabilities.get("mcpCapabilities") or {}).get("http") else "stdio"
        server = self._stdio_server() if transport == "stdio" else self._http_server()
        cwd = self.launch.get("cwd") or os.getcwd()
        session = self._ask("session/new", {"cwd": cwd, "mcpServers": [server]})
        self._session_id = session["sessionId"]
        current = {o.get("id"): o.get("currentValue") for o in session.get("configOptions") or ()}
        for key, value in self.launch.get("options") or ():
            if current.get(key) != value:
                params = {"sessionId": self._session_id, "configId": key, "value": value}
                self._ask("session/set_config_option", params)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        server = _McpServer(lambda message: mcp_answer(message, [ECHO_TOOL], _echo))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        write_all(1, _line({"url": server.url, "token": ""}))
        while os.read(0, 4096):  # until stdin ends
            pass
        server.server_close()
    elif argv[:1] == ["--launch"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as file:
            Floor(json.load(file)).run()
    elif argv and not argv[0].startswith("-"):
        Floor({"argv": argv}, bench_agent=True).run()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
