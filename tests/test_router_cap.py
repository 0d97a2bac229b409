"""The session cap against every interleaving of new requests, turn ends and the closes they cause: the router on a
fake agent and a mock clock, driven by hypothesis. No turn ends ``cancelled`` when nobody cancelled it, each gets
its own conversation's answer, and the cap is overshot only by sessions that a request is waiting on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from fakes import FakeAgent, FakeAgentProvider, assistant, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session.capacity import CAP_REASON, CapacityMeter, choose_evictions
from session.router import RouterSettings, SessionRouter, TurnRequest
from session.store import SessionStore
from wire.cancel import CancelRequest
from wire.observe.logs import get_logger

CONVERSATIONS = 5
TURNS = 3
CAP = 2


@dataclass
class Conversation:
    n: int
    history: list[dict[str, Any]] = field(default_factory=list)
    in_flight: bool = False
    outcomes: list[tuple[str | None, str]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.outcomes) == TURNS

    def next_text(self) -> str:
        return f"conversation {self.n} turn {len(self.outcomes)}"


async def answer(agent: FakeAgent, session_id: str) -> None:
    """The agent answers a running prompt with the text of its last block (the request's newest user message)."""
    prompt = [p for m, p in agent.calls if m == "session/prompt" and p["sessionId"] == session_id][-1]["prompt"]
    text = {"type": "text", "text": "re: " + prompt[-1]["text"]}
    await agent.endpoints[session_id].on_agent_update(
        {"sessionId": session_id, "update": {"sessionUpdate": "agent_message_chunk", "content": text}}
    )
    agent.finish(session_id, "end_turn")


async def run_schedule(schedule: list[tuple[str, int]]) -> tuple[list[Conversation], int]:
    agent = FakeAgent()
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(max_sessions=CAP), log=get_logger())
    conversations = [Conversation(n) for n in range(CONVERSATIONS)]
    overshoot = 0

    async def ask(conversation: Conversation) -> None:
        text = conversation.next_text()
        conversation.history.append(user(text))
        parts: list[dict[str, Any]] = []

        async def sink(part: dict[str, Any]) -> None:
            parts.append(part)

        request = TurnRequest("fake", list(conversation.history), "/tmp")
        outcome = await router.chat(request, sink, CancelRequest())
        said = "".join(p["value"] for p in parts if p["type"] == "text")
        conversation.outcomes.append((outcome.stop_reason, said))
        conversation.history.append(assistant(said))
        conversation.in_flight = False

    def note_sessions() -> None:
        nonlocal overshoot
        waiting = sum(c.in_flight for c in conversations)
        overshoot = max(overshoot, len(router.sessions) - max(CAP, waiting))

    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        for op, index in [*schedule, *[("drain", 0)] * (CONVERSATIONS * TURNS * 2)]:
            if op == "request" or op == "drain":
                for conversation in conversations[index:] + conversations[:index]:
                    if not conversation.in_flight and not conversation.done:
                        conversation.in_flight = True
                        nursery.start_soon(ask, conversation)
                        if op == "request":
                            break
            if op == "answer" or op == "drain":
                running = sorted(agent.running)
                for session_id in running[index % len(running) :][:1] if op == "answer" and running else running:
                    await answer(agent, session_id)
            await trio.testing.wait_all_tasks_blocked()
            note_sessions()
            if all(c.done for c in conversations):
                break
        nursery.cancel_scope.cancel()
    return conversations, overshoot


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["request", "answer"]), st.integers(0, 9)), max_size=60))
def test_no_turn_is_lost_to_the_cap_in_any_interleaving(schedule: list[tuple[str, int]]) -> None:
    conversations, overshoot = trio.run(run_schedule, schedule, clock=trio.testing.MockClock())
    for conversation in conversations:
        assert conversation.done, conversation
        for turn, (stop_reason, said) in enumerate(conversation.outcomes):
            assert stop_reason == "end_turn", (conversation.n, turn, conversation.outcomes)
            assert said == f"re: conversation {conversation.n} turn {turn}", (conversation.n, turn, said)
    assert overshoot <= 0


@dataclass
class Session:
    name: str
    last_used: float
    evictable: bool = True


def test_evictions_take_the_least_recently_used_that_nobody_waits_on() -> None:
    sessions = [Session("a", 3), Session("b", 1, evictable=False), Session("c", 2), Session("d", 4)]
    assert [s.name for s in choose_evictions(sessions, open_count=5, limit=3)] == ["c", "a"]
    assert choose_evictions(sessions, open_count=3, limit=3) == []
    # Not enough evictable sessions: the cap is overshot by the rest, never met by closing a busy one.
    busy = [Session("x", 1, evictable=False), Session("y", 2, evictable=False)]
    assert choose_evictions(busy, open_count=2, limit=1) == []


def test_the_meter_counts_closes_and_conversations_that_come_back_and_reports_once_a_minute() -> None:
    meter = CapacityMeter(memory=3)
    assert not meter.watching and meter.report(1000.0) is None
    meter.closed([b"a1", b"a2"], now=10.0)
    meter.closed([b"b1", b"b2"], now=20.0)  # a1 is forgotten: memory 3
    assert meter.watching
    assert not meter.request_without_session([b"x", b"a1"], now=30.0)
    assert meter.request_without_session([b"x", b"b1", b"y"], now=31.0)
    assert not meter.request_without_session([b"b1"], now=32.0)  # a conversation counts once
    assert meter.report(69.0) is None  # the window opened at 10 s
    summary = meter.report(70.0)
    assert summary is not None and (summary.closed, summary.came_back, summary.closed_total) == (2, 1, 2)
    assert meter.report(200.0) is None  # nothing since
    meter.closed([b"c1"], now=300.0)
    later = meter.report(360.0)
    assert later is not None and (later.closed, later.came_back, later.closed_total, later.came_back_total) == (
        1,
        0,
        3,
        1,
    )
    assert CAP_REASON == "session cap reached"


async def _one_turn(router: SessionRouter, agent: FakeAgent, history: list[dict[str, Any]]) -> Any:
    parts: list[dict[str, Any]] = []

    async def sink(part: dict[str, Any]) -> None:
        parts.append(part)

    async with trio.open_nursery() as nursery:

        async def answer_it() -> None:
            while not agent.running:
                agent.prompt_started = trio.Event()
                await agent.prompt_started.wait()
            await answer(agent, next(iter(agent.running)))

        nursery.start_soon(answer_it)
        return await router.chat(TurnRequest("fake", history, "/tmp"), sink, CancelRequest()), parts


async def test_a_request_takes_back_a_session_whose_close_has_not_begun(nursery: trio.Nursery) -> None:
    agent = FakeAgent()
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(max_sessions=1), log=get_logger())
    await nursery.start(router.run)
    history = [user("hello")]
    outcome, _ = await _one_turn(router, agent, history)
    (session,) = router.sessions
    router._close(session, CAP_REASON)  # the cap chose it; its actor has not run since
    history += [assistant("re: hello"), user("again")]
    outcome, parts = await _one_turn(router, agent, history)
    assert outcome.stop_reason == "end_turn" and parts == [{"type": "text", "value": "re: again"}]
    assert router.sessions == [session] and agent.method_count("session/new") == 1
    assert agent.method_count("session/close") == 0 and router.capacity.taken_back_total == 1


async def test_a_request_for_a_session_being_closed_waits_for_the_close_then_resumes_it(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Reopening the ACP session while the agent is being told to close it would lose it: the request waits.
    agent = FakeAgent()
    agent.info.can_resume = True
    store = SessionStore(tmp_path / "sessions.json", log=get_logger())
    router = SessionRouter(FakeAgentProvider(agent), RouterSettings(max_sessions=1, store=store), log=get_logger())
    await nursery.start(router.run)
    history = [user("hello")]
    await _one_turn(router, agent, history)
    (session,) = router.sessions
    closing = trio.Event()
    close_may_end = trio.Event()
    plain_request = agent.request

    async def slow_close(method: str, params: dict[str, Any]) -> Any:
        if method == "session/close":
            closing.set()
            await close_may_end.wait()
        return await plain_request(method, params)

    agent.request = slow_close  # type: ignore[method-assign]
    router._close(session, CAP_REASON)
    await closing.wait()  # the actor is done; the agent is being told
    history += [assistant("re: hello"), user("again")]
    results: list[Any] = []

    async def next_turn() -> None:
        results.append(await _one_turn(router, agent, history))

    nursery.start_soon(next_turn)
    await trio.testing.wait_all_tasks_blocked()
    assert results == [] and agent.method_count("session/resume") == 0  # waiting for the close to finish
    close_may_end.set()
    while not results:
        await trio.testing.wait_all_tasks_blocked()
    ((outcome, parts),) = results
    assert outcome.stop_reason == "end_turn" and parts == [{"type": "text", "value": "re: again"}]
    methods = [m for m, _ in agent.calls if m.startswith("session/") and m != "session/prompt"]
    assert methods == ["session/new", "session/close", "session/resume"]
    assert [p for m, p in agent.calls if m == "session/prompt"][-1]["prompt"] == [{"type": "text", "text": "again"}]
