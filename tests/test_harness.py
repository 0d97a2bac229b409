"""The ACP agent test harness through the real wire: ``lmbridge test`` and ``lmbridge replay`` run as subprocesses
(each running ``lmbridge stdio`` and an agent as theirs), and the pytest plugin from a fresh directory."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import trio

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples" / "scenarios").glob("*.toml"))


async def lmbridge(*args: str, cwd: Path = REPO, timeout: float = 120) -> tuple[int, str, str]:
    with trio.fail_after(timeout):
        process = await trio.run_process(
            [sys.executable, "-m", "bridge", *args], capture_stdout=True, capture_stderr=True, check=False, cwd=str(cwd)
        )
    return process.returncode, process.stdout.decode(), process.stderr.decode()


def report(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("scenario", EXAMPLES, ids=[p.stem for p in EXAMPLES])
async def test_each_example_scenario_passes_against_the_demo_agent(scenario: Path, tmp_path: Path) -> None:
    code, out, err = await lmbridge(
        "test", str(scenario), "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml")
    )
    assert code == 0, out + err
    assert out.startswith("agent: demo (built-in demo agent)\nPASS")
    result = report(tmp_path / "r.json")
    assert result["passed"] is True
    (one,) = result["scenarios"]
    assert one["failures"] == [] and one["notRun"] == []
    junit = ET.parse(tmp_path / "r.xml").getroot()
    assert junit.get("failures") == "0"
    assert int(junit.get("tests")) == len(one["turns"]) + len(one["checks"])


MISBEHAVIOURS = [
    # file, the expectation that fails, what the failure says was expected, what it says came
    ("wrong-stop-reason", "check stop-reason", "an ACP stop reason", "stopReason 'finished', which ACP does not have"),
    (
        "ignores-cancel",
        "check cancel",
        "stopReason 'cancelled' after session/cancel",
        "stopReason 'end_turn': the agent ignored the cancel",
    ),
    (
        "orphan-tool-call",
        "check tool-calls",
        "('compile') to reach completed or failed before its prompt ended",
        "still in_progress when session/prompt answered 'end_turn' (an orphan)",
    ),
    (
        "unknown-tool-call",
        "check tool-calls",
        "tool_call_update only for a toolCallId that a tool_call",
        "tool_call_update for unknown toolCallId 'stray-",
    ),
    (
        "invalid-update",
        "check update-schema",
        "session/update #2 (agent_message_chunk) to be a valid SessionNotification",
        'update.content.text: Field required (got {"type": "text"})',
    ),
    (
        "slow-first-update",
        "timeout (first_update)",
        "within 0.5 s ([timeouts] first_update)",
        "no update from the agent within 0.5 s of session/prompt",
    ),
]


@pytest.mark.parametrize(("name", "what", "expected", "got"), MISBEHAVIOURS, ids=[m[0] for m in MISBEHAVIOURS])
async def test_each_demo_misbehaviour_is_caught_with_a_clear_message(
    name: str, what: str, expected: str, got: str, tmp_path: Path
) -> None:
    path = f"examples/misbehaviours/{name}.toml"
    code, out, err = await lmbridge("test", path, "--json", str(tmp_path / "r.json"))
    assert code == 1, out + err
    (failure,) = report(tmp_path / "r.json")["scenarios"][0]["failures"]
    assert failure["what"] == what and failure["where"].startswith("turn 1 ("), failure
    assert expected in failure["expected"] and got in failure["got"], failure
    # The console says the same: where (file, turn, expectation), what was expected, what came.
    assert f"✗ {path}: {failure['where']}: {what}\n" in out
    assert f"expected: {failure['expected']}\n" in out and f"got:      {failure['got']}\n" in out


async def test_the_command_line_selects_checks(tmp_path: Path) -> None:
    code, out, _ = await lmbridge(
        "test",
        "examples/misbehaviours/orphan-tool-call.toml",
        "--check",
        "stop-reason,cancel",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert code == 0, out
    checks = {c["name"]: c["status"] for c in report(tmp_path / "r.json")["scenarios"][0]["checks"]}
    assert checks == {"stop-reason": "passed", "cancel": "skipped"}


RECORDED = """
name = "recorded"
[editor]
thinking = true
[[tools]]
name = "get_weather"
input_schema = { type = "object", properties = { city = { type = "string" } } }
result = "sunny in {city}"
[[turns]]
user = "/say hello there\\n/think hmm\\n/plan a; b"
[[turns]]
user = '/tools get_weather {"city": "Paris"} | get_weather {"city": "Oslo"}'
[[turns]]
user = "/run build\\n/say built"
[[turns]]
user = "/permission rm -rf build"
permissions = "reject"
[[turns]]
user = "/permission deploy\\n/say deployed"
permissions = "never"
[[turns]]
user = "/stream 3\\n/sleep 5000\\n/say never"
cancel = { on_text = "3 " }
[[turns]]
user = "/recall"
[[turns]]
user = "/say going down\\n/crash"
expect.error = -32002
[[turns]]
user = "/say back again"
new_conversation = true
[conformance]
skip = ["stop-reason"]
"""


def _views(turns: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What the editor saw of each turn, its parallel tool calls as a set: each call is an MCP request of its own, so
    they reach lmbridge (and are numbered, ``call-1``, ...) in whichever order they arrive — in a live run and in its
    replay alike."""
    views = []
    for turn in turns:
        rounds = []
        for answer in turn["editorView"]:
            calls = [part for part in answer["parts"] if part["type"] == "tool_call"]
            shown = sorted(json.dumps({**call, "callId": None}, sort_keys=True) for call in calls)
            rounds.append({**answer, "parts": [p for p in answer["parts"] if p["type"] != "tool_call"], "calls": shown})
        views.append(rounds)
    return views


async def test_a_recorded_session_replays_to_the_same_editor_visible_output(tmp_path: Path) -> None:
    scenario = tmp_path / "recorded.toml"
    scenario.write_text(RECORDED)
    code, out, err = await lmbridge(
        "test", str(scenario), "--record", str(tmp_path / "rec"), "--json", str(tmp_path / "live.json")
    )
    assert code == 0, out + err
    transcript = tmp_path / "rec" / "recorded.ndjson"
    text = transcript.read_text()
    header, *lines = map(json.loads, text.splitlines())
    assert header["agent"] == "agent:demo" and header["mcp"] == {
        "mcp:1": {"agent": "agent:demo", "session": "session-1", "server": "editor"}
    }
    assert {line["conn"] for line in lines} == {"editor", "agent:demo", "mcp:1"}
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    # Normalised and redacted: no run-specific ids, paths or secrets are left.
    assert not re.search(r"demo-[0-9a-f]{12}|lmb_[0-9a-f]{32}|run-[0-9a-f]{8}|\.sock|/tmp/", text)
    # The demo agent takes HTTP MCP servers: lmbridge's endpoint, its token redacted and its URL normalised.
    assert '"name":"Authorization","value":"<redacted>"' in text and "<workspace>" in text
    assert '"url":"<lmbridge-mcp-url>"' in text and "127.0.0.1" not in text

    replay = f"{sys.executable} -m bridge replay {transcript}"
    code, out, err = await lmbridge(
        "test",
        str(scenario),
        "--agent-cmd",
        replay,
        "--json",
        str(tmp_path / "replay.json"),
        "--artifacts",
        str(tmp_path / "art"),
    )
    assert code == 0, out + err
    live = report(tmp_path / "live.json")["scenarios"][0]["turns"]
    replayed = report(tmp_path / "replay.json")["scenarios"][0]["turns"]
    assert _views(replayed) == _views(live)
    assert [t["updates"] for t in replayed] == [t["updates"] for t in live]
    assert "tool get_weather returned: sunny in Oslo" in live[1]["text"] and live[5]["stopReason"] == "cancelled"
    assert live[7]["error"]["code"] == -32002 and live[8]["text"] == "back again\n"
    log = (tmp_path / "art" / "recorded" / "lmbridge.stderr").read_text()
    assert "differs from the recording" not in log
    # The agent crashed in turn 8 and lmbridge started it again: so did the replay, each start playing its part.
    assert "playing start 1 of 2" in log and "the recorded agent exited here" in log and "playing start 2 of 2" in log
    assert "the recording is played out" in log


async def test_replay_matches_requests_by_method_and_order_and_strict_refuses_differences(tmp_path: Path) -> None:
    recorded, changed = tmp_path / "hello.toml", tmp_path / "changed.toml"
    recorded.write_text('[[turns]]\nuser = "/say hello"\n[[turns]]\nuser = "/say again"\n')
    changed.write_text('[[turns]]\nuser = "/say hello"\n[[turns]]\nuser = "/say something else"\n')
    code, out, err = await lmbridge("test", str(recorded), "--record", str(tmp_path / "rec"))
    assert code == 0, out + err
    transcript = str(tmp_path / "rec" / "hello.ndjson")

    # Tolerant: the second prompt differs, the recorded answer comes anyway, and the difference is logged.
    code, out, err = await lmbridge(
        "test",
        str(changed),
        "--agent-cmd",
        f"{sys.executable} -m bridge replay {transcript}",
        "--json",
        str(tmp_path / "tolerant.json"),
        "--artifacts",
        str(tmp_path / "art"),
    )
    assert code == 0, out + err
    assert report(tmp_path / "tolerant.json")["scenarios"][0]["turns"][1]["text"] == "again\n"
    assert (
        "session/prompt #2 differs from the recording at params.prompt.0.text"
        in (tmp_path / "art" / "changed" / "lmbridge.stderr").read_text()
    )

    # Strict: the agent answers the differing prompt with an error, which the editor gets.
    code, out, err = await lmbridge(
        "test",
        str(changed),
        "--agent-cmd",
        f"{sys.executable} -m bridge replay --strict {transcript}",
        "--json",
        str(tmp_path / "strict.json"),
    )
    assert code == 1
    (failure,) = [f for f in report(tmp_path / "strict.json")["scenarios"][0]["failures"] if f["what"] == "no error"]
    assert failure["where"] == "turn 2 (/say something else)"
    assert "-32003" in failure["got"] and "differs from the recording" in failure["got"]


async def test_phase_timeouts_name_the_phase_and_stop_the_scenario(tmp_path: Path) -> None:
    silent = tmp_path / "silent.toml"
    silent.write_text(f"""
[agent]
command = {json.dumps(sys.executable)}
args = ["-c", "import time; time.sleep(60)"]
[timeouts]
initialize = 1
[[turns]]
user = "hello"
[[turns]]
user = "never sent"
""")
    idle = tmp_path / "idle.toml"
    idle.write_text('[timeouts]\nidle = 0.5\n[[turns]]\nuser = "/say working on it\\n/sleep 4000\\n/say done"\n')
    code, out, err = await lmbridge("test", str(silent), str(idle), "--json", str(tmp_path / "r.json"))
    assert code == 1, out + err
    first, second = report(tmp_path / "r.json")["scenarios"]
    # The turn stops at the phase; the initialize check (lmbridge's request, and its own probe) says so too.
    assert [f["what"] for f in first["failures"]] == ["timeout (initialize)", "check initialize", "check initialize"]
    assert first["failures"][0]["got"] == "the agent did not answer initialize within 1 s"
    assert [f["got"] for f in first["failures"][1:]] == ["no answer", "no answer within 1 s"]
    assert first["notRun"] == [2]
    assert [f["what"] for f in second["failures"]] == ["timeout (idle)"]
    assert second["failures"][0]["got"].startswith("the agent sent nothing for 0.5 s while the editor waited")


async def test_mistakes_in_scenario_files_exit_2_naming_the_file_and_the_key(tmp_path: Path) -> None:
    cases = {
        "unknown.toml": ('[[turns]]\nuser = "hi"\nexpect.txt = "hi"\n', "turns[0].expect.txt: unknown key"),
        "reason.toml": (
            '[[turns]]\nuser = "hi"\nexpect.stop_reason = "done"\n',
            "turns[0].expect.stop_reason: unknown stop reason 'done'",
        ),
        "toml.toml": ("[[turns]\n", "invalid TOML"),
        "tools.toml": ('[[turns]]\nuser = "hi"\ntools = ["nope"]\n', "turns[0].tools: unknown tool(s) nope"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        code, _out, err = await lmbridge("test", str(tmp_path / name))
        assert code == 2 and f"{tmp_path / name}: {message}" in err, (name, err)
    code, _, err = await lmbridge("test", "--check", "speed", str(tmp_path / "unknown.toml"))
    assert code == 2 and "lmbridge test: --check: unknown check 'speed'" in err


FRESH_TEST = """
import pytest

WEATHER = {"name": "get_weather", "description": "Weather", "inputSchema": {"type": "object"}}


def test_a_tool_round_trip(acp_agent):
    agent = acp_agent(tools=[WEATHER])
    reply = agent.chat('/tool get_weather {"city": "Paris"}')
    assert reply.stop_reason == "tool_calls" and reply.tool_calls[0]["input"] == {"city": "Paris"}
    reply = agent.tool_results({"get_weather": "sunny"})
    assert reply.text == "tool get_weather returned: sunny\\n"
    assert "agent_message_chunk" in reply.update_kinds
    reply = agent.chat("/run build")
    assert reply.update_kinds == ["tool_call", "tool_call_update", "tool_call_update"]
    assert len(agent.updates) > 3 and agent.wire.requests("session/prompt")
    agent.assert_conformant()
    agent.chat("/orphan compile")
    with pytest.raises(AssertionError, match=r"check tool-calls \\(lm/chat #4\\).*an orphan"):
        agent.assert_conformant("tool-calls")


def test_a_scenario_file(acp_agent, tmp_path):
    (tmp_path / "s.toml").write_text('[[turns]]\\nuser = "/say hi"\\nexpect.text = "hi\\\\n"\\n')
    assert acp_agent.run_scenario(tmp_path / "s.toml").passed


@pytest.mark.trio
async def test_in_trio(acp_agent):
    from bridge.harness.pytest_plugin import fake_tool

    async with acp_agent.open("demo", tools=[fake_tool("get_weather", "sunny in {city}")]) as agent:
        result = await agent.turn('/tool get_weather {"city": "Oslo"}')
        assert result.text == "tool get_weather returned: sunny in Oslo\\n"
        await agent.assert_conformant()
"""


async def test_the_pytest_plugin_works_from_a_fresh_test_file_in_a_fresh_directory(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "test_my_agent.py").write_text(FRESH_TEST)
    with trio.fail_after(120):
        process = await trio.run_process(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_agent.py"],
            cwd=str(fresh),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = process.stdout.decode() + process.stderr.decode()
    assert process.returncode == 0, out
    assert re.search(r"\b3 passed\b", out), out
