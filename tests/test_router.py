"""The router and session actors in-process, against a fake agent, on a mock clock: idle TTL, the LRU cap,
concurrent first requests, drain timeouts and agent exits — without a single real sleep."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from fakes import (
    FakeAgent,
    FakeAgentProvider,
    RouterEditor,
    answer_next_prompt,
    assistant,
    start_router,
    user,
)

from session.catalog import AgentCatalog
from session.router import RouterSettings, SessionRouter, TurnRequest
from wire.cancel import CancelRequest
from wire.observe.logs import get_logger


async def test_idle_sessions_are_closed_after_the_ttl(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    agent = FakeAgent()
    router, editor = await start_router(nursery, agent, idle_ttl=60)
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent, "end_turn", "hi")
        outcome, parts = await editor.chat([user("hello")])
    assert outcome.stop_reason == "end_turn" and parts == [{"type": "text", "value": "hi"}]
    assert len(router.sessions) == 1
    await trio.sleep(59)
    assert len(router.sessions) == 1
    await trio.sleep(30)
    assert router.sessions == []
    assert agent.method_count("session/close") == 1
    # The conversation comes back: a new session, told the conversation so far.
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent)
        await editor.chat([user("hello"), assistant("hi"), user("again")])
    prompt = [p for m, p in agent.calls if m == "session/prompt"][-1]["prompt"]
    assert prompt[0]["text"].startswith("[lmbridge] The conversation so far") and prompt[1]["text"] == "again"


async def test_the_lru_cap_closes_the_least_recently_used_idle_session(nursery: trio.Nursery, autojump_clock) -> None:
    agent = FakeAgent()
    router, editor = await start_router(nursery, agent, max_sessions=2)
    for name in ("a", "b", "c"):
        async with trio.open_nursery() as turn:
            turn.start_soon(answer_next_prompt, agent)
            await editor.chat([user(f"conversation {name}")])
        await trio.sleep(1)
    closed = [p["sessionId"] for m, p in agent.calls if m == "session/close"]
    assert closed == ["s1"]
    assert sorted(s.session_id for s in router.sessions) == ["s2", "s3"]


async def test_concurrent_first_requests_of_one_conversation_share_a_session(
    nursery: trio.Nursery, autojump_clock
) -> None:
    agent = FakeAgent()
    agent.session_new_gate = trio.Event()
    _router, editor = await start_router(nursery, agent)
    results: list[Any] = []

    async def answer_every_prompt() -> None:
        while True:
            await answer_next_prompt(agent)

    async with trio.open_nursery() as requests:

        async def run() -> None:
            results.append(await editor.chat([user("same start")]))

        nursery.start_soon(answer_every_prompt)
        requests.start_soon(run)
        requests.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        agent.session_new_gate.set()
    # Both were answered on one session: the first either finished or was superseded by the second.
    assert agent.method_count("session/new") == 1
    stop_reasons = sorted(outcome.stop_reason for outcome, _ in results)
    assert stop_reasons in (["cancelled", "end_turn"], ["end_turn", "end_turn"])


async def test_an_agent_that_ignores_cancel_loses_its_session_and_the_turn_moves_on(
    nursery: trio.Nursery, autojump_clock
) -> None:
    agent = FakeAgent(honours_cancel=False)
    _router, editor = await start_router(nursery, agent, cancel_drain_timeout=10)
    cancel = CancelRequest()
    first: list[Any] = []

    async def run_first() -> None:
        first.append(await editor.chat([user("long job")], cancel))

    nursery.start_soon(run_first)
    await agent.prompt_started.wait()
    cancel.set()
    await trio.testing.wait_all_tasks_blocked()
    assert first[0][0].stop_reason == "cancelled"  # answered at once, not after the drain
    never_answered = agent.running.pop("s1")  # the agent keeps working on it, forever
    agent.prompt_started = trio.Event()
    async with trio.open_nursery() as turn:
        # The next turn waits for the drain, which never comes; after 10 s it gets a new session.
        turn.start_soon(answer_next_prompt, agent)
        outcome, _ = await editor.chat([user("long job"), assistant(""), user("next")])
    assert outcome.stop_reason == "end_turn"
    assert agent.method_count("session/new") == 2
    assert trio.current_time() >= 10
    assert not never_answered[0].is_set()


async def test_an_agent_error_ends_the_turn_and_the_session_survives(nursery: trio.Nursery, autojump_clock) -> None:
    agent = FakeAgent()
    _router, editor = await start_router(nursery, agent)

    async def fail() -> None:
        await agent.prompt_started.wait()
        (session_id,) = list(agent.running)
        done, result = agent.running.pop(session_id)
        result["error"] = RuntimeError("model overloaded")
        done.set()

    async with trio.open_nursery() as turn:
        turn.start_soon(fail)
        outcome, _ = await editor.chat([user("hi")])
    assert isinstance(outcome.error, RuntimeError)
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent)
        outcome, _ = await editor.chat([user("hi"), user("again")])
    assert outcome.stop_reason == "end_turn" and agent.method_count("session/new") == 1


async def test_an_agent_exit_fails_the_turn_and_the_next_request_starts_afresh(
    nursery: trio.Nursery, autojump_clock
) -> None:
    agent = FakeAgent()
    router, editor = await start_router(nursery, agent)
    from bridge.acp.process import AgentExitedError

    async def crash() -> None:
        await agent.prompt_started.wait()
        (session_id,) = list(agent.running)
        agent.endpoints[session_id].on_agent_exit(AgentExitedError("fake", 1, "boom"))

    async with trio.open_nursery() as turn:
        turn.start_soon(crash)
        outcome, _ = await editor.chat([user("hi")])
    assert outcome.error is not None and outcome.error.code == -32002
    assert router.sessions == []
    agent.running.clear()
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent)
        outcome, _ = await editor.chat([user("hi"), user("again")])
    assert outcome.stop_reason == "end_turn" and agent.method_count("session/new") == 2


class _Recorded:
    """A logger that notes, with each line, how many prompts the agent had been sent by then."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent
        self.lines: list[tuple[str, int]] = []

    def bind(self, **_: Any) -> _Recorded:
        return self

    def _note(self, event: str, *args: Any, **fields: Any) -> None:
        self.lines.append((event, self.agent.method_count("session/prompt")))

    debug = info = warning = error = exception = _note


async def test_a_new_sessions_first_prompt_goes_out_before_its_session_opened_line(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # The line (a log write, ~0.1 ms) is off the path of the first chat: it follows the actor's first actions.
    agent = FakeAgent()
    log = _Recorded(agent)
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(), log=log)
    await nursery.start(router.run)
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent)
        outcome, _ = await RouterEditor(router).chat([user("hello")])
    assert outcome.stop_reason == "end_turn"
    assert ("session opened", 1) in log.lines and ("session opened", 0) not in log.lines


async def test_a_sessions_offer_is_learned_after_its_first_prompt_and_early_updates_keep_their_order(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # What session/new offers changes the editor's model list (a notification, a log line, the state file): that
    # follows the first prompt. An offer update the agent sent before answering session/new still lands on top.
    modes = {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"}]}
    grown = {"sessionUpdate": "config_option_update", "configOptions": [
        {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
         "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]}]}  # fmt: skip

    class OfferingAgent(FakeAgent):
        def send_request(self, method: str, params: dict[str, Any]) -> Any:
            reply = super().send_request(method, params)
            if method != "session/new":
                return reply
            opened = reply._result

            async def with_modes() -> Any:
                return {**await opened(), "modes": modes}

            reply._result = with_modes
            return reply

        def attach(self, session_id: str, endpoint: Any) -> list[dict[str, Any]]:
            super().attach(session_id, endpoint)
            return [{"sessionId": session_id, "update": grown}]  # came before the session/new answer

    agent = OfferingAgent()
    prompts_when_changed: list[int] = []
    catalog = AgentCatalog(on_change=lambda _agent: prompts_when_changed.append(agent.method_count("session/prompt")))
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(), log=get_logger(), catalog=catalog)
    await nursery.start(router.run)
    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent)
        outcome, _ = await RouterEditor(router).chat([user("hello")])
    assert outcome.stop_reason == "end_turn"
    assert prompts_when_changed == [1, 1]  # the session's offer, then the update: both after the prompt went out
    assert [option.id for option in catalog.offer("fake").options] == ["effort", "mode"]


async def test_the_outcome_hook_hears_a_turn_end_before_it_returns_with_its_history_recorded(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # A front answers its client from the hook (the editor's answer right behind the turn's last part). The client
    # may send its next request at once: by then the history the turn leaves must be the one it is matched against.
    from session.history import MatchKind

    agent = FakeAgent()
    router, _ = await start_router(nursery, agent)
    history = [user("hello")]
    parts: list[dict[str, Any]] = []
    heard: list[tuple[Any, ...]] = []
    returned = False

    async def sink(part: dict[str, Any]) -> None:
        parts.append(part)

    def on_outcome(outcome: Any) -> None:
        follow_up = [*history, assistant("hi there"), user("and then?")]
        matched = router._indexes[("fake", "", "")].match(follow_up)  # what a request arriving now would meet
        heard.append((outcome.stop_reason, list(parts), returned, matched.kind))

    async with trio.open_nursery() as turn:
        turn.start_soon(answer_next_prompt, agent, "end_turn", "hi there")
        outcome = await router.chat(TurnRequest("fake", history, "/tmp"), sink, CancelRequest(), on_outcome)
        returned = True
    assert outcome.stop_reason == "end_turn"
    assert heard == [("end_turn", [{"type": "text", "value": "hi there"}], False, MatchKind.CONTINUATION)]
