"""The session state machine, sans-IO: scenarios that pin the rules, and random interleavings of every event that
check the invariants — nothing lost, every turn answered exactly once, every waiter answered exactly once."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from session.machine import (
    TRANSITIONS,
    AgentExited,
    AgentUpdate,
    AnswerPermission,
    EditorCancel,
    EditorGone,
    EditorTurn,
    Emit,
    EndTurn,
    IllegalTransition,
    InvocationWithdrawn,
    PermissionRequest,
    PromptFailed,
    PromptFinished,
    ResolveInvocation,
    SendCancel,
    SendPrompt,
    SessionClosed,
    SessionMachine,
    State,
    Tick,
    ToolInvocation,
    TurnOptions,
)
from session.permissions import PermissionPolicy


def text(value: str) -> AgentUpdate:
    return AgentUpdate({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": value}})


def thought(value: str) -> AgentUpdate:
    return AgentUpdate({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": value}})


PROMPT = [{"type": "text", "text": "hi"}]
OPTIONS = [
    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


def permission_params(title: str = "Run ls") -> dict[str, Any]:
    return {"sessionId": "s", "toolCall": {"toolCallId": "t1", "title": title, "kind": "execute"}, "options": OPTIONS}


def new_machine(**kwargs: Any) -> SessionMachine:
    counter = itertools.count(1)
    return SessionMachine(new_call_id=lambda: f"lmb_{next(counter)}", **kwargs)


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


# -- scenarios --------------------------------------------------------------------------------------------------


def test_a_turn_prompts_streams_and_ends_with_the_stop_reason() -> None:
    machine = new_machine()
    actions = machine.handle(EditorTurn(1, PROMPT), 0)
    assert actions == [SendPrompt(PROMPT)] and machine.state is State.STREAMING
    assert machine.handle(text("hello"), 0) == [Emit(1, {"type": "text", "value": "hello"})]
    (end,) = machine.handle(PromptFinished("end_turn"), 0)
    assert end.turn == 1 and end.stop_reason == "end_turn" and end.emitted == ({"type": "text", "value": "hello"},)
    assert machine.state is State.IDLE and machine.idle


def test_output_between_turns_is_buffered_coalesced_and_emitted_first() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(PromptFinished("end_turn"), 0)
    for piece in ("late ", "update ", "arrives"):
        assert machine.handle(text(piece), 0) == []
    assert machine.buffered == [{"type": "text", "value": "late update arrives"}]
    actions = machine.handle(EditorTurn(2, PROMPT), 0)
    assert actions == [Emit(2, {"type": "text", "value": "late update arrives"}), SendPrompt(PROMPT)]


def test_thinking_is_sent_only_to_editors_that_render_it() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT, options=TurnOptions(thinking=False)), 0)
    assert machine.handle(thought("hmm"), 0) == []
    machine.handle(PromptFinished("end_turn"), 0)
    machine.handle(EditorTurn(2, PROMPT, options=TurnOptions(thinking=True)), 0)
    assert machine.handle(thought("aha"), 0) == [Emit(2, {"type": "thinking", "value": "aha"})]


def announced(call_id: str, *, status: str = "pending", title: str = "mcp__editor__read_file") -> AgentUpdate:
    """The agent reports a call of a client tool (Claude Code's naming), as it does before calling it."""
    return AgentUpdate({"sessionUpdate": "tool_call", "toolCallId": call_id, "title": title, "status": status})


def test_a_batch_ends_as_soon_as_every_announced_call_has_arrived() -> None:
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("toolu_1"), 9.0)
    machine.handle(announced("toolu_2"), 9.0)
    machine.handle(announced("toolu_own", title="Bash"), 9.0)  # the agent's own tool: not a client call
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert machine.deadline == pytest.approx(10.015)  # one of two: the batch waits for it while calls come
    actions = machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.001)
    (end,) = [a for a in actions if isinstance(a, EndTurn)]
    assert end.stop_reason == "tool_calls" and end.pending_calls == ("lmb_1", "lmb_2")  # at once, no timer
    assert machine.state is State.AWAITING_TOOL_RESULTS and machine.deadline is None


def test_calls_reported_running_end_the_batch_an_idle_gap_after_all_have_arrived() -> None:
    """Codex reports the calls of a response as in progress as it makes them (on a calm machine all before its first
    MCP request arrives, ~20 ms later, one after another): the batch waits for all of them, then for the idle gap —
    a report made as a call starts never says that no more are coming."""
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("c1", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(announced("c2", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(announced("toolu_9"), 9.0)
    machine.handle(AgentUpdate({"sessionUpdate": "tool_call_update", "toolCallId": "toolu_9", "status": "failed"}), 9.1)
    actions = machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert not [a for a in actions if isinstance(a, EndTurn)]
    assert machine.deadline == pytest.approx(10.05)  # a call reported running has yet to come: no idle timer
    assert machine.handle(Tick(), 10.02) == []
    actions = machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.021)
    assert not [a for a in actions if isinstance(a, EndTurn)]
    assert machine.deadline == pytest.approx(10.036)
    (end,) = machine.handle(Tick(), machine.deadline)
    assert end.pending_calls == ("lmb_1", "lmb_2")  # 21 ms apart (Codex over HTTP): one batch


def test_with_no_idle_time_each_call_goes_out_at_once_but_a_call_reported_running_is_awaited() -> None:
    """``tool_batch_idle = 0``: the batch ends when its call arrives (the actor ticks in the same step, after taking
    what is queued already), unless a call the agent reported running is still to come."""
    machine = new_machine(batch_window=0.05, batch_idle=0.0)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert machine.deadline == 10.0
    (end,) = machine.handle(Tick(), 10.0)
    assert end.pending_calls == ("lmb_1",)

    machine = new_machine(batch_window=0.05, batch_idle=0.0)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("c1", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(announced("c2", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert machine.deadline == pytest.approx(10.05)
    machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.001)
    (end,) = machine.handle(Tick(), 10.001)
    assert end.pending_calls == ("lmb_1", "lmb_2")


def test_calls_reported_only_as_they_arrive_never_end_a_batch_early() -> None:
    """Over the stdio relay Codex's MCP requests arrive with or before its reports: a report after the batch's
    first call says nothing of calls still to come, so the idle timer decides."""
    for first_report in (9.9995, 10.001):  # just before the first call, or after it
        machine = new_machine(batch_window=0.05, batch_idle=0.015)
        machine.handle(EditorTurn(1, PROMPT), 0)
        machine.handle(announced("c1", status="in_progress", title="Tool: editor/read_file"), first_report)
        machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
        machine.handle(announced("c2", status="in_progress", title="Tool: editor/read_file"), 10.001)
        actions = machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.002)
        assert not [a for a in actions if isinstance(a, EndTurn)]  # a third call may be on its way
        assert machine.deadline == pytest.approx(10.017)
        machine.handle(ToolInvocation("k3", "read_file", {"path": "c"}), 10.004)
        (end,) = machine.handle(Tick(), 10.019)
        assert end.pending_calls == ("lmb_1", "lmb_2", "lmb_3")


def test_a_second_call_reported_running_just_after_the_first_arrived_joins_its_batch() -> None:
    """Seen on a loaded machine (Codex over HTTP, two calls of one response): its first report came 24 ms before the
    first MCP request, its second report 1 ms after that request. Both calls go out in one batch."""
    machine = new_machine(batch_window=30.0, batch_idle=5.0)  # the interop suite's wide batches
    machine.handle(EditorTurn(1, PROMPT), 0)
    steps = [
        (announced("c1", status="in_progress", title="Tool: editor/get_weather"), 0.635),
        (ToolInvocation("k1", "get_weather", {"city": "Paris"}), 0.6597),
        (announced("c2", status="in_progress", title="Tool: editor/get_weather"), 0.6608),
        (ToolInvocation("k2", "get_weather", {"city": "Oslo"}), 0.689),
        (Tick(), 5.7),
    ]
    ends = [a for event, now in steps for a in machine.handle(event, now) if isinstance(a, EndTurn)]
    assert [end.pending_calls for end in ends] == [("lmb_1", "lmb_2")]


def test_a_permission_granted_for_a_client_tool_announces_its_call() -> None:
    """Gemini CLI tells of an MCP call only by asking permission for it (allowed without the editor): the call
    that follows ends the batch at once."""
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    tool_call = {"toolCallId": "mcp_editor_read_file_1", "status": "pending", "title": "read_file (editor MCP Server)"}
    options = [{"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"}]
    request = PermissionRequest("p1", {"sessionId": "s", "toolCall": tool_call, "options": options})
    [answer] = machine.handle(request, 9.0)
    assert isinstance(answer, AnswerPermission) and answer.outcome["outcome"]["optionId"] == "proceed_once"
    actions = machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 9.003)
    (end,) = [a for a in actions if isinstance(a, EndTurn)]
    assert end.pending_calls == ("lmb_1",)


def test_a_call_reported_in_progress_that_never_comes_holds_the_batch_only_until_the_window_ends() -> None:
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("c1", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(announced("c2", status="in_progress", title="Tool: editor/read_file"), 9.0)
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert machine.handle(Tick(), 10.049) == []
    (end,) = machine.handle(Tick(), 10.05)
    assert end.stop_reason == "tool_calls" and end.pending_calls == ("lmb_1",)


def test_calls_reported_in_progress_are_waited_for_a_window_after_each_call() -> None:
    """Codex over HTTP on a busy machine: three calls reported together, made 25-27 ms apart (51 ms in all)."""
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    for call_id in ("c1", "c2", "c3"):
        machine.handle(announced(call_id, status="in_progress", title="Tool: editor/read_file"), 9.98)
    for n, at in enumerate((10.0, 10.027, 10.051), start=1):
        actions = machine.handle(ToolInvocation(f"k{n}", "read_file", {"path": str(n)}), at)
        assert not [a for a in actions if isinstance(a, EndTurn)]
        if n < 3:
            assert machine.handle(Tick(), at + 0.0499) == []
    assert machine.deadline == pytest.approx(10.05)  # the window, from the first call: past, so the next tick ends it
    (end,) = machine.handle(Tick(), 10.051)
    assert end.pending_calls == ("lmb_1", "lmb_2", "lmb_3")


def test_a_call_reported_in_progress_after_the_batch_opened_is_waited_for() -> None:
    """Codex on a busy machine: its reports interleave with its calls, 25 ms apart (more than the idle time)."""
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("c1", status="in_progress", title="Tool: editor/read_file"), 9.999)
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    machine.handle(announced("c2", status="in_progress", title="Tool: editor/read_file"), 10.006)
    assert machine.handle(Tick(), 10.03) == []  # past the idle time: c2 is being made
    actions = machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.031)
    assert not [a for a in actions if isinstance(a, EndTurn)]  # the reports raced the calls: the idle timer decides
    (end,) = machine.handle(Tick(), 10.05)
    assert end.pending_calls == ("lmb_1", "lmb_2")


def test_a_call_announced_pending_that_does_not_come_waits_only_for_the_idle_timer() -> None:
    """OpenCode reports every call of a response as pending, then makes them one after the other: the rest may come
    only once the editor answered the first."""
    machine = new_machine(batch_window=0.05, batch_idle=0.015)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("toolu_1"), 9.0)
    machine.handle(announced("toolu_2"), 9.0)
    machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert machine.handle(Tick(), 10.0149) == []
    (end,) = machine.handle(Tick(), 10.015)
    assert end.stop_reason == "tool_calls" and end.pending_calls == ("lmb_1",)


def test_tool_calls_are_batched_until_a_pause_or_the_window_ends() -> None:
    machine = new_machine(batch_window=0.05, batch_idle=0.005)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(announced("c1", status="completed"), 9.0)  # reported as already ended: not counted
    first = machine.handle(ToolInvocation("k1", "read_file", {"path": "a"}), 10.0)
    assert first == [Emit(1, {"type": "tool_call", "callId": "lmb_1", "name": "read_file", "input": {"path": "a"}})]
    assert machine.deadline == pytest.approx(10.005)  # a pause of 5 ms ends the batch...
    machine.handle(ToolInvocation("k2", "read_file", {"path": "b"}), 10.004)
    assert machine.deadline == pytest.approx(10.009)  # ...each new call extends it...
    for moment in (10.008, 10.012, 10.016, 10.020, 10.024, 10.028, 10.032, 10.036, 10.040, 10.044, 10.048):
        machine.handle(ToolInvocation(f"k{moment}", "t", {}), moment)
    assert machine.deadline == pytest.approx(10.05)  # ...up to the window's end
    assert machine.handle(Tick(), 10.049) == []
    (end,) = machine.handle(Tick(), 10.05)
    assert end.stop_reason == "tool_calls" and end.pending_calls[:2] == ("lmb_1", "lmb_2")
    assert len(end.pending_calls) == 13
    assert machine.state is State.AWAITING_TOOL_RESULTS
    result = {"type": "tool_result", "callId": "lmb_1", "content": [{"type": "text", "value": "A"}]}
    actions = machine.handle(EditorTurn(2, None, {"lmb_1": result}), 11)
    assert ResolveInvocation("k1", result, "") in actions
    withdrawn = [a for a in actions if isinstance(a, ResolveInvocation) and a.invocation == "k2"]
    assert withdrawn and withdrawn[0].result is None and "no result" in withdrawn[0].reason
    assert machine.state is State.STREAMING


def test_a_call_withdrawn_within_the_window_does_not_end_the_turn() -> None:
    machine = new_machine(batch_window=0.05)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "t", {}), 0)
    (resolved,) = machine.handle(InvocationWithdrawn("k1"), 0.01)
    assert resolved.invocation == "k1" and resolved.result is None
    assert machine.handle(Tick(), 0.05) == [] and machine.state is State.STREAMING
    (end,) = machine.handle(PromptFinished("end_turn"), 0.1)
    assert end.stop_reason == "end_turn" and end.pending_calls == ()


def test_cancel_answers_the_turn_at_once_answers_permissions_cancelled_and_drains() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(PermissionRequest("p1", permission_params()), 0)
    actions = machine.handle(EditorCancel(1), 0)
    assert actions[0] == SendCancel()
    assert AnswerPermission("p1", {"outcome": {"outcome": "cancelled"}}, decided_by="lmbridge") in actions
    (end,) = of(actions, EndTurn)
    assert end.stop_reason == "cancelled"
    assert machine.state is State.CANCELLING
    assert machine.handle(text("leftover"), 0) == []  # drained
    assert machine.drained_updates == 1
    # A new turn waits for the drain, then starts cleanly: the leftover never reaches it.
    assert machine.handle(EditorTurn(2, PROMPT), 0) == []
    actions = machine.handle(PromptFinished("cancelled"), 0)
    assert actions == [SendPrompt(PROMPT)]
    (end,) = machine.handle(PromptFinished("end_turn"), 0)
    assert end.turn == 2 and end.stop_reason == "end_turn" and end.emitted == ()


def test_a_newer_request_supersedes_the_running_one() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True), 0)
    assert SendCancel() in actions and EndTurn(1, stop_reason="cancelled") in actions
    assert machine.handle(PromptFinished("cancelled"), 0) == [SendPrompt(PROMPT)]


def test_moving_on_while_awaiting_tools_withdraws_them_and_cancels_the_prompt() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "t", {}), 0)
    machine.handle(Tick(), 1)
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True), 1)
    assert actions[0] == SendCancel()
    (resolved,) = of(actions, ResolveInvocation)
    assert resolved.result is None and "moved on" in resolved.reason
    assert machine.state is State.CANCELLING


def test_drain_timeout_closes_the_session_and_reroutes_the_waiting_turn() -> None:
    machine = new_machine(drain_timeout=10)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(EditorCancel(1), 0)
    machine.handle(EditorTurn(2, PROMPT), 1)
    assert machine.deadline == 10
    actions = machine.handle(Tick(), 10)
    assert EndTurn(2, reroute=True) in actions and machine.state is State.CLOSED
    assert of(actions, SessionClosed)
    assert machine.handle(EditorTurn(3, PROMPT), 11) == [EndTurn(3, reroute=True)]


def test_agent_exit_fails_the_open_turn_and_answers_every_waiter() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "t", {}), 0)
    machine.handle(PermissionRequest("p1", permission_params()), 0)
    boom = RuntimeError("gone")
    actions = machine.handle(AgentExited(boom), 0)
    (end,) = of(actions, EndTurn)
    assert end.error is boom and end.pending_calls == ()
    assert {a.invocation for a in of(actions, ResolveInvocation)} == {"k1"}
    assert {a.request for a in of(actions, AnswerPermission)} == {"p1"}
    assert machine.state is State.CLOSED


def test_prompt_failure_becomes_the_turns_error() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    error = ValueError("agent said no")
    (end,) = machine.handle(PromptFailed(error), 0)
    assert end.error is error and machine.state is State.IDLE


def test_a_prompt_that_ends_while_tools_are_awaited_is_reported_in_the_next_turn() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "t", {}), 0)
    machine.handle(Tick(), 1)
    machine.handle(InvocationWithdrawn("k1"), 2)  # the agent gave up on the call (its own timeout)
    machine.handle(text("gave up waiting"), 2)
    machine.handle(PromptFinished("max_turn_requests"), 2)
    actions = machine.handle(EditorTurn(2, None, {}), 3)
    assert actions[0] == Emit(2, {"type": "text", "value": "gave up waiting"})
    assert actions[-1].stop_reason == "max_turn_requests"


def test_user_text_sent_with_tool_results_is_prompted_after_the_running_prompt() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(ToolInvocation("k1", "t", {}), 0)
    machine.handle(Tick(), 1)
    result = {"type": "tool_result", "callId": "lmb_1", "content": []}
    follow_up = [{"type": "text", "text": "and also this"}]
    actions = machine.handle(EditorTurn(2, follow_up, {"lmb_1": result}), 2)
    assert not of(actions, SendPrompt)
    assert machine.handle(PromptFinished("end_turn"), 2) == [SendPrompt(follow_up)]
    (end,) = machine.handle(PromptFinished("end_turn"), 3)
    assert end.turn == 2


def test_permission_policies_answer_without_asking() -> None:
    for policy, kind, expected in [
        ("allow_all", "execute", "yes"),
        ("deny", "read", "no"),
        ("allow_reads", "read", "yes"),
    ]:
        machine = new_machine(permission_policy=PermissionPolicy(policy=policy))
        machine.handle(EditorTurn(1, PROMPT), 0)
        params = permission_params()
        params["toolCall"]["kind"] = kind
        assert machine.handle(PermissionRequest("p", params), 0) == [
            AnswerPermission("p", {"outcome": {"outcome": "selected", "optionId": expected}}, decided_by="policy")
        ]
    machine = new_machine(permission_policy=PermissionPolicy(policy="allow_reads"))
    machine.handle(EditorTurn(1, PROMPT), 0)
    (asked,) = machine.handle(PermissionRequest("p", permission_params()), 0)
    assert asked.part["name"] == "acp_agent_action" and asked.part["input"]["title"] == "Run ls"


def test_without_the_permission_tool_ask_means_reject() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT, options=TurnOptions(permission_tool=False)), 0)
    assert machine.handle(PermissionRequest("p", permission_params()), 0) == [
        AnswerPermission("p", {"outcome": {"outcome": "selected", "optionId": "no"}}, decided_by="policy")
    ]


def test_closing_cancels_a_running_prompt_and_waits_for_it_a_moment() -> None:
    machine = new_machine(drain_timeout=10)
    machine.handle(EditorTurn(1, PROMPT), 0)
    actions = machine.close("idle timeout", 0)
    assert actions[0] == SendCancel() and EndTurn(1, stop_reason="cancelled") in actions
    assert machine.state is State.CANCELLING and machine.deadline == 2.0
    assert machine.handle(EditorTurn(2, PROMPT), 0.5) == [EndTurn(2, reroute=True)]
    assert machine.handle(PromptFinished("cancelled"), 1) == [SessionClosed("idle timeout")]
    assert machine.state is State.CLOSED
    stubborn = new_machine(drain_timeout=10)
    stubborn.handle(EditorTurn(1, PROMPT), 0)
    stubborn.close("shutdown", 0)
    assert stubborn.handle(Tick(), 2.0) == [SessionClosed("shutdown")]


def test_the_transition_table_is_enforced() -> None:
    machine = new_machine()
    with pytest.raises(IllegalTransition):
        machine._to(State.AWAITING_PERMISSION)
    assert State.IDLE not in TRANSITIONS[State.CLOSED]


# -- random interleavings ---------------------------------------------------------------------------------------


class Harness:
    """Drives a machine like the actor does, playing a well-behaved agent, and checks the invariants."""

    def __init__(self, machine: SessionMachine) -> None:
        self.machine = machine
        self.now = 0.0
        self.turns = itertools.count(1)
        self.keys = itertools.count(1)
        self.words = itertools.count(1)
        self.opened: list[int] = []
        self.ended: Counter[int] = Counter()
        self.closed_turns: set[int] = set()
        self.emitted_text: list[tuple[int, str]] = []
        self.accepted_text: list[str] = []
        self.waiting: set[str] = set()  # keys of invocations/permissions not yet answered
        self.answers: Counter[str] = Counter()
        self.prompts_in_flight = 0
        self.cancel_sent = False
        self.emitted_calls: dict[str, str] = {}  # callId → key, for calls the editor saw
        self.saw_cancelling = False

    def feed(self, event: object) -> None:
        before = self.machine.state
        if isinstance(event, EditorGone) and event.turn == self.machine.open_turn:
            # That editor never reliably received the turn: its text is owed again, to whoever retries.
            self.emitted_text = [(turn, text) for turn, text in self.emitted_text if turn != event.turn]
        self.saw_cancelling = self.saw_cancelling or before is State.CANCELLING
        if isinstance(event, AgentUpdate) and before not in (State.CANCELLING, State.CLOSED):
            self.accepted_text.append(event.update["content"]["text"])
        buffered = "".join(p["value"] for p in self.machine.buffered if p["type"] == "text")
        abandoned_before = self.machine.abandoned_turns
        for action in self.machine.handle(event, self.now):
            self.apply(action)
        if self.machine.abandoned_turns > abandoned_before:
            # The editor that lost this output did not come back for it: dropped on purpose, never delivered.
            self.accepted_text = (
                ["".join(self.accepted_text).removesuffix(buffered)] if buffered else self.accepted_text
            )

    def apply(self, action: object) -> None:
        if isinstance(action, Emit):
            assert action.turn not in self.closed_turns, "emitted after the turn ended"
            part = action.part
            if part["type"] == "text":
                self.emitted_text.append((action.turn, part["value"]))
            if part["type"] == "tool_call":
                self.emitted_calls[part["callId"]] = part["callId"]
        elif isinstance(action, EndTurn):
            self.ended[action.turn] += 1
            self.closed_turns.add(action.turn)
        elif isinstance(action, SendPrompt):
            assert self.prompts_in_flight == 0, "two prompts in flight"
            self.prompts_in_flight += 1
            self.cancel_sent = False
        elif isinstance(action, SendCancel):
            self.cancel_sent = True
        elif isinstance(action, (AnswerPermission, ResolveInvocation)):
            key = action.request if isinstance(action, AnswerPermission) else action.invocation
            self.answers[key] += 1
            self.waiting.discard(key)

    def finish_prompt(self, stop_reason: str) -> None:
        self.prompts_in_flight -= 1
        self.feed(PromptFinished("cancelled" if self.cancel_sent else stop_reason))


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_random_interleavings_keep_every_invariant(data: st.DataObject) -> None:
    h = Harness(new_machine(batch_window=0.05, drain_timeout=5.0))
    steps = ["turn"] + data.draw(
        st.lists(
            st.sampled_from(
                [
                    "turn",
                    "turn",
                    "turn",
                    "cancel",
                    "gone",
                    "text",
                    "text",
                    "text",
                    "tool",
                    "tool",
                    "permission",
                    "permission",
                    "withdraw",
                    "finish",
                    "finish",
                    "fail",
                    "tick",
                    "tick",
                    "exit",
                ]
            ),
            max_size=60,
        )
    )
    for step in steps:
        machine = h.machine
        if step == "turn":
            turn = next(h.turns)
            h.opened.append(turn)
            pending = machine.pending_call_ids
            answered = data.draw(st.lists(st.sampled_from(pending), unique=True)) if pending else []
            results = {
                call_id: {"type": "tool_result", "callId": call_id, "content": [{"type": "text", "value": "allow"}]}
                for call_id in answered
            }
            prompt = data.draw(st.sampled_from([PROMPT, None]))
            h.feed(
                EditorTurn(
                    turn,
                    prompt,
                    results,
                    data.draw(st.booleans()),
                    TurnOptions(permission_tool=data.draw(st.booleans())),
                    retry=data.draw(st.booleans()),
                )
            )
        elif step == "cancel" and h.opened:
            h.feed(EditorCancel(data.draw(st.sampled_from(h.opened))))
        elif step == "gone" and h.opened:
            h.feed(EditorGone(data.draw(st.sampled_from(h.opened))))
        elif step == "text":
            h.feed(text(f"w{next(h.words)} "))
        elif step in ("tool", "permission"):
            key = f"k{next(h.keys)}"
            h.waiting.add(key)
            h.feed(ToolInvocation(key, "t", {}) if step == "tool" else PermissionRequest(key, permission_params()))
        elif step == "withdraw" and h.waiting:
            h.feed(InvocationWithdrawn(data.draw(st.sampled_from(sorted(h.waiting)))))
        elif step in ("finish", "fail") and h.prompts_in_flight:
            if step == "fail":
                h.prompts_in_flight -= 1
                h.feed(PromptFailed(RuntimeError("x")))
            else:
                h.finish_prompt(data.draw(st.sampled_from(["end_turn", "max_tokens", "refusal"])))
        elif step == "tick":
            h.now += data.draw(st.sampled_from([0.01, 0.05, 1.0, 10.0]))
            h.feed(Tick())
        elif step == "exit" and data.draw(st.integers(0, 4)) == 0:
            h.prompts_in_flight = 0
            h.feed(AgentExited(RuntimeError("exit")))

    # Close — after the agent finished, or while it still works — and everything must be answered.
    if data.draw(st.booleans()):
        while h.prompts_in_flight:
            h.finish_prompt("end_turn")
    for action in h.machine.close("end of test", h.now):
        h.apply(action)
    while h.prompts_in_flight:  # closing cancelled it and waits for the agent to finish (unless it gave up on it)
        assert h.machine.state in (State.CANCELLING, State.CLOSED)
        h.finish_prompt("end_turn")

    event(f"turns answered: {min(len(h.ended), 5)}+")
    event(f"states visited include CANCELLING: {h.saw_cancelling}")
    event(f"tool calls emitted: {bool(h.emitted_calls)}")
    assert all(count == 1 for count in h.ended.values()), h.ended
    assert set(h.ended) == set(h.opened), "every editor turn is answered exactly once"
    assert h.waiting == set() and all(count == 1 for count in h.answers.values()), "every waiter answered once"
    assert h.machine.state is State.CLOSED
    # Nothing lost: every chunk accepted before a cancel reached the editor, in order — or is still buffered,
    # waiting for a next turn (closing a session keeps nothing, but only after the test looked).
    leftover = "".join(p["value"] for p in h.machine.buffered if p["type"] == "text")
    assert "".join(text for _turn, text in h.emitted_text) + leftover == "".join(h.accepted_text)


def test_an_editor_that_went_away_gets_the_whole_answer_when_it_retries() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(text("half of "), 0)
    (end,) = machine.handle(EditorGone(1), 0)
    assert end.stop_reason == "cancelled" and machine.state is State.DETACHED
    assert not [a for a in machine.handle(text("the answer"), 1) if isinstance(a, Emit)]
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True, retry=True), 2)
    assert actions == [Emit(2, {"type": "text", "value": "half of the answer"})]  # no second prompt, no cancel
    (end,) = machine.handle(PromptFinished("end_turn"), 3)
    assert end.turn == 2 and end.stop_reason == "end_turn"


def test_a_tool_call_the_editor_never_received_is_announced_again_on_retry() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    (call,) = machine.handle(ToolInvocation("k", "t", {}), 0)
    machine.handle(EditorGone(1), 0.01)
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True, retry=True), 2)
    assert actions == [Emit(2, call.part)] and not of(actions, SendPrompt)
    (end,) = machine.handle(Tick(), 2.05)
    assert end.stop_reason == "tool_calls" and end.pending_calls == (call.part["callId"],)


def test_an_answer_finished_while_the_editor_was_away_is_delivered_on_retry() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(EditorGone(1), 0)
    machine.handle(text("all done"), 1)
    machine.handle(PromptFinished("end_turn"), 1)
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True, retry=True), 2)
    assert actions[0] == Emit(2, {"type": "text", "value": "all done"})
    assert actions[-1].stop_reason == "end_turn" and not of(actions, SendPrompt)


def test_a_new_message_after_the_editor_went_away_is_moved_on() -> None:
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(EditorGone(1), 0)
    actions = machine.handle(EditorTurn(2, PROMPT, moved_on=True), 1)
    assert SendCancel() in actions and machine.state is State.CANCELLING


def test_a_continuation_after_the_editor_went_away_cancels_the_old_turn_and_drops_its_output() -> None:
    # A follow-up message (not a retry, not "moved on" by the history) must not get the abandoned turn's output in
    # front of its own answer, and the abandoned prompt must not run on.
    machine = new_machine()
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(text("old words "), 0)
    machine.handle(EditorGone(1), 0)
    machine.handle(text("more old words"), 0.5)
    actions = machine.handle(EditorTurn(2, [{"type": "text", "text": "something else"}]), 1)
    assert SendCancel() in actions and machine.state is State.CANCELLING and not of(actions, Emit)
    assert not of(machine.handle(text("drained"), 1.1), Emit)
    actions = machine.handle(PromptFinished("cancelled"), 1.2)
    assert of(actions, SendPrompt) == [SendPrompt([{"type": "text", "text": "something else"}])]
    assert not of(actions, Emit) and machine.abandoned_turns == 1
    machine.handle(text("new answer"), 1.3)
    (end,) = of(machine.handle(PromptFinished("end_turn"), 1.4), EndTurn)
    assert end.turn == 2 and end.stop_reason == "end_turn"


def test_a_turn_whose_editor_does_not_come_back_is_cancelled_after_the_grace_period() -> None:
    machine = new_machine(detached_grace=30.0)
    machine.handle(EditorTurn(1, PROMPT), 0)
    machine.handle(EditorGone(1), 5)
    assert machine.state is State.DETACHED and machine.deadline == 35
    assert machine.handle(Tick(), 34.9) == []
    actions = machine.handle(Tick(), 35)
    assert SendCancel() in actions and machine.state is State.CANCELLING and machine.abandoned_turns == 1
    machine.handle(PromptFinished("cancelled"), 36)
    assert machine.state is State.IDLE and machine.buffered == []
