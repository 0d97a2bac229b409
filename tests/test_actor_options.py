"""The session actor sets the client's session options before a prompt (a fake agent link, no process)."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
import trio.testing
from conftest import HANG

from session.actor import SessionActor
from session.machine import EditorTurn, SessionMachine, TurnOptions
from session.options import SessionOptions
from wire.cancel import CancelRequest

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


class _Log:
    def bind(self, **_: Any) -> _Log:
        return self

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Reply:
    def __init__(self) -> None:
        self.answer = trio.Event()
        self.value: Any = {}

    async def result(self) -> Any:
        await self.answer.wait()
        if isinstance(self.value, Exception):
            raise self.value
        return self.value

    def on_answer(self, callback: Any, on_lost: Any = None) -> None:
        pass  # prompts are never answered in these tests


class FakeAgent:
    """Records what the actor sends; each request is answered when the test says so."""

    id = "fake"

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.replies: list[_Reply] = []
        self.request_came = trio.Event()

    def send_request(self, method: str, params: dict[str, Any]) -> _Reply:
        self.sent.append((method, params))
        self.replies.append(_Reply())
        self.request_came.set()
        return self.replies[-1]

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self.sent.append((method, params))

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def detach(self, session_id: str) -> None:
        pass


def _actor(agent: FakeAgent) -> SessionActor:
    machine = SessionMachine(new_call_id=lambda: "lmb_1")
    actor = SessionActor(agent, "s1", machine, log=_Log())
    actor.options = SessionOptions.from_session(OPENED)
    return actor


async def test_the_prompt_waits_for_the_option_to_be_answered() -> None:
    agent = FakeAgent()
    actor = _actor(agent)
    turn = EditorTurn(1, [{"type": "text", "text": "hi"}], options=TurnOptions(settings=(("mode", "plan"),)))
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        nursery.start_soon(actor.run_turn, turn, _sink, CancelRequest())
        await agent.request_came.wait()
        assert [method for method, _ in agent.sent] == ["session/set_config_option"]  # no prompt yet
        agent.request_came = trio.Event()
        agent.replies[0].answer.set()
        await agent.request_came.wait()
        assert [method for method, _ in agent.sent] == ["session/set_config_option", "session/prompt"]
        assert actor.options.current() == {"mode": "plan"}
        nursery.cancel_scope.cancel()


async def test_a_cancel_while_the_option_is_being_set_means_no_prompt_at_all() -> None:
    agent = FakeAgent()
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
        agent.replies[0].answer.set()
        with trio.fail_after(HANG):
            while not outcomes:
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert outcomes[0].stop_reason == "cancelled"
    assert [method for method, _ in agent.sent] == ["session/set_config_option"]  # neither prompt nor cancel


async def test_the_agents_refusal_fails_the_turn_quoting_it_and_no_prompt_goes_out() -> None:
    from wire.errors import AgentReplyError, RpcError

    agent = FakeAgent()
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
        agent.replies[0].value = RpcError(-32602, "plan mode is not available")
        agent.replies[0].answer.set()
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
