"""The harness's sans-IO parts: scenario parsing and fake tool answers, schema validation (including what the ACP
SDK would silently replace), conformance checks on hand-written wires, transcripts' normalisation and redaction,
and the replay's script."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bridge.harness.checks import run_checks
from bridge.harness.replay import _canonical, _difference, build_script
from bridge.harness.scenario import ScenarioError, parse_scenario, render_template
from bridge.harness.traces import AcpLog, WireEvent
from bridge.harness.transcript import build_transcript, load_transcript, write_transcript
from bridge.harness.validation import load_json_schema, validate

SCHEMA = Path("/work/shared/reference/acp/schema.json")


def test_tool_answers_are_templated_per_case_and_in_sequence() -> None:
    scenario = parse_scenario("""
[[tools]]
name = "weather"
result = "sunny in {city} ({input})"
[[tools.cases]]
when = { city = "Atlantis" }
error = "no {city}"
[[tools]]
name = "ticket"
results = ["T-1", "T-2 for {who.name}"]
[[turns]]
user = "hi"
""")
    weather, ticket = scenario.tools
    assert weather.answer({"city": "Paris"}, 0) == ('sunny in Paris ({"city": "Paris"})', False)
    assert weather.answer({"city": "Atlantis"}, 1) == ("no Atlantis", True)
    assert ticket.answer({}, 0) == ("T-1", False)
    assert ticket.answer({"who": {"name": "Ada"}}, 1) == ("T-2 for Ada", False)
    assert ticket.answer({}, 5) == ("T-2 for {who.name}", False)  # unknown placeholders stay
    assert render_template("{name}: {n}", "count", {"n": 3}) == "count: 3"


def test_permission_answers_by_title_then_turn_then_scenario() -> None:
    scenario = parse_scenario("""
[permissions]
answer = "Allow_Always"
by_title = { "rm -rf /" = "deny" }
[[turns]]
user = "a"
[[turns]]
user = "b"
permissions = "never"
""")
    first, second = scenario.turns
    assert scenario.permission_answer_for(first, "ls") == "always"
    assert scenario.permission_answer_for(first, "rm -rf /") == "reject"
    assert scenario.permission_answer_for(second, "ls") == "never"
    assert first.label == "turn 1 (a)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[turns]]\nuser = "x"\nexpect.updates = "plan"\n', "turns[0].expect.updates: must be a list, got str"),
        ('[[turns]]\nuser = "x"\ncancel = {}\n', "turns[0].cancel: give on_text, on_part or after_ms"),
        ('[[turns]]\nuser = "x"\ncancel = { on_part = "image" }\n', "turns[0].cancel.on_part: must be one of"),
        ('[timeouts]\nidle = 0\n[[turns]]\nuser = "x"\n', "timeouts.idle: must be a positive number"),
        ('[[tools]]\nname = "a"\nresult = "x"\nerror = "y"\n[[turns]]\nuser = "x"\n', "tools[0]: give one of result"),
        ('[agent]\nid = "a"\ncommand = "b"\n[[turns]]\nuser = "x"\n', "agent: needs exactly one of 'id'"),
        ('[conformance]\nchecks = ["speed"]\n[[turns]]\nuser = "x"\n', "conformance.checks: unknown check 'speed'"),
        ('name = "nothing"\n', "turns: a scenario needs at least one [[turns]] table"),
    ],
)
def test_scenario_mistakes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(text, Path("s.toml"))
    assert str(error.value).startswith(f"s.toml: {message}"), str(error.value)


def test_conformance_skip_removes_from_all() -> None:
    scenario = parse_scenario('[conformance]\nskip = ["cancel", "initialize"]\n[[turns]]\nuser = "x"\n')
    assert scenario.checks == ("session-new", "stop-reason", "update-schema", "tool-calls")


def test_the_sdk_models_and_what_they_would_silently_replace() -> None:
    def update(**fields: Any) -> dict[str, Any]:
        return {"sessionId": "s", "update": fields}

    assert (
        validate(
            "SessionNotification", update(sessionUpdate="agent_message_chunk", content={"type": "text", "text": "hi"})
        )
        == []
    )
    assert validate("SessionNotification", update(sessionUpdate="agent_message_chunk", content={"type": "text"})) == [
        'update.content.text: Field required (got {"type": "text"})'
    ]
    assert validate("SessionNotification", update(sessionUpdate="tool_call_update", toolCallId="a", status="done")) == [
        'update.status: "done" is not a valid value (the SDK would read it as null)'
    ]
    assert validate(
        "SessionNotification", update(sessionUpdate="plan", entries=[{"content": "a", "status": "pending"}])
    ) == ["update.entries: 1 of its 1 items are invalid (the SDK would drop them)"]
    # Unknown keys are extensions, not errors.
    assert (
        validate(
            "SessionNotification",
            update(sessionUpdate="agent_message_chunk", content={"type": "text", "text": "x"}, vendorThing=1),
        )
        == []
    )


@pytest.mark.skipif(not SCHEMA.exists(), reason="the ACP JSON schema is not on this machine")
def test_the_json_schema_names_the_allowed_values() -> None:
    schema = load_json_schema(str(SCHEMA))
    problems = schema.validate(
        "SessionNotification",
        {"sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": "a", "title": "t", "kind": "weird"}},
    )
    assert problems == [
        'update.kind: "weird" is not one of "read", "edit", "delete", "move", "search", "execute", '
        '"think", "fetch", "switch_mode", "other"'
    ]


class Wire:
    """A hand-written agent wire, as lmbridge would trace it."""

    def __init__(self) -> None:
        self.log = AcpLog("agent:x")
        self.turn = 1

    def add(self, direction: str, message: dict[str, Any]) -> None:
        self.log.feed(
            WireEvent(len(self.log.events) * 0.01, "agent:x", direction, {"jsonrpc": "2.0", **message}, turn=self.turn)
        )

    def update(self, **fields: Any) -> None:
        self.add("in", {"method": "session/update", "params": {"sessionId": "s1", "update": fields}})

    def opened(self) -> None:
        self.add("out", {"id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
        self.add("in", {"id": 1, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        self.add("out", {"id": 2, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}})
        self.add("in", {"id": 2, "result": {"sessionId": "s1"}})

    def check(self, *names: str) -> list[str]:
        results = run_checks(names, self.log, file="f.toml", turn_labels={1: "turn 1 (go)"})
        return [f"{f.where}: {f.what}: expected {f.expected}; got {f.got}" for r in results for f in r.failures]


def test_tool_call_statuses_must_move_forward() -> None:
    wire = Wire()
    wire.opened()
    wire.add("out", {"id": 3, "method": "session/prompt", "params": {"sessionId": "s1", "prompt": []}})
    wire.update(sessionUpdate="tool_call", toolCallId="t1", title="build", status="in_progress")
    wire.update(sessionUpdate="tool_call_update", toolCallId="t1", status="completed")
    wire.update(sessionUpdate="tool_call_update", toolCallId="t1", status="in_progress")
    wire.add("in", {"id": 3, "result": {"stopReason": "end_turn"}})
    assert wire.check("tool-calls") == [
        "turn 1 (go): check tool-calls: expected tool call 't1' ('build') statuses to move forward: pending → "
        "in_progress → completed | failed; got completed → in_progress",
        "turn 1 (go): check tool-calls: expected tool call 't1' ('build') to reach completed or failed before its "
        "prompt ended; got still in_progress when session/prompt answered 'end_turn' (an orphan)",
    ]


def test_cancelled_without_a_cancel_and_a_permission_left_pending_at_cancel() -> None:
    wire = Wire()
    wire.opened()
    wire.add("out", {"id": 3, "method": "session/prompt", "params": {"sessionId": "s1", "prompt": []}})
    wire.add("in", {"id": 3, "result": {"stopReason": "cancelled"}})
    wire.add("out", {"id": 4, "method": "session/prompt", "params": {"sessionId": "s1", "prompt": []}})
    wire.add(
        "in",
        {
            "id": 0,
            "method": "session/request_permission",
            "params": {
                "sessionId": "s1",
                "toolCall": {"toolCallId": "p"},
                "options": [{"optionId": "a", "name": "A", "kind": "allow_once"}],
            },
        },
    )
    wire.add("out", {"method": "session/cancel", "params": {"sessionId": "s1"}})
    wire.add("out", {"id": 0, "result": {"outcome": {"outcome": "selected", "optionId": "a"}}})
    wire.add("in", {"id": 4, "result": {"stopReason": "cancelled"}})
    assert wire.check("stop-reason", "cancel") == [
        "turn 1 (go): check stop-reason: expected stopReason 'cancelled' only after session/cancel; got 'cancelled' "
        "for a prompt that was not cancelled",
        "turn 1 (go): check cancel: expected the pending permission request answered 'cancelled'; got 'selected'",
    ]


def test_an_agent_restart_starts_a_new_id_space() -> None:
    wire = Wire()
    wire.opened()
    wire.add("out", {"id": 3, "method": "session/prompt", "params": {"sessionId": "s1", "prompt": []}})
    wire.opened()  # the agent crashed; lmbridge started it again, its request ids start at 1 again
    wire.add("out", {"id": 3, "method": "session/prompt", "params": {"sessionId": "s1", "prompt": []}})
    wire.add("in", {"id": 3, "result": {"stopReason": "end_turn"}})
    first, second = wire.log.requests("session/prompt")
    assert not first.answered and second.answered
    assert wire.check("stop-reason") == [
        "turn 1 (go): check stop-reason: expected an answer to session/prompt; got no answer: the agent process "
        "exited (lmbridge started it again)"
    ]


def _event(ts: float, conn: str, direction: str, msg: Any) -> WireEvent:
    return WireEvent(ts, conn, direction, msg)


def _recorded_run() -> list[WireEvent]:
    servers = [
        {
            "name": "editor",
            "command": "/usr/bin/python3",
            "args": ["shim.py"],
            "env": [
                {"name": "LMBRIDGE_MCP_SOCKET", "value": "/run/user/1/lmbridge-x/ab.sock"},
                {"name": "LMBRIDGE_MCP_TOKEN", "value": "***"},
            ],
        }
    ]
    call_id = "lmb_" + "ab" * 16
    return [
        _event(
            100.0,
            "agent:a",
            "out",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "session/new",
                "params": {"cwd": "/tmp/work-1/workspace", "mcpServers": servers},
            },
        ),
        _event(100.1, "agent:a", "in", {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "sess-7f3a9c"}}),
        _event(
            100.2,
            "agent:a",
            "out",
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/prompt",
                "params": {"sessionId": "sess-7f3a9c", "prompt": [{"type": "text", "text": "hi"}]},
            },
        ),
        _event(
            100.3,
            "mcp:0123456789ab",
            "in",
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "tools/call",
                "params": {"name": "read", "arguments": {}, "headers": {"Authorization": "Bearer abc"}},
            },
        ),
        _event(
            100.4,
            "editor",
            "out",
            {
                "jsonrpc": "2.0",
                "method": "lm/part",
                "params": {"requestId": 2, "part": {"type": "tool_call", "callId": call_id, "name": "read"}},
            },
        ),
        _event(100.5, "mcp:0123456789ab", "out", {"jsonrpc": "2.0", "id": 0, "result": {"content": []}}),
        _event(
            100.6,
            "agent:a",
            "in",
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "sess-7f3a9c",
                    "update": {
                        "sessionUpdate": "tool_call",
                        "toolCallId": "toolu_XYZ",
                        "title": "key sk-live-123456 in sess-7f3a9c",
                    },
                },
            },
        ),
        _event(100.7, "agent:a", "in", {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}),
    ]


def test_transcripts_are_normalised_and_redacted(tmp_path: Path) -> None:
    header, *lines = build_transcript(
        _recorded_run(), scenario="s", secrets={"API_KEY": "sk-live-123456", "X": "1"}, paths={"/tmp/work-1": "<work>"}
    )
    assert header == {
        "lmbridgeTranscript": 1,
        "scenario": "s",
        "agent": "agent:a",
        "agents": ["agent:a"],
        "mcp": {"mcp:1": {"agent": "agent:a", "session": "session-1", "server": "editor"}},
        "redacted": ["API_KEY", "Authorization", "LMBRIDGE_MCP_SOCKET", "LMBRIDGE_MCP_TOKEN"],
    }
    assert [(line["seq"], line["t"], line["conn"]) for line in lines][:4] == [
        (1, 0.0, "agent:a"),
        (2, 0.1, "agent:a"),
        (3, 0.2, "agent:a"),
        (4, 0.3, "mcp:1"),
    ]
    text = json.dumps(lines)
    assert "sess-7f3a9c" not in text and "toolu_XYZ" not in text and "sk-live" not in text and "ab.sock" not in text
    assert lines[0]["msg"]["params"]["cwd"] == "<work>/workspace"
    assert lines[0]["msg"]["params"]["mcpServers"][0]["env"][0] == {
        "name": "LMBRIDGE_MCP_SOCKET",
        "value": "<redacted>",
    }
    assert lines[3]["msg"]["params"]["headers"] == {"Authorization": "<redacted>"}
    assert lines[4]["msg"]["params"]["part"]["callId"] == "lmb_1"
    assert lines[6]["msg"]["params"]["update"]["toolCallId"] == "tool-1"
    assert lines[6]["msg"]["params"]["update"]["title"] == "key <redacted:API_KEY> in session-1"
    # Written and read back; raw trace files are read (and normalised) the same way.
    write_transcript([header, *lines], tmp_path / "t.ndjson")
    assert load_transcript([tmp_path / "t.ndjson"]) == (header, lines)
    raw = tmp_path / "trace.ndjson"
    raw.write_text(
        "".join(json.dumps({"ts": e.ts, "conn": e.conn, "dir": e.dir, "msg": e.msg}) + "\n" for e in _recorded_run())
    )
    raw_header, *raw_lines = load_transcript([raw])[0], *load_transcript([raw])[1]
    assert raw_header["mcp"] == header["mcp"] and len(raw_lines) == len(lines)


def test_the_replay_script_expects_what_the_client_sent_and_emits_what_the_agent_sent() -> None:
    header, *lines = build_transcript(_recorded_run())
    script, mcp = build_script(header, lines)
    assert mcp == {"mcp:1": {"agent": "agent:a", "session": "session-1", "server": "editor"}}
    assert [(item.conn, item.emit, item.kind, item.gating) for item in script] == [
        ("acp", False, "request", True),
        ("acp", True, "response", False),
        ("acp", False, "request", True),
        ("mcp:1", True, "request", False),
        ("mcp:1", False, "response", True),
        ("acp", True, "notification", False),
        ("acp", True, "response", False),
    ]
    with pytest.raises(ValueError, match="no agent 'b' in the transcript"):
        build_script(header, lines, "b")


def test_replay_compares_requests_without_run_specific_parts() -> None:
    recorded = {"sessionId": "session-1", "cwd": "<workspace>", "prompt": [{"type": "text", "text": "lmb_3 hi"}]}
    live = {
        "sessionId": "session-1",
        "cwd": os.getcwd(),
        "prompt": [{"type": "text", "text": "lmb_" + "f" * 32 + " hi"}],
    }
    assert _difference(_canonical(recorded), _canonical(live)) is None
    live["prompt"][0]["text"] = "bye"
    assert (
        _difference(_canonical(recorded), _canonical(live), "params")
        == 'params.prompt.0.text: "bye", recorded "lmb_* hi"'
    )


def test_a_recording_with_an_agent_restart_splits_into_starts() -> None:
    def line(seq: int, conn: str, direction: str, msg: dict[str, Any]) -> dict[str, Any]:
        return {"seq": seq, "t": seq / 10, "conn": conn, "dir": direction, "msg": {"jsonrpc": "2.0", **msg}}

    lines = [
        line(1, "agent:a", "out", {"id": 1, "method": "initialize", "params": {}}),
        line(2, "agent:a", "in", {"id": 1, "result": {"protocolVersion": 1}}),
        line(3, "agent:a", "out", {"id": 2, "method": "session/new", "params": {"mcpServers": [{"name": "editor"}]}}),
        line(4, "agent:a", "in", {"id": 2, "result": {"sessionId": "session-1"}}),
        line(5, "mcp:1", "in", {"id": 0, "method": "initialize", "params": {}}),
        line(6, "agent:a", "out", {"id": 3, "method": "session/prompt", "params": {}}),
        line(7, "agent:a", "in", {"method": "session/update", "params": {}}),
        line(8, "agent:a", "out", {"id": 1, "method": "initialize", "params": {}}),  # the agent exited: a new start
        line(9, "mcp:1", "out", {"id": 0, "result": {}}),  # late, to the old connection
        line(10, "agent:a", "in", {"id": 1, "result": {"protocolVersion": 1}}),
    ]
    header = {"agents": ["agent:a"], "mcp": {"mcp:1": {"agent": "agent:a", "session": "session-1"}}}
    from bridge.harness.replay import split_generations

    first, second = split_generations(build_script(header, lines)[0])
    assert [item.seq for item in first] == [1, 2, 3, 4, 5, 6, 7]
    assert [item.seq for item in second] == [8, 10]


def test_the_demo_agents_misbehaviour_directives_parse() -> None:
    from bridge.demo.directives import ScriptError, Step, parse_script

    assert parse_script("/badstop\n/badstop done\n/ignorecancel\n/orphan cargo build\n/straycall\n/badupdate") == [
        Step("badstop", "finished"),
        Step("badstop", "done"),
        Step("ignorecancel"),
        Step("orphan", "cargo build"),
        Step("straycall"),
        Step("badupdate"),
    ]
    with pytest.raises(ScriptError, match="/orphan needs a title"):
        parse_script("/orphan")
