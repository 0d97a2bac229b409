"""The bridge service every front talks to, in ``lmbridge stdio`` and ``lmbridge serve`` alike: the agent pool, the
session router, the editor-tools wiring and the catalog of what agents offer, and what a front asks of them
(models, a chat turn, status).

Owns the order of shutdown: sessions are closed first (every turn, permission request and tool call answered),
then agent process groups are stopped.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from bridge.acp.pool import AgentPool
from bridge.config import AgentConfig, Config, tool_batch_idle
from bridge.service.limits import TurnLimits
from bridge.service.models import ModelEntry, model_entries, resolve_model
from bridge.service.principals import LOCAL, Principal
from bridge.service.share import LoopShare, Start
from bridge.service.usage import Meter, Recorder, TurnRecord, refused
from bridge.service.view import ClientView
from session.catalog import AgentCatalog, AgentOffer
from wire.errors import TooManyRequests
from wire.observe.logger import Logger
from wire.vocabulary import TOOL_CALLS

if TYPE_CHECKING:  # imported on first use: the session layer is not on the path of lmbridge's start
    from session.actor import OutcomeHook, PartSink, TurnOutcome
    from session.permissions import PermissionDecision
    from session.router import TurnRequest
    from wire.cancel import CancelRequest

__all__ = ["BridgeService"]


# Seconds between a change of the session store and its write: what a crash (not a shutdown) may lose.
STATE_WRITE_DELAY = 1.0


class BridgeService:
    def __init__(self, config: Config, *, log: Logger, tracer: Any = None) -> None:
        from pathlib import Path

        from session.permissions import PermissionPolicy, permission_tool_schema
        from session.router import RouterSettings, SessionRouter
        from session.store import SessionStore, default_state_path

        self.config = config
        self.log = log
        self.tracer = tracer
        sessions = config.sessions
        permissions = config.permissions
        self.pool = AgentPool(
            config.agents, stop_grace=sessions.stop_grace, idle_ttl=sessions.agent_idle_ttl, tracer=tracer, log=log
        )

        def policy_for(agent_id: str) -> PermissionPolicy:
            agent = self.pool.configs.get(agent_id)
            policy = (agent.permission_policy if agent else None) or permissions.policy
            return PermissionPolicy(policy=policy, tool_name=permissions.tool_name)

        state_path = Path(sessions.state_file).expanduser() if sessions.state_file else default_state_path()
        from bridge.service.editor_models import EditorModels
        from mcp_synthetic.wiring import EditorToolsSetup

        self.editor_models = EditorModels(
            config.editor_models,
            config.tools,
            own_models=lambda: [entry.id for entry in self.models()],
            log=log,
        )
        self.tools = EditorToolsSetup(
            log=log,
            tracer=tracer,
            parallel_tools=config.tools.parallel,
            local_tools=self.editor_models.tools_for,
            watch_local_tools=self.editor_models.watch,
        )
        self._state_changed = trio.Event()
        self.store = SessionStore(state_path, log=log, on_change=self._note_state_change)
        self.catalog = AgentCatalog(on_change=self._offer_changed)
        self._model_watchers: set[Callable[[], None]] = set()
        self.editor_models.watch(self._editor_models_changed)
        self._seed_offers(config.agents.values())
        self.router = SessionRouter(
            self.pool,
            RouterSettings(
                idle_ttl=sessions.idle_ttl,
                max_sessions=sessions.max_sessions,
                tool_batch_window=sessions.tool_batch_window,
                tool_batch_idle=lambda agent_id: tool_batch_idle(self.pool.configs.get(agent_id), sessions),
                cancel_drain_timeout=sessions.cancel_drain_timeout,
                detached_grace=sessions.detached_grace,
                agent_request_timeout=sessions.agent_request_timeout,
                permission_policy=policy_for,
                store=self.store,
                on_permission=self._permission_decided,
            ),
            log=log,
            setup=self.tools,
            catalog=self.catalog,
        )
        self.permission_tool = permission_tool_schema(permissions.tool_name)
        self.limits = TurnLimits(config.limits)
        self.share = LoopShare()  # whose work goes first on the event loop: a lighter principal's starting requests
        self.pool.read_gate = self.share.gate
        self.recorders: list[Recorder] = []  # where each turn's record goes (the daemon's usage ledger, its metrics)
        # Who is told of what an audit log keeps (``event(name, fields)``): permission decisions, agent processes.
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.pool.on_event = self._tell
        self.connection_count: Any = lambda: 1  # the stdio bridge has its one editor; the WebSocket server replaces it
        self.http_url: str | None = None  # the HTTP API's address, when the process serves it (daemon/status says)
        self.stopped = trio.Event()
        self.started_at = 0.0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.started_at = trio.current_time()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.pool.run)
            await nursery.start(self.tools.run)
            await nursery.start(self.router.run)
            nursery.start_soon(self._keep_state_file)
            # Everything allocated so far (mostly imported modules) lives as long as the process: keep it out of the
            # garbage collector's scans, which otherwise show as pauses in streaming latency. The commands that
            # start a service import it with the collector paused (bridge.cli): start-up is over, collect again.
            gc.freeze()
            gc.enable()
            task_status.started()
            await self.stopped.wait()
            nursery.cancel_scope.cancel()

    def _note_state_change(self) -> None:
        self._state_changed.set()

    async def _keep_state_file(self) -> None:
        """Write the session state file a moment after the store changed, in a worker thread: a turn's answer does
        not wait for the disk (a millisecond or more per turn, growing with the file), and a burst of turns (many
        conversations at once) makes one write. What changed by the end is written on the way out."""
        try:
            while True:
                await self._state_changed.wait()
                await trio.sleep(STATE_WRITE_DELAY)
                self._state_changed = trio.Event()
                content = self.store.snapshot()
                if content is not None:
                    await trio.to_thread.run_sync(self.store.write, content)
        finally:
            content = self.store.snapshot()
            if content is not None:
                self.store.write(content)

    def _tell(self, event: str, fields: dict[str, Any]) -> None:
        """Tell each listener; one that fails is logged, never the failure of what it was told about (a permission
        answer on its way to the agent, an agent starting)."""
        for listener in self.listeners:
            try:
                listener(event, fields)
            except Exception as exc:
                self.log.error("an audit event was not kept", event_name=event, error=repr(exc))

    def _permission_decided(self, decision: PermissionDecision) -> None:
        if self.listeners:
            self._tell("permission", {name: getattr(decision, name) for name in decision.__dataclass_fields__})

    def drain(self) -> None:
        """The process is stopping, gently: what runs goes on, no new conversation is opened (``Draining``)."""
        self.router.draining = True

    @property
    def draining(self) -> bool:
        return self.router.draining

    @property
    def owing(self) -> int:
        """Conversations in the middle of something (opening, a turn running, tool calls out with the client)."""
        return self.router.owing

    async def shutdown(self) -> None:
        """Close all sessions, stop all agents. Idempotent."""
        if self.stopped.is_set():
            return
        with trio.CancelScope(shield=True):
            await self.router.close_all("shutdown")
            await self.pool.stop_all()
        self.stopped.set()
        self.log.info("stopped")

    # -- what editor connections use -------------------------------------------------------------------------

    def add_agents(self, configs: Mapping[str, AgentConfig]) -> None:
        self.pool.add(configs)
        self._seed_offers(configs.values())

    def models(self, principal: Principal | None = None) -> list[ModelEntry]:
        """What the fronts list to ``principal`` (``None``: everything, in a process with one user): per agent it
        may use its default entry, then one per model it offers (``models``)."""
        return model_entries(self._agents_of(principal), self.catalog, self._shared_models(principal))

    def resolve_model(self, model_id: str, principal: Principal | None = None) -> ModelEntry:
        """The entry a request names; ``UnknownModel`` (-32602, listing the models) when there is none, or it is an
        agent ``principal`` may not use (as if absent)."""
        return resolve_model(model_id, self._agents_of(principal), self.catalog, self._shared_models(principal))

    def _agents_of(self, principal: Principal | None) -> Mapping[str, AgentConfig]:
        configs = self.pool.configs
        if principal is None or principal.agents is None:
            return configs
        return {agent_id: config for agent_id, config in configs.items() if principal.may_use(agent_id)}

    def _shared_models(self, principal: Principal | None) -> list[Any]:
        """The models the principal's editors share, each id once (for the entries of agents on the editor's
        models)."""
        if not any(config.model_source for config in self.pool.configs.values()):
            return []
        who = principal.id if principal is not None else None
        unique = {model.id: model for _name, model, _link in self.editor_models.listed(who)}
        return list(unique.values())

    def _editor_models_changed(self) -> None:
        """Agents on the editor's models list one entry per shared model: the model list changes with them."""
        if any(config.model_source for config in self.pool.configs.values()):
            for watcher in list(self._model_watchers):
                watcher()

    def watch_models(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call ``watcher()`` whenever the model list changes (an agent announced other models, options or
        commands); returns the function that stops it."""
        self._model_watchers.add(watcher)
        return lambda: self._model_watchers.discard(watcher)

    def _offer_changed(self, agent_id: str) -> None:
        config = self.pool.configs.get(agent_id)
        if config is not None:
            self.store.remember_offer(agent_id, _command_line(config), self.catalog.offer(agent_id).to_json())
        self.log.info("agent offer changed", agent=agent_id)
        self.editor_models.own_models_changed()
        for watcher in list(self._model_watchers):
            watcher()

    def _seed_offers(self, configs: Iterable[AgentConfig]) -> None:
        """What agents offered in an earlier run of lmbridge (by the same command line), until they say again."""
        for config in configs:
            stored = self.store.offer(config.id, _command_line(config))
            if stored is not None:
                self.catalog.seed(config.id, AgentOffer.from_json(stored))

    def prestart_agents(self, editor: object = None, principal: Principal | None = None) -> None:
        """An editor connected: start the agents configured with ``prestart``, and the imports serving its tools
        needs (the HTTP server and the schema checker, ~0.1 s of CPU once per process; the MCP SDK only when something
        needs it), which its first chat would otherwise wait for (editors send their tools with every chat)."""
        for config in self._agents_of(principal).values():
            if config.prestart:
                self.pool.prestart(config.id, editor)
        self.tools.preload()

    def status(self, principal: Principal | None = None) -> dict[str, Any]:
        """The daemon's state (``daemon/status``). A principal without the ``admin`` scope sees its own sessions
        and the version only: not other principals' counts, nor the agents' processes."""
        from bridge import __version__

        sessions: dict[str, int] = {}
        admin = principal is None or "admin" in principal.scopes
        for session in self.router.sessions:
            if admin or session.principal == principal.id:  # type: ignore[union-attr]  # not admin: a principal
                sessions[session.agent_id] = sessions.get(session.agent_id, 0) + 1
        if not admin:
            return {"version": __version__, "sessions": sessions}
        capacity = self.router.capacity
        return {
            "version": __version__,
            "uptimeSeconds": round(trio.current_time() - self.started_at, 3),
            "connections": self.connection_count(),
            "sessions": sessions,
            "cap": {
                "maxSessions": self.config.sessions.max_sessions,
                "closedForCap": capacity.closed_total,
                "cameBack": capacity.came_back_total,
                "takenBack": capacity.taken_back_total,
            },
            "agents": [{"id": p.id, "pid": p.pid, "sessions": p.session_count} for p in self.pool.processes],
            **({"http": self.http_url} if self.http_url else {}),
        }

    async def chat(
        self,
        request: TurnRequest,
        sink: PartSink,
        cancel: CancelRequest,
        on_outcome: OutcomeHook | None = None,
        *,
        principal: Principal | None = None,
        front: str = "",
        model: str = "",
    ) -> TurnOutcome:
        """Run one turn (``SessionRouter.chat``) within ``principal``'s limits — ``TooManyRequests`` before any work
        when it is over one — and account for it (``front``, ``model``: as the request came)."""
        from session.tokens import estimate_turn_tokens

        who = principal or LOCAL
        start = self.starting(who)  # before its turn counts: until its first part is written, busier keys' work waits
        try:
            async with self.metered(principal, front, request.agent_id, model or request.agent_id, cancel) as meter:
                if self.share.yields(who.id):  # a busier principal's new turn is bulk work too: it waits its turn
                    await self.share.wait(who.id)
                sink = meter.sink(self._shared(who.id, sink, start))
                outcome = await self.router.chat(request, sink, cancel, on_outcome)
                # A tools-out part of a prompt is not estimated: what the agent reports when the prompt ends covers
                # every model call of it (an estimate here would count the history once per tool round).
                running_on = outcome.stop_reason == TOOL_CALLS
                meter.count(
                    outcome.usage,
                    None if running_on else lambda: estimate_turn_tokens(request.messages, outcome.emitted),
                )
                meter.ended(outcome.stop_reason, outcome.error, outcome.session_id)
                return outcome
        finally:
            self.share.started(start)

    def starting(self, principal: Principal) -> Start | None:
        """A request of ``principal`` starts: its ``Start`` (``LoopShare``; hand it to ``share.started`` once its
        answer's first bytes are written), unless it is to be refused (a refused request holds nobody back). The limits
        are looked at only when a start would hold someone back: most requests pass here with a dictionary look-up."""
        if not self.share.others_busier(principal.id):
            return None
        try:
            self.limits.check(principal, now=trio.current_time(), wall=time.time())
        except TooManyRequests:
            return None
        return self.share.starting(principal.id)

    @asynccontextmanager
    async def metered(
        self, principal: Principal | None, front: str, agent: str, model: str, cancel: CancelRequest | None = None
    ) -> AsyncIterator[Meter]:
        """A turn of ``principal`` (``None``: the process's one user) within its limits, from admission (raising
        ``TooManyRequests`` when it is over one, after ``hold``) to its end, whatever that is; the turn tells the meter
        what it used and how it ended, and its record goes to the ledger."""
        who = principal or LOCAL
        identity = (time.time(), who.id, who.name, front, agent, model)
        try:
            admission = self.limits.admit(who, now=trio.current_time(), wall=identity[0])
        except TooManyRequests as error:
            self._record(refused(identity, error))
            await self.hold(who, error, cancel)
            raise
        meter = Meter(identity, counted=admission.limited or bool(self.recorders))
        self.share.turn_began(who.id)
        try:
            yield meter
        except BaseException as error:
            meter.failed(error)
            raise
        finally:
            self.share.turn_ended(who.id)
            self.limits.finish(admission, meter.tokens, wall=time.time())
            if self.recorders:
                self._record(meter.record())

    def _shared(self, who: str, sink: PartSink, start: Start | None) -> PartSink:
        """``sink`` for a turn of ``who`` on the event loop shared with other principals' turns: its first part ends
        ``start``; each part waits while ``who`` is the busier principal and another's request is starting."""
        share = self.share

        async def shared(part: dict[str, Any]) -> None:
            nonlocal start
            if share.yields(who):
                await share.wait(who)
            await sink(part)
            if start is not None:
                share.started(start)
                start = None

        return shared

    def refusal(self, principal: Principal | None, front: str, agent: str, model: str) -> TooManyRequests | None:
        """The refusal a turn of ``principal`` would meet now, recorded (None: it would be let in): a front asks as
        soon as it knows what a request is for, so that a refused request costs nothing more — then answers it after
        ``hold``. (The turn of a request let in is admitted, and counted, by ``metered``.)"""
        who = principal or LOCAL
        try:
            self.limits.check(who, now=trio.current_time(), wall=time.time())
        except TooManyRequests as error:
            self._record(refused((time.time(), who.id, who.name, front, agent, model), error))
            return error
        return None

    async def hold(self, principal: Principal, refusal: TooManyRequests, cancel: CancelRequest | None = None) -> None:
        """Wait as long as the limits say before ``refusal`` is answered (a key refused again and again waits before
        each answer: ``TurnLimits.hold``); not at all while the daemon drains, and no longer once ``cancel`` is set
        (the client went away)."""
        pause = 0.0 if self.draining else self.limits.hold(principal, refusal, now=trio.current_time())
        if pause:
            with trio.move_on_after(pause):
                if cancel is not None:
                    await cancel.wait()
                else:
                    await trio.sleep_forever()

    def _record(self, row: TurnRecord) -> None:
        """Hand a turn's record to each recorder; one that fails is logged, never the turn's failure."""
        for record in self.recorders:
            try:
                record(row)
            except Exception as exc:
                self.log.error("a turn's record was not kept", recorder=repr(record), error=repr(exc))

    def turn_request(
        self,
        entry: ModelEntry,
        messages: list[Any],
        tools: list[dict[str, Any]],
        *,
        cwd: str,
        view: ClientView = ClientView(),
        scope: str = "",
        share_running: bool = True,
        choices: tuple[tuple[str, Any], ...] = (),
        client: object = None,
        principal: Principal | None = None,
    ) -> TurnRequest:
        """The one request object of a turn, built by the front from what it resolved (``entry``, see
        ``resolve_model``) and read: the history, the client's tools (the permission tool among them when the client
        offers it), how it shows the agent's activity (``view``), where (``scope``) and how (``share_running``) its
        history is matched, its choices of the agent's session options (``session.options``), and who the client is
        (an editor connection, whose shared models the agent may ask: ``editor_models``) and whose conversation it is
        (``principal``: matched among its own only)."""
        from session.machine import TurnOptions
        from session.router import TurnRequest

        # The agent's configured options, then the model the entry chooses, then the client's choices.
        settings = {**dict(entry.agent.options), **dict(entry.settings), **dict(choices)}
        permission_name = self.permission_tool["name"]
        offered = any(tool["name"] == permission_name for tool in tools)
        bridged = tuple(tool for tool in tools if tool["name"] != permission_name)
        options = TurnOptions(
            thinking=view.thinking,
            acp_updates=view.acp_updates,
            permission_tool=offered,
            activity_as_thinking=view.activity_as_thinking,
            settings=tuple(settings.items()),
        )
        return TurnRequest(
            entry.agent.id,
            messages,
            cwd,
            options,
            bridged,
            scope,
            share_running,
            client,
            entry.thinks_with,
            principal.id if principal is not None else "",
        )


def _command_line(config: AgentConfig) -> list[str]:
    return [config.command, *config.args]
