"""The session actor sets the client's session options before a prompt (a fake agent link, no process)."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
import trio.testing
from conftest import HANG
from fakes import FakeAgentLink

from session.actor import SessionActor
from session.machine import EditorTurn, SessionMachine, TurnOptions
from session.options import SessionOptions
from wire.cancel import CancelRequest
from wire.observe.logs import get_logger

OPENED = {
    "sessionId": "s1",
    "configOptions": [
        {
            "id": "mode",
            "type": "select",
            "currentValue": "code",
            "options": [{"value": "code", "name": "Code"}, {"value": "plan", "name": "Plan"}],
        }
    ],
}


def _actor(agent: FakeAgentLink) -> SessionActor:
    machine = SessionMachine(new_call_id=lambda: "lmb_1")
    return SessionActor(agent, "s1", machine, log=get_logger(), options=SessionOptions.from_session(OPENED))


async def test_the_prompt_waits_for_the_option_to_be_answered() -> None:
    agent = FakeAgentLink()
    actor = _actor(agent)
    turn = EditorTurn(1, [{"type": "text", "text": "hi"}], options=TurnOptions(settings=(("mode", "plan"),)))
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(actor.run_turn, turn, _sink, CancelRequest())
        await agent.request_came.wait()
        assert [method for method, _ in agent.sent] == ["session/set_config_option"]  # no prompt yet
        agent.request_came = trio.Event()
        agent.replies[0].answer()
        await agent.request_came.wait()
        assert [method for method, _ in agent.sent] == ["session/set_config_option", "session/prompt"]
        assert actor.options.current() == {"mode": "plan"}
        nursery.cancel_scope.cancel()


async def test_a_cancel_while_the_option_is_being_set_means_no_prompt_at_all() -> None:
    agent = FakeAgentLink()
    actor = _actor(agent)
    turn = EditorTurn(1, [{"type": "text", "text": "hi"}], options=TurnOptions(settings=(("mode", "plan"),)))
    cancel = CancelRequest()
    outcomes: list[Any] = []
    ended = trio.Event()

    async def run() -> None:
        outcomes.append(await actor.run_turn(turn, _sink, cancel))
        ended.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(run)
        await agent.request_came.wait()
        cancel.set()
        await trio.testing.wait_all_tasks_blocked()
        agent.replies[0].answer()
        with trio.fail_after(HANG):
            while not outcomes:
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert outcomes[0].stop_reason == "cancelled"
    assert [method for method, _ in agent.sent] == ["session/set_config_option"]  # neither prompt nor cancel


async def test_the_agents_refusal_fails_the_turn_quoting_it_and_no_prompt_goes_out() -> None:
    from wire.errors import AgentReplyError, RpcError

    agent = FakeAgentLink()
    actor = _actor(agent)
    turn = EditorTurn(1, [{"type": "text", "text": "hi"}], options=TurnOptions(settings=(("mode", "plan"),)))
    outcomes: list[Any] = []
    ended = trio.Event()

    async def run() -> None:
        outcomes.append(await actor.run_turn(turn, _sink, CancelRequest()))
        ended.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(run)
        await agent.request_came.wait()
        agent.replies[0].answer(RpcError(-32602, "plan mode is not available"))
        with trio.fail_after(HANG):
            await ended.wait()
        nursery.cancel_scope.cancel()
    error = outcomes[0].error
    assert isinstance(error, AgentReplyError)
    assert error.message == (
        "the agent answered session/set_config_option (mode = 'plan') with an error: plan mode is not available"
    )
    assert [method for method, _ in agent.sent] == ["session/set_config_option"]
    assert actor.options.current() == {"mode": "code"}


async def _sink(part: dict[str, Any]) -> None:
    pass
