"""Agents that think with the editor's models, as real agents run them (offline): the agent is configured
``model_source = "editor"``, lmbridge points its model API at itself, and every model request becomes an
``editor/chat`` on the test editor, whose shared model passes it on to the fake model (``editor_served``).

The scenarios are the suite's own (``test_real_agents``), run again on that path: the fake model sees what the
agent sent, by way of lmbridge and the editor; each test then checks that the editor's model answered. Agents
whose model API lmbridge does not speak yet are listed in ``NOT_YET`` with the reason (docs/agents.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from conftest import HANG

from bridge.fakemodel.server import Call, say, stall

from .conftest import FIRST_TURN_TIMEOUT, LiveBridge
from .editor_served import ForwardingEditorModel
from .kits import KITS, MCP_SERVER, AgentKit, CodexKit
from .test_real_agents import (  # noqa: F401  (collected here again, on the editor's model)
    test_cancel_mid_turn,
    test_editor_tool_round_trip,
    test_permission_approve,
    test_text_turn,
)

pytestmark = pytest.mark.interop

NOT_YET = {
    "gemini": "it speaks only Google's generateContent API, which lmbridge does not serve",
}


@pytest.fixture(params=[agent for agent in KITS if agent not in NOT_YET])
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class _CodexOnEditorModel(CodexKit):
    """Codex's MCP tools are namespace tools in its Responses requests; lmbridge offers them to the editor's model
    joined (``mcp__editor__get_weather``), which is how the fake model sees and calls them on this path."""

    def editor_tool(self, name: str, arguments: dict[str, Any]) -> Call:
        return Call(self.offered_name(name), arguments)

    def offered_name(self, name: str) -> str:
        return f"mcp__{MCP_SERVER}__{name}"


@pytest.fixture
def kit(agent: str) -> AgentKit:
    known = KITS[agent]
    return _CodexOnEditorModel(**_fields(known)) if agent == "codex" else known


def _fields(kit: AgentKit) -> dict[str, Any]:
    return {field.name: getattr(kit, field.name) for field in dataclasses.fields(kit)}


@pytest.fixture
def model_source() -> str:
    return "editor"


@pytest.fixture(autouse=True)
def _answered_by_the_editor(live: LiveBridge, via_editor: ForwardingEditorModel | None) -> Iterator[None]:
    yield
    assert via_editor is not None
    turns = live.model.turns
    assert turns, "the fake model got no request" + live.evidence()
    # Every request the fake model answered came from the editor's model provider (the anthropic SDK), none from
    # the agent directly: the agent's model API pointed at lmbridge.
    senders = {request.headers.get("user-agent", "") for request in turns}
    assert all(sender.startswith("AsyncAnthropic/Python") for sender in senders), senders
    assert len(via_editor.calls) >= len(turns), (len(via_editor.calls), len(turns))
    assert "agent on the editor's models" in live.stderr


async def test_a_cancel_reaches_the_editors_model(live: LiveBridge, via_editor: ForwardingEditorModel) -> None:
    live.model.add(stall("Thinking it over"), say("Back after the cancel."))
    turn = await live.start("Think about it for a very long time.")
    with trio.fail_after(FIRST_TURN_TIMEOUT):
        await turn.first_part.wait()
    turn.cancel()
    cancelled = await live.finish(turn)
    assert cancelled.stop_reason == "cancelled", f"{cancelled!r}" + live.evidence()
    with trio.fail_after(HANG):  # the agent closed its model request: lmbridge sent the editor $/cancelRequest
        while via_editor.cancelled == 0:
            await trio.sleep(0.05)
    after = await live.chat("Are you still there?")
    assert after.text.endswith("Back after the cancel."), f"{after!r}" + live.evidence()
