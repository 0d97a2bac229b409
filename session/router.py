"""Routing editor turns to ACP sessions, across many concurrent conversations.

Owns: the conversation index of each agent, the live sessions (each with its actor, all in the router's nursery),
opening sessions (``session/new`` with the conversation's seed), retiring them (idle TTL, an LRU cap,
``session/close`` where the agent supports it), and the bookkeeping between turns (committing history, recording
the provisional response and the tool calls the editor owes us).

A turn is always answered: when its session closes under it, the turn is routed again — to a new session seeded
with the conversation. Closing never cancels a turn: a session is *claimed* (``LiveSession.serving``) from the
moment a request is matched to it until that request is answered, and neither the cap nor the idle timer closes a
claimed session. A request that meets a session being closed takes it back if the close has not begun, else waits
until it is closed and routes again.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import trio

from wire.cancel import CancelRequest
from wire.errors import AgentReplyError, AgentTimeoutError, Draining, InternalError
from wire.observe.logger import Logger

from .actor import AgentLink, OutcomeHook, PartSink, SessionActor, TurnOutcome
from .capacity import CAP_REASON, REPORT_INTERVAL, CapacityMeter, choose_evictions
from .catalog import AgentCatalog
from .history import Conversation, ConversationIndex, HistoryMatch, MatchKind, chain_of
from .machine import EditorTurn, SessionMachine, TurnOptions
from .options import SessionOptions
from .permissions import PermissionDecision, PermissionPolicy
from .store import SessionStore, StoredSession
from .transcript import prompt_blocks, trailing_input, transcript

__all__ = ["AgentHandle", "AgentProvider", "RouterSettings", "SessionRouter", "SessionSetup", "TurnRequest"]

R = TypeVar("R")


class AgentHandle(AgentLink, Protocol):
    """A running agent as the router sees it (``bridge.acp.process.AgentProcess`` provides it)."""

    info: Any

    @property
    def alive(self) -> bool: ...

    def attach(self, session_id: str, endpoint: Any) -> list[dict[str, Any]]: ...

    async def stop(self) -> None: ...


class AgentProvider(Protocol):
    async def acquire(self, agent_id: str, owner: object = None) -> AgentHandle:
        """A running, initialised agent process for ``agent_id`` (started if needed), for a session of ``owner``
        (``TurnRequest.client``: an agent whose model requests its client answers has a process per client)."""

    def release(self, agent: AgentHandle) -> None:
        """A session on ``agent`` is over (a process of the session's own is stopped)."""


class SessionSetup(Protocol):
    """Extra per-session set-up around ``session/new`` (the synthetic MCP server plugs in here)."""

    def prepare(self, request: TurnRequest) -> None:
        """A request is about to be routed (start slow preparations early)."""

    async def mcp_servers(self, session: LiveSession, request: TurnRequest) -> list[dict[str, Any]]: ...

    async def session_closed(self, session: LiveSession) -> None: ...

    def turn_started(self, session: LiveSession, request: TurnRequest) -> None: ...


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One client turn, built once by the front that received it (``bridge.service``): the agent, the history, the
    client's tools, how the client shows the agent's activity and which session options it chose (``options``), and
    where and how its history is matched. Nothing on the session path resolves any of it again."""

    agent_id: str
    messages: list[Any]
    cwd: str
    options: TurnOptions = TurnOptions()
    tools: tuple[dict[str, Any], ...] = ()  # the editor's tools for this request (minus the permission tool)
    # Where the history is matched: conversations of different scopes never share a session. A front sets it from
    # what names a conversation or a client (an HTTP conversation header, for example); "" is the shared scope.
    scope: str = ""
    # May a request whose history matches a session that is serving another request right now take that session
    # over? Yes for the editor front: the same history again is the editor retrying. No for HTTP clients: there
    # it is another conversation that happens to start alike, and it gets a session of its own.
    share_running: bool = True
    # The client that sent the request, as its front knows it (an editor connection): opaque here; the session's
    # setup asks it for what the client offers besides its tools (the models an editor shares).
    client: object = None
    # For an agent whose model requests its client answers (an editor's model): which of its models, "" for the
    # agent's configured one. Opaque here, like ``client``.
    thinks_with: str = ""
    # Whose conversation it is (a key's principal on a shared daemon; "" in a process with one user). Histories are
    # matched, and stored sessions found, among the principal's own conversations only: no request of one principal
    # continues, cancels or reads another's session, whatever the history or scope it sends.
    principal: str = ""


@runtime_checkable
class ConnectedClient(Protocol):
    """A client with a connection (an editor): its next request comes back on it, while it is connected."""

    @property
    def connected(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RouterSettings:
    idle_ttl: float = 1800.0
    max_sessions: int = 64
    tool_batch_window: float = 0.05
    tool_batch_idle: Callable[[str], float] = lambda agent_id: 0.015  # by agent: how each makes its calls
    cancel_drain_timeout: float = 10.0
    detached_grace: float = 60.0
    agent_request_timeout: float = 60.0  # session/new, session/load, session/resume: then the agent is restarted
    permission_policy: Callable[[str], PermissionPolicy] = lambda agent_id: PermissionPolicy()
    store: SessionStore | None = None  # fingerprints → session ids, for session/resume and session/load
    # Told each permission request a session answered (an audit log): which agent, whose conversation, what, who.
    on_permission: Callable[[PermissionDecision], None] | None = None


@dataclass(eq=False)
class LiveSession:
    key: str
    agent_id: str
    conversation: Conversation
    scope: str = ""
    serving: int = 0  # requests matched to this session and not yet answered (its claims: it is not evictable)
    ready: trio.Event = field(default_factory=trio.Event)
    session_id: str | None = None
    agent: AgentHandle | None = None
    actor: SessionActor | None = None
    last_used: float = 0.0
    close_reason: str | None = None
    client: object = None  # the client of its latest request (``TurnRequest.client``): whose conversation it is
    thinks_with: str = ""  # and that request's ``TurnRequest.thinks_with``
    principal: str = ""  # whose conversation it is (``TurnRequest.principal``), for good
    retired: trio.Event = field(default_factory=trio.Event)  # the actor is done and the agent was told

    @property
    def owing(self) -> bool:
        """Opening, claimed by a request, or in a turn whose tool calls are out with an editor (a client with a
        connection, whose next request comes back here). An HTTP client's calls are not waited for: its next request
        carries the whole history, and may be sent anywhere (another node re-seeds the conversation)."""
        actor = self.actor
        if self.serving or actor is None:
            return True
        connected = isinstance(self.client, ConnectedClient) and self.client.connected
        return connected and not actor.closed and not actor.machine.idle

    @property
    def evictable(self) -> bool:
        """Open, unclaimed, and owing nothing to anyone: closing it now cancels and loses nothing."""
        actor = self.actor
        return (
            actor is not None
            and self.close_reason is None
            and not self.serving
            and not actor.closed
            and actor.machine.idle
        )


class _NoopSetup:
    def prepare(self, request: TurnRequest) -> None:
        return None

    async def mcp_servers(self, session: LiveSession, request: TurnRequest) -> list[dict[str, Any]]:
        return []

    async def session_closed(self, session: LiveSession) -> None:
        return None

    def turn_started(self, session: LiveSession, request: TurnRequest) -> None:
        return None


class SessionRouter:
    def __init__(
        self,
        agents: AgentProvider,
        settings: RouterSettings,
        *,
        log: Logger,
        setup: SessionSetup | None = None,
        catalog: AgentCatalog | None = None,
    ) -> None:
        """``catalog`` learns what agents offer from the sessions this router opens."""
        self._agents = agents
        self.catalog = catalog if catalog is not None else AgentCatalog()
        self._settings = settings
        self._log = log
        self._setup = setup or _NoopSetup()
        self._indexes: dict[tuple[str, str, str], ConversationIndex] = {}  # by (agent, principal, scope)
        self._sessions: dict[str, LiveSession] = {}
        self._retiring: dict[str, LiveSession] = {}  # by ACP session id: closed here, the agent not yet told
        self.capacity = CapacityMeter()
        self._turn_ids = itertools.count(1)
        self.draining = False  # set: a request that would open a session is refused (``Draining``)
        self._nursery: trio.Nursery | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Owns the session actors and the reaper; returns after ``close_all``."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._reap_idle)
            nursery.start_soon(self._report_capacity)
            task_status.started()
            await trio.sleep_forever()

    async def close_all(self, reason: str) -> None:
        """Close every session (answering everything they owe, then ``session/close``) and wait until done."""
        sessions = list(self._sessions.values())
        for session in sessions:
            self._close(session, reason)
        for session in sessions:
            if session.actor is not None:
                await session.retired.wait()

    @property
    def owing(self) -> int:
        """Sessions that owe someone something: opening, claimed by a request, or in a turn (tool calls out)."""
        return sum(1 for session in self._sessions.values() if session.close_reason is None and session.owing)

    @property
    def sessions(self) -> list[LiveSession]:
        """The sessions open now: one being closed (its actor answering what it owes, the agent being told) is
        not, from the moment it is asked to close."""
        return [session for session in self._sessions.values() if session.close_reason is None]

    # -- turns -----------------------------------------------------------------------------------------------

    async def chat(
        self,
        request: TurnRequest,
        sink: PartSink,
        cancel_requested: CancelRequest,
        on_outcome: OutcomeHook | None = None,
    ) -> TurnOutcome:
        """Route and run one editor turn. Raises ``session.messages.MessageError`` for a malformed history and
        whatever opening a session raises (the agent failing to start). ``on_outcome`` is told the outcome as soon as
        the session ends the turn, once the history it leaves is recorded (a request that follows at once is matched
        against it): a front can answer its client from there, before this returns."""
        turn_id = next(self._turn_ids)
        self._setup.prepare(request)
        for _attempt in range(4):
            index = self._indexes.setdefault(_index_key(request), ConversationIndex())
            match = index.match(request.messages)
            if match.conversation is not None and not request.share_running:
                # For clients that do not share (HTTP), a session busy with another request, or a history the
                # session has already answered (nothing new in it), means another conversation that opens alike
                # (or another completion of the same input): it gets a session of its own.
                running = self._sessions.get(match.conversation.key)
                if (running is not None and running.serving) or not match.new_messages:
                    match = index.unmatched(request.messages)
            if match.kind is MatchKind.NO_MATCH:
                if self.draining:
                    raise Draining()
                # Starting an agent can take a while: a cancel (or shutdown) must not wait for it.
                done, opened = await _unless(cancel_requested, self._new_session_turn, index, match, request, turn_id)
                if not done:
                    return TurnOutcome("cancelled")
                assert opened is not None
                session, turn = opened  # claimed for this request since it was created
                # Sessions that went idle while this one opened are closed now, not after the next turn.
                self._make_room(opening=False)
            else:
                assert match.conversation is not None  # every match but NO_MATCH names its conversation
                known = self._sessions.get(match.conversation.key)
                if known is None:  # its session is gone; its record will be too
                    index.forget(match.conversation)
                    continue
                session = known
                taken_back = False
                if session.close_reason is not None:
                    taken_back = self._take_back(session)
                    if not taken_back:
                        # Being closed: once it is, the conversation gets a new session (or its stored one reopened).
                        done, _ = await _unless(cancel_requested, session.retired.wait)
                        if not done:
                            return TurnOutcome("cancelled")
                        continue
                if not session.ready.is_set():
                    done, _ = await _unless(cancel_requested, session.ready.wait)
                    if not done:
                        return TurnOutcome("cancelled")
                    continue  # the history may have moved meanwhile: match again
                turn = self._continue_turn(index, match, request, turn_id, session)
                session.serving += 1  # claimed, with no await since the match: nothing can close it under the turn
                if taken_back:  # another session, if one is idle, closes in its place
                    self._make_room(opening=False)
            assert session.actor is not None
            session.last_used = trio.current_time()
            session.client, session.thinks_with = request.client, request.thinks_with
            self._setup.turn_started(session, request)
            settle = _Settle(index, session, on_outcome)
            try:
                outcome = await session.actor.run_turn(turn, sink, cancel_requested, settle)
            finally:
                session.serving -= 1
            if outcome.reroute:
                self._log.info("session closed under a turn; routing it again", session=session.session_id)
                self._forget(session)
                continue
            if not settle.done:  # the turn ended without the hook (the caller went away first)
                settle.record(outcome)
            if session.actor.closed:
                self._forget(session)
            else:
                self._remember(session, request)
                # Sessions opened while all others were busy may exceed the cap: now that this one may be idle,
                # bring the count back down (least recently used first).
                self._make_room(opening=False)
            return replace(outcome, session_id=session.session_id or "")
        raise InternalError("could not route the request: its sessions kept closing")

    async def _new_session_turn(
        self, index: ConversationIndex, match: HistoryMatch, request: TurnRequest, turn_id: int
    ) -> tuple[LiveSession, EditorTurn]:
        key = f"{request.agent_id}:{uuid.uuid4().hex}"
        conversation = index.create(key)
        index.commit(conversation, request.messages, 0, match.start)
        # Claimed for this request from the start (``chat`` releases the claim when the turn is answered).
        session = LiveSession(
            key,
            request.agent_id,
            conversation,
            request.scope,
            serving=1,
            client=request.client,
            principal=request.principal,
        )
        self._sessions[key] = session  # visible at once: a concurrent request for it waits for ``ready``
        try:
            stored = await self._stored(request)
            resumed_length = await self._open(session, request, stored)
        except BaseException:
            self._forget(session)
            if session.agent is not None:
                self._agents.release(session.agent)
            raise
        finally:
            session.ready.set()
        agent = session.agent
        assert agent is not None
        images = bool(agent.info and agent.info.prompt("image"))
        if resumed_length is not None:
            # The agent remembers the conversation up to there: send only what came after.
            index.commit(conversation, request.messages, len(request.messages), resumed_length)
            new = request.messages[resumed_length:] or trailing_input(request.messages)
            blocks = prompt_blocks(new, images=images)
            return session, EditorTurn(turn_id, blocks or None, {}, False, request.options)
        # The seed: the editor's instructions, the conversation so far as a transcript, then the new input.
        system = [m for m in request.messages if m.get("role") == "system"]
        prior = [m for m in request.messages[: match.start] if m.get("role") != "system"]
        new = [m for m in match.new_messages if m.get("role") != "system"]
        blocks = prompt_blocks(system, images=images)
        if prior:
            blocks.append({"type": "text", "text": transcript(prior)})
        blocks += prompt_blocks(new, images=images)
        return session, EditorTurn(turn_id, blocks or None, {}, False, request.options)

    def _continue_turn(
        self, index: ConversationIndex, match: HistoryMatch, request: TurnRequest, turn_id: int, session: LiveSession
    ) -> EditorTurn:
        conversation = session.conversation
        new = match.new_messages
        moved_on = match.kind is MatchKind.MOVED_ON
        retry = not new
        if retry:
            # The same history again: a retry, a duplicate of a request still running, or an editor back after a
            # dropped connection. Ask again — unless the session kept the lost answer for it (see the machine).
            new = trailing_input(request.messages)
            moved_on = True
        agent = session.agent
        images = bool(agent and agent.info and agent.info.prompt("image"))
        if match.kind is MatchKind.CONTINUATION and not moved_on:
            # Results for calls the agent no longer waits on are dropped: the agent has moved past them.
            new = [_without_tool_results(message) for message in new]
        blocks = prompt_blocks(new, images=images)
        if conversation.pending_calls and not match.tool_results and blocks:
            # The editor answered none of the calls it was given and the user wrote something else instead:
            # the user moved on. Finishing the old turn first would act on what the user left behind.
            moved_on = True
        index.resolve_calls(conversation, list(conversation.pending_calls))
        index.commit(conversation, request.messages, match.agreed, match.start)
        return EditorTurn(turn_id, blocks or None, match.tool_results, moved_on, request.options, retry)

    # -- sessions --------------------------------------------------------------------------------------------

    async def _stored(self, request: TurnRequest) -> tuple[int, StoredSession] | None:
        """A stored session that answered a prefix of this (unknown) history, if any and not in use. One being
        closed is waited for: reopening it while the agent is told to close it would lose it."""
        store = self._settings.store
        capacity = self.capacity
        stored = store is not None and store.has_agent(request.agent_id)
        if not stored and not capacity.watching:
            return None
        chain = chain_of(request.messages)
        if capacity.watching and capacity.request_without_session(chain, trio.current_time()):
            self._log.debug("a conversation whose session the cap closed came back", agent=request.agent_id)
        if store is None or not stored:
            return None
        hit = store.lookup(request.agent_id, chain, _stored_scope(request.principal, request.scope))
        if hit is None:
            return None
        retiring = self._retiring.get(hit[1].session_id)
        if retiring is not None:
            await retiring.retired.wait()
        live = {s.session_id for s in self._sessions.values()}
        return None if hit[1].session_id in live else hit

    def _remember(self, session: LiveSession, request: TurnRequest) -> None:
        store = self._settings.store
        agent = session.agent
        if store is None or agent is None or agent.info is None or not (agent.info.can_resume or agent.info.can_load):
            return
        conversation = session.conversation
        assert session.session_id is not None
        store.remember(
            session.agent_id,
            session.session_id,
            request.cwd,
            [conversation.fingerprint, conversation.fingerprint_with_provisional],
            _stored_scope(session.principal, session.scope),
        )

    async def _ask(self, agent: AgentHandle, agent_id: str, method: str, params: dict[str, Any]) -> Any:
        """``agent.request`` with a deadline: an agent that does not answer is stopped (the next request starts it
        again) and the caller gets an error naming the agent and the step, instead of waiting forever."""
        timeout = self._settings.agent_request_timeout
        with trio.move_on_after(timeout):
            return await agent.request(method, params)
        self._log.warning("agent did not answer in time; stopping it", agent=agent_id, step=method, seconds=timeout)
        await agent.stop()
        raise AgentTimeoutError(agent_id, method, timeout)

    async def _open(
        self, session: LiveSession, request: TurnRequest, stored: tuple[int, StoredSession] | None = None
    ) -> int | None:
        """Open the ACP session: resume or load a stored one when the agent can, else ``session/new``; then its actor.
        Returns how many messages of the request the agent already knows (None for a new session)."""
        assert self._nursery is not None
        self._make_room()
        # Whose process it may share: the client's (an editor), else the principal's (an HTTP client's).
        owner = request.client if request.client is not None else (request.principal or None)
        agent = session.agent = await self._agents.acquire(request.agent_id, owner)
        servers = await self._setup.mcp_servers(session, request)
        opened = await self._reopen(agent, request, stored, servers) if stored is not None else None
        if opened is None:
            opened = await self._start_new(agent, request, servers)
        session.session_id = opened.session_id
        actor = session.actor = self._new_actor(agent, request, opened)
        # Not ``start``: the actor's inbox takes the first turn before its task runs, and the prompt goes out in the
        # task's first step instead of two scheduler passes later.
        self._nursery.start_soon(self._run_actor, session)
        early = agent.attach(opened.session_id, actor)
        if opened.known is None and early:  # (session/load replays the history as updates before answering)
            await actor.on_agent_updates(early)
        return opened.known

    async def _reopen(
        self, agent: AgentHandle, request: TurnRequest, stored: tuple[int, StoredSession], servers: list[dict[str, Any]]
    ) -> _Opened | None:
        """``session/resume`` (else ``session/load``) of a stored session, when the agent can; None when it cannot or
        refuses (the entry is forgotten). An agent that does not answer in time is not retried here: it was stopped."""
        if agent.info is None or not (agent.info.can_resume or agent.info.can_load):
            return None
        length, entry = stored
        method = "session/resume" if agent.info.can_resume else "session/load"
        params = {"sessionId": entry.session_id, "cwd": request.cwd, "mcpServers": servers}
        try:
            answer = await self._ask(agent, request.agent_id, method, params)
        except AgentTimeoutError:
            raise
        except Exception as exc:
            self._log.info(
                "stored session could not be reopened; starting a new one",
                method=method,
                session=entry.session_id,
                error=str(exc),
            )
            if self._settings.store is not None:
                self._settings.store.forget(entry.session_id)
            return None
        self._log.info("stored session reopened", method=method, session=entry.session_id, known_messages=length)
        return _Opened(answer, entry.session_id, length)

    async def _start_new(self, agent: AgentHandle, request: TurnRequest, servers: list[dict[str, Any]]) -> _Opened:
        answer = await self._ask(agent, request.agent_id, "session/new", {"cwd": request.cwd, "mcpServers": servers})
        session_id = answer.get("sessionId") if isinstance(answer, dict) else None
        if not isinstance(session_id, str) or not session_id:
            raise AgentReplyError(
                f"agent {request.agent_id!r} answered session/new without a sessionId: {answer!r}",
                agent=request.agent_id,
            )
        return _Opened(answer, session_id, None)

    def _new_actor(self, agent: AgentHandle, request: TurnRequest, opened: _Opened) -> SessionActor:
        """The session's state machine and actor, told what the session can be set to and how to report what the
        agent offers (``_OfferLearner``)."""
        settings, agent_id = self._settings, request.agent_id
        machine = SessionMachine(
            new_call_id=lambda: f"lmb_{uuid.uuid4().hex}",
            permission_policy=settings.permission_policy(agent_id),
            batch_window=settings.tool_batch_window,
            batch_idle=settings.tool_batch_idle(agent_id),
            drain_timeout=settings.cancel_drain_timeout,
            detached_grace=settings.detached_grace,
        )
        log, session_id, cwd = self._log, opened.session_id, request.cwd
        learner = _OfferLearner(
            self.catalog,
            agent_id,
            opened.answer,
            on_opened=lambda: log.info("session opened", agent=agent_id, session=session_id, cwd=cwd),
        )
        return SessionActor(
            agent,
            opened.session_id,
            machine,
            log=log.bind(agent=agent_id),
            options=SessionOptions.from_session(opened.answer),
            on_offer_update=learner.update,
            after_first_actions=learner.opened,
            on_permission=_told(
                settings.on_permission, PermissionDecision.about(agent_id, request.principal, session_id)
            ),
        )

    async def _run_actor(self, session: LiveSession) -> None:
        actor = session.actor
        assert actor is not None and session.agent is not None and session.session_id is not None
        try:
            await actor.run()
        finally:
            self._forget(session)
            self._retiring[session.session_id] = session
            with trio.CancelScope(shield=True):
                agent = session.agent
                if session.close_reason is not None and agent.alive and agent.info and agent.info.can_close:
                    with trio.move_on_after(5):
                        try:
                            await agent.request("session/close", {"sessionId": session.session_id})
                        except Exception as exc:
                            self._log.info("session/close failed", session=session.session_id, error=str(exc))
                await self._setup.session_closed(session)
                self._agents.release(agent)
                if self._retiring.get(session.session_id) is session:
                    del self._retiring[session.session_id]
                session.retired.set()

    def _close(self, session: LiveSession, reason: str) -> None:
        session.close_reason = reason
        if session.actor is not None:
            session.actor.close(reason)
        else:
            self._forget(session)

    def _take_back(self, session: LiveSession) -> bool:
        """A request met ``session`` being closed for the cap or its idle time: keep it open instead, if its actor
        has not begun closing it (the cap may be overshot until the next turn ends; see ``_make_room``)."""
        if session.close_reason == "shutdown" or session.actor is None or not session.actor.withdraw_close():
            return False
        self._log.debug("a request took back a session being closed", session=session.session_id)
        session.close_reason = None
        self.capacity.taken_back()
        return True

    def _forget(self, session: LiveSession) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
        index_key = (session.agent_id, session.principal, session.scope)
        index = self._indexes.get(index_key)
        if index is not None and index.get(session.key) is session.conversation:
            index.forget(session.conversation)
            if not len(index):
                del self._indexes[index_key]

    def _make_room(self, *, opening: bool = True) -> None:
        """Keep under the LRU cap (with room for one more when ``opening``): close the least recently used sessions
        that nobody waits on (``LiveSession.evictable``). When there are not enough of those — more conversations
        have a turn running or matched than the cap — the cap is overshot until their turns end."""
        limit = self._settings.max_sessions
        if len(self._sessions) + opening <= limit:  # under the cap counting every session: nothing to scan (each turn)
            return
        live = [s for s in self._sessions.values() if s.actor is not None and s.close_reason is None]
        now = trio.current_time()
        self.capacity.open_sessions(len(live), now)
        for session in choose_evictions(live, open_count=len(live) + opening, limit=limit):
            self._log.debug("closing the least recently used session", session=session.session_id, cap=limit)
            conversation = session.conversation
            self.capacity.closed([conversation.fingerprint, conversation.fingerprint_with_provisional], now)
            self._close(session, CAP_REASON)

    async def _report_capacity(self) -> None:
        """At most once a minute, what the cap closed and how many of those conversations came back: thrash, when
        more conversations are in use than ``max_sessions``."""
        while True:
            await trio.sleep(REPORT_INTERVAL)
            summary = self.capacity.report(trio.current_time())
            if summary is None:
                continue
            self._log.warning(
                "sessions closed to stay under the cap; conversations that came back were told their history again "
                "(raise [sessions] max_sessions above the conversations in use at once)",
                cap=self._settings.max_sessions,
                closed=summary.closed,
                came_back=summary.came_back,
                seconds=summary.window_seconds,
                peak_open=summary.peak_open,
            )

    async def _reap_idle(self) -> None:
        ttl = self._settings.idle_ttl
        interval = max(min(ttl / 4, 30.0), 0.01)
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for session in list(self._sessions.values()):
                actor = session.actor
                if actor is None or session.close_reason is not None:
                    continue
                idle_for = now - max(session.last_used, actor.last_active)
                if idle_for >= ttl and actor.machine.open_turn is None and not session.serving:
                    self._log.info("closing an idle session", session=session.session_id, idle_seconds=round(idle_for))
                    self._close(session, "idle timeout")


def _index_key(request: TurnRequest) -> tuple[str, str, str]:
    return (request.agent_id, request.principal, request.scope)


def _stored_scope(principal: str, scope: str) -> str:
    """The scope a session is stored under: the principal's and the front's, as a JSON pair — but for the one user of
    a process without principals (""), the front's as it is (what earlier versions stored), unless it looks like a
    pair: processes of either kind may share the state file, and their scopes never meet."""
    return json.dumps([principal, scope]) if principal or scope.startswith("[") else scope


async def _unless(
    cancel_requested: CancelRequest, work: Callable[..., Awaitable[R]], *args: Any
) -> tuple[bool, R | None]:
    """``await work(*args)``, abandoned as soon as ``cancel_requested`` is set: ``(finished, result)``."""
    with trio.CancelScope() as scope:
        unwatch = cancel_requested.on_set(scope.cancel)
        try:
            return True, await work(*args)
        finally:
            unwatch()
    return False, None


@dataclass(frozen=True, slots=True)
class _Opened:
    answer: Any  # the agent's answer that opened the session (what it offers and its options are in it)
    session_id: str
    known: int | None  # messages of the request a reopened session already knows; None for a new session


class _OfferLearner:
    """What a session offers (models, options, commands) goes to the catalog once the session's first prompt is out,
    not on its path: it changes the clients' model list (a notification, a log line, the state file: ~0.3 ms on an
    agent's first session). Offer updates that come before it wait, in order."""

    __slots__ = ("_agent_id", "_answer", "_catalog", "_early", "_on_opened")

    def __init__(self, catalog: AgentCatalog, agent_id: str, answer: Any, on_opened: Callable[[], object]) -> None:
        self._catalog = catalog
        self._agent_id = agent_id
        self._answer = answer
        self._on_opened: Callable[[], object] | None = on_opened
        self._early: list[dict[str, Any]] | None = []

    def update(self, update: dict[str, Any]) -> None:
        if self._early is None:
            self._catalog.learn_update(self._agent_id, update)
        else:
            self._early.append(update)

    def opened(self) -> None:
        """Once. Afterwards the session keeps the learner for its offer updates, and nothing else of its opening."""
        self._catalog.learn_session(self._agent_id, self._answer)
        for update in self._early or ():
            self._catalog.learn_update(self._agent_id, update)
        on_opened, self._on_opened, self._answer, self._early = self._on_opened, None, None, None
        if on_opened is not None:
            on_opened()


class _Settle:
    """A turn's outcome recorded in the session's history, then handed to the front's hook: called by the actor in the
    step that ends the turn, or by the router once the turn has returned, whichever comes first."""

    __slots__ = ("done", "index", "on_outcome", "session")

    def __init__(self, index: ConversationIndex, session: LiveSession, on_outcome: OutcomeHook | None) -> None:
        self.index = index
        self.session = session
        self.on_outcome = on_outcome
        self.done = False

    def __call__(self, outcome: TurnOutcome) -> None:
        if outcome.reroute:
            return
        self.record(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def record(self, outcome: TurnOutcome) -> None:
        self.done = True
        actor = self.session.actor
        if actor is not None and not actor.closed:
            self.index.set_provisional(self.session.conversation, list(outcome.emitted))
            self.index.add_pending_calls(self.session.conversation, outcome.pending_calls)


def _without_tool_results(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [p for p in content if not (isinstance(p, dict) and p.get("type") == "tool_result")]}


def _told(
    hook: Callable[[PermissionDecision], None] | None, about: PermissionDecision
) -> Callable[[dict[str, Any], dict[str, Any], str], None] | None:
    """The actor's permission hook: each answer, as a ``PermissionDecision`` of its session, to ``hook``."""
    if hook is None:
        return None
    return lambda params, outcome, decided_by: hook(about.of(params, outcome, decided_by))
