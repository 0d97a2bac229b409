"""The benchmarks' side of the pipes: blocking, minimal NDJSON peers (no Trio, no SDK), so that what is measured is
the bridge and the agent, not the client.

- ``Peer``: a subprocess speaking newline-delimited JSON-RPC on stdin/stdout.
- ``BridgeClient``: an editor on ``lmbridge stdio`` (editor protocol v1).
- ``DirectAgent``: the same reader talking ACP straight to an agent process (the baselines without the bridge).

Both readers do the same work per line — ``json.loads`` and a look at ``method``/``id`` — so a ratio between a
bridge path and its direct path is the bridge's cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bridge.editor.client import assistant_message

__all__ = [
    "AGENT",
    "BARE_FLOOR",
    "MCP_SERVER",
    "ROOT",
    "TOOL_FLOOR",
    "BridgeClient",
    "DirectAgent",
    "FloorClient",
    "Peer",
    "assistant_message",
    "bridge_argv",
    "clock",
    "user",
]

ROOT = Path(__file__).resolve().parent.parent
AGENT = str(ROOT / "bench" / "agent.py")
MCP_SERVER = str(ROOT / "bench" / "mcp_server.py")
TOOL_FLOOR = str(ROOT / "bench" / "tool_floor.py")
BARE_FLOOR = str(ROOT / "bench" / "bare_floor.py")
clock = time.perf_counter  # CLOCK_MONOTONIC on Linux, like time.monotonic_ns in the agent
loads = json.loads


def _dumps(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


def bridge_argv(*args: str) -> list[str]:
    """``lmbridge stdio ARGS`` the way an editor runs it: the installed console script when there is one."""
    script = Path(sys.executable).with_name("lmbridge")
    if script.exists():
        return [str(script), "stdio", *args]
    return [sys.executable, "-m", "bridge", "stdio", *args]


class Peer:
    def __init__(
        self, argv: list[str], *, env: dict[str, str] | None = None, stderr: Any = None, cwd: str | None = None
    ) -> None:
        self.started = clock()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr if stderr is not None else subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            bufsize=0,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin.fileno()
        self._out = self.process.stdout.fileno()
        self._rest = b""
        self._lines: deque[bytes] = deque()
        self._next_id = 1
        self.read_at = 0.0  # clock() when the bytes of the last line returned were read

    @property
    def pid(self) -> int:
        return self.process.pid

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view) :]

    def send(self, message: dict[str, Any]) -> None:
        self.write(_dumps(message))

    def _fill(self) -> None:
        data = os.read(self._out, 1 << 16)
        self.read_at = clock()
        if not data:
            raise EOFError(f"pid {self.pid} closed its output (exit code {self.process.poll()})")
        pieces = (self._rest + data).split(b"\n")
        self._rest = pieces.pop()
        self._lines.extend(pieces)

    def line(self) -> bytes:
        while not self._lines:
            self._fill()
        return self._lines.popleft()

    def message(self) -> dict[str, Any]:
        while True:
            line = self.line()
            if line.strip():
                return loads(line)

    def request(self, method: str, params: Any = None) -> Any:
        request_id = self.next_id()
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        while True:
            reply = self.message()
            if reply.get("id") == request_id and "method" not in reply:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply.get("result")

    def close(self, timeout: float = 20.0) -> int:
        """Close stdin (the orderly stop for both the bridge and the agents) and wait."""
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.process.stdout.close()  # type: ignore[union-attr]
        return code


class BridgeClient(Peer):
    """An editor on ``lmbridge stdio``."""

    def __init__(
        self,
        config: Path | str,
        *,
        env: dict[str, str] | None = None,
        stderr: Any = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(bridge_argv("--config", str(config), *extra_args), env=env, stderr=stderr)

    def initialize(self) -> dict[str, Any]:
        return self.request(
            "initialize", {"protocolVersion": 1, "clientInfo": {"name": "lmbridge-bench", "version": "1"}}
        )

    def start_chat(self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        request_id = self.next_id()
        params: dict[str, Any] = {"modelId": model, "messages": messages}
        if tools:
            params["options"] = {"tools": tools}
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "lm/chat", "params": params})
        return request_id

    def chat(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        request_id = self.start_chat(model, messages, tools)
        parts: list[dict[str, Any]] = []
        result = self.finish_chat(request_id, parts.append)
        return parts, result

    def finish_chat(self, request_id: int, on_part: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Read until the answer to ``request_id``; its parts go to ``on_part``."""
        while True:
            message = self.message()
            if "method" in message:
                params = message.get("params") or {}
                if message["method"] == "lm/part" and params.get("requestId") == request_id:
                    on_part(params["part"])
            elif message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"lm/chat failed: {message['error']}")
                return message["result"]

    def finish_chats(self, request_ids: list[int]) -> dict[int, dict[str, Any]]:
        """Read until every one of ``request_ids`` is answered (parts are dropped); their results by id."""
        waiting = set(request_ids)
        results: dict[int, dict[str, Any]] = {}
        while waiting:
            message = self.message()
            if "method" not in message and message.get("id") in waiting:
                if "error" in message:
                    raise RuntimeError(f"lm/chat failed: {message['error']}")
                waiting.discard(message["id"])
                results[message["id"]] = message["result"]
        return results

    def count_chunks(self, request_id: int) -> tuple[int, dict[str, Any]]:
        """The throughput reader: parse every line and count the agent's flood chunks in this request's parts (each
        chunk's text ends with one space, so parts that merge several chunks count right), until the answer."""
        count = 0
        line = self.line
        while True:
            message = loads(line())
            if "method" in message:
                count += message["params"]["part"].get("value", "").count(" ")
            elif message.get("id") == request_id:
                return count, message

    def text_lines(self, request_id: int) -> Iterator[tuple[str, float]]:
        """(text of each part, clock() at which its bytes were read), until the answer to ``request_id``."""
        while True:
            message = loads(self.line())
            if "method" in message:
                part = message["params"]["part"]
                if part.get("type") == "text":
                    yield part["value"], self.read_at
            elif message.get("id") == request_id:
                return


class FloorClient(BridgeClient):
    """The same editor talking to ``bench/tool_floor.py`` (lmbridge's transports alone, the bench agent behind it)
    in lmbridge's place: the floor of the tool round trip. ``relay``: MCP through the stdio relay, else over HTTP.
    ``bare``: ``bench/bare_floor.py`` instead (the standard library alone, MCP over HTTP); ``launch``: that floor
    with the agent its launch file names (``--launch``)."""

    def __init__(
        self,
        *,
        relay: bool,
        bare: bool = False,
        env: dict[str, str] | None = None,
        stderr: Any = None,
        launch: Path | None = None,
    ) -> None:
        if launch is not None:
            argv = [sys.executable, BARE_FLOOR, "--launch", str(launch)]
        else:
            if bare:
                floor = [sys.executable, BARE_FLOOR]
            else:
                floor = [sys.executable, TOOL_FLOOR, "--relay"] if relay else [sys.executable, TOOL_FLOOR]
            argv = [*floor, sys.executable, AGENT] if relay else [*floor, sys.executable, AGENT, "--mcp-http"]
        Peer.__init__(self, argv, env=env, stderr=stderr)  # not lmbridge's command line


class DirectAgent(Peer):
    """The same minimal reader talking ACP to an agent process directly: the baselines."""

    def __init__(self, argv: list[str] | None = None, *, env: dict[str, str] | None = None, stderr: Any = None) -> None:
        super().__init__(argv or [sys.executable, AGENT], env=env, stderr=stderr)

    def initialize(self) -> dict[str, Any]:
        return self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    def new_session(self, mcp_servers: list[dict[str, Any]] | None = None) -> str:
        return self.request("session/new", {"cwd": str(ROOT), "mcpServers": mcp_servers or []})["sessionId"]

    def start_prompt(self, session_id: str, text: str) -> int:
        request_id = self.next_id()
        self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "session/prompt",
                "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
            }
        )
        return request_id

    def count_chunks(self, request_id: int) -> tuple[int, dict[str, Any]]:
        """The same reader on the agent's own updates."""
        count = 0
        line = self.line
        while True:
            message = loads(line())
            if "method" in message:
                count += message["params"]["update"]["content"].get("text", "").count(" ")
            elif message.get("id") == request_id:
                return count, message

    def text_lines(self, request_id: int) -> Iterator[tuple[str, float]]:
        while True:
            message = loads(self.line())
            if "method" in message:
                content = message["params"]["update"].get("content") or {}
                if content.get("type") == "text":
                    yield content["text"], self.read_at
            elif message.get("id") == request_id:
                return

    def prompt_texts(self, session_id: str, text: str) -> list[str]:
        return [value for value, _at in self.text_lines(self.start_prompt(session_id, text))]
