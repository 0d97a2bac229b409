"""Editor protocol v1 through the real wire: ``lmbridge stdio`` as a subprocess, the demo agent as its subprocess."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import HANG, PYTHON, Bridge, first_chat_with_initialize, open_bridge, processes_with_marker
from fakes import user

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check


async def test_initialize_returns_versions_and_the_permission_tool(tmp_path: Path, agents_toml: Path) -> None:
    async with open_bridge(tmp_path, agents_toml) as live:
        info = await live.client.request(
            "initialize", {"protocolVersion": 1, "clientInfo": {"name": "t", "version": "1"}}
        )
        models = await live.client.models()
    assert info["protocolVersion"] == 1
    assert info["serverInfo"]["name"] == "lmbridge"
    assert info["permissionTool"]["name"] == "acp_agent_action"
    assert info["permissionTool"]["inputSchema"]["required"] == ["title", "options"]
    by_id = {m["id"]: m for m in models}
    assert {"demo", "scripted", "missing"} <= set(by_id)
    assert by_id["scripted"]["name"] == "Scripted test agent"
    assert by_id["demo"]["capabilities"] == {"toolCalling": True, "imageInput": True}


@pytest.mark.smoke
async def test_a_text_turn_streams_parts_before_its_stop_reason(bridge: Bridge) -> None:
    result = await bridge.chat("/say the quick brown fox")
    assert result.error is None and result.stop_reason == "end_turn"
    assert result.text == "the quick brown fox\n"
    assert bridge.client.stray_parts == []
    # Streamed: the first words reach the editor while the agent is still busy with the rest of its turn.
    early_words = trio.Event()
    streamed: list[str] = []

    def on_part(part: dict) -> None:  # the words may come in one part or several
        streamed.append(part["value"])
        if "".join(streamed) == "early words\n":
            early_words.set()

    turn = await bridge.client.start_chat(
        "scripted",
        [user("hi"), result.assistant_message(), user("/say early words\n/sleep 600000\n/say late words")],
        on_part=on_part,
    )
    with trio.fail_after(HANG):
        await early_words.wait()
    assert not turn.request.answered and "".join(p["value"] for p in turn.parts) == "early words\n"
    turn.cancel()
    assert (await turn.result()).stop_reason == "cancelled"


async def test_plain_text_gets_the_deterministic_echo(bridge: Bridge) -> None:
    result = await bridge.chat("hello there")
    assert result.text == "echo: hello there\n"


async def test_the_second_turn_of_a_conversation_reuses_the_acp_session(bridge: Bridge) -> None:
    history = [user("first message")]
    first = await bridge.chat(history)
    history += [first.assistant_message(), user("/recall")]
    second = await bridge.chat(history)
    assert second.text == 'earlier prompts: ["first message"]\n'
    assert bridge.stderr.count("session opened") == 1


async def test_a_long_conversation_continues_turn_after_turn(bridge: Bridge) -> None:
    # Over the parser's 16 KiB threshold: from the second turn on, the repeated history is reused, not re-parsed.
    long_opening = "context " * 6000
    history = [user(long_opening)]
    history.append((await bridge.chat(history)).assistant_message())
    for n in range(3):
        history.append(user(f"turn {n}"))
        history.append((await bridge.chat(history)).assistant_message())
    history.append(user("/recall"))
    recall = await bridge.chat(history)
    assert recall.text == "earlier prompts: " + json.dumps([long_opening, "turn 0", "turn 1", "turn 2"]) + "\n"
    assert bridge.stderr.count("session opened") == 1
    # An edit deep inside the long history is still seen: another conversation, a new session (seeded with it).
    edited = [user(long_opening.replace("context", "contexts", 1)), *history[1:]]
    assert (await bridge.chat(edited)).text == "earlier prompts: []\n"
    assert bridge.stderr.count("session opened") == 2


async def test_cancel_ends_the_turn_and_the_next_turn_is_clean(bridge: Bridge) -> None:
    history = [user("/stream 3\n/sleep 600000\n/say never")]
    turn = await bridge.client.start_chat("scripted", history)
    with trio.fail_after(HANG):
        await turn.first_part.wait()
    with trio.fail_after(HANG):  # the cancel ends it: the agent's sleep would last ten minutes
        turn.cancel()
        result = await turn.result()
    assert result.stop_reason == "cancelled"
    assert "never" not in result.text
    history += [result.assistant_message(), user("/say after the cancel")]
    after = await bridge.chat(history)
    assert after.stop_reason == "end_turn" and after.text == "after the cancel\n"


async def test_cancel_before_any_output_is_still_answered(bridge: Bridge) -> None:
    turn = await bridge.client.start_chat("scripted", [user("/sleep 600000")])
    turn.cancel()
    with trio.fail_after(HANG):  # includes the agent's cold start
        result = await turn.result()
    assert result.stop_reason == "cancelled" and result.parts == []


async def test_unknown_method_is_method_not_found_and_the_bridge_carries_on(bridge: Bridge) -> None:
    with pytest.raises(Exception) as error:
        await bridge.client.request("lm/teleport", {})
    assert getattr(error.value, "code", None) == -32601
    assert (await bridge.chat("/say still here")).text == "still here\n"


async def test_unknown_model_is_invalid_params_naming_modelid(bridge: Bridge) -> None:
    result = await bridge.chat("hi", model="gpt-imaginary")
    assert result.error is not None and result.error.code == -32602
    assert result.error.data == {"field": "modelId"}
    assert "gpt-imaginary" in result.error.message and "scripted" in result.error.message


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "messages"),
        ([{"role": "robot", "content": []}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].value"),
        (
            [{"role": "user", "content": [{"type": "tool_result", "callId": "x", "content": "no"}]}],
            "messages[0].content[0].content",
        ),
    ],
)
async def test_malformed_messages_get_invalid_params_naming_the_field(
    bridge: Bridge, messages: list, field: str
) -> None:
    result = await bridge.chat(messages)
    assert result.error is not None and result.error.code == -32602
    assert result.error.data == {"field": field}


async def test_unknown_part_types_are_ignored(bridge: Bridge) -> None:
    message = {"role": "user", "content": [{"type": "hologram", "x": 1}, {"type": "text", "value": "/say fine"}]}
    result = await bridge.chat([message])
    assert result.text == "fine\n"


async def test_requests_before_initialize_are_refused(tmp_path: Path, agents_toml: Path) -> None:
    from bridge.editor.client import spawn_stdio

    async with spawn_stdio(["--config", str(agents_toml)]) as (client, _process):
        with pytest.raises(Exception) as error:
            await client.models()
        assert "initialize" in str(error.value)
        with pytest.raises(Exception) as version:
            await client.initialize(protocolVersion=2)
        assert getattr(version.value, "data", None) == {"field": "protocolVersion"}


async def test_agent_command_not_found_is_agent_failed_to_start(bridge: Bridge) -> None:
    result = await bridge.chat("hi", model="missing")
    assert result.error is not None and result.error.code == -32001
    assert "command not found" in result.error.message and "/nonexistent/lmbridge-test-agent" in result.error.message


async def test_agent_that_exits_at_start_reports_its_stderr(bridge: Bridge) -> None:
    result = await bridge.chat("hi", model="failing")
    assert result.error is not None and result.error.code == -32001
    assert "fatal: no credentials configured" in result.error.data["stderr"]
    assert result.error.data["exitCode"] == 3
    assert "fatal: no credentials configured" in result.error.message


async def test_agent_that_never_answers_initialize_times_out(bridge: Bridge, marker: str) -> None:
    with trio.fail_after(HANG):
        result = await bridge.chat("hi", model="silent")
    assert result.error is not None and result.error.code == -32001
    assert "no answer to initialize within 1 s" in result.error.message
    assert processes_with_marker(marker) == [] or await _gone_soon(marker)


async def _gone_soon(marker: str) -> bool:
    with trio.fail_after(HANG):
        while processes_with_marker(marker):
            await trio.sleep(0.05)  # polling /proc: there is no event for another process's exit
    return True


async def test_agent_crash_mid_turn_is_agent_exited_then_the_next_turn_starts_afresh(bridge: Bridge) -> None:
    history = [user("/say before the crash\n/crash")]
    crashed = await bridge.chat(history)
    assert crashed.error is not None and crashed.error.code == -32002
    assert "crashing on purpose" in crashed.error.data["stderr"]
    assert crashed.text.startswith("before the crash")
    history += [user("/say recovered\n/recall")]
    recovered = await bridge.chat(history)
    assert recovered.error is None, recovered.error
    assert recovered.text.startswith("recovered\nearlier prompts: []")
    assert bridge.stderr.count("session opened") == 2


async def test_usage_and_context_and_cost_reach_the_editor_in_the_answer(bridge: Bridge) -> None:
    first = await bridge.chat([user("/usage 1200 200000 0.0525 USD\n/say done")])
    assert first.text == "done\n" and first.stop_reason == "end_turn"
    assert first.usage == {
        "inputTokens": 1200,
        "outputTokens": 1,
        "totalTokens": 1201,
        "contextUsed": 1200,
        "contextSize": 200000,
        "cost": {"amount": 0.0525, "currency": "USD"},
    }
    # The context figure is the session's latest: a later turn without an update still reports it.
    history = [user("/usage 1200 200000 0.0525 USD\n/say done"), first.assistant_message(), user("/say again")]
    second = await bridge.chat(history)
    assert second.usage == {"contextUsed": 1200, "contextSize": 200000, "cost": {"amount": 0.0525, "currency": "USD"}}


async def test_the_clients_choice_of_session_options_holds_before_each_prompt(bridge: Bridge) -> None:
    history = [user("/options")]
    first = await bridge.chat(history, modelOptions={"mode": "plan", "verbose": True})
    assert first.text == 'options: effort="medium" mode="plan" model="demo-small" verbose=true\n', first.error
    history += [first.assistant_message(), user("/options")]
    second = await bridge.chat(history, modelOptions={"mode": "plan", "verbose": True})  # already so: nothing sent
    history += [second.assistant_message(), user("/options")]
    third = await bridge.chat(history, modelOptions={"effort": "high"})  # the others stay as they are
    assert third.text == 'options: effort="high" mode="plan" model="demo-small" verbose=true\n'
    assert bridge.stderr.count("session option set") == 3 and bridge.stderr.count("session opened") == 1
    # A value the agent does not offer: the turn fails naming it; the conversation goes on.
    history += [third.assistant_message(), user("/options")]
    refused = await bridge.chat(history, modelOptions={"mode": "fly"})
    assert refused.error is not None and refused.error.code == -32602
    assert refused.error.message == "Invalid params: options.modelOptions.mode: must be one of ask, code, plan"
    again = await bridge.chat(history, modelOptions={"mode": "ask"})
    assert again.text == 'options: effort="high" mode="ask" model="demo-small" verbose=true\n'
    wrong_type = await bridge.chat(history, modelOptions={"mode": 3})
    assert wrong_type.error is not None and "options.modelOptions.mode: must be a string or a boolean" in str(
        wrong_type.error.message
    )


async def test_options_in_the_agents_table_hold_unless_the_client_chooses_otherwise(tmp_path: Path) -> None:
    config = tmp_path / "options.toml"
    config.write_text(f"""
[agents.planner]
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
options = {{ mode = "plan", effort = "high" }}
""")
    async with open_bridge(tmp_path, config) as live:
        configured = await live.chat("/options", model="planner")
        assert configured.text == 'options: effort="high" mode="plan" model="demo-small" verbose=false\n'
        chosen = await live.chat("/options\n/say again", model="planner", modelOptions={"mode": "ask"})
        assert chosen.text.startswith('options: effort="high" mode="ask" model="demo-small" verbose=false\n')


async def test_count_tokens_is_an_estimate(bridge: Bridge) -> None:
    assert await bridge.client.count_tokens("scripted", text="") == 0
    assert await bridge.client.count_tokens("scripted", text="abcd" * 25) == 25
    assert await bridge.client.count_tokens("scripted", text="日本語") == 3
    counted = await bridge.client.count_tokens("scripted", message=user("abcd" * 10))
    assert counted == 10 + 4


async def test_eof_stops_turns_sessions_and_agents_and_exits_zero(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with open_bridge(tmp_path, agents_toml) as live:
        turn = await live.client.start_chat("scripted", [user("/stream 2\n/sleep 600000")])
        with trio.fail_after(HANG):
            await turn.first_part.wait()
        assert processes_with_marker(marker), "the agent should be running"
        await live.process.stdin.aclose()
        with trio.fail_after(HANG):
            result = await turn.result()
            code = await live.process.wait()
    assert result.stop_reason == "cancelled"
    assert code == 0
    assert processes_with_marker(marker) == []


async def test_shutdown_request_answers_then_exits_with_no_process_left(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    async with open_bridge(tmp_path, agents_toml) as live:
        turn = await live.client.start_chat("scripted", [user("/stream 1\n/sleep 600000")])
        with trio.fail_after(HANG):
            await turn.first_part.wait()
        with trio.fail_after(HANG):
            assert await live.client.request("shutdown", None) is None
            result = await turn.result()
            code = await live.process.wait()
    assert result.stop_reason == "cancelled" and code == 0
    assert processes_with_marker(marker) == []


async def test_sigterm_is_an_orderly_shutdown(tmp_path: Path, agents_toml: Path, marker: str) -> None:
    async with open_bridge(tmp_path, agents_toml) as live:
        turn = await live.client.start_chat("scripted", [user("/stream 1\n/sleep 600000")])
        with trio.fail_after(HANG):
            await turn.first_part.wait()
        live.process.send_signal(signal.SIGTERM)
        with trio.fail_after(HANG):
            result = await turn.result()
            code = await live.process.wait()
    assert result.stop_reason == "cancelled" and code == 0
    assert processes_with_marker(marker) == []


async def test_trace_dir_records_every_connection_as_private_ndjson(tmp_path: Path, agents_toml: Path) -> None:
    traces = tmp_path / "traces"
    async with open_bridge(tmp_path, agents_toml, "--trace-dir", str(traces)) as live:
        await live.chat("/say traced")
    files = sorted(traces.iterdir())
    assert {f.name.rsplit("-", 1)[-1] for f in files} == {"editor.ndjson", "agent_scripted.ndjson"}
    assert stat.S_IMODE(traces.stat().st_mode) == 0o700
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert {line["dir"] for line in lines} == {"in", "out"}
        assert all(isinstance(line["ts"], float) and "msg" in line for line in lines)
    editor_lines = [
        json.loads(line) for line in next(f for f in files if f.name.endswith("editor.ndjson")).read_text().splitlines()
    ]
    assert any(line["msg"].get("method") == "lm/part" for line in editor_lines)


async def test_logs_go_to_stderr_and_stdout_carries_protocol_only(tmp_path: Path, agents_toml: Path) -> None:
    process = await trio.lowlevel.open_process(
        [
            os.environ.get("PYTHON", __import__("sys").executable),
            "-m",
            "bridge",
            "stdio",
            "--config",
            str(agents_toml),
            "--log-level",
            "debug",
        ],
        stdin=__import__("subprocess").PIPE,
        stdout=__import__("subprocess").PIPE,
        stderr=__import__("subprocess").PIPE,
    )
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "lm/chat",
            "params": {"modelId": "scripted", "messages": [user("/say hi")]},
        },
    ]
    await process.stdin.send_all(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    out = b""
    with trio.fail_after(30):
        while b'"id":2,' not in out:
            out += await process.stdout.receive_some()
        await process.stdin.aclose()
        while chunk := await process.stdout.receive_some():
            out += chunk
        err = b""
        while chunk := await process.stderr.receive_some():
            err += chunk
        assert await process.wait() == 0
    for line in out.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert b"lmbridge stdio ready" in err and b"session opened" in err


async def test_cancel_while_the_agent_is_still_starting_does_not_wait_for_it(tmp_path: Path, marker: str) -> None:
    config = tmp_path / "slow.toml"
    # An agent that takes ten minutes before it even starts speaking ACP.
    late_start = "import time, runpy; time.sleep(600); runpy.run_module('bridge.demo', run_name='__main__')"
    config.write_text(f"""
[agents.slow]
command = "{__import__("sys").executable}"
args = ["-c", "{late_start}"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}
""")
    async with open_bridge(tmp_path, config) as live:
        turn = await live.client.start_chat("slow", [user("hi")])
        await _agent_started(marker)
        with trio.fail_after(HANG):
            turn.cancel()
            result = await turn.result()
        assert result.stop_reason == "cancelled"
        # Shutdown while it is still starting: no wait for it, and nothing left behind.
        turn = await live.client.start_chat("slow", [user("again")])
        with trio.fail_after(HANG):
            assert await live.client.request("shutdown", None) is None
            assert (await turn.result()).stop_reason == "cancelled"
            assert await live.process.wait() == 0
    assert processes_with_marker(marker) == []


async def _agent_started(marker: str) -> None:
    with trio.fail_after(HANG):
        while not processes_with_marker(marker):
            await trio.sleep(0.05)  # polling /proc: there is no event for another process's start


async def test_an_agent_gets_lmbridges_environment_minus_unset_env(tmp_path: Path, marker: str) -> None:
    config = tmp_path / "env.toml"
    config.write_text(f"""
[agents.clean]
command = "{__import__("sys").executable}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}", GIVEN = "by config" }}
unset_env = ["SECRET_*"]
""")
    async with open_bridge(tmp_path, config, env={"SECRET_TOKEN": "s3cret", "PLAIN": "kept"}) as live:
        reply = await live.chat("/env SECRET_TOKEN\n/env PLAIN\n/env GIVEN", model="clean")
    assert reply.text == "SECRET_TOKEN=(unset)\nPLAIN=kept\nGIVEN=by config\n"


@pytest.mark.parametrize(
    "first",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":7}}',
        b'{"jsonrpc":"2.0","id":1,"method":"initialize"',
        b'{"jsonrpc":"2.0","id":1,"method":"lm/models","params":{}}',
    ],
)
async def test_an_unusual_first_message_is_answered_by_the_engine(first: bytes) -> None:
    import subprocess as sp
    import sys as _sys

    process = await trio.lowlevel.open_process(
        [_sys.executable, "-m", "bridge", "stdio", "--log-level", "warning"],
        stdin=sp.PIPE,
        stdout=sp.PIPE,
        stderr=sp.DEVNULL,
    )
    await process.stdin.send_all(
        first + b"\n" + b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":1}}\n'
    )
    out = b""
    with trio.fail_after(HANG):
        while out.count(b"\n") < 2:
            out += await process.stdout.receive_some()
        await process.stdin.aclose()
        assert await process.wait() == 0
    error, ok = (json.loads(line) for line in out.splitlines()[:2])
    assert error["error"]["code"] in (-32602, -32700, -32600)
    assert ok["id"] == 2 and ok["result"]["protocolVersion"] == 1


def test_the_input_pipe_is_widened_for_long_histories(tmp_path: Path) -> None:
    import fcntl

    from bridge.daemon.stdio import _LONG_INPUT, _widen_pipe

    read_end, write_end = os.pipe()
    try:
        _widen_pipe(read_end)
        assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) == _LONG_INPUT
        fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)  # smaller now: widened again
        _widen_pipe(read_end)
        assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) == _LONG_INPUT
    finally:
        os.close(read_end)
        os.close(write_end)
    regular = tmp_path / "input"
    regular.write_bytes(b"")
    with regular.open("rb") as file:
        _widen_pipe(file.fileno())  # not a pipe: left alone, no error


def _prestart_toml(tmp_path: Path, marker: str) -> Path:
    path = tmp_path / "prestart.toml"
    path.write_text(f"""
[agents.scripted]
command = "{sys.executable}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}
prestart = true

[agents.broken]
command = "{sys.executable}"
args = ["-c", "import sys; sys.stderr.write('fatal: no credentials configured\\\\n'); sys.exit(3)"]
prestart = true
""")
    return path


async def test_prestarted_agents_start_when_the_editor_connects(tmp_path: Path, marker: str) -> None:
    async with open_bridge(tmp_path, _prestart_toml(tmp_path, marker)) as live:
        # Logged when the editor's initialize is applied, before any later request is read (initialize itself
        # may be answered before the daemon is up).
        await live.client.models()
        assert "prestarting an agent" in live.stderr and "agent=scripted" in live.stderr
        first = await live.chat("hello")
        assert first.text == "echo: hello\n"
        assert live.stderr.count("agent ready") == 1, "the chat waited for the prestarted agent, not a second one"
        assert len(processes_with_marker(marker)) == 1
        # An agent that cannot start: the failure is logged, and the chat that needs it says why.
        broken = await live.chat("hello", model="broken")
        assert broken.error is not None and "no credentials configured" in json.dumps(broken.error.data)
        assert "agent failed to start" in live.stderr and "agent=broken" in live.stderr
    assert live.process.returncode == 0
    assert processes_with_marker(marker) == [], "the prestarted agent outlived the bridge"


MUTE_AFTER_INITIALIZE = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "initialize":
        reply = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": reply}) + "\\n")
        sys.stdout.flush()
    # session/new and everything else: never answered
"""


async def test_an_agent_that_never_answers_session_new_is_given_up_on_and_restarted(
    tmp_path: Path, marker: str
) -> None:
    # lm/chat must not wait forever for an agent that never answers session/new.
    config = tmp_path / "mute.toml"
    config.write_text(
        f"[agents.mute]\ncommand = {json.dumps(sys.executable)}\nargs = ['-c', {json.dumps(MUTE_AFTER_INITIALIZE)}]\n"
        f'env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}\n'
        "[sessions]\nagent_request_timeout = 1\nstop_grace = 1\n"
    )
    async with open_bridge(tmp_path, config) as live:
        for attempt in (1, 2):
            with trio.fail_after(HANG):
                result = await live.chat("hi", model="mute")
            assert result.error is not None and result.error.code == -32003, result
            assert "agent 'mute' did not answer session/new within 1 s; lmbridge restarted it" in result.error.message
            assert result.error.data == {"agent": "mute", "step": "session/new", "timeoutSeconds": 1.0}
            assert live.stderr.count("agent process started") == attempt  # a new process each time
        assert live.stderr.count("agent did not answer in time") == 2
    assert processes_with_marker(marker) == [] or await _gone_soon(marker)


async def test_sessions_over_the_cap_are_closed_once_their_turns_end(tmp_path: Path, agents_toml: Path) -> None:
    # The cap is checked when turns end too: sessions opened while all others were busy (and their MCP servers)
    # must not stay until the idle TTL.
    config = tmp_path / "capped.toml"
    config.write_text(agents_toml.read_text().replace("[sessions]", "[sessions]\nmax_sessions = 2"))
    async with open_bridge(tmp_path, config) as live:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(5):
                    nursery.start_soon(live.chat, f"/say conversation {n}\n/sleep 300")
        status = await live.client.request("daemon/status", {})
        assert status["sessions"] == {"scripted": 2}
        assert live.stderr.count("closing the least recently used session") == 3


async def test_a_crash_fails_the_running_turns_retryably_and_the_agent_is_restarted_once(bridge: Bridge) -> None:
    # One agent process serves every session of the agent: its crash touches all their running turns.
    histories = [[user(f"/say conversation {n} started\n/sleep 5000")] for n in range(4)]
    results: dict[int, Any] = {}

    async def run(n: int) -> None:
        results[n] = await bridge.chat(histories[n])

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(run, n)
            crashed = await bridge.chat("/say crashing\n/crash")
    assert crashed.error is not None and crashed.error.code == -32002
    for n in range(4):
        error = results[n].error
        assert error is not None and error.code == -32002 and error.data["retryable"] is True
        assert "lmbridge starts it again: send the request again, the conversation continues" in error.message
    with trio.fail_after(30):
        again = [await bridge.chat([*histories[n], user(f"/say conversation {n} goes on")]) for n in range(4)]
    assert [a.text for a in again] == [f"conversation {n} goes on\n" for n in range(4)]
    assert bridge.stderr.count("agent exited under its sessions; starting it again") == 1
    assert bridge.stderr.count("agent process started") == 2  # restarted once, not once per conversation


async def test_with_isolation_per_session_a_crash_touches_one_conversation_only(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    config = tmp_path / "isolated.toml"
    config.write_text(agents_toml.read_text().replace('name = "Scripted test agent"', 'isolation = "session"'))
    async with open_bridge(tmp_path, config) as live:
        results: dict[int, Any] = {}

        async def run(n: int) -> None:
            results[n] = await live.chat(f"/say conversation {n} started\n/sleep 1500\n/say conversation {n} done")

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(3):
                    nursery.start_soon(run, n)
                crashed = await live.chat("/say crashing\n/crash")
        assert crashed.error is not None and crashed.error.code == -32002
        for n in range(3):
            assert results[n].error is None and results[n].text.endswith(f"conversation {n} done\n")
        assert live.stderr.count("agent process started") == 4  # one per conversation
        status = await live.client.request("daemon/status", {})
        assert len(status["agents"]) == 3  # the crashed one is gone; the others serve their sessions
    assert processes_with_marker(marker) == [] or await _gone_soon(marker)


async def test_the_agent_of_a_first_chat_sent_with_initialize_starts_before_lmbridge_is_up(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    """An editor woken by a chat sends it with initialize: lmbridge starts that chat's agent before importing the
    rest of itself, and the pool runs that very process (one start, stopped with lmbridge)."""
    messages, stderr, code = await first_chat_with_initialize(agents_toml, "scripted", "/say early")
    parts = [m["params"]["part"] for m in messages if m.get("method") == "lm/part"]
    assert [m["result"] for m in messages if m.get("id") == 1] == [{"stopReason": "end_turn"}]
    assert "".join(p["value"] for p in parts if p["type"] == "text") == "early\n"
    assert "early=True" in stderr and stderr.count("agent process started") == 1, stderr
    assert code == 0
    assert processes_with_marker(marker) == [], "the early agent outlived lmbridge"


async def test_the_agent_of_a_first_chat_sent_with_initialize_is_started_before_initialize_is_answered(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    """The editor sent its chat already, so it does not wait for the answer to initialize: the agent's start comes
    first (the answer needs modules the spawn does not)."""
    running_when_answered: list[int] = []
    messages, _stderr, code = await first_chat_with_initialize(
        agents_toml,
        "scripted",
        "/say hi",
        on_initialized=lambda: running_when_answered.extend(processes_with_marker(marker)),
    )
    assert [m["result"]["serverInfo"]["name"] for m in messages if m.get("id") == 0] == ["lmbridge"]
    assert len(running_when_answered) == 1, "the agent was not running yet when initialize was answered"
    assert code == 0


@pytest.mark.parametrize("after_answer", [False, True], ids=["chat-with-initialize", "chat-after-the-answer"])
async def test_the_agent_of_a_first_chat_is_sent_initialize_as_it_starts_and_only_once(
    tmp_path: Path, agents_toml: Path, after_answer: bool
) -> None:
    """The agent started early gets its ``initialize`` right away, while lmbridge imports the rest of itself; the
    pool's handshake takes that answer instead of asking again, and numbers its own requests from 1. The wire
    trace shows the request as sent."""
    trace = tmp_path / "trace"
    messages, stderr, code = await first_chat_with_initialize(
        agents_toml, "scripted", "/say hi", after_answer=after_answer, extra_args=("--trace-dir", str(trace))
    )
    assert [m["result"] for m in messages if m.get("id") == 1] == [{"stopReason": "end_turn"}], messages
    assert code == 0
    if "early=True" not in stderr:  # the chat came after the imports ended (a loaded machine): the usual start
        assert after_answer, stderr
        return
    [agent_trace] = trace.glob("*-agent_scripted.ndjson")
    records = [json.loads(line) for line in agent_trace.read_text().splitlines()]
    sent = [r["msg"] for r in records if r["dir"] == "out" and "method" in r["msg"]]
    assert sent[0]["method"] == "initialize" and sent[0]["id"] == 0, sent[0]
    assert [m["method"] for m in sent].count("initialize") == 1
    assert all(m["id"] >= 1 for m in sent[1:] if "id" in m)
    answers = [r["msg"] for r in records if r["dir"] == "in" and r["msg"].get("id") == 0]
    assert len(answers) == 1 and answers[0]["result"]["protocolVersion"] == 1


async def test_a_first_chat_sent_once_initialize_is_answered_is_served_by_one_agent_start(
    tmp_path: Path, agents_toml: Path, marker: str
) -> None:
    """VS Code's extension sends its first chat once ``initialize`` is answered: lmbridge reads it while it imports
    the rest of itself and starts its agent then (``early=True`` in the log when the chat came before the imports
    ended, as it does on an idle machine; either way one start, and the chat is answered)."""
    messages, stderr, code = await first_chat_with_initialize(agents_toml, "scripted", "/say later", after_answer=True)
    parts = [m["params"]["part"] for m in messages if m.get("method") == "lm/part"]
    assert [m["result"] for m in messages if m.get("id") == 1] == [{"stopReason": "end_turn"}]
    assert "".join(p["value"] for p in parts if p["type"] == "text") == "later\n"
    assert stderr.count("agent process started") == 1, stderr
    assert code == 0
    assert processes_with_marker(marker) == [], "the agent outlived lmbridge"


def _pipe_with(data: bytes) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    return read_end, write_end


def test_the_next_request_is_read_while_lmbridge_imports_the_rest_of_itself() -> None:
    from bridge.daemon.stdio import import_while_reading

    chat = b'{"jsonrpc":"2.0","id":1,"method":"lm/chat","params":{}}\n'
    read_end, write_end = _pipe_with(b"")
    try:
        # The editor writes its chat in two pieces while the imports run; both are read before they end, and the
        # chat is handed on (its agent started) while the imports still run: they wait for it here.
        handed_on = threading.Event()
        imports_saw: list[bool] = []

        def load() -> None:
            os.write(write_end, chat[:10])
            os.write(write_end, chat[10:] + b'{"jsonrpc":"2.0","id":2')
            imports_saw.append(handed_on.wait(60))

        def on_request(read: bytes) -> tuple[str, bytes]:
            handed_on.set()
            return "agent", read

        pending, started = import_while_reading(load, read_end, b"", on_request=on_request)
        assert pending.startswith(chat) and imports_saw == [True]
        assert started[0] == "agent" and started[1].startswith(chat)
        # Nothing comes: the imports' end ends the wait; a request already there is not waited on either.
        assert import_while_reading(lambda: None, read_end, b"") == (b"", None)
        assert import_while_reading(lambda: None, read_end, b"x\n", on_request=on_request) == (b"x\n", None)

        # An import that fails is left to the caller's own import, which raises it.
        def broken() -> None:
            raise ImportError("no module named trio")

        assert import_while_reading(broken, read_end, b"") == (b"", None)
        os.close(write_end)
        write_end = -1
        assert import_while_reading(lambda: None, read_end, b"x") == (b"x", None)  # end of input: nothing to read
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


@pytest.mark.parametrize(
    ("model", "error_code"),
    [("nobody", -32602), ("missing", -32001), ("failing", -32001)],
    ids=["unknown-model", "command-not-found", "exits-at-start"],
)
async def test_a_first_chat_whose_agent_cannot_start_early_gets_the_usual_error(
    tmp_path: Path, agents_toml: Path, model: str, error_code: int
) -> None:
    messages, stderr, code = await first_chat_with_initialize(agents_toml, model, "hello")
    [answer] = [m for m in messages if m.get("id") == 1]
    assert answer["error"]["code"] == error_code, answer
    assert code == 0
    if model == "failing":  # started early, failed in the pool's handshake like any start
        assert "early=True" in stderr and "no credentials configured" in json.dumps(answer["error"])
    else:
        assert "early=True" not in stderr


# Modules whose import an editor must not wait for before lmbridge answers initialize and starts a first chat's agent
# (tens of milliseconds each, most of them Trio's): they load while the agent starts.
LATER_MODULES = ("trio", "ssl", "sqlite3", "hypercorn", "jsonschema", "pydantic", "structlog", "orjson", "mcp")


def test_the_command_line_answers_initialize_before_the_heavy_imports(tmp_path: Path) -> None:
    """``lmbridge stdio`` as an editor starts it: the command line's parser (every subcommand's) and the
    configuration load nothing of ``LATER_MODULES`` before the answer to ``initialize`` is written."""
    import subprocess

    script = f"""
import json, runpy, sys
import bridge.daemon.stdio as stdio
answer = stdio.answer_initialize
def answered(*args, **kwargs):
    answer(*args, **kwargs)
    loaded = sorted({{name.partition(".")[0] for name in sys.modules}} & set({LATER_MODULES!r}))
    print("loaded before the answer: " + json.dumps(loaded), file=sys.stderr, flush=True)
stdio.answer_initialize = answered
sys.argv = ["lmbridge", "stdio", "--config", {str(tmp_path / "lmbridge.toml")!r}]
runpy.run_module("bridge", run_name="__main__")
"""
    (tmp_path / "lmbridge.toml").write_text("")
    request = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    done = subprocess.run([PYTHON, "-c", script], input=request, capture_output=True, timeout=60)
    assert json.loads(done.stdout.splitlines()[0])["result"]["protocolVersion"] == 1, done.stderr[-2000:]
    [line] = [line for line in done.stderr.decode().splitlines() if line.startswith("loaded before the answer: ")]
    assert json.loads(line.partition(": ")[2]) == [], line


def test_initialize_is_answered_before_the_json_rpc_engine_is_imported(tmp_path: Path) -> None:
    """The answer an editor waits for comes from what ``read_initialize`` needed (the standard library's JSON): the
    engine and orjson (~4 ms of imports) load after it. An id that has no UTF-8 form is written escaped."""
    import subprocess

    script = """
import os, sys
from bridge.config import parse_config
from bridge.daemon.stdio import answer_initialize, read_initialize
inbound, outbound = os.pipe(), os.pipe()
os.write(inbound[1], b'{"jsonrpc":"2.0","id":"\\\\ud800-7","method":"initialize","params":{"protocolVersion":1}}\\n')
first, rest = read_initialize(inbound[0])
answer_initialize(parse_config(''), first, outbound[1])
print(os.read(outbound[0], 1 << 20).decode())
print(sorted(m for m in ("wire.rpc.protocol", "orjson", "trio") if m in sys.modules))
"""
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    reply, loaded = [line for line in done.stdout.splitlines() if line]
    answer = json.loads(reply)
    assert answer["id"] == "\ud800-7" and answer["result"]["protocolVersion"] == 1
    assert loaded == "[]", loaded
