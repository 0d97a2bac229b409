"""The session state machine, sans-IO: one ACP session seen from the bridge.

Owns the rules that make a long-lived, asynchronous agent session look like request/response model turns:
what goes out live, what waits for the next turn, when a turn ends, and what a cancel does. It is fed events
(``handle(event, now)``) and returns actions for the shell (``session.actor``) to carry out; it never waits, reads
a clock or does I/O, so every interleaving can be tested directly.

States (``State``) and the transitions allowed between them (``TRANSITIONS``):

    IDLE ──EditorTurn(prompt)──▶ STREAMING ──tool call / permission + batch window──▶ AWAITING_TOOL_RESULTS
     ▲  ◀──PromptFinished──────────┤  ▲                                                AWAITING_PERMISSION
     │                              │  └──────────EditorTurn(results)──────────────────────┘   │
     │                    EditorCancel / superseded / moved on                              moved on
     │                              ▼                                                          │
     └──────PromptFinished──── CANCELLING ◀───────────────────────────────────────────────────┘
                 (drained)          │ drain timeout, AgentExited (from anywhere)
                                    ▼
                                  CLOSED

    STREAMING ──EditorGone (the editor's connection dropped)──▶ DETACHED: the prompt runs on, its output kept;
    a retry of the same request resumes it (STREAMING), or gets it with its stop reason once it ended (IDLE).
    Any other request, or no retry within ``detached_grace``, abandons it: the prompt is cancelled (CANCELLING)
    and what it said is dropped, never delivered into another request's answer.

Invariants (checked by the property tests):
- every editor turn gets exactly one ``EndTurn``; nothing is emitted for a turn after it;
- agent output produced while no turn is open is buffered and emitted first in the next turn — text and thinking
  coalesced, never dropped; only output that arrives *after* ``session/cancel`` (the drain) is discarded; when an
  editor goes away mid-turn (``EditorGone``), what it was sent is owed again and goes to its retry;
- every permission request and tool invocation gets exactly one answer;
- at most one ``session/prompt`` is in flight.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .bridged import is_bridged_tool
from .messages import ACP_UPDATE_MIME_TYPE, object_at
from .permissions import PermissionPolicy, cancelled_outcome
from .render import ActivityRenderer, acp_update_part

__all__ = [
    "TRANSITIONS",
    "Action",
    "AgentExited",
    "AgentUpdate",
    "AgentUpdates",
    "AnswerPermission",
    "EditorCancel",
    "EditorGone",
    "EditorTurn",
    "Emit",
    "EndTurn",
    "Event",
    "IllegalTransition",
    "InvocationWithdrawn",
    "PermissionRequest",
    "PromptFailed",
    "PromptFinished",
    "ResolveInvocation",
    "SendCancel",
    "SendPrompt",
    "SessionClosed",
    "SessionMachine",
    "State",
    "Tick",
    "ToolInvocation",
    "TurnOptions",
]


class State(enum.Enum):
    IDLE = "idle"  # no prompt running, no editor turn open
    STREAMING = "streaming"  # a prompt is running and an editor turn is open: output goes out live
    AWAITING_TOOL_RESULTS = "awaiting_tool_results"  # the turn ended with tool_calls; the prompt waits on editor tools
    AWAITING_PERMISSION = "awaiting_permission"  # the same, waiting on permission answers only
    CANCELLING = "cancelling"  # session/cancel sent; draining until the prompt's stopReason
    DETACHED = "detached"  # the editor went away mid-turn: the prompt runs on, its output kept for the editor's return
    CLOSED = "closed"  # the agent exited or the session was closed: every new turn is sent elsewhere


_AWAITING = (State.AWAITING_TOOL_RESULTS, State.AWAITING_PERMISSION)

TRANSITIONS: Mapping[State, frozenset[State]] = {
    State.IDLE: frozenset({State.STREAMING, State.CLOSED}),
    State.STREAMING: frozenset({State.IDLE, *_AWAITING, State.CANCELLING, State.DETACHED, State.CLOSED}),
    State.AWAITING_TOOL_RESULTS: frozenset({State.STREAMING, State.IDLE, State.CANCELLING, State.CLOSED}),
    State.AWAITING_PERMISSION: frozenset({State.STREAMING, State.IDLE, State.CANCELLING, State.CLOSED}),
    State.CANCELLING: frozenset({State.IDLE, State.STREAMING, State.CLOSED}),
    State.DETACHED: frozenset({State.STREAMING, State.IDLE, State.CANCELLING, State.CLOSED}),
    State.CLOSED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug in the machine: a transition not in ``TRANSITIONS``."""


# -- events ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnOptions:
    thinking: bool = False  # the editor renders thinking parts
    acp_updates: bool = False  # the editor wants raw ACP updates as data parts
    permission_tool: bool = True  # the editor offers the permission tool in this request
    activity_as_thinking: bool = False  # the agent's tool and plan lines go out as thinking parts, not text
    settings: tuple[tuple[str, Any], ...] = ()  # the client's choices of the agent's session options, for its prompts


@dataclass(frozen=True, slots=True)
class EditorTurn:
    turn: Hashable
    prompt: list[dict[str, Any]] | None  # ACP content blocks for a new session/prompt; None: nothing new to say
    tool_results: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # callId → editor tool_result part
    moved_on: bool = False  # the history shows the user moved on: cancel what is pending first
    options: TurnOptions = TurnOptions()
    retry: bool = False  # the same request as before, nothing new in it (a retry, or an editor back after a drop)


@dataclass(frozen=True, slots=True)
class EditorCancel:
    turn: Hashable


@dataclass(frozen=True, slots=True)
class EditorGone:
    """The editor can no longer receive this turn (its connection dropped). Unlike a cancel, the agent is not
    stopped: what it produces is kept, and a retry of the same request picks it up."""

    turn: Hashable


@dataclass(frozen=True, slots=True)
class AgentUpdate:
    update: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AgentUpdates:
    """Several updates that arrived together, in order (a streaming agent sends hundreds per read)."""

    updates: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    request: Hashable
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolInvocation:
    invocation: Hashable
    name: str  # the editor's tool name
    arguments: Any


@dataclass(frozen=True, slots=True)
class InvocationWithdrawn:
    """The agent gave up on a tool call or permission request (MCP cancel, ACP cancel_request)."""

    invocation: Hashable


@dataclass(frozen=True, slots=True)
class PromptFinished:
    stop_reason: str
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PromptFailed:
    error: Exception


@dataclass(frozen=True, slots=True)
class AgentExited:
    error: Exception


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the shell sends this when ``deadline`` is reached)."""


Event = (
    EditorTurn
    | EditorCancel
    | EditorGone
    | AgentUpdate
    | AgentUpdates
    | PermissionRequest
    | ToolInvocation
    | InvocationWithdrawn
    | PromptFinished
    | PromptFailed
    | AgentExited
    | Tick
)

# -- actions -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendPrompt:
    blocks: list[dict[str, Any]]
    settings: tuple[tuple[str, Any], ...] = ()  # session options that must hold before the prompt goes out


@dataclass(frozen=True, slots=True)
class SendCancel:
    pass


@dataclass(frozen=True, slots=True)
class Emit:
    turn: Hashable
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EndTurn:
    turn: Hashable
    stop_reason: str | None = None  # None when ``error`` is set or the turn must be re-routed
    error: Exception | None = None
    reroute: bool = False  # this session cannot serve the turn (closed): route it again, to a new session
    emitted: tuple[dict[str, Any], ...] = ()  # what the editor received in this turn (its provisional response)
    pending_calls: tuple[str, ...] = ()  # callIds the editor should answer in its next request
    usage: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AnswerPermission:
    request: Hashable
    outcome: dict[str, Any]
    unreadable: str | None = None  # the editor's answer, when it could not be understood (rejected, and logged)
    decided_by: str = "client"  # "client" (its answer), "policy" (the permission policy), "lmbridge" (withdrawn)


@dataclass(frozen=True, slots=True)
class ResolveInvocation:
    invocation: Hashable
    result: dict[str, Any] | None  # the editor's tool_result part, or None when withdrawn
    reason: str = ""  # why it was withdrawn, in words the model can read


@dataclass(frozen=True, slots=True)
class SessionClosed:
    reason: str


Action = SendPrompt | SendCancel | Emit | EndTurn | AnswerPermission | ResolveInvocation | SessionClosed


# -- the machine -------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    call_id: str
    key: Hashable
    part: dict[str, Any]
    permission: dict[str, Any] | None  # the request params, for permission calls
    emitted: bool = False


@dataclass(slots=True)
class _OpenTurn:
    """An editor turn being answered. What it was sent is kept (for the provisional history), adjacent text merged
    as it comes — a long stream is one part, not a hundred thousand."""

    turn: Hashable
    options: TurnOptions
    _parts: list[dict[str, Any]] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)  # the text run after the last non-text part

    def sent(self, part: dict[str, Any]) -> None:
        if part["type"] == "text":
            self._text.append(part["value"])
            return
        self._flush()
        self._parts.append(part)

    def _flush(self) -> None:
        if self._text:
            self._parts.append({"type": "text", "value": "".join(self._text)})
            self._text.clear()

    @property
    def emitted(self) -> list[dict[str, Any]]:
        self._flush()
        return self._parts

    def forget_emitted(self) -> None:
        self._parts.clear()
        self._text.clear()


def _answer_text(result: dict[str, Any]) -> str:
    return "".join(p.get("value", "") for p in result.get("content", ()) if p.get("type") == "text")[:200]


_MAX_BUFFERED_DATA_PARTS = 1000
WITHDRAWN_NO_RESULT = (
    "The editor's next request carried no result for this tool call (the user skipped it or "
    "moved on); the call was withdrawn."
)
WITHDRAWN_CANCELLED = "The user cancelled the request; the tool call was withdrawn."
WITHDRAWN_MOVED_ON = "The user moved on without running this tool; the call was withdrawn."
WITHDRAWN_AGENT_GONE = "The session ended; the tool call was withdrawn."


class SessionMachine:
    def __init__(
        self,
        *,
        new_call_id: Callable[[], str],
        permission_policy: PermissionPolicy = PermissionPolicy(),
        batch_window: float = 0.05,
        batch_idle: float = 0.015,
        drain_timeout: float = 10.0,
        detached_grace: float = 60.0,
    ) -> None:
        self.state = State.IDLE
        self._detached_grace = detached_grace
        self._detached_deadline: float | None = None
        self._new_call_id = new_call_id
        self._policy = permission_policy
        self._batch_window = batch_window
        self._batch_idle = min(batch_idle, batch_window)
        self._window_opened: float | None = None
        self._drain_timeout = drain_timeout
        self._close_timeout = min(2.0, drain_timeout)
        self._closing: str | None = None  # set by close(): end the session when the cancelled prompt finishes
        self._renderer = ActivityRenderer()
        self._turn: _OpenTurn | None = None
        self._queued: EditorTurn | None = None  # waits for the drain of a cancelled prompt
        self._next_prompt: list[dict[str, Any]] | None = None  # sent when the running prompt finishes
        self._finished: PromptFinished | PromptFailed | None = None  # a prompt that ended while no turn was open
        self._prompt_running = False
        self._pending: dict[str, _Pending] = {}
        self._by_key: dict[Hashable, str] = {}
        self._buffer: list[dict[str, Any]] = []
        self._buffered_data_parts = 0
        self._window_deadline: float | None = None
        # Calls of the client's tools the agent told of, and how many calls arrived in the open batch. Claude Code
        # reports every call of the model's response as pending once it is parsed; Codex reports each as in
        # progress as it starts them (over HTTP all of a response's ~20 ms before the first MCP request arrives,
        # over the stdio relay interleaved with the requests); Gemini CLI asks permission for each (answered here).
        # When every call told of has arrived, the batch ends at once instead of waiting for the idle timer -- if
        # they were told of as the model's (pending, or asked permission for), all at once. Calls reported only as
        # they are made (in progress) never say that no more are coming: on a calm machine Codex reports all of a
        # response's calls before its first MCP request arrives, on a busy one the next report comes after it.
        self._announced_calls: set[str] = set()
        self._last_running_report: float | None = None
        self._batch_arrivals = 0
        self._drain_deadline: float | None = None
        self._options = TurnOptions()  # the latest turn's: decides permission handling while no turn is open
        self._resumable = False  # output of a turn whose editor went away is in the buffer: a retry picks it up
        self.drained_updates = 0  # updates discarded after session/cancel (for logs and tests)
        self.abandoned_turns = 0  # turns whose editor went away and did not come back for them (logs and tests)

    # -- introspection --------------------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """When the shell must send ``Tick`` (the batching window or the drain timeout), if ever."""
        if self.state is State.STREAMING:
            return self._window_deadline
        if self.state is State.CANCELLING:
            return self._drain_deadline
        if self.state is State.DETACHED:
            return self._detached_deadline
        return None

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def open_turn(self) -> Hashable | None:
        return self._turn.turn if self._turn is not None else None

    @property
    def pending_call_ids(self) -> list[str]:
        return list(self._pending)

    @property
    def buffered(self) -> list[dict[str, Any]]:
        return list(self._buffer)

    @property
    def idle(self) -> bool:
        """Nothing running, nothing owed to anyone: the session may be closed without losing anything."""
        return (
            self.state is State.IDLE
            and not self._pending
            and self._queued is None
            and not self._buffer
            and self._finished is None
        )

    # -- the one entry point ---------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        out: list[Action] = []
        handler = self._handlers[type(event)]
        handler(self, event, now, out)
        return out

    def _to(self, state: State) -> None:
        if state is not self.state and state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.state.name} → {state.name}")
        self.state = state

    # -- editor events ---------------------------------------------------------------------------------------

    def _on_turn(self, event: EditorTurn, now: float, out: list[Action]) -> None:
        if self.state is State.CLOSED or self._closing is not None:
            out.append(EndTurn(event.turn, reroute=True))
            return
        self._options = event.options
        self._renderer.activity_as_thinking = event.options.activity_as_thinking
        if self.state is State.STREAMING:
            # A newer request for this conversation supersedes the one still running.
            self._cancel_prompt(now, out, WITHDRAWN_CANCELLED)
            self._queued = event
            return
        if self.state is State.CANCELLING:
            if self._queued is not None:
                out.append(EndTurn(self._queued.turn, stop_reason="cancelled"))
            self._queued = event
            return
        if event.retry and self._resumable:
            # The editor is back with the request it lost the answer to: give it what the agent said meanwhile
            # (and, if the prompt still runs, the rest as it comes) instead of asking the agent again.
            self._begin(EditorTurn(event.turn, None, event.tool_results, False, event.options), now, out)
            return
        if self._resumable:
            # Something else than the request whose answer was lost: the user moved on from it.
            draining = self._abandon(now, out)
            if draining:  # the new turn waits until the abandoned prompt has ended
                self._queued = EditorTurn(event.turn, event.prompt, {}, False, event.options)
                return
        if event.moved_on:
            if self._prompt_running:
                self._cancel_prompt(now, out, WITHDRAWN_MOVED_ON)
                self._queued = EditorTurn(event.turn, event.prompt, {}, False, event.options)
                return
            self._withdraw_all(WITHDRAWN_MOVED_ON, out)
            self._next_prompt = None
        self._begin(event, now, out)

    def _begin(self, event: EditorTurn, now: float, out: list[Action]) -> None:
        """Open the turn: answer what the editor answered, withdraw what it did not, flush the buffer, then
        prompt (now, or once the running prompt is done)."""
        for call_id in list(self._pending):
            pending = self._pending[call_id]
            result = event.tool_results.get(call_id)
            if result is None and not pending.emitted:
                continue  # announced only in this turn's buffer flush, below
            self._forget(call_id)
            if pending.permission is not None:
                answer = result if result is not None else {"content": [], "isError": True}
                outcome, understood = self._policy.outcome_for_result(pending.permission, answer)
                out.append(AnswerPermission(pending.key, outcome, None if understood else _answer_text(answer)))
            else:
                out.append(ResolveInvocation(pending.key, result, "" if result is not None else WITHDRAWN_NO_RESULT))
        turn = self._turn = _OpenTurn(event.turn, event.options)
        self._resumable = False
        buffered, self._buffer = self._buffer, []
        self._buffered_data_parts = 0
        for part in buffered:
            self._emit(turn, part, out)
        unsent = [p for p in self._pending.values() if not p.emitted]
        for pending in unsent:
            pending.emitted = True
            self._emit(turn, pending.part, out)
        if unsent:
            self._arm_window(now)

        if self._prompt_running:
            if event.prompt:
                self._next_prompt = (self._next_prompt or []) + event.prompt
            self._to(State.STREAMING)
            return
        finished, self._finished = self._finished, None
        # Text that came with tool results for a prompt that has since finished is still owed to the agent.
        prompt = (self._next_prompt or []) + (event.prompt or [])
        self._next_prompt = None
        if prompt:
            self._send_prompt(prompt, out)
            self._to(State.STREAMING)
            return
        # Nothing to ask the agent: the turn is what was waiting for it.
        if unsent or any(p.emitted for p in self._pending.values()):
            self._end_turn(out, stop_reason="tool_calls")
        elif isinstance(finished, PromptFailed):
            self._end_turn(out, error=finished.error)
        else:
            self._end_turn(
                out,
                stop_reason=finished.stop_reason if finished else "end_turn",
                usage=finished.usage if finished else None,
            )

    def _on_cancel(self, event: EditorCancel, now: float, out: list[Action]) -> None:
        if self._queued is not None and self._queued.turn == event.turn:
            out.append(EndTurn(event.turn, stop_reason="cancelled"))
            self._queued = None
            return
        if self._turn is None or self._turn.turn != event.turn:
            return  # already answered
        self._cancel_prompt(now, out, WITHDRAWN_CANCELLED)

    def _on_gone(self, event: EditorGone, now: float, out: list[Action]) -> None:
        if self._queued is not None and self._queued.turn == event.turn:
            out.append(EndTurn(event.turn, stop_reason="cancelled"))
            self._queued = None
            return
        turn = self._turn
        if turn is None or turn.turn != event.turn:
            return
        # What the editor may not have received goes back in front of the buffer; calls it never answered are
        # announced again when it returns.
        kept, self._buffer = self._buffer, []
        for part in turn.emitted:
            if part["type"] != "tool_call":
                self._buffer_part(part)
        for part in kept:
            self._buffer_part(part)
        for pending in self._pending.values():
            pending.emitted = False
        turn.forget_emitted()
        self._end_turn(out, stop_reason="cancelled")
        self._resumable = True
        self._detached_deadline = now + self._detached_grace
        self._to(State.DETACHED if self._prompt_running else State.IDLE)

    def _abandon(self, now: float, out: list[Action]) -> bool:
        """The editor that lost this output is not coming back for it: drop it, and cancel the prompt if it runs
        (True: it is being cancelled)."""
        self.abandoned_turns += 1
        self._resumable = False
        self._detached_deadline = None
        self._buffer = []
        self._buffered_data_parts = 0
        self._finished = None  # how the abandoned prompt ended is nobody's answer now
        if self._prompt_running:
            self._cancel_prompt(now, out, WITHDRAWN_MOVED_ON)
            return True
        self._withdraw_all(WITHDRAWN_MOVED_ON, out)
        return False

    def _cancel_prompt(self, now: float, out: list[Action], reason: str) -> None:
        """Cancel the running prompt: send ``session/cancel``, answer pending permission requests ``cancelled``
        (ACP requires it), withdraw tool calls, answer the open turn ``cancelled``, and drain until the agent's
        stopReason arrives."""
        if self._prompt_running:
            out.append(SendCancel())
        self._withdraw_all(reason, out)
        if self._turn is not None:
            self._end_turn(out, stop_reason="cancelled")
        self._next_prompt = None
        if self._prompt_running:
            self._drain_deadline = now + self._drain_timeout
            self._to(State.CANCELLING)
        else:
            self._to(State.IDLE)

    # -- agent events ----------------------------------------------------------------------------------------

    def _on_update(self, event: AgentUpdate, now: float, out: list[Action]) -> None:
        self._update(event.update, now, out)

    def _on_updates(self, event: AgentUpdates, now: float, out: list[Action]) -> None:
        turn = self._turn
        if self.state is not State.STREAMING or turn is None or turn.options.acp_updates:
            for update in event.updates:
                self._update(update, now, out)
            return
        # Streaming a batch: adjacent text goes out as one part (the hot path of a talkative agent).
        run: list[str] = []
        render = self._renderer.render
        for update in event.updates:
            if update.get("sessionUpdate") != "agent_message_chunk":
                self._note_tool_report(update, now)
            for part in render(update):
                if part["type"] == "text":
                    run.append(part["value"])
                    continue
                if run:
                    self._emit(turn, {"type": "text", "value": "".join(run)}, out)
                    run.clear()
                self._emit(turn, part, out)
        if run:
            self._emit(turn, {"type": "text", "value": "".join(run)}, out)

    def _update(self, update: dict[str, Any], now: float, out: list[Action]) -> None:
        if self.state is State.CLOSED:
            return
        if self.state is State.CANCELLING:
            self.drained_updates += 1
            return
        self._note_tool_report(update, now)
        parts = self._renderer.render(update)
        turn = self._turn
        if turn is not None:
            for part in parts:
                self._emit(turn, part, out)
            if turn.options.acp_updates:
                self._emit(turn, acp_update_part(update), out)
        else:
            for part in parts:
                self._buffer_part(part)
            if self._options.acp_updates and self._buffered_data_parts < _MAX_BUFFERED_DATA_PARTS:
                self._buffered_data_parts += 1
                self._buffer.append(acp_update_part(update))

    def _on_permission(self, event: PermissionRequest, now: float, out: list[Action]) -> None:
        if self.state in (State.CANCELLING, State.CLOSED):
            out.append(AnswerPermission(event.request, cancelled_outcome(), decided_by="lmbridge"))
            return
        automatic = self._policy.automatic(event.params, tool_offered=self._options.permission_tool)
        if automatic is not None:
            # A permission asked for a client tool (Gemini CLI asks before each MCP call; allowed here) tells of
            # the call as a ``tool_call`` report would.
            self._announce(object_at(event.params, "toolCall"), now, as_made=False)
            out.append(AnswerPermission(event.request, automatic, decided_by="policy"))
            return
        call_id = self._new_call_id()
        part = {
            "type": "tool_call",
            "callId": call_id,
            "name": self._policy.tool_name,
            "input": self._policy.tool_input(event.params),
        }
        self._add_pending(_Pending(call_id, event.request, part, event.params), now, out)

    def _on_invocation(self, event: ToolInvocation, now: float, out: list[Action]) -> None:
        if self.state in (State.CANCELLING, State.CLOSED):
            reason = WITHDRAWN_CANCELLED if self.state is State.CANCELLING else WITHDRAWN_AGENT_GONE
            out.append(ResolveInvocation(event.invocation, None, reason))
            return
        call_id = self._new_call_id()
        part = {"type": "tool_call", "callId": call_id, "name": event.name, "input": event.arguments}
        self._add_pending(_Pending(call_id, event.invocation, part, None), now, out)

    def _add_pending(self, pending: _Pending, now: float, out: list[Action]) -> None:
        self._pending[pending.call_id] = pending
        self._by_key[pending.key] = pending.call_id
        if self._turn is not None:
            pending.emitted = True
            self._emit(self._turn, pending.part, out)
            if pending.permission is None:
                self._batch_arrivals += 1
            self._arm_window(now)
            told_by_the_model = self._last_running_report is None
            complete = 0 < len(self._announced_calls) <= self._batch_arrivals and told_by_the_model
            if pending.permission is None and complete and self.state is State.STREAMING:
                self._close_batch(out)  # every call the agent announced is here: nothing more to wait for
        # else: announced by the next turn's buffer flush

    def _note_tool_report(self, update: dict[str, Any], now: float) -> None:
        """Keep ``_announced_calls``: client-tool calls reported ``pending`` (the agent has them from the model and
        will make them) or ``in_progress`` (being made), until they end."""
        kind = update.get("sessionUpdate")
        if kind == "tool_call":
            status = update.get("status", "pending")
            if status in ("pending", "in_progress"):
                self._announce(update, now, as_made=status == "in_progress")
        elif kind == "tool_call_update" and update.get("status") in ("completed", "failed"):
            self._announced_calls.discard(update.get("toolCallId"))

    def _announce(self, tool_call: dict[str, Any], now: float, *, as_made: bool) -> None:
        """A client-tool call the agent told of. ``as_made``: reported as the agent makes it, so the report may
        race the call itself."""
        call_id = tool_call.get("toolCallId")
        if not isinstance(call_id, str) or not is_bridged_tool(tool_call, self._policy.server_name):
            return
        new = call_id not in self._announced_calls
        self._announced_calls.add(call_id)
        if as_made and new:
            self._last_running_report = now
            if self._window_opened is not None and self.state is State.STREAMING:
                self._arm_window(now)  # a call being made while the batch is open: wait for it (the window)

    def _arm_window(self, now: float) -> None:
        """Tool calls go out together: the turn ends once no call has come for ``batch_idle`` seconds, and at the
        latest ``batch_window`` after the first (agents issue parallel calls within a millisecond or two). While a
        call the agent reported *in progress* has not arrived, the idle timer does not run and the window runs
        from the latest call: it is being made (Codex over HTTP: 20 ms between calls, 25-30 ms when the machine is
        busy, so three calls can take longer than one window). A call reported only ``pending`` may never come
        before the editor answers the others (OpenCode, or Claude Code with tools it runs one by one, make them one
        after the other): the idle timer still runs."""
        if self._window_opened is None:
            self._window_opened = now
        closing = self._window_opened + self._batch_window
        if len(self._announced_calls) <= self._batch_arrivals or self._last_running_report is None:
            closing = min(closing, now + self._batch_idle)
        else:
            closing = max(closing, now + self._batch_window)
        self._window_deadline = closing

    def _on_withdrawn(self, event: InvocationWithdrawn, now: float, out: list[Action]) -> None:
        call_id = self._by_key.get(event.invocation)
        if call_id is None:
            return
        pending = self._pending[call_id]
        self._forget(call_id)
        if pending.permission is not None:
            out.append(AnswerPermission(pending.key, cancelled_outcome(), decided_by="lmbridge"))
        else:
            out.append(ResolveInvocation(pending.key, None, "withdrawn by the agent"))

    def _on_finished(self, event: PromptFinished | PromptFailed, now: float, out: list[Action]) -> None:
        if not self._prompt_running:
            return
        self._prompt_running = False
        if self.state is State.STREAMING:
            if self._next_prompt and isinstance(event, PromptFinished):
                prompt, self._next_prompt = self._next_prompt, None
                self._send_prompt(prompt, out)
                return
            self._next_prompt = None
            if any(p.emitted for p in self._pending.values()):
                self._end_turn(out, stop_reason="tool_calls")
            elif isinstance(event, PromptFailed):
                self._end_turn(out, error=event.error)
            else:
                self._end_turn(out, stop_reason=event.stop_reason, usage=event.usage)
            self._to(State.IDLE)
        elif self.state is State.CANCELLING:
            self._drain_deadline = None
            if self._closing is not None:
                self._to(State.CLOSED)
                out.append(SessionClosed(self._closing))
                return
            self._to(State.IDLE)
            queued, self._queued = self._queued, None
            if queued is not None:
                self._begin(queued, now, out)
        elif self.state in _AWAITING or self.state is State.DETACHED:
            self._finished = event
            self._to(State.IDLE)

    def _on_exit(self, event: AgentExited, now: float, out: list[Action]) -> None:
        if self.state is State.CLOSED:
            return
        if self._turn is not None:
            self._end_turn(out, error=event.error)
        if self._queued is not None:
            out.append(EndTurn(self._queued.turn, reroute=True))
            self._queued = None
        self._withdraw_all(WITHDRAWN_AGENT_GONE, out)
        self._prompt_running = False
        self._to(State.CLOSED)
        out.append(SessionClosed("the agent exited"))

    def _on_tick(self, event: Tick, now: float, out: list[Action]) -> None:
        if self.state is State.DETACHED and self._detached_deadline is not None and now >= self._detached_deadline:
            self._abandon(now, out)  # the editor did not come back within the grace period
            return
        if self.state is State.STREAMING and self._window_deadline is not None and now >= self._window_deadline:
            if not any(p.emitted for p in self._pending.values()):
                self._window_deadline = self._window_opened = None  # the agent withdrew its calls: keep streaming
                return
            self._close_batch(out)
        elif self.state is State.CANCELLING and self._drain_deadline is not None and now >= self._drain_deadline:
            if self._queued is not None:
                out.append(EndTurn(self._queued.turn, reroute=True))
                self._queued = None
            self._prompt_running = False
            self._to(State.CLOSED)
            out.append(
                SessionClosed(
                    self._closing or f"the agent did not finish its cancelled prompt within {self._drain_timeout:g} s"
                )
            )

    def _close_batch(self, out: list[Action]) -> None:
        """The tool calls and permission requests gathered so far go to the editor: the turn ends."""
        self._end_turn(out, stop_reason="tool_calls")
        tools_pending = any(p.permission is None for p in self._pending.values())
        self._to(State.AWAITING_TOOL_RESULTS if tools_pending else State.AWAITING_PERMISSION)

    def close(self, reason: str, now: float) -> list[Action]:
        """Close the session on the bridge's initiative (idle timeout, shutdown): answer everything owed. A running
        prompt is cancelled first and given a moment (``_close_timeout``) to finish, so that the agent does not
        see its session closed under a prompt it is still answering."""
        out: list[Action] = []
        if self.state is State.CLOSED:
            return out
        if self._queued is not None:
            out.append(EndTurn(self._queued.turn, stop_reason="cancelled"))
            self._queued = None
        self._closing = reason
        if self._prompt_running:
            if self.state is not State.CANCELLING:
                self._cancel_prompt(now, out, WITHDRAWN_AGENT_GONE)
            self._drain_deadline = min(self._drain_deadline or now + self._close_timeout, now + self._close_timeout)
            return out
        if self._turn is not None:
            self._end_turn(out, stop_reason="cancelled")
        self._withdraw_all(WITHDRAWN_AGENT_GONE, out)
        self._next_prompt = None
        self._to(State.CLOSED)
        out.append(SessionClosed(reason))
        return out

    # -- helpers ---------------------------------------------------------------------------------------------

    def _send_prompt(self, blocks: list[dict[str, Any]], out: list[Action]) -> None:
        self._prompt_running = True
        out.append(SendPrompt(blocks, self._options.settings))

    def _emit(self, turn: _OpenTurn, part: dict[str, Any], out: list[Action]) -> None:
        kind = part["type"]
        if kind == "thinking" and not turn.options.thinking:
            return
        if kind == "data" and part["mimeType"] == ACP_UPDATE_MIME_TYPE and not turn.options.acp_updates:
            return
        turn.sent(part)
        out.append(Emit(turn.turn, part))

    def _buffer_part(self, part: dict[str, Any]) -> None:
        kind = part["type"]
        if kind in ("text", "thinking") and self._buffer and self._buffer[-1]["type"] == kind:
            self._buffer[-1] = {"type": kind, "value": self._buffer[-1]["value"] + part["value"]}
        else:
            self._buffer.append(part)

    def _end_turn(
        self,
        out: list[Action],
        *,
        stop_reason: str | None = None,
        error: Exception | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        turn = self._turn
        assert turn is not None
        self._turn = None
        self._window_deadline = None
        self._window_opened = None
        self._announced_calls.clear()
        self._last_running_report = None
        self._batch_arrivals = 0
        pending = tuple(call_id for call_id, p in self._pending.items() if p.emitted)
        context = self._renderer.usage
        if context is not None:
            usage = {**(usage or {}), "contextUsed": context.used, "contextSize": context.size}
            if context.cost is not None:
                usage["cost"] = context.cost
        out.append(
            EndTurn(
                turn.turn,
                stop_reason=None if error else stop_reason,
                error=error,
                emitted=tuple(turn.emitted),
                pending_calls=pending if not error else (),
                usage=usage,
            )
        )

    def _withdraw_all(self, reason: str, out: list[Action]) -> None:
        for call_id in list(self._pending):
            pending = self._pending[call_id]
            self._forget(call_id)
            if pending.permission is not None:
                out.append(AnswerPermission(pending.key, cancelled_outcome(), decided_by="lmbridge"))
            else:
                out.append(ResolveInvocation(pending.key, None, reason))

    def _forget(self, call_id: str) -> None:
        pending = self._pending.pop(call_id)
        self._by_key.pop(pending.key, None)

    _handlers: ClassVar[Mapping[type, Callable[..., None]]] = {
        EditorTurn: _on_turn,
        EditorCancel: _on_cancel,
        EditorGone: _on_gone,
        AgentUpdate: _on_update,
        AgentUpdates: _on_updates,
        PermissionRequest: _on_permission,
        ToolInvocation: _on_invocation,
        InvocationWithdrawn: _on_withdrawn,
        PromptFinished: _on_finished,
        PromptFailed: _on_finished,
        AgentExited: _on_exit,
        Tick: _on_tick,
    }
