"""One agent process under test, spoken to directly (no lmbridge in between): its JSON-RPC over stdio, every line
of it kept in a transcript, its stderr's tail kept, its process group stopped when done.

Deliberately not ``wire.rpc.connection``: the kit must send what a well-behaved client never would (a line that is
not JSON, an invalid request) and see exactly what came back, including lines a JSON-RPC engine would drop. So
this is a small client of its own: lines in (framed by ``wire.rpc.protocol.LineFramer``), answers matched to
requests by id, the agent's own requests answered by a ``ClientSide`` (what the kit advertised), notifications
kept in arrival order. Every wait takes a deadline; nothing outlives ``open_agent``'s block.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bridge.acp.process import stop_process_group
from wire.rpc.protocol import LineFramer

from .terminals import ClientTerminals, chunks

__all__ = [
    "AgentGone",
    "AgentSpec",
    "Answer",
    "ClientSide",
    "LiveAgent",
    "TranscriptLine",
    "open_agent",
]

MAX_LINE_BYTES = 64 * 1024 * 1024
STDERR_TAIL_BYTES = 8 * 1024
STOP_GRACE = 3.0
Reply = dict[str, Any] | Awaitable[dict[str, Any]] | None  # a reply to the agent, one to come, or held


class AgentGone(Exception):
    """The agent exited (or closed its stdout) before answering."""


@dataclass(frozen=True)
class AgentSpec:
    """How to start the agent: a command line, its environment and working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None

    def describe(self) -> str:
        return " ".join(self.argv)


@dataclass
class TranscriptLine:
    """One line on the agent's stdio: ``dir`` is ``out`` (to the agent) or ``in`` (from it); ``message`` the
    parsed JSON, or None when the line was not JSON (``raw`` then has it)."""

    t: float
    dir: str
    raw: str
    message: Any = None

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"t": round(self.t, 4), "dir": self.dir}
        if self.message is not None:
            entry["msg"] = self.message
        else:
            entry["raw"] = self.raw[:2000]
        return entry


@dataclass
class Answer:
    """The agent's answer to one request: ``result`` or ``error`` (the JSON-RPC error object), and the whole
    response message as sent."""

    message: dict[str, Any]

    @property
    def ok(self) -> bool:
        return "result" in self.message and "error" not in self.message

    @property
    def result(self) -> Any:
        return self.message.get("result")

    @property
    def error(self) -> Any:
        return self.message.get("error")

    def field(self, name: str) -> Any:
        """A field of a successful answer's result object; None for an error or a result that is not an object."""
        return self.result.get(name) if self.ok and isinstance(self.result, dict) else None

    def error_code(self) -> int | None:
        error = self.error
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, int) and not isinstance(code, bool) else None

    def describe(self) -> str:
        if self.ok:
            return "a result"
        error = self.error
        if isinstance(error, dict):
            return f"error {error.get('code')}: {str(error.get('message'))[:200]}"
        return f"an answer with neither result nor a valid error: {json.dumps(self.message)[:200]}"


@dataclass
class ClientSide:
    """What the kit's client advertised and how it answers the agent's requests. Every request the agent makes
    is kept in ``requests`` (method, params), whatever the answer."""

    workspace: Path
    fs_read: bool = False
    fs_write: bool = False
    terminal: bool = False
    # allow (once, else always) | always (always, else once) | reject | cancelled | hold (left for the kit to answer)
    permission_answer: str = "allow"
    requests: list[tuple[str, Any]] = field(default_factory=list)
    terminals: ClientTerminals = field(default_factory=ClientTerminals)

    def capabilities(self) -> dict[str, Any]:
        return {"fs": {"readTextFile": self.fs_read, "writeTextFile": self.fs_write}, "terminal": self.terminal}

    def answer(self, method: str, params: Any) -> Reply:
        """The result or error (``{"error": ...}``) for one of the agent's requests, or an awaitable of it (a
        terminal's, which may wait for its command); None to hold it."""
        self.requests.append((method, params))
        if method == "session/request_permission":
            if self.permission_answer == "hold":
                return None
            return {"result": {"outcome": self._permission(params)}}
        if method == "fs/read_text_file" and self.fs_read:
            return self._read(params)
        if method == "fs/write_text_file" and self.fs_write:
            return self._write(params)
        if method.startswith("terminal/") and self.terminal:
            return self.terminals.answer(method, params)
        return {"error": {"code": -32601, "message": f"method not found: {method} (the client did not offer it)"}}

    def _permission(self, params: Any) -> dict[str, Any]:
        options = params.get("options") if isinstance(params, dict) else None
        preferred = {
            "allow": ("allow_once", "allow_always"),
            "always": ("allow_always", "allow_once"),
            "reject": ("reject_once", "reject_always"),
        }
        if self.permission_answer in preferred and isinstance(options, list):
            offered = [o for o in options if isinstance(o, dict)]
            for kind in preferred[self.permission_answer]:
                for option in offered:
                    if option.get("kind") == kind:
                        return {"outcome": "selected", "optionId": option.get("optionId")}
        return {"outcome": "cancelled"}

    def _inside(self, params: Any) -> Path | None:
        path = params.get("path") if isinstance(params, dict) else None
        if not isinstance(path, str) or not os.path.isabs(path):
            return None
        resolved = Path(path).resolve()
        return resolved if resolved.is_relative_to(self.workspace.resolve()) else None

    def _read(self, params: Any) -> dict[str, Any]:
        path = self._inside(params)
        if path is None:
            return {"error": {"code": -32602, "message": "path must be absolute and inside the session's cwd"}}
        try:
            return {"result": {"content": path.read_text()}}
        except OSError as exc:
            return {"error": {"code": -32002, "message": f"cannot read {path}: {exc.strerror}"}}

    def _write(self, params: Any) -> dict[str, Any]:
        path = self._inside(params)
        content = params.get("content") if isinstance(params, dict) else None
        if path is None or not isinstance(content, str):
            return {"error": {"code": -32602, "message": "path must be absolute and inside the session's cwd"}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return {"result": {}}


class LiveAgent:
    """The running agent: requests out, answers, notifications and the agent's requests in. Use through
    ``open_agent``."""

    def __init__(self, process: trio.Process, client: ClientSide, started: float) -> None:
        self._process = process
        self.client = client
        self._started = started
        self.transcript: list[TranscriptLine] = []
        self.notifications: list[dict[str, Any]] = []  # in arrival order
        self.held: list[dict[str, Any]] = []  # the agent's requests the client side left for the kit to answer
        self._answers: dict[Any, Answer] = {}
        self._arrived = trio.Event()  # set (and replaced) whenever anything arrives
        self._next_id = 0
        self._sending = trio.Lock()
        self.closed = trio.Event()  # stdout ended: no more messages
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self.stderr_bytes = 0
        self._nursery: trio.Nursery | None = None  # where late replies (terminals) run: open_agent's

    # -- sending ------------------------------------------------------------------------------------------------

    async def send_line(self, raw: str, message: Any = None, *, shown: str | None = None) -> None:
        """Write one line as is (a newline is added); ``message`` is what it encodes, for the transcript, and
        ``shown`` what the transcript keeps of a line too long to keep whole."""
        stdin = self._process.stdin
        assert stdin is not None
        try:
            async with self._sending:  # the kit's requests and the reader's answers to the agent share the pipe
                self._record("out", shown if shown is not None else raw, message)
                await stdin.send_all(raw.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise AgentGone("the agent closed its stdin") from exc

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_line(json.dumps(message, ensure_ascii=False), message)

    async def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def start_request(self, method: str, params: Any = None) -> int:
        """Send a request; returns its id (for ``answer``)."""
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return self._next_id

    async def answer(self, request_id: Any, timeout: float) -> Answer:
        """The answer to request ``request_id``; ``TimeoutError`` after ``timeout`` s, ``AgentGone`` if the agent
        closed its stdout first."""
        with trio.move_on_after(timeout):
            while request_id not in self._answers:
                if self.closed.is_set():
                    raise AgentGone(self.exit_description())
                await self._arrived.wait()
            return self._answers[request_id]
        raise TimeoutError(f"no answer within {timeout:g} s")

    async def request(self, method: str, params: Any = None, *, timeout: float) -> Answer:
        return await self.answer(await self.start_request(method, params), timeout)

    async def respond(self, request: dict[str, Any], reply: dict[str, Any]) -> None:
        """Answer one of the agent's held requests (``reply``: ``{"result": ...}`` or ``{"error": ...}``)."""
        self.held.remove(request)
        await self._reply(request["id"], reply)

    def answered(self, request_id: Any) -> Answer | None:
        return self._answers.get(request_id)

    async def wait_until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition()`` holds (checked whenever something arrives); False on timeout or when the
        agent's stdout ends first."""
        with trio.move_on_after(timeout):
            while not condition():
                if self.closed.is_set():
                    return condition()
                await self._arrived.wait()
            return True
        return False

    async def close_stdin(self) -> None:
        stdin = self._process.stdin
        if stdin is not None:
            with trio.CancelScope(shield=True):
                try:
                    await stdin.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def stop(self) -> None:
        """Stop the agent's process group now (closing stdin, then signals), as at the end of the block."""
        with trio.CancelScope(shield=True):
            await stop_process_group(self._process, STOP_GRACE)

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit status once the process has exited, None if it is still running after ``timeout`` s."""
        with trio.move_on_after(timeout):
            return await self._process.wait()
        return None

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def exit_description(self) -> str:
        code = self._process.returncode
        if code is None:
            return "the agent closed its stdout"
        if code < 0:
            return f"the agent was killed by signal {-code}"
        return f"the agent exited with status {code}"

    def stderr_tail(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def now(self) -> float:
        return trio.current_time() - self._started

    # -- receiving ----------------------------------------------------------------------------------------------

    def _record(self, direction: str, raw: str, message: Any = None) -> None:
        self.transcript.append(TranscriptLine(self.now(), direction, raw, message))

    async def _read_stdout(self) -> None:
        framer = LineFramer(MAX_LINE_BYTES)
        try:
            async for data in chunks(self._process.stdout):
                for line in framer.feed(data):
                    if isinstance(line, LineFramer.LineTooLong):
                        self._record("in", f"<a line of {line.size} bytes, over the kit's limit>")
                    else:
                        await self._take(line)
                self._wake()
        finally:
            self.closed.set()
            self._wake()

    async def _take(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\r")
        if not text.strip():
            return
        try:
            message = json.loads(text)
        except ValueError:
            self._record("in", text)
            return
        self._record("in", text, message)
        if not isinstance(message, dict):
            return
        if "method" in message and "id" in message:
            reply = self.client.answer(str(message.get("method")), message.get("params"))
            if reply is None:
                self.held.append(message)
            elif isinstance(reply, dict):
                await self._reply(message["id"], reply)
            else:  # answered when it is ready, while the agent's other messages keep coming
                assert self._nursery is not None
                self._nursery.start_soon(self._reply_later, message["id"], reply)
        elif "method" in message:
            self.notifications.append(message)
        elif "id" in message:
            self._answers.setdefault(message["id"], Answer(message))

    async def _reply_later(self, request_id: Any, reply: Awaitable[dict[str, Any]]) -> None:
        try:
            answer = await reply
        except Exception as exc:  # the kit's client failed on what the agent asked: an error, never a crashed run
            answer = {"error": {"code": -32603, "message": f"the client failed: {exc!r}"}}
        await self._reply(request_id, answer)

    async def _reply(self, request_id: Any, reply: dict[str, Any]) -> None:
        try:
            await self.send({"jsonrpc": "2.0", "id": request_id, **reply})
        except AgentGone:
            pass

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = trio.Event()

    async def _read_stderr(self) -> None:
        async for data in chunks(self._process.stderr):
            self.stderr_bytes += len(data)
            self._stderr.append(bytes(data))
            self._stderr_size += len(data)
            while self._stderr_size - len(self._stderr[0]) >= STDERR_TAIL_BYTES:
                self._stderr_size -= len(self._stderr.popleft())


@asynccontextmanager
async def open_agent(spec: AgentSpec, client: ClientSide) -> AsyncIterator[LiveAgent]:
    """Start the agent (its own process group), yield it, and stop the group when the block ends — also when it
    is cancelled. ``OSError`` when the command cannot be started."""
    process = await trio.lowlevel.open_process(
        list(spec.argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(spec.env),
        cwd=spec.cwd,
    )
    agent = LiveAgent(process, client, trio.current_time())
    try:
        async with trio.open_nursery() as nursery:
            agent._nursery = nursery
            client.terminals.attach(nursery)
            nursery.start_soon(agent._read_stdout)
            nursery.start_soon(agent._read_stderr)
            try:
                yield agent
            finally:
                with trio.CancelScope(shield=True):
                    await stop_process_group(process, STOP_GRACE)
                    await client.terminals.aclose()
                nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # open_nursery itself failed
            with trio.CancelScope(shield=True):
                await stop_process_group(process, STOP_GRACE)


def split_env(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs (``--agent-env``); ``ValueError`` naming a malformed one."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--agent-env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env
