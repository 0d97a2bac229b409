"""Editor tools through the real wire: the demo agent (its MCP side on the official ``mcp`` client) calls the
editor's tools through ``lmbridge stdio``, over each transport lmbridge offers — the shared streamable-HTTP listener
(the default for an agent that advertises ``mcpCapabilities.http``, as the demo agent does) and the stdio relay it
starts; the editor answers in its next request."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import Bridge, open_bridge, processes_with_marker
from fakes import user

pytestmark = pytest.mark.wire  # lmbridge and its agents as processes: make test, not make check

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CLOCK = {"name": "get_time", "description": "The time", "inputSchema": {"type": "object"}}
TOOLS = [WEATHER, CLOCK]


def result(call: dict[str, Any], text: str, *, error: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "tool_result",
        "callId": call["callId"],
        "content": [{"type": "text", "value": text}],
    }
    if error:
        part["isError"] = True
    return part


def with_transport(agents_toml: Path, transport: str) -> Path:
    """The test config with ``mcp_transport`` set on the scripted (demo) agent."""
    text = agents_toml.read_text()
    marker = "[agents.scripted]\n"
    assert marker in text
    agents_toml.write_text(text.replace(marker, f'{marker}mcp_transport = "{transport}"\n', 1))
    return agents_toml


@pytest.fixture(params=["auto", "stdio"], ids=["http", "stdio-relay"])
async def bridge(
    request: pytest.FixtureRequest, tmp_path: Path, agents_toml: Path, marker: str
) -> AsyncIterator[Bridge]:
    async with open_bridge(tmp_path, with_transport(agents_toml, request.param)) as live:
        yield live
    assert live.process.returncode == 0, live.stderr[-3000:]
    assert processes_with_marker(marker) == [], "an agent process outlived the bridge"


async def turn(bridge: Bridge, history: list[dict[str, Any]], *, tools: list[dict[str, Any]] = TOOLS):
    reply = await bridge.chat(history, tools=tools)
    assert reply.error is None, reply.error
    history.append(reply.assistant_message())
    return reply


@pytest.mark.smoke
async def test_a_tool_call_goes_to_the_editor_and_its_result_back_to_the_agent(bridge: Bridge) -> None:
    history = [user('/tool get_weather {"city": "Paris"}')]
    first = await turn(bridge, history)
    assert first.stop_reason == "tool_calls"
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"} and call["callId"].startswith("lmb_")
    history.append({"role": "user", "content": [result(call, "sunny, 21 °C")]})
    second = await turn(bridge, history)
    assert second.stop_reason == "end_turn"
    assert second.text == "tool get_weather returned: sunny, 21 °C\n"
    assert bridge.stderr.count("session opened") == 1


async def test_parallel_calls_go_out_together_with_unique_call_ids(bridge: Bridge) -> None:
    history = [user('/tools get_weather {"city": "Oslo"} | get_weather {"city": "Rome"} | get_time {}')]
    first = await turn(bridge, history)
    assert first.stop_reason == "tool_calls" and len(first.tool_calls) == 3
    assert len({c["callId"] for c in first.tool_calls}) == 3
    answers = {"Oslo": "snow", "Rome": "sun"}
    history.append(
        {"role": "user", "content": [result(c, answers.get(c["input"].get("city"), "12:00")) for c in first.tool_calls]}
    )
    second = await turn(bridge, history)
    assert second.text.splitlines() == [
        "tool get_weather returned: snow",
        "tool get_weather returned: sun",
        "tool get_time returned: 12:00",
    ]


async def test_invalid_arguments_are_refused_before_the_editor_sees_them(bridge: Bridge) -> None:
    reply = await turn(bridge, [user('/tool get_weather {"town": 5}')])
    assert reply.tool_calls == [] and reply.stop_reason == "end_turn"
    assert reply.text.startswith("tool get_weather failed: Invalid arguments for get_weather:")
    assert "'city' is a required property" in reply.text


async def test_arguments_written_as_a_json_string_are_parsed(bridge: Bridge) -> None:
    nested = {
        "name": "configure",
        "description": "x",
        "inputSchema": {
            "type": "object",
            "properties": {"options": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        },
    }
    reply = await turn(bridge, [user('/tool configure {"options": "{\\"n\\": 3}"}')], tools=[nested])
    (call,) = reply.tool_calls
    assert call["input"] == {"options": {"n": 3}}


async def test_an_unknown_tool_is_an_error_the_model_can_read(bridge: Bridge) -> None:
    reply = await turn(bridge, [user("/tool launch_rockets {}")])
    assert reply.tool_calls == []
    assert "Unknown tool 'launch_rockets'" in reply.text and "get_time, get_weather" in reply.text


async def test_a_tool_whose_schema_is_invalid_is_reported_not_fatal(bridge: Bridge) -> None:
    broken = {"name": "broken", "description": "x", "inputSchema": {"type": "objectish"}}
    reply = await turn(bridge, [user("/tool broken {}\n/tool get_time {}")], tools=[broken, CLOCK])
    assert reply.text.startswith(
        "tool broken failed: the tool 'broken' cannot be called: the editor gave it an "
        "invalid input schema at type: 'objectish' is not valid"
    )
    (call,) = reply.tool_calls
    assert call["name"] == "get_time"


async def test_an_error_result_from_the_editor_reaches_the_agent_as_an_error(bridge: Bridge) -> None:
    history = [user('/tool get_weather {"city": "Atlantis"}')]
    first = await turn(bridge, history)
    history.append({"role": "user", "content": [result(first.tool_calls[0], "no such city", error=True)]})
    second = await turn(bridge, history)
    assert second.text == "tool get_weather failed: no such city\n"


async def test_image_results_reach_the_agent_as_images(bridge: Bridge) -> None:
    history = [user("/tool get_time {}")]
    first = await turn(bridge, history)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 92).decode()
    history.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "callId": first.tool_calls[0]["callId"],
                    "content": [{"type": "data", "mimeType": "image/png", "data": png}],
                }
            ],
        }
    )
    second = await turn(bridge, history)
    assert second.text == "tool get_time returned: [image image/png, 100 bytes]\n"


async def test_a_call_the_editor_did_not_answer_is_withdrawn_with_a_readable_error(bridge: Bridge) -> None:
    history = [user('/tools get_weather {"city": "Oslo"} | get_time {}')]
    first = await turn(bridge, history)
    weather = next(c for c in first.tool_calls if c["name"] == "get_weather")
    history.append({"role": "user", "content": [result(weather, "snow")]})  # no result for get_time
    second = await turn(bridge, history)
    lines = second.text.splitlines()
    assert lines[0] == "tool get_weather returned: snow"
    assert lines[1].startswith("tool get_time failed: The editor's next request carried no result for this tool call")


async def test_moving_on_without_a_result_cancels_the_waiting_prompt(bridge: Bridge) -> None:
    history = [user('/tool get_weather {"city": "Paris"}\n/say never said')]
    first = await turn(bridge, history)
    assert first.stop_reason == "tool_calls"
    history.append(user("/say something else entirely"))
    second = await turn(bridge, history)
    assert second.stop_reason == "end_turn" and second.text == "something else entirely\n"
    assert "never said" not in second.text


async def test_an_agent_that_gives_up_on_a_call_withdraws_it(bridge: Bridge) -> None:
    # The agent's MCP client times out at once and sends notifications/cancelled: the bridge withdraws the call (or
    # never sees it, when the client gave up before its request was out). If that came before the turn ended, the
    # turn streams on to the agent's own end; if the turn ended first (tool_calls), the rest comes with the next
    # request, and the editor's late result is ignored. Which of these happens depends on the machine's speed: what
    # the user sees must not.
    history = [user('/toolwait 1 get_weather {"city": "Paris"}\n/say moved on')]
    reply = await turn(bridge, history)
    text = reply.text
    if reply.stop_reason == "tool_calls":
        history.append({"role": "user", "content": [result(reply.tool_calls[0], "too late")]})
        text += (await turn(bridge, history)).text
    assert text.startswith("tool get_weather failed: MCP error") and text.endswith("moved on\n")
    assert "too late" not in text


async def test_a_changed_tool_set_is_announced_and_removed_tools_are_refused(bridge: Bridge) -> None:
    history = [user("/tool get_time {}")]
    first = await turn(bridge, history, tools=[CLOCK])
    history.append({"role": "user", "content": [result(first.tool_calls[0], "12:00")]})
    await turn(bridge, history, tools=[CLOCK])
    history.append(user("/tool get_time {}"))
    third = await turn(bridge, history, tools=[WEATHER])
    assert third.tool_calls == [] and third.text.startswith("tool get_time failed: Unknown tool 'get_time'")
    assert "Available tools: get_weather" in third.text
    assert "the editor's tools changed" in bridge.stderr
    history.append(user('/tool get_weather {"city": "Lima"}'))
    fourth = await turn(bridge, history, tools=[WEATHER])
    assert [c["name"] for c in fourth.tool_calls] == ["get_weather"]


async def test_the_agent_crashing_while_a_tool_runs_starts_afresh_next_time(bridge: Bridge, marker: str) -> None:
    history = [user('/tool get_weather {"city": "Paris"}')]
    first = await turn(bridge, history)
    for pid in processes_with_marker(marker):
        os.kill(pid, 9)
    history.append({"role": "user", "content": [result(first.tool_calls[0], "sunny")]})
    history.append(user("/say carrying on"))
    with trio.fail_after(30):
        second = await bridge.chat(history, tools=TOOLS)
        if second.error is not None:  # the request overtook the bridge noticing the crash: it says so
            assert second.error.code == -32002 and "signal 9" in second.error.message
            second = await bridge.chat(history, tools=TOOLS)
    assert second.error is None, second.error
    assert second.text == "carrying on\n"
    history += [second.assistant_message(), user("/recall")]
    recalled = await bridge.chat(history, tools=TOOLS)
    (seed,) = json.loads(recalled.text.removeprefix("earlier prompts: "))
    assert "returned: sunny" in seed and bridge.stderr.count("session opened") == 2


async def test_the_mcp_socket_is_private_and_refuses_a_process_without_the_token(
    tmp_path: Path, agents_toml: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    config = with_transport(agents_toml, "stdio")
    async with open_bridge(tmp_path, config, env={"XDG_RUNTIME_DIR": str(runtime)}) as live:
        reply = await live.chat([user("/tool get_time {}")], tools=[CLOCK])
        assert reply.tool_calls
        (directory,) = runtime.iterdir()
        (sock_path,) = directory.glob("*.sock")
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
        for opening in (
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n',
            b"LMBRIDGE-MCP-1 not-the-token\n" + b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n',
        ):
            answer = await trio.to_thread.run_sync(_talk, str(sock_path), opening)
            assert answer == b""  # closed without relaying a byte
        assert live.stderr.count("refused a connection to an MCP socket") == 2
    assert not sock_path.exists()


def _talk(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        return received


async def test_sessions_share_one_http_listener_each_with_its_own_path_and_token(tmp_path: Path, marker: str) -> None:
    from conftest import PYTHON

    config = tmp_path / "http.toml"
    config.write_text(f"""
[agents.direct]
command = "{PYTHON}"
args = ["-m", "bridge.demo"]
env = {{ LMBRIDGE_TEST_MARKER = "{marker}" }}

[sessions]
max_sessions = 1
""")
    traces = tmp_path / "traces"

    def post(url: str, token: str | None = None) -> int:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    async with open_bridge(tmp_path, config, "--trace-dir", str(traces)) as live:
        for city in ("Paris", "Oslo"):  # the second conversation's turn ends over max_sessions: the first closes
            history = [user(f'/tool get_weather {{"city": "{city}"}}')]
            first = await live.chat(history, model="direct", tools=TOOLS)
            (call,) = first.tool_calls
            history += [first.assistant_message(), {"role": "user", "content": [result(call, f"sunny in {city}")]}]
            second = await live.chat(history, model="direct", tools=TOOLS)
            assert second.text == f"tool get_weather returned: sunny in {city}\n"
        agent_trace = next(traces.glob("*agent_direct.ndjson")).read_text()
        servers = [
            server
            for line in agent_trace.splitlines()
            if '"session/new"' in line and '"dir":"out"' in line
            for server in json.loads(line)["msg"]["params"]["mcpServers"]
        ]
        assert [server["type"] for server in servers] == ["http", "http"]
        closed, open_ = (urllib.parse.urlsplit(server["url"]) for server in servers)
        assert closed.netloc == open_.netloc and closed.hostname == "127.0.0.1"  # one listener
        assert closed.path != open_.path and closed.path.startswith("/mcp/")
        # The token never reaches a trace; without it the open session's endpoint refuses, a closed one is gone.
        assert all(server["headers"] == [{"name": "Authorization", "value": "Bearer ***"}] for server in servers)
        assert await trio.to_thread.run_sync(post, open_.geturl()) == 401
        assert await trio.to_thread.run_sync(post, open_.geturl(), "wrong") == 401
        assert await trio.to_thread.run_sync(post, closed.geturl()) == 404
        assert await trio.to_thread.run_sync(post, f"http://{open_.netloc}/mcp/") == 404
    mcp_trace = "".join(path.read_text() for path in traces.glob("*mcp_*.ndjson"))
    assert '"method":"tools/call"' in mcp_trace and "sunny in Oslo" in mcp_trace
    assert '"readOnlyHint":true' in mcp_trace  # the agent may run the editor's tools concurrently (docs/tools.md)
    assert '"listChanged":true' in mcp_trace  # as on stdio: the agent is told when the editor's tools change
    assert live.stderr.count("refused an HTTP MCP request: wrong or missing token") == 2
