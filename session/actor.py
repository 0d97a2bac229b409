"""The Trio session actor: one task per ACP session that merges everything about it into one event stream.

Owns the shell around ``SessionMachine``: it receives agent updates, permission requests and tool invocations
(from the agent connection and the synthetic MCP server), editor turns and cancels (from the router), and prompt
completions (from its own prompt task); feeds them to the machine in arrival order; and carries out the actions:
sending ``session/prompt``/``session/cancel``, streaming parts to the editor turn's sink, answering the waiting
permission requests and tool calls.

Everyone waiting on the actor has a cancel path: an editor turn whose caller is cancelled sends ``EditorCancel``; a
permission request or tool call whose caller gives up sends ``InvocationWithdrawn``; a closed actor answers at once.
Agent updates go through a bounded number of slots, so a flood from the agent waits for a slow editor instead of
growing memory; everything else is never blocked.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import trio

from wire.cancel import CancelRequest
from wire.errors import AgentError, AgentReplyError, InternalError, InvalidParams, RpcError
from wire.observe.logger import Logger
from wire.vocabulary import STOP_REASONS

from .elicitation import as_permission, elicitation_answer
from .machine import (
    Action,
    AgentExited,
    AgentUpdates,
    AnswerPermission,
    EditorCancel,
    EditorGone,
    EditorTurn,
    Emit,
    EndTurn,
    Event,
    InvocationWithdrawn,
    PermissionRequest,
    PromptFailed,
    PromptFinished,
    ResolveInvocation,
    SendCancel,
    SendPrompt,
    SessionClosed,
    SessionMachine,
    Tick,
    ToolInvocation,
)
from .options import SessionOptions, request_label
from .permissions import cancelled_outcome
from .render import prompt_usage

__all__ = ["AgentLink", "PartSink", "SessionActor", "TurnOutcome"]

T = TypeVar("T")
_SESSION_ENDED = "The session ended; the tool call was withdrawn."
_UPDATE_SLOTS = 256
_OPTION_UPDATES = ("config_option_update", "current_mode_update")
_OFFER_UPDATES = ("config_option_update", "available_commands_update")  # what the agent offers (session.catalog)
OPTION_TIMEOUT = 30.0  # seconds for the agent to answer session/set_config_option or session/set_mode

PartSink = Callable[[dict[str, Any]], Awaitable[None]]
# Told a turn's outcome in the step that ends the turn, before its caller wakes: what must follow the turn's last
# part at once (the editor's answer) need not wait for a scheduler round. It must not raise, nor block.
OutcomeHook = Callable[["TurnOutcome"], None]
# A permission request answered: its params, the outcome, who decided ("client", "policy", "lmbridge").
PermissionHook = Callable[[dict[str, Any], dict[str, Any], str], None]


class AgentLink(Protocol):
    """The agent connection as the actor sees it (``bridge.acp.process.AgentProcess`` provides it)."""

    id: str

    async def request(self, method: str, params: dict[str, Any]) -> Any: ...

    def send_request(self, method: str, params: dict[str, Any]) -> Any:
        """Queue a request now; the returned object's ``result()`` awaits the answer."""

    def notify(self, method: str, params: dict[str, Any]) -> None: ...

    def detach(self, session_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    stop_reason: str | None
    error: Exception | None = None
    reroute: bool = False
    emitted: tuple[dict[str, Any], ...] = ()
    pending_calls: tuple[str, ...] = ()
    usage: dict[str, Any] | None = None
    session_id: str = ""  # the ACP session that ran the turn (set by the router; "" when none did)

    @classmethod
    def from_action(cls, action: EndTurn) -> TurnOutcome:
        return cls(action.stop_reason, action.error, action.reroute, action.emitted, action.pending_calls, action.usage)


class _Turn:
    __slots__ = ("broken", "done", "on_done", "outcome", "sink")

    def __init__(self, sink: PartSink, on_done: OutcomeHook | None) -> None:
        self.sink = sink
        self.on_done = on_done
        self.done = trio.Event()
        self.outcome: TurnOutcome | None = None
        self.broken = False  # the editor stopped listening: skip further parts


class _Waiter(Generic[T]):
    """A permission request or tool call waiting for the machine's answer; ``fallback`` is its answer when the
    session ends before the machine could give one."""

    __slots__ = ("decided_by", "done", "fallback", "value")

    def __init__(self, fallback: T) -> None:
        self.done = trio.Event()
        self.value: T = fallback  # the answer, once ``done`` is set
        self.fallback = fallback
        self.decided_by = "lmbridge"  # a permission's answer: who gave it (``AnswerPermission.decided_by``)

    def give_up(self) -> None:
        _answer(self, self.fallback)


class SessionActor:
    def __init__(
        self,
        agent: AgentLink,
        session_id: str,
        machine: SessionMachine,
        *,
        log: Logger,
        options: SessionOptions | None = None,
        on_offer_update: Callable[[dict[str, Any]], object] | None = None,
        after_first_actions: Callable[[], object] | None = None,
        on_permission: PermissionHook | None = None,
    ) -> None:
        """``options``: what the session can be set to (from the agent's answer that opened it). ``on_offer_update``
        is told each update that changes what the agent offers (``session.catalog``); ``after_first_actions`` is called
        once, when the actor has carried out its first actions (the router's "session opened": after the first prompt
        is out, not on its path). ``on_permission`` is told each permission request answered: its params, the
        outcome, and who decided."""
        self.agent = agent
        self.session_id = session_id
        self.machine = machine
        self._log = log.bind(session=session_id)
        self._inbox_send, self._inbox = trio.open_memory_channel[Event | _CloseRequest](math.inf)
        self._update_slots = trio.Semaphore(_UPDATE_SLOTS)
        self._turns: dict[Hashable, _Turn] = {}
        self._close_asked: _CloseRequest | None = None  # a close asked for and not yet begun: it can be withdrawn
        self.closed = False
        self.finished = trio.Event()
        self.last_active = trio.current_time()
        self.options = options if options is not None else SessionOptions()
        self._configuring: _Flag | None = None  # options being set before a prompt; True once cancelled meanwhile
        self._prompt_cancelled = CancelRequest()  # set when the prompt running now is cancelled, or the session closes
        self._on_offer_update = on_offer_update
        self._after_first_actions = after_first_actions
        self._on_permission = on_permission

    # -- running ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._loop()
                nursery.cancel_scope.cancel()
        finally:
            self._first_actions_done()  # a session closed before it did anything opened all the same
            self.closed = True
            self._prompt_cancelled.set()
            self.agent.detach(self.session_id)
            self._inbox_send.close()
            self._answer_leftovers()
            self.finished.set()

    async def _loop(self) -> None:
        machine = self.machine
        ticked = False
        while not machine.closed:
            deadline = machine.deadline
            event: Event | _CloseRequest
            if deadline is None:
                event = await self._inbox.receive()
                ticked = False
            else:
                try:
                    event = self._inbox.receive_nowait()  # what is queued comes before the deadline, as below
                except trio.WouldBlock:
                    event = Tick()
                    if ticked or deadline > trio.current_time():
                        with trio.move_on_at(deadline):
                            event = await self._inbox.receive()
                        ticked = False
                    else:
                        # Already due (the window closed while the actor was busy, e.g. writing the call out):
                        # the Tick now, not after a timer round of the scheduler (~50 µs here). Once in a row:
                        # a deadline the Tick did not move still gets a checkpoint.
                        ticked = True
            # Take whatever else is queued without yielding, then carry out all the actions together: a flood of
            # updates becomes a few large parts and writes instead of one per update.
            actions: list[Action] = []
            while True:
                actions += self._handle(event)
                if machine.closed or len(actions) > 1024:
                    break
                try:
                    event = self._inbox.receive_nowait()
                except trio.WouldBlock:
                    break
            await self._execute(actions)
            if self._after_first_actions is not None:
                self._first_actions_done()

    def _first_actions_done(self) -> None:
        done, self._after_first_actions = self._after_first_actions, None
        if done is not None:
            done()

    def _handle(self, event: Event | _CloseRequest) -> list[Action]:
        if isinstance(event, _CloseRequest):
            if event.withdrawn:
                return []
            if self._close_asked is event:
                self._close_asked = None
            return self.machine.close(event.reason, trio.current_time())
        if isinstance(event, AgentUpdates):
            self._update_slots.release()
        return self.machine.handle(event, trio.current_time())

    def _answer_leftovers(self) -> None:
        while True:
            try:
                event = self._inbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            match event:
                case EditorTurn(turn=turn):
                    self._finish_turn(EndTurn(turn, reroute=True))
                case PermissionRequest(request=_Waiter() as waiter) | ToolInvocation(invocation=_Waiter() as waiter):
                    waiter.give_up()
        for turn_id in list(self._turns):
            self._finish_turn(EndTurn(turn_id, reroute=True))

    async def _execute(self, actions: list[Action]) -> None:
        for action in _coalesce_text(actions):
            match action:
                case Emit(turn=turn_id, part=part):
                    turn = self._turns.get(turn_id)
                    if turn is not None and not turn.broken:
                        try:
                            await turn.sink(part)
                        except Exception as exc:  # the editor is gone: keep the agent's output for its return
                            self._log.info("editor stopped listening; keeping the turn's output", error=str(exc))
                            turn.broken = True
                            self._inbox_send.send_nowait(EditorGone(turn_id))
                case EndTurn():
                    self._finish_turn(action)
                case SendPrompt(blocks=blocks, settings=settings):
                    self._prompt_cancelled = CancelRequest()
                    self._prompt_with(blocks, settings)
                case SendCancel():
                    self._prompt_cancelled.set()
                    if self._configuring is not None:  # the prompt has not gone out: it will not
                        self._configuring.value = True
                    else:
                        self.agent.notify("session/cancel", {"sessionId": self.session_id})
                case AnswerPermission(request=waiter, outcome=outcome, unreadable=unreadable, decided_by=by):
                    if isinstance(waiter, _Waiter):
                        waiter.decided_by = by
                    if unreadable is not None:
                        self._log.warning(
                            "could not read the editor's answer to a permission request; rejecting", answer=unreadable
                        )
                    _answer(waiter, outcome)
                case ResolveInvocation(invocation=waiter, result=result, reason=reason):
                    _answer(waiter, (result, reason))
                case SessionClosed(reason=reason):
                    self._log.info("session closed", reason=reason)
                    self.closed = True
                    self._prompt_cancelled.set()
        self.last_active = trio.current_time()

    def _prompt_with(self, blocks: list[dict[str, Any]], settings: tuple[tuple[str, Any], ...]) -> None:
        """Send the prompt, first setting the session's options where the client chose other values."""
        if settings:
            try:
                requests = self.options.requests(self.session_id, dict(settings))
            except InvalidParams as exc:
                self._send_nowait(PromptFailed(exc))
                return
            if requests:
                self._configuring = cancelled = _Flag()
                self._nursery.start_soon(self._configure_then_prompt, requests, blocks, cancelled)
                return
        self._send_prompt(blocks)

    def _send_prompt(self, blocks: list[dict[str, Any]]) -> None:
        # Queued here, synchronously: a session/cancel executed next must follow it on the wire.
        reply = self.agent.send_request("session/prompt", {"sessionId": self.session_id, "prompt": blocks})
        # The answer is taken in wire order: updates the agent sends after it belong to the next turn.
        reply.on_answer(self._prompt_answered, on_lost=lambda: self._prompt_lost(reply))

    async def _configure_then_prompt(
        self, requests: list[tuple[str, dict[str, Any]]], blocks: list[dict[str, Any]], cancelled: _Flag
    ) -> None:
        """The option requests one after the other, each answered before the next (agents handle requests
        concurrently); then the prompt, unless the turn was cancelled meanwhile."""
        for method, params in requests:
            what = request_label(method, params)
            try:
                with trio.fail_after(OPTION_TIMEOUT):
                    result = await self.agent.send_request(method, params).result()
            except trio.TooSlowError:
                failure: Exception = AgentReplyError(
                    f"the agent did not answer {what} within {OPTION_TIMEOUT:g} s", agent=self.agent.id
                )
            except Exception as exc:
                failure = self._agent_failure(exc, what=what)
            else:
                self.options.answered(method, params, result)
                self._log.info("session option set", request=what)
                continue
            self._configuring = None
            self._send_nowait(PromptFailed(failure))
            return
        self._configuring = None
        if cancelled.value:
            self._send_nowait(PromptFinished("cancelled", None))
        else:
            self._send_prompt(blocks)

    def _finish_turn(self, action: EndTurn) -> None:
        turn = self._turns.pop(action.turn, None)
        if turn is not None:
            turn.outcome = TurnOutcome.from_action(action)
            if turn.on_done is not None and not turn.broken:
                try:
                    turn.on_done(turn.outcome)
                except Exception:
                    self._log.exception("a turn's outcome hook failed")
            turn.done.set()

    def _prompt_answered(self, result: Any, error: BaseException | None) -> None:
        event: Event
        if error is not None:
            event = PromptFailed(self._agent_failure(error))
        else:
            stop_reason = result.get("stopReason") if isinstance(result, dict) else None
            if stop_reason in STOP_REASONS:
                event = PromptFinished(stop_reason, prompt_usage(result))
            else:
                event = PromptFailed(
                    AgentReplyError(
                        f"the agent answered session/prompt with stopReason {stop_reason!r}", agent=self.agent.id
                    )
                )
        self._send_nowait(event)

    def _agent_failure(self, error: BaseException, what: str = "the prompt") -> Exception:
        """A failed request (``what``) as the error a client is shown: the agent's own JSON-RPC error is quoted;
        an agent that went away stays that (retryable)."""
        if isinstance(error, AgentError) or not isinstance(error, Exception):
            return error if isinstance(error, Exception) else InternalError(str(error))
        if isinstance(error, RpcError):
            return AgentReplyError.from_agent_error(error, what=what, agent=self.agent.id)
        return error

    def _prompt_lost(self, reply: Any) -> None:
        """The agent went away without answering the prompt: a task started now reports the failure, with the
        exit status once it is known (not a task per prompt waiting on every answer for this rare case)."""
        if self.closed:
            return

        async def report() -> None:
            try:
                await reply.result()
            except Exception as exc:
                self._send_nowait(PromptFailed(self._agent_failure(exc)))

        self._nursery.start_soon(report)

    # -- what the router calls -------------------------------------------------------------------------------

    async def run_turn(
        self, turn: EditorTurn, sink: PartSink, cancel_requested: CancelRequest, on_done: OutcomeHook | None = None
    ) -> TurnOutcome:
        """Run one editor turn on this session. Always returns an outcome: ``reroute`` if the session closed
        before it could take the turn. If the caller is cancelled, the turn is cancelled in the session. ``on_done``
        is told the outcome first, in the actor's step that ends the turn (not for a turn that never started)."""
        handle = self._turns[turn.turn] = _Turn(sink, on_done)
        if self.closed or not self._send_nowait(turn):
            del self._turns[turn.turn]
            return TurnOutcome(None, reroute=True)
        unwatch = cancel_requested.on_set(lambda: self._send_nowait(EditorCancel(turn.turn)))
        try:
            await handle.done.wait()
        finally:
            unwatch()
            if not handle.done.is_set():  # the caller went away (its connection closed) without cancelling
                handle.broken = True
                self._send_nowait(EditorGone(turn.turn))
        assert handle.outcome is not None
        return handle.outcome

    def close(self, reason: str) -> None:
        """Close the session: every waiting turn, permission request and tool call is answered."""
        asked = self._close_asked
        if asked is not None:  # one close at a time: the latest reason is the one given
            asked.reason = reason
            return
        request = _CloseRequest(reason)
        if self._send_nowait(request):
            self._close_asked = request

    def withdraw_close(self) -> bool:
        """Take back a ``close`` the actor has not begun: True if it will not happen (the session stays open)."""
        request, self._close_asked = self._close_asked, None
        if request is None or self.closed:
            return False
        request.withdrawn = True
        return True

    # -- what the agent side calls (SessionEndpoint) ---------------------------------------------------------

    async def on_agent_updates(self, batch: list[dict[str, Any]]) -> None:
        """Updates that arrived together. A bounded number of batches wait in the inbox: beyond that the agent's
        reader waits too, and the agent with it (backpressure from a slow editor)."""
        updates = []
        for params in batch:
            update = params.get("update")
            if isinstance(update, dict):
                updates.append(update)
                kind = update.get("sessionUpdate")
                if kind in _OPTION_UPDATES:
                    self.options.observe(update)
                if kind in _OFFER_UPDATES and self._on_offer_update is not None:
                    self._on_offer_update(update)
            else:
                self._log.warning("session/update without an update object; ignored")
        if not updates:
            return
        try:
            self._update_slots.acquire_nowait()
        except trio.WouldBlock:
            await self._update_slots.acquire()
        try:
            self._inbox_send.send_nowait(AgentUpdates(tuple(updates)))
        except trio.ClosedResourceError:
            self._update_slots.release()

    async def on_agent_update(self, params: dict[str, Any]) -> None:
        await self.on_agent_updates([params])

    async def on_permission_request(self, params: dict[str, Any], context: Any) -> dict[str, Any]:
        waiter: _Waiter[dict[str, Any]] = _Waiter(cancelled_outcome())
        if not self._send_nowait(PermissionRequest(waiter, params)):
            return waiter.fallback
        await self._wait(waiter, context.cancel_requested)
        if self._on_permission is not None:
            self._on_permission(params, waiter.value, waiter.decided_by)
        return waiter.value

    async def on_elicitation(self, params: dict[str, Any], context: Any) -> dict[str, Any]:
        """An agent's question takes the permission path (``session.elicitation``)."""
        permission = as_permission(params)
        if permission is None:
            self._log.info("elicitation of an unknown mode; declined", mode=params.get("mode"))
            return {"action": "decline"}
        return elicitation_answer(permission, await self.on_permission_request(permission, context))

    async def invoke_tool(self, name: str, arguments: Any) -> tuple[dict[str, Any] | None, str]:
        """A tool call from the synthetic MCP server: blocks until the editor's result arrives. Returns
        ``(tool_result part, "")`` or ``(None, reason)``. The agent withdraws a call by cancelling it (its MCP
        ``notifications/cancelled``, or the connection closing)."""
        waiter: _Waiter[tuple[dict[str, Any] | None, str]] = _Waiter((None, _SESSION_ENDED))
        if not self._send_nowait(ToolInvocation(waiter, name, arguments)):
            return waiter.fallback
        await self._wait(waiter)
        return waiter.value

    def prompt_cancelled(self) -> CancelRequest:
        """Set when the prompt running now (or the last one) is cancelled, or the session closes: what a tool call
        lmbridge answers itself (``mcp_synthetic.LocalTool``) is withdrawn on, as the machine withdraws the editor's
        tool calls then. A new prompt has a new one."""
        return self._prompt_cancelled

    def on_agent_exit(self, error: Exception) -> None:
        self._send_nowait(AgentExited(error))

    # -- helpers ---------------------------------------------------------------------------------------------

    async def _wait(self, waiter: _Waiter[Any], cancel_requested: CancelRequest | None = None) -> None:
        """Until the machine answers ``waiter``; withdrawn when the caller is cancelled or ``cancel_requested`` is
        set."""
        unwatch = cancel_requested.on_set(lambda: self._withdraw(waiter)) if cancel_requested is not None else None
        try:
            await waiter.done.wait()
        finally:
            if unwatch is not None:
                unwatch()
            if not waiter.done.is_set():
                self._withdraw(waiter)

    def _withdraw(self, waiter: _Waiter[Any]) -> None:
        if not self._send_nowait(InvocationWithdrawn(waiter)):
            waiter.give_up()

    def _send_nowait(self, event: Event | _CloseRequest) -> bool:
        try:
            self._inbox_send.send_nowait(event)
        except trio.ClosedResourceError:
            return False
        return True


def _coalesce_text(actions: list[Action]) -> list[Action]:
    """Adjacent text parts for the same turn become one part: the editor gets the same text in fewer messages."""
    out: list[Action] = []
    run: list[str] = []  # text of a run of text Emits for ``run_turn``, ending at out[-1]
    run_turn: Hashable = None

    def close_run() -> None:
        if len(run) > 1:
            out[-1] = Emit(run_turn, {"type": "text", "value": "".join(run)})
        run.clear()

    for action in actions:
        if isinstance(action, Emit) and action.part["type"] == "text":
            if run and run_turn == action.turn:
                run.append(action.part["value"])
                continue
            close_run()
            run.append(action.part["value"])
            run_turn = action.turn
        else:
            close_run()
        out.append(action)
    close_run()
    return out


class _Flag:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False


@dataclass(slots=True)
class _CloseRequest:
    reason: str
    withdrawn: bool = False  # taken back before the actor came to it (``withdraw_close``)


def _answer(waiter: Hashable, value: Any) -> None:
    if isinstance(waiter, _Waiter) and not waiter.done.is_set():
        waiter.value = value
        waiter.done.set()
