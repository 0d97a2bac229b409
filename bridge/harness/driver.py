"""One agent under test behind a live ``lmbridge stdio``, driven exactly like an editor.

Owns: which agent is tested (a configured id, the built-in demo, or a command) and the private config file that
runs it; spawning ``lmbridge stdio`` with ``--trace-dir`` into a private work directory (its session state file
too, so that no run resumes another's sessions); the conversation history; a *turn* — the user's message and every
tool round after it: fake editor tools answer their calls, permission requests get the scenario's answer (or none),
cancel triggers fire; the per-phase timeouts (initialize, session/new, first update, idle, cancel, turn), enforced
by a watchdog that follows the agent's trace while a request is in flight; and ``settle``: waiting for cancelled
prompts to be answered before the checks read the wire.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bridge.editor.client import ChatTurn, EditorClient, assistant_message, spawn_stdio

from .scenario import Cancel, Timeouts, ToolSpec
from .traces import AcpLog, TraceFollower, WireEvent

__all__ = [
    "SHUTDOWN_TURN",
    "AgentUnderTest",
    "Driver",
    "DriverError",
    "PhaseTimeout",
    "RoundResult",
    "TurnResult",
    "open_driver",
    "resolve_agent",
]

SHUTDOWN_TURN = -1  # the "turn" of what was read after the scenario's turns (shutdown)
POLL_INTERVAL = 0.02  # seconds between reads of the agent's trace while a request is in flight


class DriverError(Exception):
    """The bridge or the agent could not be driven at all (lmbridge did not start, initialize failed)."""


@dataclass(frozen=True)
class AgentUnderTest:
    """The agent a run tests: ``config`` is None for the built-in demo agent."""

    id: str
    config: Any = None  # bridge.config.AgentConfig

    @property
    def conn(self) -> str:
        return f"agent:{self.id}"

    def describe(self) -> str:
        if self.config is None:
            return f"{self.id} (built-in demo agent)"
        return f"{self.id} ({shlex.join(self.config.argv)})"


def resolve_agent(
    agent_id: str | None = None,
    command: str | Sequence[str] | None = None,
    *,
    config_path: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    authenticate: str | None = None,
    command_id: str = "under-test",
) -> AgentUnderTest:
    """A configured agent (``agent_id``, looked up in the config file lmbridge would read, ``demo`` built in) or a
    command (``command``, a string split like a shell would, or a list)."""
    from bridge.config import DEMO_AGENT_ID, AgentConfig, load_config

    if command is not None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise DriverError("the agent command is empty")
        return AgentUnderTest(
            command_id,
            AgentConfig(
                id=command_id,
                name=command_id,
                command=argv[0],
                args=tuple(argv[1:]),
                env=dict(env or {}),
                cwd=cwd,
                authenticate=authenticate,
            ),
        )
    agent_id = agent_id or DEMO_AGENT_ID
    if agent_id == DEMO_AGENT_ID:
        return AgentUnderTest(DEMO_AGENT_ID)
    config = load_config(config_path)
    if agent_id not in config.agents:
        known = ", ".join(sorted(config.agents))
        where = f" in {config.path}" if config.path else " (no config file found)"
        raise DriverError(f"no agent {agent_id!r}{where}; known agents: {known}")
    return AgentUnderTest(agent_id, config.agents[agent_id])


def config_text(agent: AgentUnderTest, timeouts: Timeouts, permission_policy: str, state_file: Path) -> str:
    """The private config file of a run: the agent under test, and the bridge settings the harness relies on."""
    import tomli_w

    from bridge.config import DEFAULT_TOOL_BATCH_IDLE

    data: dict[str, Any] = {}
    config = agent.config
    if config is not None:
        table: dict[str, Any] = {"name": config.name, "command": config.command, "args": list(config.args)}
        if config.env:
            table["env"] = dict(config.env)
        if config.unset_env:
            table["unset_env"] = list(config.unset_env)
        for key in ("cwd", "authenticate", "permission_policy", "tool_batch_idle"):
            if getattr(config, key) is not None:
                table[key] = getattr(config, key)
        if config.options:
            table["options"] = dict(config.options)
        table.update(
            mcp_transport=config.mcp_transport,
            max_input_tokens=config.max_input_tokens,
            max_output_tokens=config.max_output_tokens,
            image_input=config.image_input,
            # A little later than the harness's own limit, so that the harness reports the timeout (naming
            # the phase).
            initialize_timeout=float(timeouts.initialize) + 5.0,
        )
        data["agents"] = {agent.id: table}
    # The state file is private: no session is resumed from another run. Parallel tool calls the agent reports as
    # being made are waited for up to 10 s (not 50 ms), and the next call 15 ms for every agent (not a known agent's
    # shorter time): what a turn shows the editor must not depend on how busy the machine is (a recorded session
    # replays to the same view).
    data["sessions"] = {
        "cancel_drain_timeout": float(timeouts.cancel),
        "state_file": str(state_file),
        "tool_batch_window": 10.0,
        "tool_batch_idle": DEFAULT_TOOL_BATCH_IDLE,
    }
    data["permissions"] = {"policy": permission_policy}
    return tomli_w.dumps(data)


@dataclass
class PhaseTimeout:
    phase: str  # initialize | session_new | first_update | idle | cancel | turn: the key in [timeouts]
    message: str  # what happened
    limit: float = 0.0

    @property
    def expected(self) -> str:
        what = {
            "initialize": "an answer to initialize",
            "session_new": "an answer to session/new",
            "first_update": "a first message from the agent after session/prompt",
            "idle": "no silence of the agent",
            "cancel": "an answer to the cancelled session/prompt",
            "turn": "the whole turn",
        }.get(self.phase, self.phase)
        return f"{what} within {self.limit:g} s ([timeouts] {self.phase})"


@dataclass
class RoundResult:
    """One ``lm/chat`` of a turn."""

    parts: list[dict[str, Any]]
    stop_reason: str | None
    error: dict[str, Any] | None  # {"code", "message", "data"}
    usage: dict[str, Any] | None
    seconds: float

    @property
    def text(self) -> str:
        return "".join(p.get("value", "") for p in self.parts if p.get("type") == "text")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [p for p in self.parts if p.get("type") == "tool_call"]

    def to_json(self) -> dict[str, Any]:
        return {
            "parts": self.parts,
            "stopReason": self.stop_reason,
            "error": self.error,
            "usage": self.usage,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class ToolAnswer:
    call_id: str
    name: str
    text: str | None  # None: not answered ("never")
    is_error: bool = False


_OPENING_METHODS = ("session/new", "session/load", "session/resume")


@dataclass
class TurnResult:
    number: int
    user: str
    rounds: list[RoundResult] = field(default_factory=list)
    answers: list[ToolAnswer] = field(default_factory=list)
    permission_tool: str = "acp_agent_action"
    cancelled: bool = False  # the editor cancelled it (a cancel trigger fired)
    timeout: PhaseTimeout | None = None
    problem: str | None = None  # the turn could not be driven as the scenario says (e.g. too many rounds)
    events: list[WireEvent] = field(default_factory=list)  # the agent's wire during the turn
    seconds: float = 0.0

    @property
    def parts(self) -> list[dict[str, Any]]:
        return [part for r in self.rounds for part in r.parts]

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.rounds)

    @property
    def thinking(self) -> str:
        return "".join(p.get("value", "") for p in self.parts if p.get("type") == "thinking")

    @property
    def stop_reason(self) -> str | None:
        return self.rounds[-1].stop_reason if self.rounds else None

    @property
    def error(self) -> dict[str, Any] | None:
        return self.rounds[-1].error if self.rounds else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The editor-tool calls (the permission tool's excluded), across rounds."""
        return [p for r in self.rounds for p in r.tool_calls if p.get("name") != self.permission_tool]

    @property
    def permissions(self) -> list[dict[str, Any]]:
        """The inputs of the permission requests the editor was asked, across rounds."""
        return [
            p.get("input") or {} for r in self.rounds for p in r.tool_calls if p.get("name") == self.permission_tool
        ]

    @property
    def updates(self) -> list[WireEvent]:
        """The agent's updates for this turn. When the turn opened the session, what the agent said while it was
        being opened (its slash commands, options; a loaded session's replay) is the session's, not the turn's: only
        updates after the first prompt count."""
        events = self.events
        opened = any(e.dir == "out" and e.method in _OPENING_METHODS for e in events)
        if opened:
            prompt = next((i for i, e in enumerate(events) if e.dir == "out" and e.method == "session/prompt"), None)
            events = events[prompt:] if prompt is not None else []
        return [e for e in events if e.dir == "in" and e.method == "session/update"]

    def editor_view(self) -> list[dict[str, Any]]:
        """What the editor saw, comparable across runs: per round, the parts (tool-call ids replaced by their
        order) and how it ended."""
        ids: dict[str, str] = {}
        rounds = []
        for r in self.rounds:
            parts = []
            for part in r.parts:
                if part.get("type") == "tool_call":
                    part = {**part, "callId": ids.setdefault(part.get("callId", ""), f"call-{len(ids) + 1}")}
                parts.append(part)
            merged: list[dict[str, Any]] = []
            for part in parts:  # chunking is not part of what an editor shows
                if merged and part.get("type") == merged[-1].get("type") and part.get("type") in ("text", "thinking"):
                    merged[-1] = {**merged[-1], "value": merged[-1]["value"] + part["value"]}
                else:
                    merged.append(part)
            rounds.append(
                {"parts": merged, "stopReason": r.stop_reason, "error": {"code": r.error["code"]} if r.error else None}
            )
        return rounds

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "user": self.user,
            "text": self.text,
            "stopReason": self.stop_reason,
            "error": self.error,
            "cancelled": self.cancelled,
            "seconds": round(self.seconds, 3),
            "toolCalls": [{"name": c.get("name"), "input": c.get("input")} for c in self.tool_calls],
            "permissions": [p.get("title") for p in self.permissions],
            "answers": [{"name": a.name, "text": a.text, "isError": a.is_error} for a in self.answers],
            "updates": _counted(_label(e) for e in self.updates),
            "rounds": [r.to_json() for r in self.rounds],
            "editorView": self.editor_view(),
            "timeout": {"phase": self.timeout.phase, "message": self.timeout.message} if self.timeout else None,
            "problem": self.problem,
        }


def _label(event: WireEvent) -> str:
    from .traces import update_label

    return update_label(event.params)


def _counted(labels: Any) -> list[str]:
    """Consecutive repeats as one entry: ``agent_message_chunk ×41``."""
    out: list[list[Any]] = []
    for label in labels:
        if out and out[-1][0] == label:
            out[-1][1] += 1
        else:
            out.append([label, 1])
    return [f"{label} ×{count}" if count > 1 else label for label, count in out]


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "value": text}]}


class Driver:
    """A live bridge with the agent under test; use ``open_driver``."""

    def __init__(
        self,
        agent: AgentUnderTest,
        work_dir: Path,
        *,
        timeouts: Timeouts,
        client: EditorClient,
        process: trio.Process,
        permission_tool: dict[str, Any],
        stderr_path: Path,
    ) -> None:
        self.agent = agent
        self.work_dir = work_dir
        self.trace_dir = work_dir / "traces"
        self.stderr_path = stderr_path
        self.timeouts = timeouts
        self.client = client
        self.process = process
        self.permission_tool = permission_tool
        self.history: list[dict[str, Any]] = []
        self.follower = TraceFollower(self.trace_dir)
        self.log = AcpLog(agent.conn)
        self.mcp_events: list[WireEvent] = []
        self.turn_number = 0
        self._clock_offset = trio.current_time() - time.time()
        self._tool_calls_made: dict[str, int] = {}
        self._last_agent_activity = -1.0  # trio time of the agent's latest message (ACP or MCP)

    # -- traces ---------------------------------------------------------------------------------------------

    def poll(self) -> list[WireEvent]:
        new = self.follower.poll()
        for event in new:
            event.turn = self.turn_number
            if event.conn == self.agent.conn:
                self.log.feed(event)
            elif event.conn.startswith("mcp:"):
                self.mcp_events.append(event)
            else:
                continue
            if event.dir == "in":
                self._last_agent_activity = max(self._last_agent_activity, self.when(event))
        return new

    def when(self, event: WireEvent) -> float:
        """An event's time on the Trio clock."""
        return event.ts + self._clock_offset

    @property
    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- turns ----------------------------------------------------------------------------------------------

    def tool_definitions(
        self, tools: Sequence[ToolSpec | dict[str, Any]], permission_tool: bool
    ) -> list[dict[str, Any]]:
        definitions = [t.definition() if isinstance(t, ToolSpec) else dict(t) for t in tools]
        if permission_tool:
            definitions.append(self.permission_tool)
        return definitions

    async def turn(
        self,
        text: str,
        *,
        tools: Sequence[ToolSpec] = (),
        permission_tool: bool = True,
        answer_permission: Callable[[str], str] = lambda title: "allow",
        cancel: Cancel | None = None,
        new_conversation: bool = False,
        max_rounds: int = 10,
        reverse_results: bool = False,
        number: int | None = None,
    ) -> TurnResult:
        """The user says ``text``; tool rounds follow until the agent's turn ends (or a permission is left
        unanswered). Never raises for what the agent does: it is all in the result."""
        self.turn_number = number if number is not None else self.turn_number + 1
        result = TurnResult(self.turn_number, text, permission_tool=self.permission_tool["name"])
        started = trio.current_time()
        self.poll()
        first_event = len(self.log.events)
        if new_conversation:
            self.history = []
        self.history.append(user_message(text))
        definitions = self.tool_definitions(tools, permission_tool)
        by_name = {t.name: t for t in tools}
        state = _TurnState(text_so_far="", cancel=cancel, fired=False)
        deadline = started + self.timeouts.turn
        while True:
            round_result, timeout, fired = await self._round(definitions, state, deadline, first=not result.rounds)
            result.rounds.append(round_result)
            result.cancelled = result.cancelled or fired
            self._remember(round_result)
            if timeout is not None:
                result.timeout = timeout
                break
            if round_result.error is not None or round_result.stop_reason != "tool_calls":
                break
            answers = self._answer(round_result.tool_calls, by_name, answer_permission)
            result.answers.extend(answers)
            given = [a for a in answers if a.text is not None]
            if reverse_results:
                given.reverse()
            if not given:
                break  # every request left unanswered: the next turn moves on
            if len(result.rounds) >= max_rounds:
                result.problem = (
                    f"the turn still wanted tool results after {max_rounds} rounds "
                    "(raise max_rounds if that is expected)"
                )
                break
            self.history.append({"role": "user", "content": [_tool_result(a) for a in given]})
        self.poll()
        result.events = self.log.events[first_event:]
        result.seconds = trio.current_time() - started
        return result

    async def chat_round(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[ToolSpec | dict[str, Any]] = (),
        permission_tool: bool = True,
        cancel: Cancel | None = None,
    ) -> tuple[RoundResult, list[WireEvent]]:
        """One ``lm/chat`` with ``messages`` appended to the history (the pytest driver's primitive); each counts
        as a turn of its own."""
        self.turn_number += 1
        self.poll()
        first_event = len(self.log.events)
        self.history.extend(messages)
        state = _TurnState(text_so_far="", cancel=cancel, fired=False)
        round_result, timeout, _ = await self._round(
            self.tool_definitions(tools, permission_tool), state, trio.current_time() + self.timeouts.turn, first=True
        )
        self._remember(round_result)
        self.poll()
        if timeout is not None and round_result.error is None:
            round_result.error = {"code": "timeout", "message": f"{timeout.phase}: {timeout.message}", "data": None}
        return round_result, self.log.events[first_event:]

    def _remember(self, result: RoundResult) -> None:
        """Add the response to the history as an editor does: what it showed (an empty response is not kept)."""
        message = assistant_message(result.parts)
        if message["content"]:
            self.history.append(message)

    def _answer(
        self, calls: list[dict[str, Any]], tools: dict[str, ToolSpec], answer_permission: Callable[[str], str]
    ) -> list[ToolAnswer]:
        answers = []
        for call in calls:
            name, call_id, arguments = call.get("name", ""), call.get("callId", ""), call.get("input")
            if name == self.permission_tool["name"]:
                title = (arguments or {}).get("title", "") if isinstance(arguments, dict) else ""
                word = answer_permission(title)
                answers.append(ToolAnswer(call_id, name, None if word == "never" else word))
                continue
            spec = tools.get(name)
            if spec is None:
                answers.append(ToolAnswer(call_id, name, f"the test scenario has no tool {name!r}", True))
                continue
            count = self._tool_calls_made.get(name, 0)
            self._tool_calls_made[name] = count + 1
            text, is_error = spec.answer(arguments, count)
            answers.append(ToolAnswer(call_id, name, text, is_error))
        return answers

    async def _round(
        self, tools: list[dict[str, Any]], state: _TurnState, deadline: float, first: bool
    ) -> tuple[RoundResult, PhaseTimeout | None, bool]:
        started = trio.current_time()
        timeout: list[PhaseTimeout] = []
        chat: ChatTurn | None = None
        fired_before = state.fired
        seen_types: set[str] = set()

        def trigger() -> None:
            cancel = state.cancel
            if cancel is None or state.fired or chat is None:
                return
            if (cancel.on_text is not None and cancel.on_text in state.text_so_far) or (
                cancel.on_part is not None
                and (cancel.on_part in seen_types or (cancel.on_part == "any" and seen_types))
            ):
                state.fired = True
                chat.cancel()

        def on_part(part: dict[str, Any]) -> None:
            seen_types.add(str(part.get("type")))
            if part.get("type") == "text":
                state.text_so_far += part.get("value", "")
            trigger()

        chat = await self.client.start_chat(self.agent.id, list(self.history), tools=tools, on_part=on_part)
        trigger()  # for parts that arrived while the request was being sent
        result = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watchdog, chat, started, deadline, timeout, nursery.cancel_scope)
            if first and state.cancel is not None and state.cancel.after_ms is not None and not state.fired:
                nursery.start_soon(self._cancel_after, chat, state, state.cancel.after_ms / 1000)
            result = await chat.result()
            nursery.cancel_scope.cancel()
        if result is None:  # the watchdog gave up on lmbridge
            problem = timeout[0]
            raise DriverError(
                f"{problem.phase} timeout, and lmbridge did not answer the cancelled lm/chat within "
                f"15 s; its stderr: {_tail(self.stderr_path)}"
            )
        error = None
        if result.error is not None:
            error = {"code": result.error.code, "message": result.error.message, "data": result.error.data}
        return (
            RoundResult(list(result.parts), result.stop_reason, error, result.usage, trio.current_time() - started),
            timeout[0] if timeout else None,
            state.fired and not fired_before,
        )

    async def _cancel_after(self, chat: ChatTurn, state: _TurnState, seconds: float) -> None:
        await trio.sleep(seconds)  # the scenario asks for a cancel at this moment
        if not state.fired:
            state.fired = True
            chat.cancel()

    async def _watchdog(
        self, chat: ChatTurn, round_started: float, deadline: float, found: list[PhaseTimeout], scope: trio.CancelScope
    ) -> None:
        while True:
            self.poll()
            now = trio.current_time()
            problem = self._phase_problem(now, round_started, deadline)
            if problem is not None:
                found.append(problem)
                chat.cancel()  # the bridge answers a cancelled turn at once...
                await trio.sleep(15)
                scope.cancel()  # ...or something is badly wrong with it
                return
            await trio.sleep(POLL_INTERVAL)

    def _phase_problem(self, now: float, round_started: float, deadline: float) -> PhaseTimeout | None:
        t = self.timeouts
        if now > deadline:
            return PhaseTimeout("turn", f"the turn took longer than {t.turn:g} s", t.turn)
        for exchange in self.log.pending_client_requests:
            waited = now - self.when(exchange.sent)
            if exchange.method == "initialize" and waited > t.initialize:
                return PhaseTimeout(
                    "initialize", f"the agent did not answer initialize within {t.initialize:g} s", t.initialize
                )
            if exchange.method in ("session/new", "session/load", "session/resume") and waited > t.session_new:
                return PhaseTimeout(
                    "session_new",
                    f"the agent did not answer {exchange.method} within {t.session_new:g} s",
                    t.session_new,
                )
            if exchange.method != "session/prompt":
                continue
            sent = self.when(exchange.sent)
            cancel = next(
                (
                    c
                    for c in self.log.cancels
                    if self.when(c) >= sent and (c.params or {}).get("sessionId") == exchange.session_id
                ),
                None,
            )
            if cancel is not None:
                if now - self.when(cancel) > t.cancel:
                    return PhaseTimeout(
                        "cancel",
                        f"the agent did not answer the cancelled session/prompt within "
                        f"{t.cancel:g} s of session/cancel",
                        t.cancel,
                    )
                continue
            if self._last_agent_activity < sent:
                if waited > t.first_update:
                    return PhaseTimeout(
                        "first_update",
                        f"no update from the agent within {t.first_update:g} s of session/prompt",
                        t.first_update,
                    )
                continue
            quiet_since = max(self._last_agent_activity, round_started)
            if now - quiet_since > t.idle and not self._waiting_for_editor():
                return PhaseTimeout(
                    "idle",
                    f"the agent sent nothing for {t.idle:g} s while the editor waited "
                    "(session/prompt still unanswered)",
                    t.idle,
                )
        return None

    def _waiting_for_editor(self) -> bool:
        """Whether the agent waits for lmbridge (a permission request or a tool call not yet answered)."""
        return bool(self.log.pending_agent_requests)

    # -- the end --------------------------------------------------------------------------------------------

    async def settle(self) -> list[str]:
        """Wait (bounded by the cancel timeout) until every prompt that was cancelled has been answered, so the
        checks see the agent's answers. Returns problems (prompts still unanswered)."""
        with trio.move_on_after(self.timeouts.cancel):
            while True:
                self.poll()
                if not self._cancelled_pending():
                    return []
                await trio.sleep(POLL_INTERVAL)
        return [
            f"session/prompt (id {e.id}) still unanswered {self.timeouts.cancel:g} s after session/cancel"
            for e in self._cancelled_pending()
        ]

    def _cancelled_pending(self) -> list[Any]:
        pending = []
        for exchange in self.log.pending_client_requests:
            if exchange.method == "session/prompt" and any(
                (c.params or {}).get("sessionId") == exchange.session_id and self.when(c) >= self.when(exchange.sent)
                for c in self.log.cancels
            ):
                pending.append(exchange)
        return pending


@dataclass
class _TurnState:
    text_so_far: str
    cancel: Cancel | None
    fired: bool


def _tool_result(answer: ToolAnswer) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "tool_result",
        "callId": answer.call_id,
        "content": [{"type": "text", "value": answer.text or ""}],
    }
    if answer.is_error:
        part["isError"] = True
    return part


@asynccontextmanager
async def open_driver(
    agent: AgentUnderTest,
    work_dir: str | os.PathLike[str],
    *,
    timeouts: Timeouts = Timeouts(),
    thinking: bool = False,
    acp_updates: bool = False,
    workspace: str | None = None,
    permission_policy: str = "ask",
    log_level: str = "info",
    env: dict[str, str] | None = None,
) -> AsyncIterator[Driver]:
    """Start ``lmbridge stdio`` for ``agent`` with its files in ``work_dir``, initialize it like an editor, and
    yield the driver. On exit: ``shutdown``, the bridge's exit awaited, and a last read of the traces."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "traces").mkdir(mode=0o700, exist_ok=True)
    config_path = work / "lmbridge.toml"
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(config_text(agent, timeouts, permission_policy, work / "state" / "sessions.json"))
    project = Path(workspace) if workspace else work / "workspace"
    project.mkdir(parents=True, exist_ok=True)
    stderr_path = work / "lmbridge.stderr"
    bridge_env = dict(env or {})
    args = ["--config", str(config_path), "--trace-dir", str(work / "traces"), "--log-level", log_level]
    failure: DriverError | None = None
    driver: Driver | None = None
    try:
        async with AsyncExitStack() as stack:
            stderr = stack.enter_context(open(stderr_path, "wb"))  # noqa: SIM115 (the stack closes it)
            client, process = await stack.enter_async_context(spawn_stdio(args, stderr=stderr, env=bridge_env))
            try:
                with trio.fail_after(30):
                    info = await client.initialize(
                        workspaceFolders=[str(project.resolve())],
                        clientInfo={"name": "lmbridge-test", "version": "1"},
                        capabilities={"thinking": thinking, "acpUpdates": acp_updates},
                    )
            except trio.TooSlowError:
                failure = DriverError(
                    f"lmbridge stdio did not answer initialize within 30 s; its stderr: {_tail(stderr_path)}"
                )
            except Exception as exc:
                failure = DriverError(f"lmbridge stdio failed to initialize: {exc}; its stderr: {_tail(stderr_path)}")
            if failure is None:
                driver = Driver(
                    agent,
                    work,
                    timeouts=timeouts,
                    client=client,
                    process=process,
                    permission_tool=info["permissionTool"],
                    stderr_path=stderr_path,
                )
                try:
                    yield driver
                finally:
                    with trio.CancelScope(shield=True):
                        driver.turn_number = SHUTDOWN_TURN
                        driver.poll()
                        with trio.move_on_after(30):
                            try:
                                await client.shutdown()
                            except Exception:
                                pass
    except BaseExceptionGroup as group:
        # spawn_stdio's nursery wraps whatever the body raised; callers want the exception itself.
        raise _single(group) from None
    if failure is not None:
        raise failure
    if driver is not None:
        driver.poll()


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups, or the group itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(none)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty)"
