"""The tool round trip's hops with nothing but the standard library: how low the floor goes without Trio or Hypercorn.

``bench/tool_floor.py`` measures the hops lmbridge adds with lmbridge's own transports (Trio, its JSON-RPC engine,
its MCP endpoint under Hypercorn). This is the same conversation with blocking threads and ``http.server``: the
least a Python process can do to relay an agent's MCP call to an editor and the editor's result back. Two modes:

    python bench/bare_floor.py --serve        an MCP server on streamable HTTP (JSON responses) that answers
                                              ``echo`` at once; prints ``{"url": ...}``: the baseline;
                                              it serves until its stdin ends
    python bench/bare_floor.py AGENT_ARGV...  in lmbridge's place: the editor on stdin/stdout (editor protocol
                                              v1, ``initialize`` and ``lm/chat``), AGENT_ARGV as the agent, its
                                              MCP calls served over HTTP and relayed to the editor

The difference between the two, the agent timing the same calls, is what the relay itself costs: two pipe hops,
the editor's own work, and the wake-ups in between. It serves only the conversations of the tool benchmark (one
prompt, then one tool result per request). Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings, standard library only as well
from agent import Lines, write_all
from mcp_server import ECHO_TOOL


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class _McpHandler(BaseHTTPRequestHandler):
    """MCP over streamable HTTP, JSON responses only: ``initialize``, ``tools/list``, ``tools/call``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's client expects
    wbufsize = 1 << 16  # the head and the body in one write (flushed after each request)
    disable_nagle_algorithm = True
    server: _McpServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        if "id" not in message:  # a notification
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bare-floor", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [ECHO_TOOL]}
        else:
            result = self.server.call(params)
        body = _line({"jsonrpc": "2.0", "id": message["id"], "result": result})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _McpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, call: Any) -> None:
        super().__init__(("127.0.0.1", 0), _McpHandler)
        self.call = call

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


def _echo(params: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": (params.get("arguments") or {}).get("text", "")}]}


class Floor:
    """The editor link (main thread), the agent link (a reader thread) and the MCP server (a thread per connection),
    wired to each other directly."""

    def __init__(self, agent_argv: list[str]) -> None:
        self.agent = subprocess.Popen(agent_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self.agent.stdin is not None and self.agent.stdout is not None
        self._to_agent = self.agent.stdin.fileno()
        self._from_agent = Lines(self.agent.stdout.fileno())
        self._editor_lock = threading.Lock()
        self._answers: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._next_id = 0
        self._turn: Any = None  # the id of the editor's open lm/chat
        self._prompt_id: int | None = None
        self._waiting: tuple[threading.Event, list[Any]] | None = None  # the MCP call waiting for its result
        self._calls = 0
        self._stopping = False  # the editor closed: the agent is being stopped on purpose
        self.mcp = _McpServer(self._call)

    def _to_editor(self, *messages: dict[str, Any]) -> None:
        with self._editor_lock:
            write_all(1, b"".join(_line(message) for message in messages))

    def _new_id(self) -> int:
        # Taken, and made known to the agent reader, before the request is written: the answer may come at once.
        self._next_id += 1
        return self._next_id

    def _request(self, request_id: int, method: str, params: dict[str, Any]) -> None:
        write_all(self._to_agent, _line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))

    def _ask(self, method: str, params: dict[str, Any]) -> Any:
        answered, holder = threading.Event(), []
        request_id = self._new_id()
        self._answers[request_id] = answered, holder
        self._request(request_id, method, params)
        answered.wait()
        return holder[0]

    def _read_agent(self) -> None:
        try:
            self._relay_agent()
        finally:
            # The agent is gone (or its output unreadable): nothing would answer what waits on it. Exit at once, so
            # that the editor's side sees this program's output end instead of waiting for ever.
            if not self._stopping:
                sys.stderr.write(f"bare floor: the agent's output ended (exit code {self.agent.poll()})\n")
                sys.stderr.flush()
                os._exit(1)

    def _relay_agent(self) -> None:
        while (line := self._from_agent.next()) is not None:
            message = json.loads(line)
            if "method" not in message:
                if message.get("id") == self._prompt_id:
                    turn, self._turn = self._turn, None
                    self._to_editor({"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "end_turn"}})
                elif message.get("id") in self._answers:
                    answered, holder = self._answers.pop(message["id"])
                    holder.append(message.get("result"))
                    answered.set()
                continue
            update = (message.get("params") or {}).get("update") or {}
            if update.get("sessionUpdate") == "agent_message_chunk" and self._turn is not None:
                part = {"type": "text", "value": update["content"]["text"]}
                params = {"requestId": self._turn, "part": part}
                self._to_editor({"jsonrpc": "2.0", "method": "lm/part", "params": params})

    def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        self._calls += 1
        part = {"type": "tool_call", "callId": f"call_{self._calls}", "name": params["name"]}
        part["input"] = params.get("arguments") or {}
        answered, holder = threading.Event(), []
        self._waiting = answered, holder
        turn, self._turn = self._turn, None
        self._to_editor(
            {"jsonrpc": "2.0", "method": "lm/part", "params": {"requestId": turn, "part": part}},
            {"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "tool_calls"}},
        )
        answered.wait()
        content = holder[0].get("content") or []
        return {"content": [{"type": "text", "text": c.get("value", "")} for c in content if c.get("type") == "text"]}

    def run(self) -> None:
        threading.Thread(target=self.mcp.serve_forever, daemon=True).start()
        threading.Thread(target=self._read_agent, daemon=True).start()
        self._ask("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        editor = Lines(0)
        try:
            while (line := editor.next()) is not None:
                message = json.loads(line)
                if message.get("method") == "initialize":
                    info = {"protocolVersion": 1, "serverInfo": {"name": "bare-floor", "version": "1"}, "models": []}
                    self._to_editor({"jsonrpc": "2.0", "id": message["id"], "result": info})
                elif message.get("method") == "lm/chat":
                    self._chat(message["id"], message["params"])
        finally:
            self._stopping = True
            self.agent.kill()
            self.agent.wait()
            self.mcp.server_close()

    def _chat(self, request_id: Any, params: dict[str, Any]) -> None:
        self._turn = request_id
        last = params["messages"][-1]["content"]
        results = [part for part in last if part.get("type") == "tool_result"]
        if results and self._waiting is not None:
            (answered, holder), self._waiting = self._waiting, None
            holder.append(results[0])
            answered.set()
            return
        # A new conversation: a session with the MCP server, then the prompt (answered by the agent reader).
        server = {"type": "http", "name": "editor", "url": self.mcp.url, "headers": []}
        session = self._ask("session/new", {"cwd": os.getcwd(), "mcpServers": [server]})
        text = "".join(part.get("value", "") for part in last if part.get("type") == "text")
        prompt = {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": text}]}
        self._prompt_id = self._new_id()
        self._request(self._prompt_id, "session/prompt", prompt)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        server = _McpServer(_echo)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        write_all(1, _line({"url": server.url, "token": ""}))
        while os.read(0, 4096):  # until stdin ends
            pass
        server.server_close()
    else:
        Floor(argv).run()


if __name__ == "__main__":
    main(sys.argv[1:])
