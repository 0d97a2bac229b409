"""The ACP client side: one agent process, its JSON-RPC connection, and the ACP sessions multiplexed over it.

Owns: spawning the agent in its own process group, the ``initialize``/``authenticate`` handshake, the
``session/*`` requests the bridge sends, routing what the agent sends (``session/update``,
``session/request_permission``) to the session that owns it, the agent's stderr (logged, and its tail kept for
error replies), and stopping the whole process group (SIGTERM, then SIGKILL after a grace period: codex-acp
ignores stdin EOF, npm launchers orphan their children).

It does not decide anything about turns or history: that is ``session/``.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any, Protocol

import trio

from bridge.config import AgentConfig, mcp_transport
from wire.errors import AgentExitedError, AgentStartError, InvalidParams
from wire.observe.logs import get_logger
from wire.observe.redact import redact
from wire.rpc.connection import (
    ACP_CANCEL,
    ConnectionClosed,
    JsonRpcConnection,
    MethodTable,
    OutgoingRequest,
    ReadGate,
    RequestContext,
    StreamWire,
)

from .handshake import AgentInfo, HandshakeError, handshake
from .spawn import spawn_options
from .watchdog import forget_group, watch_group

__all__ = [
    "AgentProcess",
    "SessionEndpoint",
    "StderrTail",
    "stop_process_group",
]


class StderrTail:
    """The last lines an agent wrote to stderr, bounded in lines and in bytes per line."""

    def __init__(self, max_lines: int = 40, max_line_chars: int = 1000) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._max_line_chars = max_line_chars

    def add(self, line: str) -> None:
        if len(line) > self._max_line_chars:
            line = line[: self._max_line_chars] + "…"
        self._lines.append(line)

    def text(self) -> str:
        return "\n".join(self._lines)


class SessionEndpoint(Protocol):
    """What an ACP session (the session actor) receives from its agent."""

    async def on_agent_updates(self, updates: list[dict[str, Any]]) -> None: ...

    async def on_permission_request(self, params: dict[str, Any], context: RequestContext) -> dict[str, Any]: ...

    async def on_elicitation(self, params: dict[str, Any], context: RequestContext) -> dict[str, Any]: ...

    def on_agent_exit(self, error: AgentExitedError) -> None: ...


# Updates that arrive for a session id nobody has attached yet (the agent may notify right after answering
# session/new, before the caller registered, and session/load replays history before it answers) are held here.
_EARLY_SESSIONS = 32
_EARLY_UPDATES_PER_SESSION = 4096


# An agent's output is read 16 KiB at a time: the messages of one read are handled in one step of the event loop,
# and while a key's agent writes as fast as the pipe takes (64 KiB reads: ~350 small updates, 2-3 ms a step) every
# other key's request waited behind such steps; 16 KiB reads cut that wait to a third at no throughput cost measured
# (docs/performance.md#one-keys-flood). A long message still comes in 64 KiB reads.
_READ_SIZE = 16 * 1024
_LONG_READ_SIZE = 64 * 1024


class AgentProcess:
    """One running agent. ``run`` (started with ``nursery.start``) spawns it, completes the handshake, then
    serves until the process exits or ``stop`` is called; it raises ``AgentStartError`` if the start fails."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        stop_grace: float = 3.0,
        tracer: Any = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        spawned: subprocess.Popen[bytes] | None = None,
        initialize_id: int | None = None,
        read_gate: ReadGate | None = None,
    ) -> None:
        """``spawned``: the agent's process, already started (``bridge.acp.spawn``), to run instead of starting
        one; ``initialize_id``: the id of the ``initialize`` it was sent then, whose answer the handshake awaits.
        ``read_gate``: for a process that works for one principal, when its output is to wait for others'
        requests (``bridge.service.share``)."""
        self._read_gate = read_gate
        self.config = config
        self._spawned = spawned
        self._initialize_id = initialize_id
        self._initialize_sent: OutgoingRequest | None = None
        self.id = config.id
        self.info: AgentInfo | None = None
        self.stderr = StderrTail()
        self.exit_code: int | None = None
        self.exited = trio.Event()
        self.finished = trio.Event()  # run() is over: the sessions were told, the process group is gone
        self.sessions_lost = 0  # sessions that were attached when it exited (not stopped by lmbridge)
        self._stop_grace = stop_grace
        self._tracer = tracer
        self._max_message_bytes = max_message_bytes
        self._log = get_logger().bind(agent=config.id)
        self._process: trio.Process | AdoptedProcess | None = None
        self._conn: JsonRpcConnection | None = None
        self._sessions: dict[str, SessionEndpoint] = {}
        self._early: collections.OrderedDict[str, list[dict[str, Any]]] = collections.OrderedDict()
        self._stop_requested = trio.Event()
        self._stderr_done = trio.Event()

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def mcp_transport(self) -> str:
        """How the editor's tools reach this agent ("auto": HTTP when it advertises it, else the stdio relay)."""
        return mcp_transport(self.config)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and not self.exited.is_set() and not self._stop_requested.is_set()

    async def run(self, *, task_status: trio.TaskStatus[AgentProcess] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        try:
            if self._spawned is not None:
                self._process = AdoptedProcess(self._spawned)  # its environment's secrets are known already
            else:
                self._process = await trio.lowlevel.open_process(config.argv, **spawn_options(config))
        except FileNotFoundError:
            raise AgentStartError(
                config.id, f"command not found: {config.command!r} (check [agents.{config.id}].command and PATH)"
            ) from None
        except OSError as exc:
            raise AgentStartError(config.id, f"cannot run {config.command!r}: {exc.strerror or exc}") from None
        process = self._process
        watch_group(process.pid)  # start_new_session: the pid is the group's id
        self._log.info(
            "agent process started", pid=process.pid, command=config.command, early=self._spawned is not None
        )
        assert process.stdin is not None and process.stdout is not None
        methods = MethodTable()
        methods.notification("session/update", self._on_updates, batch=True)
        methods.request("session/request_permission", self._on_permission_request, handles_cancel=True)
        methods.request("elicitation/create", self._on_elicitation, handles_cancel=True)
        self._conn = JsonRpcConnection(
            StreamWire(process.stdout, process.stdin, read_size=_READ_SIZE, long_read_size=_LONG_READ_SIZE),
            methods,
            name=f"agent:{config.id}",
            cancel_style=ACP_CANCEL,
            tracer=self._tracer,
            max_message_bytes=self._max_message_bytes,
            read_gate=self._read_gate,
        )
        if self._initialize_id is not None:  # awaited before the connection reads: the answer may be waiting already
            self._initialize_sent = self._conn.expect_answer(self._initialize_id, "initialize")
        start_error: AgentStartError | None = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._conn.serve)
                nursery.start_soon(self._pump_stderr)
                nursery.start_soon(self._watch_exit)
                try:
                    await self._handshake()
                except AgentStartError as exc:
                    # Raised outside the nursery: inside, Trio would wrap it in an ExceptionGroup.
                    start_error = exc
                else:
                    task_status.started(self)
                    with trio.CancelScope() as watch:
                        nursery.start_soon(self._cancel_when, watch, self._conn.peer_closed)
                        nursery.start_soon(self._cancel_when, watch, self.exited)
                        await self._stop_requested.wait()
                    # The pipe usually closes a moment before the exit status is known; wait for it briefly so
                    # the sessions' error replies carry the exit code.
                    with trio.move_on_after(0.5):
                        await self.exited.wait()
                    self._notify_exit()
                await self._terminate()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._terminate()
                self._notify_exit()
            self.finished.set()
        if start_error is not None:
            raise start_error

    async def _cancel_when(self, scope: trio.CancelScope, event: trio.Event) -> None:
        await event.wait()
        scope.cancel()

    async def stop(self) -> None:
        """Ask the agent to stop (EOF, SIGTERM, SIGKILL after the grace period) and wait until it is gone."""
        self._stop_requested.set()
        if self._process is not None:
            with trio.CancelScope(shield=True):
                await self._terminate()

    async def _handshake(self) -> None:
        assert self._conn is not None
        config = self.config
        try:
            sent = self._initialize_sent.result if self._initialize_sent is not None else None
            self.info = await handshake(
                self._conn.request,
                timeout=config.initialize_timeout,
                authenticate=config.authenticate,
                log=self._log,
                initialize_sent=sent,
            )
        except HandshakeError as exc:
            raise await self._start_error(str(exc)) from None
        self._log.info(
            "agent initialized",
            agent_info=self.info.agent_info.get("name"),
            load=self.info.can_load,
            resume=self.info.can_resume,
            close=self.info.can_close,
        )

    async def _start_error(self, problem: str) -> AgentStartError:
        # Give the process a moment to finish writing stderr and exit, so the error quotes all of it.
        with trio.move_on_after(1.0):
            await self._stderr_done.wait()
        with trio.move_on_after(0.5):
            await self.exited.wait()
        return AgentStartError(self.id, problem, self.stderr.text(), self.exit_code)

    async def _pump_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        buffer = b""
        try:
            while True:
                try:
                    data = await self._process.stderr.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._stderr_line(line)
                if len(buffer) > 65536:  # a "line" that never ends: log it in pieces
                    self._stderr_line(buffer)
                    buffer = b""
            if buffer:
                self._stderr_line(buffer)
        finally:
            self._stderr_done.set()

    def _stderr_line(self, raw: bytes) -> None:
        # Masked before it is kept: the tail goes to the log and, in error data, to the editor.
        line = redact(raw.decode("utf-8", "replace").rstrip("\r"))
        if line.strip():
            self.stderr.add(line)
            self._log.info("agent stderr", line=line)

    async def _watch_exit(self) -> None:
        assert self._process is not None
        code = await self._process.wait()
        self.exit_code = code
        self.exited.set()
        level = self._log.info if self._stop_requested.is_set() else self._log.warning
        level("agent process exited", pid=self._process.pid, exit_code=code)

    async def _terminate(self) -> None:
        """Stop the whole process group: close stdin, SIGTERM, then SIGKILL after the grace period. Also sweeps
        the group after the leader exited, for launchers that leave children behind."""
        process = self._process
        if process is None:
            return
        self._stop_requested.set()

        def killing() -> None:
            self._log.warning("agent did not stop after SIGTERM; sending SIGKILL", grace=self._stop_grace)

        await stop_process_group(process, self._stop_grace, on_kill=killing)
        forget_group(process.pid)

    def _notify_exit(self) -> None:
        error = AgentExitedError(self.id, self.exit_code, self.stderr.text())
        sessions, self._sessions = self._sessions, {}
        if not self._stop_requested.is_set():
            self.sessions_lost += len(sessions)
        for endpoint in sessions.values():
            endpoint.on_agent_exit(error)

    # -- sessions -------------------------------------------------------------------------------------------

    def attach(self, session_id: str, endpoint: SessionEndpoint) -> list[dict[str, Any]]:
        """Route this session's traffic to ``endpoint``; returns updates that arrived before it was attached."""
        self._sessions[session_id] = endpoint
        return self._early.pop(session_id, [])

    def detach(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send an ACP request and wait for its result; ``AgentExitedError`` if the agent is gone or goes away
        meanwhile. If the caller is cancelled, the agent is told (``$/cancel_request``)."""
        reply = self.send_request(method, params)
        try:
            return await reply.result()
        except BaseException:
            reply.abandon()
            raise

    def send_request(self, method: str, params: dict[str, Any]) -> AgentReply:
        """Queue an ACP request now (in order with what is queued after it); await ``result()`` for the answer."""
        if self._conn is None or not self.alive:
            return AgentReply(self, None)
        try:
            return AgentReply(self, self._conn.start_request_nowait(method, params))
        except ConnectionClosed:
            return AgentReply(self, None)

    def notify(self, method: str, params: dict[str, Any]) -> None:
        if self._conn is not None and self.alive:
            self._conn.notify_nowait(method, params)

    async def _on_updates(self, batch: list[Any]) -> None:
        """Updates that arrived together, handed to their sessions in runs (order kept within each session)."""
        run: list[dict[str, Any]] = []
        current = None
        for params in batch:
            if not isinstance(params, dict) or not isinstance(params.get("sessionId"), str):
                self._log.warning("session/update without a sessionId; ignored")
                continue
            if params["sessionId"] != current and run:
                await self._deliver(current, run)
                run = []
            current = params["sessionId"]
            run.append(params)
        if run:
            await self._deliver(current, run)

    async def _deliver(self, session_id: Any, updates: list[dict[str, Any]]) -> None:
        endpoint = self._sessions.get(session_id)
        if endpoint is not None:
            await endpoint.on_agent_updates(updates)
            return
        for params in updates:
            self._hold(session_id, params)

    def _hold(self, session_id: str, params: dict[str, Any]) -> None:
        held = self._early.get(session_id)
        if held is None:
            if len(self._early) >= _EARLY_SESSIONS:
                dropped, _ = self._early.popitem(last=False)
                self._log.warning("dropping updates for a session that was never opened", session=dropped)
            held = self._early[session_id] = []
        if len(held) < _EARLY_UPDATES_PER_SESSION:
            held.append(params)

    async def _on_permission_request(self, params: Any, context: RequestContext) -> Any:
        endpoint = self._endpoint(params, "permission request", "cancelled")
        if endpoint is None:
            return {"outcome": {"outcome": "cancelled"}}
        return await endpoint.on_permission_request(params, context)

    async def _on_elicitation(self, params: Any, context: RequestContext) -> Any:
        """An agent's question (unstable ACP): a session's goes to that session; one outside any session (during
        authentication, say) has nobody to ask and is declined."""
        endpoint = self._endpoint(params, "elicitation", "declined")
        if endpoint is None:
            return {"action": "decline"}
        return await endpoint.on_elicitation(params, context)

    def _endpoint(self, params: Any, what: str, answer: str) -> SessionEndpoint | None:
        """The session an agent's request is for; None (logged) when lmbridge has no such session."""
        if not isinstance(params, dict):
            raise InvalidParams("params", "must be an object")
        session_id = params.get("sessionId")
        endpoint = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if endpoint is None:
            self._log.warning(f"{what} for an unknown session; answering {answer}", session=session_id)
        return endpoint


class AgentReply:
    """The answer to an ACP request, once it comes."""

    def __init__(self, agent: AgentProcess, call: OutgoingRequest | None) -> None:
        self._agent = agent
        self._call = call

    async def result(self) -> Any:
        agent = self._agent
        if self._call is not None:
            try:
                return await self._call.result()
            except ConnectionClosed:
                pass
        with trio.move_on_after(1.0):  # the pipe closes a moment before the exit status is known
            await agent.exited.wait()
        raise AgentExitedError(agent.id, agent.exit_code, agent.stderr.text())

    def abandon(self) -> None:
        if self._call is not None and not self._call.answered:
            self._call.abandon()

    def on_answer(self, callback: Any, on_lost: Callable[[], object] | None = None) -> None:
        """``callback(result, error)`` in wire order (see ``OutgoingRequest.on_answer``). When the agent went
        away instead of answering, ``on_lost()`` instead (at once if it was gone already): ``result()`` reports
        that, with the exit status."""
        if self._call is None:
            if on_lost is not None:
                on_lost()
            return

        def relay(result: Any, error: BaseException | None) -> None:
            if not isinstance(error, ConnectionClosed):
                callback(result, error)
            elif on_lost is not None:
                on_lost()

        self._call.on_answer(relay)


class AdoptedProcess:
    """A ``subprocess.Popen`` started before Trio ran (``bridge.acp.spawn``), with the part of ``trio.Process``
    that lmbridge uses: the pipes as Trio streams, ``wait``, ``returncode``, ``pid``."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self._popen = popen
        self.pid = popen.pid
        # The streams own duplicates of the pipes (made non-blocking); the Popen's own file objects are closed.
        self.stdin: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(os.dup(popen.stdin.fileno()))
        self.stdout: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(os.dup(popen.stdout.fileno()))
        self.stderr: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(os.dup(popen.stderr.fileno()))
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            pipe.close()

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """The exit status, once the process has exited (it is reaped here)."""
        while self._popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):  # no pidfd (old kernel), or it was just reaped: poll again soon
                await trio.sleep(0.05)
                continue
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        code = self._popen.returncode
        assert code is not None
        return code


async def stop_process_group(
    process: trio.Process | AdoptedProcess, grace: float, *, on_kill: Callable[[], None] | None = None
) -> None:
    """Stop a process started with ``start_new_session`` and everything in its group: close its stdin, SIGTERM
    the group, SIGKILL it after ``grace`` seconds. Also sweeps the group after the leader exited, for launchers
    that leave children behind. Returns once the leader has exited."""
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    pgid = process.pid  # start_new_session: the process leads its own group
    if _group_alive(pgid) or process.returncode is None:
        _signal_group(pgid, signal.SIGTERM)
        with trio.move_on_after(grace):
            while process.returncode is None or _group_alive(pgid):
                if process.returncode is None:
                    with trio.move_on_after(0.05):
                        await process.wait()
                else:
                    await trio.sleep(0.05)  # polling the group: there is no event for "group empty"
        if process.returncode is None or _group_alive(pgid):
            if on_kill is not None:
                on_kill()
            _signal_group(pgid, signal.SIGKILL)
            await process.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
