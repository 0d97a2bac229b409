"""The session actor's deadlines (the tool batch window): a deadline already due when the actor would wait is handled
at once, without a timer round of the scheduler; what is queued still comes first. A fake agent link, no process."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
import trio.testing
from conftest import HANG
from fakes import FakeAgentLink

from session.actor import SessionActor
from session.machine import EditorTurn, SessionMachine
from wire.cancel import CancelRequest
from wire.observe.logs import get_logger


class _ActorSteps(trio.abc.Instrument):
    """Numbers the steps of the actor's task, so a test can tell what happened within one of them."""

    def __init__(self) -> None:
        self.step = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("SessionActor.run"):
            self.step += 1


async def _tool_call_ends_the_turn(
    batch_window: float, *, batch_idle: float = 0.015, calls: int = 1
) -> tuple[int, int, Any]:
    """Open a turn, make ``calls`` tool calls at once (all queued before the actor runs) with the given batch window
    and idle time; the actor steps at which the first call's part was sunk and at which the turn ended, and the
    turn's outcome."""
    agent = FakeAgentLink()  # the prompt runs until the test ends
    ids = iter(f"lmb_{n}" for n in range(1, 100))
    machine = SessionMachine(new_call_id=lambda: next(ids), batch_window=batch_window, batch_idle=batch_idle)
    actor = SessionActor(agent, "s1", machine, log=get_logger())
    steps = _ActorSteps()
    trio.lowlevel.add_instrument(steps)
    sunk_at: list[int] = []
    ended_at: list[int] = []

    async def sink(part: dict[str, Any]) -> None:
        if part["type"] == "tool_call":
            sunk_at.append(steps.step)

    outcomes: list[Any] = []
    done = trio.Event()

    async def turn() -> None:
        outcomes.append(await actor.run_turn(EditorTurn(1, [{"type": "text", "text": "hi"}]), sink, CancelRequest()))
        ended_at.append(steps.step)  # the actor has not run since it ended the turn: nothing woke it
        done.set()

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(turn)
            await agent.request_came.wait()
            for n in range(calls):
                nursery.start_soon(actor.invoke_tool, "read_file", {"path": f"{n}.py"})
            with trio.fail_after(HANG):
                await done.wait()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    return sunk_at[0], ended_at[0], outcomes[0]


async def test_a_batch_window_already_over_ends_the_turn_in_the_step_that_sent_the_call() -> None:
    # A zero window is over as soon as the call is written out: the Tick is handled at once, in the same step.
    sunk, ended, outcome = await _tool_call_ends_the_turn(batch_window=0.0)
    assert outcome.stop_reason == "tool_calls" and outcome.pending_calls == ("lmb_1",)
    assert ended == sunk


async def test_a_window_still_open_waits_for_its_timer(autojump_clock: trio.testing.MockClock) -> None:
    sunk, ended, outcome = await _tool_call_ends_the_turn(batch_window=0.05)
    assert outcome.stop_reason == "tool_calls"
    assert ended > sunk
    assert trio.current_time() >= 0.015 - 1e-9  # the idle timer (batch_idle, 15 ms: no other call came) ran out


async def test_with_no_idle_time_calls_already_queued_go_out_together(autojump_clock: trio.testing.MockClock) -> None:
    """``tool_batch_idle = 0`` (Codex's): no timer, but the calls queued by the time the actor handles the first
    are taken in the same step and end the turn together."""
    sunk, ended, outcome = await _tool_call_ends_the_turn(batch_window=0.05, batch_idle=0.0, calls=2)
    assert outcome.stop_reason == "tool_calls" and outcome.pending_calls == ("lmb_1", "lmb_2")
    assert ended == sunk
    assert trio.current_time() == 0.0  # no timer ran: the mock clock never moved
