"""Models through the wire: lm/models lists each agent's models and options once a session has shown them,
lm/modelsChanged says when, an ``agent/model`` entry chooses the model, and a restarted lmbridge remembers."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import HANG, Bridge, open_bridge
from fakes import user

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


async def test_an_agents_models_options_and_commands_become_entries(bridge: Bridge) -> None:
    by_id = {m["id"]: m for m in await bridge.client.models()}
    assert "scripted/demo-large" not in by_id and "options" not in by_id["scripted"]  # not learned yet

    seen = bridge.client.models_changes
    result = await bridge.chat("/options")
    assert result.text == 'options: effort="medium" mode="code" model="demo-small" verbose=false\n'
    with trio.fail_after(HANG):
        await bridge.client.wait_models_changed(seen)

    by_id = {m["id"]: m for m in await bridge.client.models()}
    assert by_id["scripted/demo-large"]["name"] == "Scripted test agent: Demo Large"
    assert by_id["scripted/demo-large"]["agent"] == "scripted"
    assert [o["id"] for o in by_id["scripted"]["options"]] == ["model", "mode", "effort", "verbose"]
    assert [o["id"] for o in by_id["scripted/demo-large"]["options"]] == ["mode", "effort", "verbose"]
    effort = by_id["scripted/demo-small"]["options"][1]
    assert effort["category"] == "thought_level" and effort["default"] == "medium"
    assert [v["value"] for v in effort["values"]] == ["low", "medium", "high"]
    commands = {c["name"]: c for c in by_id["scripted"]["commands"]}
    assert commands["say"] == {
        "name": "say",
        "description": "stream TEXT (and a newline) in several chunks",
        "hint": "TEXT",
    }
    assert "badstop" not in commands  # the demo's misbehaviours are not offered

    # The entry chooses the model, the client's options the rest; switching between turns keeps the session.
    first = [user("/options")]
    large = await bridge.chat(first, model="scripted/demo-large", modelOptions={"effort": "high"})
    assert large.text == 'options: effort="high" mode="code" model="demo-large" verbose=false\n'
    history = [*first, {"role": "assistant", "content": [{"type": "text", "value": large.text}]}, user("/recall")]
    recalled = await bridge.chat(history, model="scripted/demo-small")
    assert recalled.error is None and "/options" in recalled.text

    unknown = await bridge.chat("hi", model="scripted/demo-huge")
    assert unknown.error is not None and unknown.error.code == -32602
    assert "scripted/demo-large" in unknown.error.message


async def test_a_restarted_lmbridge_lists_what_the_agent_offered(tmp_path: Path, agents_toml: Path) -> None:
    async with open_bridge(tmp_path, agents_toml) as first:
        seen = first.client.models_changes
        assert (await first.chat("hi")).error is None
        with trio.fail_after(HANG):
            await first.client.wait_models_changed(seen)
    async with open_bridge(tmp_path, agents_toml) as second:
        ids = [m["id"] for m in await second.client.models()]
        assert ids[ids.index("scripted") : ids.index("scripted") + 3] == [
            "scripted", "scripted/demo-small", "scripted/demo-large"]  # fmt: skip
    # Another command line for the agent: what it offered then is not listed.
    agents_toml.write_text(
        agents_toml.read_text().replace('args = ["-m", "bridge.demo"]', 'args = ["-m", "bridge.demo", "--x"]', 1)
    )
    async with open_bridge(tmp_path, agents_toml) as third:
        assert "scripted/demo-large" not in [m["id"] for m in await third.client.models()]
