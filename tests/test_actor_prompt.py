"""The session actor's prompt: its answer is taken as the wire delivers it, with no task waiting on it; an agent that
went away without answering fails the turn with its exit status. A fake agent link, no process."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
import trio.testing
from conftest import HANG

from session.actor import SessionActor, TurnOutcome
from session.machine import EditorTurn, SessionMachine
from wire.cancel import CancelRequest
from wire.errors import AgentExitedError
from wire.observe.logs import get_logger


class _Reply:
    def __init__(self, gone_already: bool) -> None:
        self.gone_already = gone_already
        self.callback: Any = None
        self.on_lost: Any = None

    def on_answer(self, callback: Any, on_lost: Any = None) -> None:
        self.callback, self.on_lost = callback, on_lost
        if self.gone_already:
            on_lost()

    async def result(self) -> Any:
        raise AgentExitedError("fake", 3, "segfault")


class _Agent:
    id = "fake"

    def __init__(self, *, gone_already: bool = False) -> None:
        self.gone_already = gone_already
        self.replies: list[_Reply] = []
        self.prompted = trio.Event()

    def send_request(self, method: str, params: dict[str, Any]) -> _Reply:
        self.replies.append(_Reply(self.gone_already))
        self.prompted.set()
        return self.replies[-1]

    def notify(self, method: str, params: dict[str, Any]) -> None:
        pass

    def detach(self, session_id: str) -> None:
        pass


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if "SessionActor" in task.name:  # the actor's own, not the test's
            self.names.append(task.name)


async def _turn(agent: _Agent, then: Any) -> tuple[TurnOutcome, list[str]]:
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
            await agent.prompted.wait()
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
    outcome, spawned = await _turn(_Agent(), lambda reply: reply.callback({"stopReason": "end_turn"}, None))
    assert outcome.stop_reason == "end_turn" and outcome.error is None
    assert spawned == []


async def test_an_agent_gone_mid_prompt_fails_the_turn_with_its_exit_status() -> None:
    outcome, spawned = await _turn(_Agent(), lambda reply: reply.on_lost())
    assert isinstance(outcome.error, AgentExitedError) and outcome.error.exit_code == 3
    assert len(spawned) == 1  # the report, started when the agent was found gone


async def test_an_agent_gone_before_the_prompt_went_out_fails_the_turn_with_its_exit_status() -> None:
    outcome, _ = await _turn(_Agent(gone_already=True), lambda reply: None)
    assert isinstance(outcome.error, AgentExitedError) and "segfault" in str(outcome.error)
