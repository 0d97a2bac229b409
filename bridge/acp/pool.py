"""The agent pool: at most one running process per configured agent, started on first use, stopped when idle — or,
with ``isolation = "key"``, one per agent and principal, or with ``isolation = "session"`` one per session, stopped
with it.

Owns the agent processes (all of them run in the pool's nursery), starting them once even when several requests
need one at the same moment, restarting at once an agent whose process died under its sessions, and stopping
agents that have had no session for ``agent_idle_ttl`` seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from bridge.config import AgentConfig
from wire.errors import AgentStartError, UnknownModel
from wire.observe.logger import Logger
from wire.rpc.connection import ReadGate

from .process import AgentProcess
from .spawn import EarlyAgent, kill_spawned

__all__ = ["AgentPool", "Launch", "Launcher"]


class Launch(Protocol):
    """What a ``Launcher`` prepared for one agent process: the configuration it is started with, and the two
    moments the launcher hears of (``started`` once it runs, ``ended`` once it is gone, whether or not it started)."""

    config: AgentConfig

    def started(self, process: AgentProcess) -> None: ...

    def ended(self) -> None: ...


class Launcher(Protocol):
    """Prepares an agent's process before it is started (an agent on the editor's models gets the address and a
    token of its own for its model requests). ``prepare`` returns ``None`` for an agent it has nothing for."""

    async def prepare(self, config: AgentConfig, principal: str | None) -> Launch | None:
        """``principal``: whose conversations the process is for (``None``: anyone's)."""


# A shared process's key: the agent, and for an agent on the editor's models its owner — an editor (its principal and
# serial number, never reused), or an HTTP client's principal —, whose model it thinks with: a model request names no
# conversation, so a process serves one editor. "" for every other agent.
_Key = tuple[str, str]


def _key(config: AgentConfig, owner: object) -> _Key:
    """Which shared process serves a session of ``owner`` (an editor connection, or a principal id): the agent's one;
    with ``isolation = "key"`` one per principal; for an agent on the editor's models one per editor."""
    if owner is None:
        return (config.id, "")
    principal = owner if isinstance(owner, str) else str(getattr(owner, "principal_id", ""))
    if config.model_source:
        if isinstance(owner, str):
            return (config.id, f"{owner}\0")
        return (config.id, f"{principal}\0{getattr(owner, 'serial', id(owner))}")
    if config.isolation == "key" and principal:
        return (config.id, f"{principal}\0")
    return (config.id, "")


def _principal_of(key: _Key) -> str | None:
    """Whose conversations a process of ``key`` is for (``None``: anyone's)."""
    return key[1].partition("\0")[0] if key[1] else None


class _Start:
    """An agent being started, in a task of the pool's own: whoever waits for it may give up (a cancelled turn)
    without aborting the start for the others; the pool's shutdown cancels it."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.process: AgentProcess | None = None
        self.scope = trio.CancelScope()


class AgentPool:
    def __init__(
        self,
        configs: Mapping[str, AgentConfig],
        *,
        stop_grace: float = 3.0,
        idle_ttl: float = 600.0,
        tracer: Any = None,
        log: Logger,
    ) -> None:
        self.configs: dict[str, AgentConfig] = dict(configs)
        self._stop_grace = stop_grace
        self._idle_ttl = idle_ttl
        self._tracer = tracer
        self._log = log
        # Shared processes by ``_key``: one per agent, or for an agent on the editor's models one per editor.
        self._running: dict[_Key, AgentProcess] = {}
        self._starting: dict[_Key, _Start] = {}
        self._idle_since: dict[_Key, float] = {}
        self._dedicated: set[AgentProcess] = set()  # isolation = "session": one process per session
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self.launcher: Launcher | None = None  # set by whoever composes lmbridge, before the first agent starts
        # Told of each agent process that started and exited: ``(event, fields)`` (an audit log).
        self.on_event: Callable[[str, dict[str, Any]], None] | None = None
        # The read gate of a process that works for one principal (its output waits while others' requests start).
        self.read_gate: Callable[[str], ReadGate] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._reap_idle)
            task_status.started()
            await trio.sleep_forever()

    def config(self, agent_id: str) -> AgentConfig:
        config = self.configs.get(agent_id)
        if config is None:
            raise UnknownModel(agent_id, list(self.configs))
        return config

    def add(self, configs: Mapping[str, AgentConfig]) -> None:
        """Agents defined by an editor (``initialize.agents``); a running agent keeps its old definition until
        its process stops."""
        self.configs.update(configs)

    @property
    def processes(self) -> list[AgentProcess]:
        return [p for p in [*self._running.values(), *self._dedicated] if p.alive]

    async def acquire(self, agent_id: str, owner: object = None) -> AgentProcess:
        """A running agent for a new session of ``owner`` (the client whose conversation it is): the agent's shared
        process (started if needed) — for an agent on the editor's models the one of that editor, whose model it
        thinks with —, or with ``isolation = "session"`` a process of the session's own, stopped by ``release``."""
        config = self.config(agent_id)
        key = _key(config, owner)
        if config.isolation == "session":
            return await self._start_dedicated(config, _principal_of(key))
        while True:
            if self._closed:
                raise AgentStartError(agent_id, "lmbridge is shutting down")
            process = self._running.get(key)
            if process is not None and process.alive:
                self._idle_since.pop(key, None)
                return process
            start = self._starting.get(key)
            if start is None:
                start = self._begin(config, key=key)
            await start.done.wait()
            if start.error is not None:
                raise start.error
            if start.process is not None:
                return start.process

    async def _start_dedicated(self, config: AgentConfig, principal: str | None) -> AgentProcess:
        if self._closed or self._nursery is None:
            raise AgentStartError(config.id, "lmbridge is shutting down")
        begun = trio.current_time()
        process: AgentProcess = await self._nursery.start(self._run_process, config, None, principal)
        self._dedicated.add(process)
        self._log.info(
            "agent ready",
            agent=config.id,
            pid=process.pid,
            start_seconds=round(trio.current_time() - begun, 3),
            isolation="session",
        )
        return process

    def release(self, process: Any) -> None:
        """A session of ``process`` is over: a process of its own is stopped; a shared one stays (idle TTL)."""
        if isinstance(process, AgentProcess) and process in self._dedicated and self._nursery is not None:
            self._dedicated.discard(process)
            self._nursery.start_soon(process.stop)

    def prestart(self, agent_id: str, owner: object = None) -> None:
        """Start the agent (for ``owner``'s conversations, see ``acquire``) in the background unless it runs or is
        starting (no one waits; a failure is logged and the next ``acquire`` tries again). Unused, it is stopped like
        any idle agent, after ``idle_ttl``."""
        self._prestart(self.config(agent_id), _key(self.config(agent_id), owner))

    def _prestart(self, config: AgentConfig, key: _Key) -> None:
        if self._closed or self._nursery is None or key in self._starting:
            return
        process = self._running.get(key)
        if process is None or not process.alive:
            self._log.info("prestarting an agent", agent=config.id)
            self._begin(config, key=key)

    def adopt(self, early: EarlyAgent) -> None:
        """Run an agent process started before the pool existed (``lmbridge stdio`` starts the agent of an editor's
        first chat while it imports the rest of itself), as if ``prestart`` had started it. Stopped at once when
        the pool cannot take it."""
        config = early.config
        key = _key(config, None)
        if self._closed or self._nursery is None or key in self._starting or key in self._running:
            early.abandon()
            return
        early.adopted = True
        self.configs.setdefault(config.id, config)
        self._begin(config, early)

    def _begin(self, config: AgentConfig, early: EarlyAgent | None = None, *, key: _Key | None = None) -> _Start:
        assert self._nursery is not None
        key = key or _key(config, None)
        start = self._starting[key] = _Start()
        self._nursery.start_soon(self._start, config, start, early, key)
        return start

    async def _start(self, config: AgentConfig, start: _Start, early: EarlyAgent | None, key: _Key) -> None:
        assert self._nursery is not None
        process: AgentProcess | None = None
        begun = trio.current_time()
        try:
            with start.scope:
                process = await self._nursery.start(self._run_process, config, early, _principal_of(key))
                start.process = process
                self._running[key] = process
                self._nursery.start_soon(self._restart_after_crash, process, key)
                self._log.info(
                    "agent ready", agent=config.id, pid=process.pid, start_seconds=round(trio.current_time() - begun, 3)
                )
            if start.process is None:
                start.error = AgentStartError(config.id, "lmbridge is shutting down")
        except Exception as exc:
            start.error = exc
            self._log.warning("agent failed to start", agent=config.id, error=str(exc))
        finally:
            if early is not None and (process is None or process.pid is None):  # cancelled before it ran it
                kill_spawned(early.process)
            del self._starting[key]
            start.done.set()

    async def _run_process(
        self,
        config: AgentConfig,
        early: EarlyAgent | None,
        principal: str | None,
        *,
        task_status: trio.TaskStatus[AgentProcess] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run one agent process, as the launcher prepared it (an adopted process was started without it)."""
        launcher = self.launcher if early is None else None
        launch = await launcher.prepare(config, principal) if launcher is not None else None
        process: AgentProcess | None = None
        try:
            gate = self.read_gate(principal) if self.read_gate is not None and principal else None
            process = AgentProcess(
                launch.config if launch else config,
                stop_grace=self._stop_grace,
                tracer=self._tracer,
                spawned=early.process if early is not None else None,
                initialize_id=early.initialize_id if early is not None else None,
                read_gate=gate,
            )
            await process.run(task_status=_Started(task_status, process, launch, self._tell))
        finally:
            if launch is not None:
                launch.ended()
            if process is not None and process.pid is not None:  # it ran: it exited, or was stopped (cancelled)
                self._tell(
                    "agent_exited",
                    {
                        "agent": config.id,
                        "pid": process.pid,
                        "principal": principal,
                        "exit_code": process.exit_code,
                        "sessions_lost": process.sessions_lost,  # > 0: it exited under its sessions (a crash)
                    },
                )

    def _tell(self, event: str, fields: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event, fields)

    async def _restart_after_crash(self, process: AgentProcess, key: _Key) -> None:
        """One agent process serves every session of its agent: when it exits under them, start it again at once
        (once: the new process has no sessions yet), so that their next requests find it ready and reopen their
        conversations (``session/load`` or ``session/resume`` where the agent can, else from the history)."""
        await process.finished.wait()
        if self._closed or not process.sessions_lost or self._running.get(key) not in (process, None):
            return
        self._log.warning(
            "agent exited under its sessions; starting it again",
            agent=process.id,
            exit_code=process.exit_code,
            sessions=process.sessions_lost,
        )
        self._prestart(self.configs.get(process.id) or process.config, key)  # as configured, not as launched

    async def stop_all(self) -> None:
        """Stop every agent process group, including those still starting, and wait until they are gone."""
        self._closed = True
        for start in list(self._starting.values()):
            start.scope.cancel()
        async with trio.open_nursery() as nursery:
            for process in [*self._running.values(), *self._dedicated]:
                nursery.start_soon(process.stop)

    async def _reap_idle(self) -> None:
        ttl = self._idle_ttl
        interval = max(min(ttl / 4, 30.0), 0.01) if math.isfinite(ttl) else 60.0
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for key, process in list(self._running.items()):
                if not process.alive:
                    del self._running[key]
                    self._idle_since.pop(key, None)
                    continue
                if process.session_count:
                    self._idle_since.pop(key, None)
                    continue
                since = self._idle_since.setdefault(key, now)
                if now - since >= ttl:
                    self._log.info("stopping an idle agent", agent=process.id, idle_seconds=round(now - since))
                    del self._running[key]
                    self._idle_since.pop(key, None)
                    assert self._nursery is not None
                    self._nursery.start_soon(process.stop)


class _Started:
    """Passes ``task_status.started()`` on with the process, after telling the launch it runs."""

    def __init__(
        self,
        status: trio.TaskStatus[AgentProcess],
        process: AgentProcess,
        launch: Launch | None,
        tell: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self._status = status
        self._process = process
        self._launch = launch
        self._tell = tell

    def started(self, value: object = None) -> None:
        process = self._process
        self._tell("agent_started", {"agent": process.id, "pid": process.pid, "command": process.config.command})
        if self._launch is not None:
            self._launch.started(self._process)
        self._status.started(self._process)
