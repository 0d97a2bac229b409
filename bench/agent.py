"""A minimal ACP agent for the benchmarks: raw newline-delimited JSON-RPC over stdio, standard library only.

It is the far end of every benchmark that measures the bridge's own cost, so it does as little as possible: no SDK,
no validation, one process, blocking I/O. The bridge (through ``[agents.<id>]`` in a temporary config) and the
benchmarks' direct readers (no bridge) drive exactly the same program.

The prompt's last text line (blocks the bridge writes as context, starting with ``[lmbridge]``, are skipped) is one
directive:

    flood N          N ``agent_message_chunk`` updates, written as fast as the pipe takes them
    steady N RATE    N chunks at RATE per second; each chunk's text is its CLOCK_MONOTONIC time in ns and a space
    say TEXT         one chunk with TEXT
    stall            one chunk "stalling", then nothing until ``session/cancel`` for the session: the prompt is then
                     answered ``cancelled`` (what the cancel benchmark times)
    plan             one ``plan`` update (the bridge renders it with the ACP SDK's models, importing them if needed:
                     a warm-up turn with it returns only once that import is done)
    tools N          connect to the session's first MCP server (stdio, or streamable HTTP), then call its tool
                     ``echo`` N + 1 times in a row (the first is a warm-up) timing each call; the last chunk is
                     ``timings:`` + a JSON list of the N round trips in microseconds
    tools N announce the same, each call first reported as a pending ``tool_call`` (as Claude Code reports the
                     calls of the model's response before making them)
    anything else    one chunk "ok"

A directive ending in `` apart`` (``steady 100 200 apart``) is carried out in a thread of its own, its answer sent when
it is done, so that prompts of several sessions stream at once, as a real agent's do; otherwise one prompt at a time.

then answers the prompt with ``end_turn`` (``stall``: ``cancelled``). Run as ``python bench/agent.py``; with
``--mcp-http`` it advertises ``mcpCapabilities.http`` (as Claude Code, Codex and Gemini CLI do), so lmbridge gives it
an HTTP MCP server.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import deque
from typing import Any

CONTEXT_PREFIX = "[lmbridge]"
MCP_PROTOCOL_VERSION = "2025-06-18"


class Lines:
    """Blocking newline framing over a file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._rest = b""
        self._lines: deque[bytes] = deque()

    def next(self) -> bytes | None:
        while not self._lines:
            data = os.read(self.fd, 1 << 16)
            if not data:
                return None
            pieces = (self._rest + data).split(b"\n")
            self._rest = pieces.pop()
            self._lines.extend(piece for piece in pieces if piece.strip())
        return self._lines.popleft()


_WRITING = threading.Lock()  # prompts carried out apart write whole messages, never into each other's


def write_all(fd: int, data: bytes) -> None:
    with _WRITING:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


def send(message: dict[str, Any]) -> None:
    write_all(1, json.dumps(message, separators=(",", ":")).encode() + b"\n")


def chunk_line(session_id: str, text: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
        + session_id.encode()
        + b'","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":'
        + json.dumps(text).encode()
        + b"}}}}\n"
    )


def mcp_client(server: dict[str, Any]) -> McpClient | HttpMcpClient:
    return HttpMcpClient(server) if server.get("url") else McpClient(server)


def _initialize(client: McpClient | HttpMcpClient) -> None:
    client.request(
        "initialize",
        {
            "protocolVersion": MCP_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "lmbridge-bench-agent", "version": "1"},
        },
    )
    client.notify("notifications/initialized")
    client.request("tools/list", {})


class HttpMcpClient:
    """Just enough of an MCP client (streamable HTTP, one keep-alive connection) to time ``tools/call``."""

    def __init__(self, server: dict[str, Any]) -> None:
        url = urllib.parse.urlsplit(server["url"])
        self._path = url.path
        self._connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=60)
        self._headers = {item["name"]: item["value"] for item in server.get("headers") or ()}
        self._headers.update({"content-type": "application/json", "accept": "application/json, text/event-stream"})
        self._next_id = 1
        _initialize(self)

    def _post(self, message: dict[str, Any]) -> tuple[http.client.HTTPResponse, bytes]:
        self._connection.request("POST", self._path, json.dumps(message, separators=(",", ":")), self._headers)
        response = self._connection.getresponse()
        body = response.read()
        if response.status >= 400:
            raise RuntimeError(f"MCP over HTTP: {response.status} {body[:200]!r}")
        return response, body

    def notify(self, method: str) -> None:
        self._post({"jsonrpc": "2.0", "method": method})

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self._next_id
        self._next_id += 1
        response, body = self._post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        session = response.getheader("mcp-session-id")
        if session:
            self._headers["mcp-session-id"] = session
            self._headers["mcp-protocol-version"] = MCP_PROTOCOL_VERSION
        if (response.getheader("content-type") or "").startswith("text/event-stream"):
            lines = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
        else:
            lines = [body]
        for line in lines:
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"MCP error: {message['error']}")
                return dict(message["result"])
        raise RuntimeError(f"MCP over HTTP: no answer to {method} in {body[:200]!r}")

    def close(self) -> None:
        self._connection.close()


class McpClient:
    """Just enough of an MCP client (stdio transport) to time ``tools/call``."""

    def __init__(self, server: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.update({item["name"]: item["value"] for item in server.get("env") or ()})
        self.process = subprocess.Popen(
            [server["command"], *server.get("args", [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin.fileno()
        self._lines = Lines(self.process.stdout.fileno())
        self._next_id = 1
        _initialize(self)

    def notify(self, method: str) -> None:
        write_all(self._in, json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = self._next_id
        self._next_id += 1
        write_all(
            self._in,
            json.dumps(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, separators=(",", ":")
            ).encode()
            + b"\n",
        )
        while True:
            line = self._lines.next()
            if line is None:
                raise EOFError("the MCP server closed its output")
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"MCP error: {message['error']}")
                return message["result"]

    def close(self) -> None:
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def directive(blocks: list[dict[str, Any]]) -> str:
    """The prompt's last text line, the blocks lmbridge writes as context skipped."""
    texts = [
        b.get("text", "")
        for b in blocks
        if b.get("type") == "text" and not b.get("text", "").startswith(CONTEXT_PREFIX)
    ]
    return texts[-1].strip().splitlines()[-1].strip() if texts and texts[-1].strip() else ""


class Agent:
    def __init__(self, lines: Lines, *, mcp_http: bool = False) -> None:
        self.lines = lines  # its stdin: ``stall`` reads on while a prompt is running
        self.mcp_http = mcp_http
        self.sessions: dict[str, list[Any]] = {}  # session id → its mcpServers
        self.mcp: dict[str, McpClient | HttpMcpClient] = {}
        self._count = 0

    def handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params") or {}
        if method is None or request_id is None:  # a response, or a notification (session/cancel): nothing to do
            return
        if method == "initialize":
            result: Any = {
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": False,
                    "promptCapabilities": {"image": False},
                    "mcpCapabilities": {"http": self.mcp_http},
                    "sessionCapabilities": {"close": {}},
                },
                "agentInfo": {"name": "lmbridge-bench-agent", "version": "1"},
                "authMethods": [],
            }
        elif method == "session/new":
            self._count += 1
            session_id = f"bench-{os.getpid()}-{self._count}"
            self.sessions[session_id] = list(params.get("mcpServers") or [])
            result = {"sessionId": session_id}
        elif method == "session/close":
            session_id = params.get("sessionId")
            self.sessions.pop(session_id, None)
            client = self.mcp.pop(session_id, None)
            if client is not None:
                client.close()
            result = {}
        elif method == "session/prompt":
            blocks = params.get("prompt") or []
            if directive(blocks).endswith(" apart"):
                threading.Thread(target=self.prompt_apart, args=(request_id, params), daemon=True).start()
                return
            result = {"stopReason": self.prompt(params.get("sessionId"), blocks)}
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            send({"jsonrpc": "2.0", "id": request_id, "error": error})
            return
        send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def prompt_apart(self, request_id: Any, params: dict[str, Any]) -> None:
        stop_reason = self.prompt(params.get("sessionId"), params.get("prompt") or [])
        send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": stop_reason}})

    def prompt(self, session_id: str, blocks: list[dict[str, Any]]) -> str:
        word, _, rest = directive(blocks).removesuffix(" apart").partition(" ")
        if word == "flood":
            self.flood(session_id, int(rest))
        elif word == "steady":
            count, rate = rest.split()
            self.steady(session_id, int(count), float(rate))
        elif word == "say":
            write_all(1, chunk_line(session_id, rest))
        elif word == "plan":
            entry = {"content": "warm up", "priority": "medium", "status": "pending"}
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": session_id, "update": {"sessionUpdate": "plan", "entries": [entry]}},
                }
            )
        elif word == "tools":
            count, _, how = rest.partition(" ")
            self.tools(session_id, int(count), announce=how == "announce")
        elif word == "stall":
            write_all(1, chunk_line(session_id, "stalling"))
            return self.stall(session_id)
        else:
            write_all(1, chunk_line(session_id, "ok"))
        return "end_turn"

    def stall(self, session_id: str) -> str:
        """Read on until ``session/cancel`` for this session; what else comes meanwhile is handled as usual."""
        while (line := self.lines.next()) is not None:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            params = message.get("params") or {}
            if message.get("method") == "session/cancel" and params.get("sessionId") == session_id:
                return "cancelled"
            self.handle(message)
        return "cancelled"

    def flood(self, session_id: str, count: int) -> None:
        head = (
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
            + session_id.encode()
            + b'","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
        )
        tail = b' "}}}}\n'
        batch: list[bytes] = []
        for number in range(1, count + 1):
            batch.append(head + str(number).encode() + tail)
            if len(batch) == 256:
                write_all(1, b"".join(batch))
                batch.clear()
        if batch:
            write_all(1, b"".join(batch))

    def steady(self, session_id: str, count: int, rate: float) -> None:
        """Paced emission (the pacing is the load generator, not synchronisation): chunk i is due at start + i/rate;
        each carries the monotonic time at which it was written."""
        period = int(1e9 / rate)
        clock = time.monotonic_ns
        start = clock()
        for index in range(count):
            due = start + index * period
            now = clock()
            if due > now:
                time.sleep((due - now) / 1e9)
            write_all(1, chunk_line(session_id, f"{clock()} "))

    def tools(self, session_id: str, count: int, *, announce: bool = False) -> None:
        client = self.mcp.get(session_id)
        if client is None:
            servers = [s for s in self.sessions.get(session_id, []) if s.get("command") or s.get("url")]
            if not servers:
                write_all(1, chunk_line(session_id, "error: no MCP server in session/new"))
                return
            client = self.mcp[session_id] = mcp_client(servers[0])
        clock = time.perf_counter_ns
        timings = []
        for index in range(count + 1):
            started = clock()
            if announce:
                update = {"sessionUpdate": "tool_call", "toolCallId": f"c{index}", "title": "mcp__editor__echo"}
                update["status"] = "pending"
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "session/update",
                        "params": {"sessionId": session_id, "update": update},
                    }
                )
            result = client.request("tools/call", {"name": "echo", "arguments": {"text": f"call {index}"}})
            elapsed = clock() - started
            if result.get("isError"):
                write_all(1, chunk_line(session_id, f"error: {json.dumps(result)}"))
                return
            if index:
                timings.append(elapsed / 1000)
        write_all(1, chunk_line(session_id, "timings:" + json.dumps(timings)))


def main() -> int:
    lines = Lines(0)
    agent = Agent(lines, mcp_http="--mcp-http" in sys.argv[1:])
    try:
        while True:
            line = lines.next()
            if line is None:
                return 0
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                agent.handle(message)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        for client in agent.mcp.values():
            client.close()


if __name__ == "__main__":
    sys.exit(main())
