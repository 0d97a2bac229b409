"""The session actor's prompt: its answer is taken as the wire delivers it, with no task waiting on it; an agent that
went away without answering fails the turn with its exit status. A fake agent link, no process."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
import trio.testing
from conftest import HANG
from fakes import FakeAgentLink

from session.actor import SessionActor, TurnOutcome
from session.machine import EditorTurn, SessionMachine
from wire.cancel import CancelRequest
from wire.errors import AgentExitedError
from wire.observe.logs import get_logger

SEGFAULT = AgentExitedError("fake", 3, "segfault")


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if "SessionActor" in task.name:  # the actor's own, not the test's
            self.names.append(task.name)


async def _turn(agent: FakeAgentLink, then: Any) -> tuple[TurnOutcome, list[str]]:
    """Run one turn; ``then(reply)`` once the prompt is out. The outcome, and the tasks the actor spawned."""
    actor = SessionActor(agent, "s1", SessionMachine(new_call_id=lambda: "lmb_1"), log=get_logger())
    outcomes: list[TurnOutcome] = []
    spawns = _Spawns()

    async def turn() -> None:
        outcomes.append(await actor.run_turn(EditorTurn(1, [{"type": "text", "text": "hi"}]), _sink, CancelRequest()))

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        trio.lowlevel.add_instrument(spawns)
        try:
            nursery.start_soon(turn)
            await agent.request_came.wait()
            then(agent.replies[0])
            with trio.fail_after(HANG):
                while not outcomes:
                    await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(spawns)
        nursery.cancel_scope.cancel()
    return outcomes[0], spawns.names


async def _sink(part: dict[str, Any]) -> None:
    pass


async def test_an_answered_prompt_ends_the_turn_and_no_task_waited_for_it() -> None:
    outcome, spawned = await _turn(FakeAgentLink(), lambda reply: reply.answer({"stopReason": "end_turn"}))
    assert outcome.stop_reason == "end_turn" and outcome.error is None
    assert spawned == []


async def test_an_agent_gone_mid_prompt_fails_the_turn_with_its_exit_status() -> None:
    outcome, spawned = await _turn(FakeAgentLink(), lambda reply: reply.lose(SEGFAULT))
    assert isinstance(outcome.error, AgentExitedError) and outcome.error.exit_code == 3
    assert len(spawned) == 1  # the report, started when the agent was found gone


async def test_an_agent_gone_before_the_prompt_went_out_fails_the_turn_with_its_exit_status() -> None:
    outcome, _ = await _turn(FakeAgentLink(gone=SEGFAULT), lambda reply: None)
    assert isinstance(outcome.error, AgentExitedError) and "segfault" in str(outcome.error)


async def test_the_prompts_cancel_signal_is_set_by_a_cancel_and_a_new_prompt_has_a_new_one() -> None:
    # What a tool call lmbridge answers itself is withdrawn on (mcp_synthetic's LocalTool, e.g. the editor's models).
    agent = FakeAgentLink()
    actor = SessionActor(agent, "s1", SessionMachine(new_call_id=lambda: "lmb_1"), log=get_logger())
    cancel = CancelRequest()
    outcomes: list[TurnOutcome] = []

    async def turn(number: int, cancel: CancelRequest) -> None:
        outcomes.append(await actor.run_turn(EditorTurn(number, [{"type": "text", "text": "hi"}]), _sink, cancel))

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(turn, 1, cancel)
        await agent.request_came.wait()
        first = actor.prompt_cancelled()
        assert not first.is_set()
        cancel.set()
        with trio.fail_after(HANG):
            await first.wait()
        assert agent.sent[-1][0] == "session/cancel"
        agent.replies[0].answer({"stopReason": "cancelled"})
        with trio.fail_after(HANG):
            while not outcomes:
                await trio.testing.wait_all_tasks_blocked()
        agent.request_came = trio.Event()
        nursery.start_soon(turn, 2, CancelRequest())
        await agent.request_came.wait()
        assert actor.prompt_cancelled() is not first and not actor.prompt_cancelled().is_set()
        second = actor.prompt_cancelled()
        actor.close("the test ends")
        with trio.fail_after(HANG):
            await second.wait()  # the session closing withdraws too
        nursery.cancel_scope.cancel()
