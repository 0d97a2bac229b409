"""``lmbridge replay TRANSCRIPT``: an ACP agent on stdin/stdout that plays back the agent side of a recorded
transcript, so that a real agent's session becomes an offline, deterministic regression fixture.

Owns the replay. The transcript's agent connection and the MCP connections of its sessions become one script, in
recorded order, of messages to *expect* (what the client sent: lmbridge to the agent, lmbridge's MCP server to the
agent's MCP client) and messages to *emit* (what the agent sent, on ACP and on MCP). Each emitted message is sent
once every earlier expected message that the agent had to wait for has arrived:

- requests from the client, matched by method and order (the 2nd ``session/prompt`` that arrives is the 2nd
  recorded one), whatever their JSON-RPC ids, session cwd or MCP socket paths: the recorded answer goes back with
  the live request's id;
- answers to the agent's own requests (permission requests, MCP calls), matched by id (the replay sends the
  recorded ids);
- ``session/cancel``, matched by order. Other notifications (``$/cancel_request``, MCP progress, list changes)
  are accepted whenever they come and never waited for;
- ``authenticate`` and the session options lmbridge sets before a prompt (``session/set_config_option``,
  ``session/set_mode``, ``session/set_model``: the agent's configured ``options``) depend on the configuration, not
  on the conversation: a recorded one that does not come is skipped, and one that was not recorded is answered with
  success.

The agent's own ids (sessions, tool calls) are the recorded ones, so they line up by construction. MCP connections
are made like the agent made them: when the script reaches the first message the agent sent on one, the replay
starts the stdio MCP server the *live* ``session/new`` of that session names (lmbridge's shim, with this run's
socket and token) and plays the recorded MCP client messages to it. A request that differs from the recording
(after normalising ids, paths and ``cwd``) is logged on stderr; with ``--strict`` it is answered with an error.
Requests beyond the recording are answered with an error naming the method. ``--timing`` keeps the recorded
pauses before each emitted message (capped at 5 s), for scenarios whose outcome depends on timing.

When the recorded agent exited and lmbridge started it again, the recording has one part per start (each begins
with ``initialize``): a replay process plays the part of its start — counted in a small state file per transcript
and parent process (lmbridge keeps its pid across agent restarts) — and exits where the recorded agent did.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from .transcript import load_transcript

__all__ = ["Item", "Replayer", "build_script", "generation_to_play", "main", "split_generations"]

_GATING_NOTIFICATIONS = {"session/cancel"}
_IGNORED_KEYS = {"cwd", "mcpServers", "_meta", "clientInfo", "additionalDirectories"}
# Requests that follow from lmbridge's configuration rather than from the conversation.
_CONFIGURATION = ("authenticate", "session/set_config_option", "session/set_mode", "session/set_model")


@dataclass
class Item:
    seq: int
    t: float
    conn: str  # "acp" or "mcp:<n>"
    emit: bool  # True: the agent sends it; False: the agent expects it
    msg: dict[str, Any]
    matched: trio.Event = field(default_factory=trio.Event)
    live_id: Any = None
    live_params: Any = None
    refused: bool = False  # --strict refused it: its recorded answer is not sent

    @property
    def method(self) -> str | None:
        return self.msg.get("method")

    @property
    def kind(self) -> str:
        if "method" in self.msg:
            return "request" if "id" in self.msg else "notification"
        return "response"

    @property
    def gating(self) -> bool:
        if self.emit:
            return False
        return self.kind != "notification" or self.method in _GATING_NOTIFICATIONS


def build_script(
    header: dict[str, Any], lines: list[dict[str, Any]], agent: str | None = None
) -> tuple[list[Item], dict[str, dict[str, Any]]]:
    """The replay script for one recorded agent, and its MCP connections (``mcp:<n>`` → session, server)."""
    agents = header.get("agents") or sorted({line["conn"] for line in lines if line["conn"].startswith("agent:")})
    if agent is not None:
        conn = agent if agent.startswith("agent:") else f"agent:{agent}"
        if conn not in agents:
            raise ValueError(f"no agent {agent!r} in the transcript (it has {', '.join(agents) or 'none'})")
    else:
        if not agents:
            raise ValueError("the transcript has no agent connection")
        if len(agents) > 1 and header.get("agent") not in agents:
            raise ValueError(f"the transcript has several agents ({', '.join(agents)}): choose one with --agent")
        conn = str(header.get("agent")) if header.get("agent") in agents else agents[0]
    mcp = {name: info for name, info in (header.get("mcp") or {}).items() if info.get("agent", conn) == conn}
    script: list[Item] = []
    for line in lines:
        msg = line.get("msg")
        if not isinstance(msg, dict):
            continue
        if line["conn"] == conn:
            script.append(Item(line["seq"], float(line.get("t", 0.0)), "acp", line["dir"] == "in", msg))
        elif line["conn"] in mcp:
            script.append(Item(line["seq"], float(line.get("t", 0.0)), line["conn"], line["dir"] == "in", msg))
    return script, mcp


def split_generations(script: list[Item]) -> list[list[Item]]:
    """The script per start of the agent process: a recording where the agent exited and lmbridge started it
    again has several (each begins with ``initialize``). MCP connections belong to the start that opened them."""
    generations: list[list[Item]] = [[]]
    seen_initialize = False
    for item in script:
        if item.conn == "acp" and not item.emit and item.method == "initialize":
            if seen_initialize:
                generations.append([])
            seen_initialize = True
        generations[-1].append(item)
    owner: dict[str, int] = {}
    for index, generation in enumerate(generations):
        for item in generation:
            owner.setdefault(item.conn, index)
    return [
        [item for item in generation if item.conn == "acp" or owner[item.conn] == index]
        for index, generation in enumerate(generations)
    ]


def generation_to_play(transcripts: list[str], count: int) -> tuple[int, Callable[[], None]]:
    """Which start of the recorded agent this process is, and a function that counts this start as done (called
    once the client opens a session: a mere ``initialize``, such as the harness's version probe, does not count).
    The parent (lmbridge) keeps its pid across agent restarts, so a small state file per transcript and parent
    counts the starts."""
    if count <= 1:
        return 0, lambda: None
    import hashlib
    import tempfile

    key = hashlib.sha1("\0".join(os.path.abspath(t) for t in transcripts).encode()).hexdigest()[:16]
    parent = os.getppid()
    started = _process_start(parent)
    path = os.path.join(tempfile.gettempdir(), f"lmbridge-replay-{key}-{parent}.json")
    index = 0
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        if state.get("parentStart") == started:
            index = int(state.get("next", 0))
    except (OSError, ValueError, TypeError):
        pass

    def commit() -> None:
        try:
            if index + 1 >= count:  # the last start: nothing left to count
                os.unlink(path)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"parentStart": started, "next": index + 1}, handle)
        except OSError:
            pass

    return index, commit


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]  # field 22: start time, in clock ticks since boot
    except (OSError, IndexError):
        return None


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if k not in _IGNORED_KEYS}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"lmb_(?:[0-9a-f]{32}|\d+)", "lmb_*", value)
    return value


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:80]


def _difference(recorded: Any, live: Any, path: str = "") -> str | None:
    if isinstance(recorded, dict) and isinstance(live, dict):
        for key in sorted(set(recorded) | set(live)):
            if key not in live or key not in recorded:
                return f"{path}.{key}: {'missing' if key not in live else 'not recorded'}"
            found = _difference(recorded[key], live[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(live, list):
        if len(recorded) != len(live):
            return f"{path}: {len(live)} items, recorded {len(recorded)}"
        for index, (a, b) in enumerate(zip(recorded, live, strict=True)):
            found = _difference(a, b, f"{path}.{index}")
            if found:
                return found
        return None
    if recorded != live:
        return f"{path or '(value)'}: {_show(live)}, recorded {_show(recorded)}"
    return None


class Replayer:
    def __init__(
        self,
        script: list[Item],
        mcp: dict[str, dict[str, Any]],
        *,
        strict: bool = False,
        timing: bool = False,
        stderr: Any = None,
        exits: bool = False,
        on_session: Callable[[], None] | None = None,
    ) -> None:
        self.script = script
        self._on_session = on_session  # called once, when the client first opens a session
        self.exits = exits  # the recorded agent exited after this script (lmbridge started it again)
        self.exit_code = 0
        self._main_scope: trio.CancelScope | None = None
        self.mcp = mcp
        self.strict = strict
        self.timing = timing
        self._stderr = stderr or sys.stderr
        self._requests: dict[tuple[str, str], deque[Item]] = {}  # (conn, method) → expected requests, in order
        self._notifications: dict[tuple[str, str], deque[Item]] = {}
        self._responses: dict[tuple[str, str], Item] = {}  # (conn, id) → expected answer to the agent
        self._by_recorded_id: dict[tuple[str, str], Item] = {}  # (conn, recorded request id) → the request item
        self._counts: dict[str, int] = {}
        for item in script:
            if item.emit:
                continue
            key_id = json.dumps(item.msg.get("id"))
            if item.kind == "request":
                self._requests.setdefault((item.conn, item.method or ""), deque()).append(item)
                self._by_recorded_id[(item.conn, key_id)] = item
            elif item.kind == "notification":
                self._notifications.setdefault((item.conn, item.method or ""), deque()).append(item)
            else:
                self._responses[(item.conn, key_id)] = item
        self._senders: dict[str, Any] = {}
        self._send_locks: dict[str, trio.Lock] = {}
        self._mcp_dead: set[str] = set()
        self._processes: list[trio.Process] = []
        self._nursery: trio.Nursery | None = None

    def log(self, text: str) -> None:
        self._stderr.write(f"lmbridge replay: {text}\n")
        self._stderr.flush()

    # -- wires --------------------------------------------------------------------------------------------

    async def run(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self._senders["acp"] = send
        # SIGTERM (how lmbridge stops an agent, right after closing its stdin) ends the replay like end of input;
        # the receiver stays installed until the MCP servers we started have been reaped.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._main_scope = nursery.cancel_scope
                nursery.start_soon(self._play)
                nursery.start_soon(_cancel_on_signal, signals, nursery.cancel_scope)
                await self._read("acp", receive)  # until the client closes stdin
                nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                for process in self._processes:
                    await _stop(process)

    async def _read(self, conn: str, receive: trio.abc.ReceiveStream) -> None:
        buffer = b""
        while True:
            try:
                data = await receive.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    self.log(f"{conn}: a line that is not JSON: {line[:100]!r}")
                    continue
                if isinstance(message, dict):
                    await self._incoming(conn, message)

    async def _write(self, conn: str, message: dict[str, Any]) -> None:
        sender = self._senders.get(conn)
        if sender is None:
            return
        lock = self._send_locks.setdefault(conn, trio.Lock())
        async with lock:
            try:
                await sender.send_all(json.dumps(message, ensure_ascii=False).encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # -- matching what comes ------------------------------------------------------------------------------

    async def _incoming(self, conn: str, message: dict[str, Any]) -> None:
        method = message.get("method")
        if isinstance(method, str) and "id" in message:
            if self._on_session is not None and method.startswith("session/"):
                self._on_session()
                self._on_session = None
            queue = self._requests.get((conn, method))
            if not queue and method in _CONFIGURATION:  # configuration, not conversation: optional both ways
                self.log(f"{conn}: {method} was not recorded; accepting it")
                await self._write(conn, {"jsonrpc": "2.0", "id": message["id"], "result": {}})
                return
            if not queue:
                self.log(f"{conn}: unexpected {method} request: the recording has no further one")
                await self._write(
                    conn,
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {
                            "code": -32603,
                            "message": f"lmbridge replay: the recording has no further {method} request",
                        },
                    },
                )
                return
            item = queue.popleft()
            self._skip_optional_before(item)
            item.live_id = message["id"]
            item.live_params = message.get("params")
            count = self._counts[method] = self._counts.get(method, 0) + 1
            difference = _difference(_canonical(item.msg.get("params")), _canonical(message.get("params")), "params")
            if difference:
                self.log(f"{conn}: {method} #{count} differs from the recording at {difference}")
                if self.strict:
                    item.refused = True
                    await self._write(
                        conn,
                        {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "error": {
                                "code": -32602,
                                "message": f"lmbridge replay --strict: {method} #{count} differs from the "
                                f"recording at {difference}",
                            },
                        },
                    )
            item.matched.set()
        elif isinstance(method, str):
            queue = self._notifications.get((conn, method))
            if queue:
                queue.popleft().matched.set()
        elif "id" in message:
            answered = self._responses.pop((conn, json.dumps(message.get("id"))), None)
            if answered is None:
                self.log(f"{conn}: an answer to no recorded request (id {message.get('id')!r})")
                return
            difference = _difference(
                _canonical({k: v for k, v in answered.msg.items() if k != "jsonrpc"}),
                _canonical({k: v for k, v in message.items() if k != "jsonrpc"}),
                "answer",
            )
            if difference:
                self.log(
                    f"{conn}: the answer to request {message.get('id')!r} differs from the recording at "
                    f"{difference} (replaying the recorded agent anyway)"
                )
            answered.matched.set()

    def _skip_optional_before(self, item: Item) -> None:
        """A recorded configuration request (``authenticate``, a session option) that the live client did not send
        before this request will not come (the replaying configuration differs): stop waiting for it, and do not
        answer it."""
        for method in _CONFIGURATION:
            if method == item.method:
                continue
            queue = self._requests.get((item.conn, method))
            while queue and queue[0].seq < item.seq:
                skipped = queue.popleft()
                skipped.refused = True
                skipped.matched.set()
                self.log(f"{item.conn}: the recorded {method} request did not come; going on without it")

    # -- playing what goes --------------------------------------------------------------------------------

    async def _play(self) -> None:
        previous_t = 0.0
        last_emit = max((i for i, item in enumerate(self.script) if item.emit), default=-1)
        for index, item in enumerate(self.script):
            if self.exits and index > last_emit:
                break  # what the client sent to an agent that had gone
            if not item.emit:
                if item.gating and item.conn not in self._mcp_dead:
                    await item.matched.wait()
                previous_t = item.t
                continue
            if self.timing and item.t > previous_t:
                await trio.sleep(min(item.t - previous_t, 5.0))
            previous_t = item.t
            await self._emit(item)
        if self.exits:
            self.log("the recorded agent exited here (lmbridge started it again); exiting")
            self.exit_code = 1
            assert self._main_scope is not None
            self._main_scope.cancel()
            return
        self.log("the recording is played out; answering further requests with errors")

    async def _emit(self, item: Item) -> None:
        message = dict(item.msg)
        if item.kind == "response":
            request = self._by_recorded_id.get((item.conn, json.dumps(message.get("id"))))
            if request is None or request.refused:
                return
            message["id"] = request.live_id
            if request.method == "initialize" and item.conn == "acp":
                message = _without_http_mcp(message)
        if item.conn != "acp":
            if item.conn in self._mcp_dead:
                return
            if item.conn not in self._senders and not await self._connect_mcp(item.conn):
                return
        await self._write(item.conn, message)

    async def _connect_mcp(self, conn: str) -> bool:
        info = self.mcp.get(conn) or {}
        session, server_name = info.get("session"), info.get("server")
        opened = None
        for item in self.script:  # the live session/new (load, resume) of that session
            if item.emit or item.method not in ("session/new", "session/load", "session/resume"):
                continue
            if item.method != "session/new" and (item.msg.get("params") or {}).get("sessionId") == session:
                opened = item
            elif item.method == "session/new":
                answer = next(
                    (
                        a
                        for a in self.script
                        if a.emit and a.kind == "response" and a.conn == "acp" and a.msg.get("id") == item.msg.get("id")
                    ),
                    None,
                )
                if answer is not None and (answer.msg.get("result") or {}).get("sessionId") == session:
                    opened = item
        servers = (opened.live_params or {}).get("mcpServers") if opened is not None else None
        if not servers:
            self.log(f"{conn}: cannot reconnect: the live session/new of {session!r} named no MCP server")
            self._give_up(conn)
            return False
        server = next(
            (s for s in servers if isinstance(s, dict) and s.get("name") == server_name and s.get("command")),
            next((s for s in servers if isinstance(s, dict) and s.get("command")), None),
        )
        if server is None:
            self.log(f"{conn}: cannot reconnect: no stdio MCP server in the live session/new (only stdio is replayed)")
            self._give_up(conn)
            return False
        env = {**os.environ, **{e["name"]: e["value"] for e in server.get("env") or () if isinstance(e, dict)}}
        try:
            process = await trio.lowlevel.open_process(
                [server["command"], *server.get("args", [])], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:
            self.log(f"{conn}: cannot start the MCP server {server['command']!r}: {exc}")
            self._give_up(conn)
            return False
        self._processes.append(process)
        assert process.stdin is not None and process.stdout is not None and self._nursery is not None
        self._senders[conn] = process.stdin
        self._nursery.start_soon(self._read, conn, process.stdout)
        return True

    def _give_up(self, conn: str) -> None:
        """Without its MCP server, a connection's expectations can never be met: stop waiting for them."""
        self._mcp_dead.add(conn)
        for item in self.script:
            if item.conn == conn:
                item.matched.set()


def _without_http_mcp(response: dict[str, Any]) -> dict[str, Any]:
    """The recorded ``initialize`` answer, saying the agent takes no HTTP MCP servers: a replay reconnects MCP over
    stdio only, so lmbridge (``mcp_transport = "auto"``) gives it the stdio relay, whichever transport recorded."""
    result = response.get("result")
    capabilities = result.get("agentCapabilities") if isinstance(result, dict) else None
    mcp = capabilities.get("mcpCapabilities") if isinstance(capabilities, dict) else None
    if not isinstance(mcp, dict) or not mcp.get("http"):
        return response
    assert isinstance(result, dict) and isinstance(capabilities, dict)
    capabilities = {**capabilities, "mcpCapabilities": {**mcp, "http": False}}
    return {**response, "result": {**result, "agentCapabilities": capabilities}}


async def _cancel_on_signal(signals: Any, scope: trio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


async def _stop(process: trio.Process) -> None:
    try:
        if process.stdin is not None:
            await process.stdin.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    with trio.move_on_after(2):
        await process.wait()
        return
    process.kill()
    await process.wait()


def main(args: argparse.Namespace) -> int:
    try:
        header, lines = load_transcript(args.transcripts)
        script, mcp = build_script(header, lines, args.agent)
    except (OSError, ValueError) as exc:
        print(f"lmbridge replay: {exc}", file=sys.stderr)
        return 2
    generations = split_generations(script)
    index, count_start = generation_to_play(args.transcripts, len(generations))
    if index >= len(generations):
        print(
            f"lmbridge replay: this is start {index + 1} of the agent; the recording has {len(generations)}: "
            "answering every request with an error",
            file=sys.stderr,
        )
        script = []
    else:
        script = generations[index]
        if len(generations) > 1:
            print(
                f"lmbridge replay: playing start {index + 1} of {len(generations)} of the recorded agent",
                file=sys.stderr,
                flush=True,
            )
    # stdout carries the protocol only: anything else written to fd 1 goes to stderr.
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    replayer = Replayer(
        script,
        mcp,
        strict=args.strict,
        timing=args.timing,
        exits=0 <= index < len(generations) - 1,
        on_session=count_start,
    )

    async def serve() -> None:
        receive = trio.lowlevel.FdStream(os.dup(0))
        send = trio.lowlevel.FdStream(protocol_fd)
        await replayer.run(receive, send)

    try:
        trio.run(serve)
    except KeyboardInterrupt:
        return 130
    return replayer.exit_code
