"""Real agents through ``lmbridge stdio``, offline: Claude Code, Codex and Gemini CLI (pinned npm releases), each
configured in lmbridge's config file and pointed at a scripted fake model on 127.0.0.1.

Each test runs once per agent (the ``agent`` fixture). The editor side is ``bridge.editor.client``, as in the wire
tests; the model side is ``bridge.fakemodel``: the test scripts what the model answers, then asserts both what the
editor got and what the agent sent the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import first_chat_with_initialize, processes_with_marker
from fakes import ScriptedEditorModel, user

from bridge.fakemodel.server import FakeModel, call, parallel, say, stall

from .conftest import FIRST_TURN_TIMEOUT, TURN_TIMEOUT, LiveBridge
from .kits import AgentKit, model_name, requested_model, write_config

pytestmark = pytest.mark.interop

# Seconds: bounds only a broken bridge reaches (the fake model stalls forever; a stopped agent must go), never a
# measure of speed — cancel and shutdown latencies are benchmark figures (docs/performance.md).
CANCEL_BOUND = 60
SHUTDOWN_BOUND = 60

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def tool_results(answers: dict[str, str]) -> dict[str, Any]:
    """The editor's next user message: one text result per call id."""
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "callId": call_id, "content": [{"type": "text", "value": text}]}
            for call_id, text in answers.items()
        ],
    }


async def test_text_turn(live: LiveBridge) -> None:
    answer = "".join(f"Line {n} of a long answer, streamed by the fake model.\n" for n in range(1, 31))
    live.model.add(say(answer, chunks=40))

    result = await live.chat("What is the answer?")

    assert result.error is None, f"{result.error!r}" + live.evidence()
    assert result.stop_reason == "end_turn"
    assert result.text == answer
    # What the agent reports of usage (tokens, context fill, cost) reaches the editor in the answer.
    assert set(live.kit.usage_fields) <= set(result.usage or {}), result.usage
    # (How many parts depends on how the deltas arrived: the bridge merges text that arrives together.)
    assert result.parts and all(part["type"] == "text" for part in result.parts), result.parts
    assert "What is the answer?" in live.model.turns[0].text


async def test_cancel_mid_turn(live: LiveBridge) -> None:
    live.model.add(stall("Thinking it over"), say("Back after the cancel."))

    turn = await live.start("Think about it for a very long time.")
    with trio.fail_after(FIRST_TURN_TIMEOUT):
        await live.model.wait_for_turn(1)
        await turn.first_part.wait()
    turn.cancel()
    cancelled = await live.finish(turn, timeout=CANCEL_BOUND)
    assert cancelled.stop_reason == "cancelled", f"{cancelled!r}" + live.evidence()
    assert cancelled.text == "Thinking it over"

    after = await live.chat("Are you still there?")
    assert after.error is None, f"{after.error!r}" + live.evidence()
    assert after.stop_reason == "end_turn"
    assert after.text.endswith("Back after the cancel.")
    assert "Are you still there?" in live.model.turns[1].text


async def test_shutdown_leaves_no_process(live: LiveBridge, marker: str) -> None:
    live.model.add(stall("Working on it"))
    turn = await live.start("Start something long.")
    with trio.fail_after(FIRST_TURN_TIMEOUT):
        stalled = await live.model.wait_for_turn(1)
    assert processes_with_marker(marker), "the agent should be running"
    groups = live.agent_pids
    assert groups, live.evidence()

    await live.process.stdin.aclose()
    with trio.fail_after(SHUTDOWN_BOUND):
        result = await turn.result()
        code = await live.process.wait()
        await stalled.disconnected.wait()  # the agent's connection to the model went away with it

    assert result.stop_reason == "cancelled"
    assert code == 0, live.evidence()
    assert processes_with_marker(marker) == []
    assert not [pgid for pgid in groups if _group_alive(pgid)], "an agent process group is still alive"


async def test_editor_tool_round_trip(live: LiveBridge) -> None:
    kit, model = live.kit, live.model
    model.add(call(kit.editor_tool("get_weather", {"city": "Paris"})), say("It is sunny in Paris."))
    tools = [WEATHER_TOOL, live.permission_tool]

    first = await live.chat("What is the weather in Paris?", tools=tools)
    assert kit.offered_name("get_weather") in model.turns[0].tool_names
    assert first.error is None, f"{first.error!r}" + live.evidence()
    assert first.stop_reason == "tool_calls", live.evidence()
    [weather] = first.tool_calls
    assert weather["name"] == "get_weather" and weather["input"] == {"city": "Paris"}
    assert weather["callId"].startswith("lmb_")

    final = await live.chat(tool_results({weather["callId"]: "Sunny, 22 degrees"}), tools=tools)
    assert final.error is None, f"{final.error!r}" + live.evidence()
    assert final.stop_reason == "end_turn"
    assert final.text.endswith("It is sunny in Paris.")
    assert any("Sunny, 22 degrees" in result.text for result in model.turns[1].tool_results), model.turns[1].text
    # lmbridge's default for the agent: its shared HTTP listener, or the stdio relay where that is faster (Codex)
    agent_traces = "".join(p.read_text() for p in live.trace_dir.glob("*agent_*.ndjson"))
    assert ('"type":"http"' in agent_traces) == (kit.mcp_over == "http")
    assert ("shim.py" in agent_traces) == (kit.mcp_over == "stdio")


@pytest.mark.parametrize("editor_model", ["editor-gpt"], indirect=True)
async def test_the_agent_asks_the_editors_own_model(live: LiveBridge, editor_model: ScriptedEditorModel) -> None:
    """The editor shares a model; the agent's model calls lmbridge's ``editor_model`` tool (no editor tool offered in
    the request: the tool is there for the editor's models alone), the editor answers it, and the answer reaches the
    agent's model. Whether the agent asked for progress is recorded (docs/agents.md, "editor model tool")."""
    kit, model = live.kit, live.model
    model.add(
        call(kit.editor_tool("editor_model", {"prompt": "Say hello from the editor"})), say("The editor said it.")
    )

    result = await live.chat("Ask the editor's model to say hello.", tools=[live.permission_tool])
    assert result.error is None, f"{result.error!r}" + live.evidence()
    assert result.stop_reason == "end_turn", live.evidence()
    assert result.text.endswith("The editor said it."), live.evidence()
    assert kit.offered_name("editor_model") in model.turns[0].tool_names
    assert [call["modelId"] for call in editor_model.calls] == ["editor-gpt"]
    seen = " ".join(r.text for r in model.turns[1].tool_results)
    assert "editor-gpt heard: Say hello from the editor" in seen, seen
    calls = [
        json.loads(line)["msg"]
        for path in live.trace_dir.glob("*mcp*.ndjson")
        for line in path.read_text().splitlines()
        if '"tools/call"' in line
    ]
    asked_progress = any((c.get("params") or {}).get("_meta", {}).get("progressToken") is not None for c in calls)
    print(f"interop  {kit.id:<7} editor_model tool call: progressToken {'sent' if asked_progress else 'not sent'}")


@pytest.mark.parametrize("mcp_transport", ["stdio", "http"])
async def test_editor_tool_round_trip_over_either_transport(live: LiveBridge, mcp_transport: str) -> None:
    """The same round trip with ``mcp_transport`` chosen: over ``stdio`` the agent starts lmbridge's relay as a stdio
    MCP server, over ``http`` it connects to the shared HTTP listener (every other scenario runs on the default)."""
    kit, model = live.kit, live.model
    model.add(call(kit.editor_tool("get_weather", {"city": "Paris"})), say("It is sunny in Paris."))
    tools = [WEATHER_TOOL, live.permission_tool]

    first = await live.chat("What is the weather in Paris?", tools=tools)
    assert first.stop_reason == "tool_calls", f"{first!r}" + live.evidence()
    [weather] = first.tool_calls
    final = await live.chat(tool_results({weather["callId"]: "Sunny, 22 degrees"}), tools=tools)
    assert final.stop_reason == "end_turn" and final.text.endswith("It is sunny in Paris."), live.evidence()
    assert any("Sunny, 22 degrees" in result.text for result in model.turns[1].tool_results)
    agent_traces = "".join(p.read_text() for p in live.trace_dir.glob("*agent_*.ndjson"))
    assert ("shim.py" in agent_traces) == (mcp_transport == "stdio")
    assert ('"type":"http"' in agent_traces) == (mcp_transport == "http")


# A 2×2 red PNG.
RED_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg=="


async def test_a_pasted_image_reaches_the_model(live: LiveBridge) -> None:
    """An image part from the editor becomes an ACP image block (all three accept images) and the agent passes it
    to its model: the fake model's request carries the same bytes."""
    live.model.add(say("A small red square."))
    image = {"type": "data", "mimeType": "image/png", "data": RED_PNG}
    result = await live.chat({"role": "user", "content": [{"type": "text", "value": "What is this?"}, image]})
    assert result.error is None and result.text == "A small red square.", f"{result!r}" + live.evidence()
    assert RED_PNG in json.dumps(live.model.turns[0].body), live.evidence()
    prompts = [
        line["msg"]["params"]["prompt"]
        for path in live.trace_dir.glob("*agent_*.ndjson")
        for line in map(json.loads, path.read_text().splitlines())
        if line["dir"] == "out" and line["msg"].get("method") == "session/prompt"
    ]
    assert [block for block in prompts[0] if block["type"] == "image"] == [
        {"type": "image", "mimeType": "image/png", "data": RED_PNG}
    ]


async def test_a_session_option_chosen_by_the_client_is_set_before_the_prompt(live: LiveBridge) -> None:
    """options.modelOptions → session/set_config_option (Claude Code, Codex) or session/set_mode (Gemini CLI),
    answered before the prompt goes out; a model choice shows in the model's requests."""
    key, value = live.kit.session_option
    live.model.add(say("As you wish."), say("Still as you wish."))
    first = await live.chat("Hello?", modelOptions={key: value})
    # (Gemini CLI says "[MODE_UPDATE] plan" as text of the turn after the mode changes.)
    assert first.error is None and first.text.endswith("As you wish."), f"{first!r}" + live.evidence()
    second = await live.chat("Again?", modelOptions={key: value})  # already set: nothing is sent again
    assert second.error is None and second.text == "Still as you wish.", f"{second!r}" + live.evidence()
    lines = [
        line
        for path in live.trace_dir.glob("*agent_*.ndjson")
        for line in map(json.loads, path.read_text().splitlines())
    ]
    sets = [
        line["msg"]
        for line in lines
        if line["msg"].get("method") == live.kit.sets_option_with and key in line["msg"]["params"].get("configId", key)
    ]
    assert len(sets) == 1 and value in sets[0]["params"].values(), sets
    answer = next(line["msg"] for line in lines if line["dir"] == "in" and line["msg"].get("id") == sets[0]["id"])
    assert "error" not in answer, answer
    order = [line["msg"].get("method") for line in lines if line["dir"] == "out"]
    assert order.index(live.kit.sets_option_with) < order.index("session/prompt")
    if key == "model":
        assert all(model_name(value) in json.dumps(turn.body.get("model")) for turn in live.model.turns), [
            turn.body.get("model") for turn in live.model.turns
        ]


async def test_the_agents_models_options_and_commands_are_listed_and_an_entry_chooses_the_model(
    live: LiveBridge,
) -> None:
    """Once a session has shown them, lm/models lists what the agent offers (options; an ``agent/model`` entry per
    model; its slash commands) and says so with lm/modelsChanged; choosing an ``agent/model`` entry reaches the
    model's requests."""
    kit = live.kit
    key, _ = kit.session_option
    entry = f"{kit.id}/{kit.model_entry}"
    live.model.add(say("Hello."))
    assert (await live.chat("Hello?")).error is None, live.evidence()

    def complete(listed: dict[str, Any]) -> bool:
        own = listed.get(kit.id, {})
        options = [option["id"] for option in own.get("options", ())]
        return key in options and entry in listed and (not kit.announces_commands or bool(own.get("commands")))

    # An agent tells its options, models and commands in separate updates, each a lm/modelsChanged: listed again
    # after each one, until all are there.
    with trio.fail_after(TURN_TIMEOUT):
        while True:
            seen = live.client.models_changes
            listed = {m["id"]: m for m in await live.client.models()}
            if complete(listed):
                break
            await live.client.wait_models_changed(seen)
    own = listed[kit.id]
    commands = [command["name"] for command in own.get("commands", ())]
    assert (len(commands) > 0) == kit.announces_commands, (commands, own)
    assert "model" not in [option["id"] for option in listed[entry].get("options", ())]
    live.model.add(say("Chosen."))
    chosen = await live.client.chat(entry, [user("Which model?")])
    assert chosen.error is None and chosen.text.endswith("Chosen."), f"{chosen!r}" + live.evidence()
    assert model_name(kit.model_entry) in requested_model(live.model.turns[-1]), requested_model(live.model.turns[-1])


async def test_a_slash_command_typed_by_the_user_runs_as_the_agents_command(live: LiveBridge) -> None:
    """ACP agents take a command as prompt text: lmbridge passes ``/name`` through untouched, and the agent runs it:
    answers it itself (Claude Code's /context, Gemini CLI's /about: no model request) or expands it into a prompt
    for the model (OpenCode's /init)."""
    if live.kit.slash_command is None:
        pytest.skip(f"{live.kit.id} announces no slash commands")
    command, evidence, asks_model = live.kit.slash_command
    if asks_model:
        live.model.add(say("Done."))
    result = await live.chat(command)
    assert result.error is None, f"{result!r}" + live.evidence()
    if asks_model:
        (turn,) = live.model.turns
        assert evidence in json.dumps(turn.body["messages"][-1]) and result.text == "Done.", live.evidence()
    else:
        assert result.text.startswith(evidence), f"{result!r}" + live.evidence()
        assert live.model.turns == [], "the command went to the model as text"


@pytest.mark.parametrize("prestart", [True])
async def test_prestarted_agent_serves_the_first_chat(live: LiveBridge) -> None:
    """With ``prestart`` the agent starts when the editor connects; the first chat (with tools, as editors send
    them) uses that process."""
    await live.client.models()  # by now lmbridge has applied the editor's initialize
    assert "prestarting an agent" in live.stderr, live.evidence()
    live.model.add(say("Ready when you are."))

    result = await live.chat("Are you there?", tools=[WEATHER_TOOL, live.permission_tool])

    assert result.stop_reason == "end_turn" and result.text == "Ready when you are.", f"{result!r}" + live.evidence()
    assert len(live.agent_pids) == 1 and live.stderr.count("agent ready") == 1, live.evidence()


async def test_a_first_chat_sent_with_initialize_runs_on_the_agent_started_early(
    installed: Any, kit: AgentKit, model: FakeModel, tmp_path: Path, marker: str
) -> None:
    """An editor woken by a chat sends it along with initialize: lmbridge starts the agent before importing the
    rest of itself, and that very process (npm launchers, native binaries) answers the chat."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    table = kit.agent_table(model_url=model.base_url, home=home, project=project, marker=marker)
    config = write_config(tmp_path / "lmbridge.toml", {kit.id: table})
    model.add(say("Up early."))

    messages, stderr, code = await first_chat_with_initialize(
        config, kit.id, "Are you up?", workspace=project, timeout=FIRST_TURN_TIMEOUT
    )

    [answer] = [m for m in messages if m.get("id") == 1]
    text = "".join(m["params"]["part"].get("value", "") for m in messages if m.get("method") == "lm/part")
    assert answer.get("result", {}).get("stopReason") == "end_turn", f"{answer}\n{stderr[-3000:]}"
    assert text.endswith("Up early."), text
    assert "early=True" in stderr and stderr.count("agent process started") == 1, stderr[-3000:]
    assert code == 0
    assert processes_with_marker(marker) == [], "the early agent outlived lmbridge"


async def test_editor_tool_calls_are_not_echoed_as_activity(live: LiveBridge) -> None:
    kit, model = live.kit, live.model
    model.add(call(kit.editor_tool("get_weather", {"city": "Paris"})), say("It is sunny in Paris."))
    tools = [WEATHER_TOOL, live.permission_tool]

    first = await live.chat("What is the weather in Paris?", tools=tools)
    [weather] = first.tool_calls
    final = await live.chat(tool_results({weather["callId"]: "Sunny, 22 degrees"}), tools=tools)

    assert final.stop_reason == "end_turn"
    assert [part["type"] for part in first.parts] == ["tool_call"]
    assert final.text == "It is sunny in Paris."


@pytest.mark.parametrize("mcp_transport", ["http", "stdio"])
async def test_the_agents_mcp_session_is_served_without_the_mcp_sdk(live: LiveBridge) -> None:
    """lmbridge answers an agent's MCP itself, over HTTP (``mcp_synthetic.early``) and over the stdio relay
    (``mcp_synthetic.stdio``): the opening (Claude Code asks ``server/discover`` first and is told to use
    ``initialize``), the event stream, the tool calls — a first one right after start (Codex makes it at machine
    speed), a later one in the same session — and the session's end. The MCP SDK, half a second of CPU, is never
    imported."""
    kit, model = live.kit, live.model
    model.add(call(kit.editor_tool("get_weather", {"city": "Paris"})), say("Sunny in Paris."))
    tools = [WEATHER_TOOL, live.permission_tool]

    first = await live.chat("What is the weather in Paris?", tools=tools)
    [paris] = first.tool_calls
    assert (await live.chat(tool_results({paris["callId"]: "Sunny"}), tools=tools)).text.endswith("Sunny in Paris.")

    model.add(call(kit.editor_tool("get_weather", {"city": "Oslo"})), say("Rain in Oslo."))
    second = await live.chat("And in Oslo?", tools=tools)
    [oslo] = second.tool_calls
    assert oslo["input"] == {"city": "Oslo"}, second.tool_calls
    final = await live.chat(tool_results({oslo["callId"]: "Rain"}), tools=tools)
    assert final.error is None and final.text.endswith("Rain in Oslo."), f"{final!r}" + live.evidence()
    assert len(live.agent_pids) == 1  # one session throughout: nothing was reopened
    assert "MCP endpoints listening" in live.stderr  # lmbridge's debug log is on: the next lines would be in it
    assert "an MCP request needs the SDK" not in live.stderr, live.evidence()  # over HTTP
    assert "an MCP message needs the SDK" not in live.stderr, live.evidence()  # over the relay
    assert "MCP SDK imported" not in live.stderr, live.evidence()


# How long lmbridge gathers parallel calls into one response: the defaults (50 ms, 15 ms idle) suit a calm machine,
# and the agents' calls come milliseconds apart — on a machine busy with other work, tens of milliseconds. Here the
# gaps a batch tolerates are wide, so that what is checked is the grouping itself, never how fast the machine is (a
# machine running two test suites beside stress-ng showed Codex 2 s between two calls of one response).
WIDE_BATCHES = {"tool_batch_window": 30.0, "tool_batch_idle": 5.0}


@pytest.mark.parametrize(
    ("cities", "mcp_transport", "sessions"),
    [
        (("Paris", "Oslo"), "auto", WIDE_BATCHES),
        (("Paris", "Oslo", "Rome"), "auto", WIDE_BATCHES),
        (("Paris", "Oslo", "Rome"), "stdio", WIDE_BATCHES),
        (("Paris", "Oslo", "Rome"), "http", WIDE_BATCHES),
    ],
    ids=["two", "three", "three-over-the-stdio-relay", "three-over-http"],
)
async def test_parallel_editor_tools(live: LiveBridge, cities: tuple[str, ...]) -> None:
    """Calls the model made together reach the editor together (Claude Code, Codex: the tools carry readOnlyHint),
    or one per response (Gemini CLI runs MCP calls one after the other; OpenCode mostly does); results go back in
    reverse order. Over the stdio relay Codex's calls arrive before its reports of them: still one batch."""
    kit, model = live.kit, live.model
    model.add(parallel(*(kit.editor_tool("get_weather", {"city": city}) for city in cities)), say("Weather told."))
    tools = [WEATHER_TOOL, live.permission_tool]
    weather = {city: f"Weather in {city}: fine" for city in cities}

    result = await live.chat(f"What is the weather in {', '.join(cities)}?", tools=tools)
    responses: list[list[str]] = []
    while result.stop_reason == "tool_calls" and sum(map(len, responses)) < len(cities):
        assert {c["name"] for c in result.tool_calls} == {"get_weather"}, result.tool_calls
        responses.append([c["input"]["city"] for c in result.tool_calls])
        answers = {c["callId"]: weather[c["input"]["city"]] for c in reversed(result.tool_calls)}
        result = await live.chat(tool_results(answers), tools=tools)

    assert result.error is None, f"{result.error!r}" + live.evidence()
    if kit.mcp_calls == "together":
        assert [sorted(r) for r in responses] == [sorted(cities)], f"{responses}" + live.evidence()
    elif kit.mcp_calls == "one_by_one":
        assert sorted(responses) == sorted([city] for city in cities), responses
    else:  # each call reaches the editor once, in whatever grouping
        assert sorted(city for r in responses for city in r) == sorted(cities), responses
    assert result.stop_reason == "end_turn", live.evidence()
    assert result.text.endswith("Weather told.")
    seen = " ".join(r.text for turn in model.turns[1:] for r in turn.tool_results)
    assert all(weather[city] in seen for city in cities), seen


async def test_parallel_editor_tools_beside_a_shell_permission(live: LiveBridge) -> None:
    """A parallel pair of editor tools and a permission request for the agent's own shell tool in one model
    response: the permission still reaches the editor, and nothing waits on anything else."""
    kit, model = live.kit, live.model
    paris, oslo = kit.editor_tool("get_weather", {"city": "Paris"}), kit.editor_tool("get_weather", {"city": "Oslo"})
    model.add(parallel(paris, oslo, kit.shell("touch mixed.txt")), say("All done."))
    tools = [WEATHER_TOOL, live.permission_tool]
    permission = live.permission_tool["name"]

    result = await live.chat("Weather in Paris and Oslo, and create mixed.txt.", tools=tools)
    asked: list[str] = []
    for _round in range(4):
        if result.stop_reason != "tool_calls":
            break
        answers = {}
        for call_part in result.tool_calls:
            if call_part["name"] == permission:
                asked.append("permission")
                answers[call_part["callId"]] = "allow"
            else:
                asked.append(call_part["input"]["city"])
                answers[call_part["callId"]] = f"Weather in {call_part['input']['city']}: fine"
        result = await live.chat(tool_results(answers), tools=tools)

    assert result.error is None, f"{result.error!r}" + live.evidence()
    assert sorted(asked) == ["Oslo", "Paris", "permission"], f"{asked}" + live.evidence()
    assert result.stop_reason in ("end_turn", kit.rejected_shell_stop_reason), live.evidence()
    assert (live.project / "mixed.txt").exists(), live.evidence()


async def test_permission_approve(live: LiveBridge) -> None:
    kit, model = live.kit, live.model
    model.add(call(kit.shell("touch approved.txt")), say("Created approved.txt."))
    tools = [live.permission_tool]

    first = await live.chat("Please create approved.txt.", tools=tools)
    ask = _permission_call(live, first)
    assert "touch approved.txt" in json.dumps(ask["input"])
    assert {option["kind"] for option in ask["input"]["options"]} >= {"allow_once", "reject_once"}
    assert not (live.project / "approved.txt").exists(), "ran before the user answered"

    final = await live.chat(tool_results({ask["callId"]: "allow"}), tools=tools)
    assert final.error is None, f"{final.error!r}" + live.evidence()
    assert final.stop_reason == "end_turn", live.evidence()
    assert final.text.endswith("Created approved.txt.")
    assert (live.project / "approved.txt").exists()
    assert model.turns[1].tool_results, "the command's outcome did not reach the model"


async def test_permission_reject(live: LiveBridge) -> None:
    kit, model = live.kit, live.model
    model.add(call(kit.shell("touch rejected.txt")), say("Understood, I did not create it."))
    tools = [live.permission_tool]

    first = await live.chat("Please create rejected.txt.", tools=tools)
    ask = _permission_call(live, first)

    final = await live.chat(tool_results({ask["callId"]: "reject"}), tools=tools)
    assert final.error is None, f"{final.error!r}" + live.evidence()
    assert not (live.project / "rejected.txt").exists()
    assert final.stop_reason == kit.rejected_shell_stop_reason, live.evidence()
    if kit.model_told_of_rejection:  # the model was told and answered
        assert final.text.endswith("Understood, I did not create it.")
        assert model.turns[1].tool_results
    else:  # Codex, OpenCode: rejecting ends the turn; the model never hears back
        assert len(model.turns) == 1


async def test_command_start_line_names_the_command(live: LiveBridge) -> None:
    live.model.add(call(live.kit.shell("touch started.txt")), say("Done."))

    lines = (await _run_allowing(live, "Please create started.txt.")).splitlines()
    assert any(line.startswith("✓") and "touch started.txt" in line for line in lines), lines
    starts = [line for line in lines if line.startswith("▸")]
    assert all("touch started.txt" in line for line in starts), lines


@pytest.fixture
def reports_failed_commands(kit: AgentKit) -> None:
    if kit.id == "gemini":
        pytest.skip("gemini-cli reports a failing command as completed; the exit code is only in its output")


@pytest.mark.usefixtures("reports_failed_commands")
async def test_failed_command_line_says_why(live: LiveBridge) -> None:
    live.model.add(call(live.kit.shell("ls /nonexistent-interop-dir")), say("That folder does not exist."))

    text = await _run_allowing(live, "Please list /nonexistent-interop-dir.")

    [failed] = [line for line in text.splitlines() if line.startswith("✗")]
    assert "No such file or directory" in failed or "exit code 2" in failed.lower(), failed


async def _run_allowing(live: LiveBridge, prompt: str) -> str:
    """Send ``prompt``, allow every permission the agent asks (Codex asks none for what it deems read-only) and
    return the text of all the responses."""
    tools = [live.permission_tool]
    result = await live.chat(prompt, tools=tools)
    text = result.text
    while result.stop_reason == "tool_calls":
        ask = _permission_call(live, result)
        result = await live.chat(tool_results({ask["callId"]: "allow"}), tools=tools)
        text += result.text
    assert result.error is None and result.stop_reason == "end_turn", f"{result!r}" + live.evidence()
    return text


def _permission_call(live: LiveBridge, result: Any) -> dict[str, Any]:
    assert result.error is None, f"{result.error!r}" + live.evidence()
    assert result.stop_reason == "tool_calls", f"{result!r}" + live.evidence()
    [ask] = result.tool_calls
    assert ask["name"] == live.permission_tool["name"]
    return ask


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
